"""The scale-out benchmark's throughput phase: K tenant processes (the multiplex benchmark's
SFT and GRPO loops, official SDK) against `loraplex serve --workers 1` and `--workers 2` (one
torch thread per worker), interleaved 1, 2, 1, 2, ...; each run a fixed window after the
tenants' warm-up.

Per run: trained tokens in the window (a step straddling an edge counts by the fraction of it
inside) ÷ the window; CPU seconds of the server's process tree by role (server, Ray's own
processes, engine workers), of the tenants and of the whole machine; each worker's engine-busy
time from `/api/v1/loraplex/stats`; load average and the GEMM probe before and after. Knows the
servers only through HTTP and their pids.
"""

from __future__ import annotations

import os
import queue
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.harness.procs import machine_cpu_s
from benchmarks.harness.workers import Workers
from benchmarks.multiplex.workload import Workload
from benchmarks.scaleout.procs import TreeCpu
from benchmarks.scaleout.server import WorkerServer

WORKER_COUNTS = (1, 2)
#: Per model size: the multiplex benchmark's workload on `small`, a scaled-down one on `tiny`
#: (vocabulary 1024).
WORKLOADS = {"small": Workload(),
             "tiny": Workload(seq_len=32, prompt_len=16, max_tokens=8, rank=4, vocab_limit=512)}


@dataclass(frozen=True)
class Reading:
    """Counters at one instant: wall clock, server stats, CPU seconds."""

    t: float
    stats: dict[str, Any]
    tree: TreeCpu
    tenants_cpu_s: float
    machine_busy_s: float
    machine_total_s: float


def read(server: WorkerServer, pool: Workers, tenants: range, recent: int = 0) -> Reading:
    stats = server.stats(recent)
    busy, total = machine_cpu_s()
    return Reading(time.time(), stats, TreeCpu.read(server.pid), pool.cpu_s(tenants), busy,
                   total)


def window_tokens(steps: list[dict[str, Any]], t_go: float, t_end: float
                  ) -> tuple[float, float]:
    """(trained, sampled) tokens of the steps inside [t_go, t_end]; a step that straddles an
    edge counts by the fraction of its duration inside."""
    trained = sampled = 0.0
    for s in steps:
        inside = min(s["t1"], t_end) - max(s["t0"], t_go)
        if inside <= 0:
            continue
        fraction = inside / max(1e-9, s["t1"] - s["t0"])
        trained += fraction * s["trained_tokens"]
        sampled += fraction * s["sampled_tokens"]
    return trained, sampled


def lane_stats(before: dict[str, Any], after: dict[str, Any], t_go: float, t_end: float
               ) -> list[dict[str, Any]]:
    """Per engine worker (lane): engine-busy seconds in the window (each plan's engine call
    clipped to it), utilization, engine seconds per plan kind, training cycles."""
    old = {s["worker"]: s for s in before["schedulers"]}
    out = []
    for section in after["schedulers"]:
        prior = old.get(section["worker"], {"engine_s": {}})
        records = section["recent_cycles"]
        busy = sum(max(0.0, min(t_end, c["wall_time"] + c["engine_s"])
                       - max(t_go, c["wall_time"])) for c in records)
        cycles = [c for c in records if c["kind"] == "cycle" and c["num_tokens"]
                  and t_go <= c["wall_time"] <= t_end]
        out.append({
            "worker": section["worker"], "busy_s": busy, "utilization": busy / (t_end - t_go),
            "engine_s": {k: round(v - prior["engine_s"].get(k, 0.0), 3)
                         for k, v in section["engine_s"].items()},
            "train_cycles": len(cycles),
            # ``num_tenants``: a non-operator key sees no other tenant's id, only the count.
            "mean_tenants_per_cycle": (statistics.fmean(c["num_tenants"] for c in cycles)
                                       if cycles else 0.0)})
    return out


def summarize(workers: int, steps: list[dict[str, Any]], t_go: float, t_end: float,
              before: Reading, after: Reading) -> dict[str, Any]:
    """One run's numbers from its steps and the two readings around its window."""
    window = t_end - t_go
    span = after.t - before.t
    cores = os.cpu_count() or 1
    trained, sampled = window_tokens(steps, t_go, t_end)
    tree = after.tree.since(before.tree)
    tenants_cpu = after.tenants_cpu_s - before.tenants_cpu_s
    machine = after.machine_busy_s - before.machine_busy_s
    lanes = lane_stats(before.stats, after.stats, t_go, t_end)
    busy = sum(lane["busy_s"] for lane in lanes)
    ours = tree["total"] + tenants_cpu
    latencies = [s["t1"] - s["t0"] for s in steps]
    cpu_s = {**{k: round(v, 3) for k, v in tree.items()}, "tenants": round(tenants_cpu, 3),
             "machine_busy": round(machine, 3), "other": round(max(0.0, machine - ours), 3)}
    return {
        "workers": workers, "window_s": window, "num_steps": len(steps),
        "trained_tokens": trained, "aggregate_tok_s": trained / window,
        "sampled_tok_s": sampled / window,
        "step_latency_s": ({"p50": statistics.median(latencies),
                            "max": max(latencies)} if latencies else {}),
        # What the work cost, whatever else ran on the machine: tokens per CPU second of the
        # server's process tree and the tenants.
        "tok_per_cpu_s": trained / max(1e-9, ours),
        "tok_per_worker_cpu_s": trained / max(1e-9, tree["engine_workers"]),
        "cpu_s": cpu_s,
        "cpu_share": {k: v / (span * cores) for k, v in cpu_s.items()},
        "cpu_cores_used": ours / span,
        "worker_cpu_s": sorted(round(v, 3) for v in after.tree.worker_cpu_s(before.tree)
                               .values()),
        "lanes": lanes,
        # CPU seconds the engine workers got per second their engines were busy: 1.0 is a
        # full core whenever a worker computes; less is time spent waiting for a core.
        "worker_cpu_per_busy_s": tree["engine_workers"] / max(1e-9, busy),
        "per_tenant_tok_s": [window_tokens([s for s in steps if s["worker"] == i], t_go,
                                           t_end)[0] / window
                             for i in sorted({s["worker"] for s in steps})],
    }


def run_window(pool: Workers, server: WorkerServer, workload: Workload,
               modes: tuple[str, ...], num_tenants: int, window_s: float, label: str
               ) -> dict[str, Any]:
    """One run: jobs → warm-up → go → steps until the window closes → stop (the algorithm;
    reads top to bottom). Tenant i runs ``modes[i % len(modes)]``."""
    tenants = range(num_tenants)
    for i in tenants:
        # One timed step, then one more per ``more`` until ``stop``.
        pool.send(i, {"job": {**workload.job(modes[i % len(modes)]), "base_url": server.url,
                              "base_model": server.base_model, "api_key": f"tml-{label}-t{i}",
                              "timed_steps": 1, "seed": i}})
    pool.wait_all(tenants, "ready", timeout_s=1800)
    load_start = os.getloadavg()
    before = read(server, pool, tenants)
    t_go = time.time()
    t_end = t_go + window_s
    for i in tenants:
        pool.send(i, {"go": True})
    steps: list[dict[str, Any]] = []
    finished: set[int] = set()
    after: Reading | None = None
    while len(finished) < num_tenants:
        wait_s = max(0.01, t_end - time.time()) if after is None else 30.0
        try:
            event = pool.next_event(wait_s)
        except queue.Empty:
            event = None
        if after is None and time.time() >= t_end:
            after = read(server, pool, tenants, recent=4096)
        if event is None:
            continue
        if event.kind == "step":
            steps.append(dict(event.body, worker=event.worker))
            # Keep stepping while the window is open, so the load stays steady to its end.
            pool.send(event.worker, {"more" if time.time() < t_end else "stop": True})
        elif event.kind == "finished":
            finished.add(event.worker)
    assert after is not None
    run = summarize(server.workers, steps, t_go, t_end, before, after)
    run["load_avg"] = {"start": [round(x, 2) for x in load_start],
                       "end": [round(x, 2) for x in os.getloadavg()]}
    run["modes"] = [modes[i % len(modes)] for i in tenants]
    return run


def throughput_phase(servers: dict[int, WorkerServer], pool: Workers, model_name: str, *,
                     rounds: int, window_s: float, num_tenants: int, modes: tuple[str, ...],
                     probe: Callable[[], dict[str, Any]],
                     on_run: Callable[[str], None] = lambda _: None,
                     on_done: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Runs on ``servers[1]`` and ``servers[2]`` (ready), 1, 2, 1, 2, ...; both stay up for
    the whole phase, so the idle one's Ray runtime is idle load on both sides."""
    runs: dict[int, list[dict[str, Any]]] = {w: [] for w in WORKER_COUNTS}
    for r in range(rounds):
        for w in WORKER_COUNTS:
            on_run(f"round {r + 1}/{rounds}, --workers {w}")
            probe_before = probe()
            run = run_window(pool, servers[w], WORKLOADS[model_name], modes, num_tenants,
                             window_s, f"r{r}-w{w}-{int(time.time())}")
            run.update(round=r, probe_before=probe_before, probe_after=probe())
            runs[w].append(run)
            on_done()
    return {"runs": {str(w): v for w, v in runs.items()}, **derive(runs)}


def derive(runs: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Ratios workers 2 ÷ 1, each the median over rounds of the ratio within a round (runs
    seconds apart, so the machine's other load mostly cancels), and where the time went."""
    pairs = list(zip(runs[1], runs[2], strict=True))

    def ratio(get: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(get(two) / max(1e-9, get(one)) for one, two in pairs)

    def median(get: Callable[[dict[str, Any]], float], w: int) -> float:
        return statistics.median(get(run) for run in runs[w])

    where = {}
    for w in WORKER_COUNTS:
        shares = {k: statistics.median(r["cpu_share"][k] for r in runs[w])
                  for k in runs[w][0]["cpu_share"]}
        num_lanes = min(len(r["lanes"]) for r in runs[w])
        where[str(w)] = {
            "aggregate_tok_s": median(lambda r: r["aggregate_tok_s"], w),
            "cpu_share": shares,
            "cpu_cores_used": median(lambda r: r["cpu_cores_used"], w),
            "worker_utilization": [statistics.median(r["lanes"][i]["utilization"]
                                                     for r in runs[w])
                                   for i in range(num_lanes)],
            "worker_cpu_per_busy_s": median(lambda r: r["worker_cpu_per_busy_s"], w),
            "tok_per_worker_cpu_s": median(lambda r: r["tok_per_worker_cpu_s"], w),
        }
    return {
        "ratio_per_round": [two["aggregate_tok_s"] / max(1e-9, one["aggregate_tok_s"])
                            for one, two in pairs],
        "throughput_ratio_2v1": ratio(lambda r: r["aggregate_tok_s"]),
        # Trained tokens per CPU second (server tree + tenants), 2 ÷ 1: ~1 when two workers
        # spend CPU as well as one; the wall-clock ratio ≈ this × cpu_rate_ratio_2v1.
        "throughput_ratio_2v1_cpu": ratio(lambda r: r["tok_per_cpu_s"]),
        "cpu_rate_ratio_2v1": ratio(lambda r: r["cpu_cores_used"]),
        "worker_cpu_ratio_2v1": ratio(lambda r: r["cpu_s"]["engine_workers"]),
        "where": where,
    }
