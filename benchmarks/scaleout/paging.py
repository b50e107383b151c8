"""Adapter paging under a memory budget, in one process, one torch thread: how much one engine
worker can train when its device holds only N adapters, and what a page move costs.

Three engines of the same model side by side, stepped in turn (interleaved): ``resident`` (no
budget, N adapters: the baseline step), ``disk`` (a budget of N adapters, host budget 0: every
page-out writes a page file) and ``host`` (the same budget, host tier unbounded: on a CPU
engine a move hands the tensors over). The paged engines train 4N adapters round robin. Round
1 creates and trains each adapter once (page-outs only: the LRU trained adapter leaves), later
rounds swap (one page-out, one page-in per step), which splits the paging seconds of
`Engine.memory_stats` into a page-out and a page-in cost. Bytes moved are checked against the
adapter state of theory: LoRA leaves + two AdamW moments in fp32 + the step scalar (gradients
are freed by the optim_step before a step's adapter can leave).
"""

from __future__ import annotations

import shutil
import statistics
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.multiplex.workload import Workload

STEP_BYTES = 4  # the AdamW step count: one float32


@dataclass
class Trained:
    """One engine and what stepping it recorded (per step: seconds and paging deltas)."""

    name: str
    engine: Any
    adapters: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    max_resident: int = 0
    max_bytes_resident: int = 0


def _datum(seq_len: int, vocab_limit: int, seed: int) -> Any:
    from loraplex.domain.data import Datum, TensorData

    tokens = [(seed * 7919 + 31 * i) % (vocab_limit - 1) + 1 for i in range(seq_len)]
    return Datum(array("q", tokens), {
        "target_tokens": TensorData.from_list(tokens[1:] + tokens[:1], "int64"),
        "weights": TensorData.from_list([1.0] * seq_len, "float32")})


def step(trained: Trained, index: int, round_: int, workload: Workload, seq_len: int) -> None:
    """Create adapter ``index`` if new, then one forward_backward + optim_step on it."""
    from loraplex.domain.lora import LoraConfig
    from loraplex.domain.optim import AdamParams
    from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
    from loraplex.errors import LoraplexError

    engine = trained.engine
    adapter = f"{trained.name}-{index}"
    before = engine.memory_stats().paging
    t0 = time.perf_counter()
    if index >= len(trained.adapters):
        engine.create_adapter(adapter, LoraConfig(workload.rank, seed=index))
        trained.adapters.append(adapter)
    work = ForwardBackwardWork(f"fb-{round_}-{index}", adapter,
                               (_datum(seq_len, workload.vocab_limit, index),),
                               "cross_entropy", {}, False)
    outcomes = [*engine.forward_backward([work]),
                *engine.optim_step([OptimStepWork(f"opt-{round_}-{index}", adapter,
                                                  AdamParams())])]
    seconds = time.perf_counter() - t0
    failed = [o for o in outcomes if isinstance(o, LoraplexError)]
    if failed:
        raise RuntimeError(f"{trained.name} engine: {adapter} failed: {failed[0]}")
    memory = engine.memory_stats()
    after = memory.paging
    trained.max_resident = max(trained.max_resident, memory.num_resident)
    trained.max_bytes_resident = max(trained.max_bytes_resident, memory.bytes_resident)
    trained.steps.append({"round": round_, "adapter": index, "s": seconds,
                          "page_s": after.seconds - before.seconds,
                          "outs": after.page_outs - before.page_outs,
                          "ins": after.page_ins - before.page_ins})


def split_ms(steps: list[dict[str, Any]]) -> dict[str, float | None]:
    """Page-out ms from steps that only paged out; page-in ms from the rest of the swaps."""
    only_out = [s for s in steps if s["outs"] and not s["ins"]]
    swaps = [s for s in steps if s["ins"]]
    out_ms = (1000 * sum(s["page_s"] for s in only_out) / sum(s["outs"] for s in only_out)
              if only_out else None)
    in_ms = None
    if swaps and out_ms is not None:
        in_s = sum(s["page_s"] for s in swaps) - out_ms / 1000 * sum(s["outs"] for s in swaps)
        # Clamped: where moves cost less than the timing noise (the host tier on a CPU
        # engine) the difference can come out below zero.
        in_ms = max(0.0, 1000 * in_s / sum(s["ins"] for s in swaps))
    moves = sum(s["outs"] + s["ins"] for s in steps)
    return {"page_out_ms": out_ms, "page_in_ms": in_ms,
            "mean_move_ms": 1000 * sum(s["page_s"] for s in steps) / moves if moves else None,
            "swap_ms": None if in_ms is None or out_ms is None else out_ms + in_ms}


def paging_phase(model_dir: Path, page_dir: Path, workload: Workload, *, num_resident: int,
                 rounds: int, seq_len: int) -> dict[str, Any]:
    """The three engines, ``rounds`` rounds of 4N steps each (see the module docstring)."""
    from loraplex.config import EngineConfig
    from loraplex.engine.executor import Engine

    shutil.rmtree(page_dir, ignore_errors=True)
    num_adapters = 4 * num_resident
    resident = Trained("resident", Engine(str(model_dir), EngineConfig(num_threads=1)))
    step(resident, 0, 0, workload, seq_len)  # the first adapter gives the state's size
    num_params = resident.engine.bank.get(resident.adapters[0]).num_params
    rest_bytes = 3 * 4 * num_params + STEP_BYTES  # leaves + 2 moments (fp32) + step
    peak_bytes = rest_bytes + 4 * num_params  # + gradients, while a step runs
    budget = (num_resident - 1) * rest_bytes + peak_bytes  # N-1 at rest + one training
    paged = {tier: Trained(tier, Engine(str(model_dir), EngineConfig(
        num_threads=1, adapter_memory_budget=budget, host_memory_budget=host,
        page_dir=str(page_dir / tier)))) for tier, host in (("disk", 0), ("host", None))}
    try:
        for r in range(rounds):
            for i in range(num_adapters):
                if r or i:
                    step(resident, i % num_resident, r, workload, seq_len)
                for trained in paged.values():
                    step(trained, i, r, workload, seq_len)
        result = {"num_params": num_params, "rest_bytes": rest_bytes,
                  "peak_bytes": peak_bytes, "budget_bytes": budget,
                  "num_resident_budgeted": num_resident, "num_adapters": num_adapters,
                  "rounds": rounds, "seq_len": seq_len, "rank": workload.rank,
                  "resident_bytes_per_adapter":
                      resident.engine.memory_stats().bytes_resident / num_resident,
                  "resident_step_ms": _median_step_ms(resident)}
        for tier, trained in paged.items():
            result[tier] = _tier_result(trained, rest_bytes, budget, page_dir / tier)
        result["swap_overhead_per_step_ms"] = (result["disk"]["step_ms"]
                                               - result["resident_step_ms"])
        return result
    finally:
        for trained in (resident, *paged.values()):
            trained.engine.close()


def _median_step_ms(trained: Trained) -> float:
    later = [s["s"] for s in trained.steps if s["round"] > 0] or [s["s"] for s in trained.steps]
    return 1000 * statistics.median(later)


def _tier_result(trained: Trained, rest_bytes: int, budget: int, page_dir: Path
                 ) -> dict[str, Any]:
    memory = trained.engine.memory_stats()
    p = memory.paging
    written = p.bytes_to_disk / p.to_disk if p.to_disk else None
    read = p.bytes_from_disk / p.from_disk if p.from_disk else None
    disk_free = shutil.disk_usage(page_dir if page_dir.exists() else page_dir.parent).free
    return {
        **split_ms(trained.steps), "step_ms": _median_step_ms(trained),
        "adapters_trained": len(trained.adapters),
        "max_resident": trained.max_resident,
        "max_bytes_resident": trained.max_bytes_resident,
        "within_budget": trained.max_bytes_resident <= budget and not p.over_budget_calls,
        "paging": {k: getattr(p, k) for k in ("page_outs", "page_ins", "to_disk", "from_disk",
                                              "bytes_to_host", "bytes_from_host",
                                              "bytes_to_disk", "bytes_from_disk", "seconds",
                                              "over_budget_calls", "max_over_budget_bytes")},
        "bytes_per_page_file": written, "bytes_per_page_read": read,
        "written_vs_theory": None if written is None else written / rest_bytes,
        "read_vs_theory": None if read is None else read / rest_bytes,
        # Page files that fit on the page dir's disk now: the bound on adapters per worker.
        "disk_bound_adapters": int(disk_free // written) if written else None,
    }
