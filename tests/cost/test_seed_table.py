"""Acceptance: the seed-calibrated presets reproduce the published comparison table.

Tolerances are the issue's: exact-fit cells within 2%, code_rl self-hosted within 5%, factors
within 10% (except code_rl), every winner. The cells physics cannot reach are reported as
known deviations, and these tests check they really deviate (a stale note would fail).
"""

from __future__ import annotations

import json

import pytest

from loraplex.cost.presets import PRESET_NAMES, get_preset
from loraplex.cost.seed_table import PUBLISHED, comparison_table

ROWS = {row.workload: row for row in comparison_table()}

WITHIN_2_PERCENT = [
    ("math_rl", "tinker_usd"), ("math_rl", "self_hosted_usd"),
    ("harbor_rl", "tinker_usd"), ("harbor_rl", "self_hosted_usd"),
    ("swe_rl", "tinker_usd"), ("swe_rl", "self_hosted_usd"),
    ("osworld_rl", "tinker_usd"), ("osworld_rl", "self_hosted_usd"),
]


@pytest.mark.parametrize(("workload", "cell"), WITHIN_2_PERCENT)
def test_fitted_cells_within_2_percent(workload: str, cell: str) -> None:
    assert ROWS[workload].ratio(cell) == pytest.approx(1.0, abs=0.02)  # type: ignore[arg-type]


def test_code_rl_self_hosted_within_5_percent_unfitted() -> None:
    assert ROWS["code_rl"].ratio("self_hosted_usd") == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("workload", PRESET_NAMES)
def test_every_winner_matches(workload: str) -> None:
    assert ROWS[workload].comparison.winner == PUBLISHED[workload].winner


@pytest.mark.parametrize("workload", [n for n in PRESET_NAMES if n != "code_rl"])
def test_factors_within_10_percent(workload: str) -> None:
    assert ROWS[workload].ratio("factor") == pytest.approx(1.0, abs=0.10)


def test_code_rl_tinker_is_the_physical_1137_and_reported_as_a_deviation() -> None:
    row = ROWS["code_rl"]
    assert row.ours("tinker_usd") == pytest.approx(1137, rel=0.005)
    assert {d.cell for d in row.known_deviations} == {"tinker_usd", "factor"}
    ratio = row.ratio("tinker_usd")
    assert ratio is not None and ratio < 0.9


@pytest.mark.parametrize("workload", ["swe_rl", "osworld_rl"])
def test_prefix_caching_cells_are_reported_deviations_within_1_6x(workload: str) -> None:
    row = ROWS[workload]
    ratio = row.ratio("tinker_cached_usd")
    assert ratio is not None and 1.1 < ratio < 1.6
    assert [d.cell for d in row.known_deviations] == ["tinker_cached_usd"]
    assert "sampled_only" in row.known_deviations[0].reason


def test_rows_without_deviations_have_none_listed() -> None:
    for name in ("math_rl", "harbor_rl"):
        assert ROWS[name].known_deviations == ()


def test_json_rows_have_the_documented_schema() -> None:
    rows = json.loads(json.dumps([row.to_json() for row in comparison_table()]))
    assert [r["workload"] for r in rows] == list(PRESET_NAMES)
    for r in rows:
        assert {"workload", "model", "tinker_usd", "tinker_cached_usd", "self_hosted_usd",
                "winner", "factor", "known_deviations"} <= set(r)
        assert r["winner"] in ("tinker", "self_hosted")
        assert r["calibration"] == "seed-calibrated"
    assert rows[0]["tinker_cached_usd"] is None and rows[3]["tinker_cached_usd"] > 0


def test_seed_calibration_is_labelled_and_kept_apart_from_physical_defaults() -> None:
    for name in PRESET_NAMES:
        seed, physical = get_preset(name), get_preset(name, "physical")
        assert seed.calibration == "seed-calibrated" and physical.calibration == "physical"
        assert any(note.startswith("seed-calibrated:") for note in seed.notes)
        assert not any("seed-calibrated" in note for note in physical.notes)
    assert get_preset("math_rl", "physical").workload.prompt_tokens == 200
    assert get_preset("math_rl").workload.prompt_tokens == 241
    assert get_preset("math_rl", "physical").self_host.fixed_seconds_per_step == 0.0


def test_physical_defaults_are_a_different_table() -> None:
    physical = {row.workload: row for row in comparison_table("physical")}
    # The environment latency nobody states decides the agentic rows: harbor_rl flips.
    assert physical["harbor_rl"].comparison.winner == "self_hosted"
    ratio = physical["osworld_rl"].ratio("self_hosted_usd")
    assert ratio is not None and ratio < 0.5
