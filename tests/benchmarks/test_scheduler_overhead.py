"""The scheduler-overhead benchmark runs end to end on a tiny load (numbers are not checked:
timings on a shared machine are noise; the benchmark itself reports them)."""

from __future__ import annotations

from benchmarks.scheduler_overhead import measure, per_op_overhead_ms


def test_both_drivers_run_every_op_and_report_overhead() -> None:
    result = measure(tenants=3, steps=4, chunks=2)
    for driver in ("threaded", "sync"):
        assert result[driver]["ops"] == 3 * 4 * 3
        assert result[driver]["per_op_overhead_ms"] > 0
    assert result["threaded"]["cycles"] >= 4, "each tenant's 4 steps need ≥ 4 cycles"
    assert isinstance(per_op_overhead_ms(tenants=2, steps=2, chunks=1), float)
