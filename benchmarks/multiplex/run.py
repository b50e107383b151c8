"""One multiplex benchmark run against one `loraplex serve` process: send the tenants their
jobs, wait for warm-up, release them together, keep early finishers stepping until every tenant
has done its timed steps, then turn the tenants' step timestamps, the server's
``/api/v1/loraplex/stats`` and /proc CPU counters into the run's numbers.

Knows the server only through HTTP and its pid; knows nothing of the other runs.
"""

from __future__ import annotations

import os
import queue
import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.harness.procs import machine_cpu_s, process_cpu_s
from benchmarks.harness.server_process import ServerProcess, serve_loraplex
from benchmarks.harness.workers import Workers
from benchmarks.multiplex.workload import Workload

MODEL_NAME = "small"
OBSERVER_KEY = "tml-multiplex-observer"


@dataclass(frozen=True)
class RunSpec:
    """One run.

    Attributes:
        mode: ``sft`` or ``grpo``.
        k: the tenant count this run belongs to.
        variant: ``packed`` / ``timeslice`` (K tenants) or ``single`` (one tenant, K× batch).
        timed_steps: steps per tenant inside the measured window.
        workload: what every tenant does per step (``single``: K tenants' batch).
    """

    mode: str
    k: int
    variant: str
    timed_steps: int
    workload: Workload = field(default_factory=Workload)

    @property
    def num_tenants(self) -> int:
        return 1 if self.variant == "single" else self.k

    def tenant_job(self, base_url: str, base_model: str, worker: int, label: str
                   ) -> dict[str, Any]:
        multiplier = self.k if self.variant == "single" else 1
        return {**self.workload.job(self.mode, multiplier), "base_url": base_url,
                "base_model": base_model, "api_key": f"tml-{label}-t{worker}",
                "timed_steps": self.timed_steps, "seed": worker}


@contextmanager
def loraplex_server(model_dir: Path, data_dir: Path, num_threads: int | None,
                    *flags: str) -> Iterator[ServerProcess]:
    shutil.rmtree(data_dir, ignore_errors=True)  # no sessions or adapters from an earlier run
    threads = [] if num_threads is None else ["--threads", str(num_threads)]
    with serve_loraplex(MODEL_NAME, str(model_dir), data_dir, *threads, *flags,
                        env={"no_proxy": "127.0.0.1,localhost"}) as process:
        yield process


@dataclass(frozen=True)
class Snapshot:
    """Counters read at one instant: wall clock, server stats, CPU seconds."""

    t: float
    stats: dict[str, Any]
    tenants_cpu_s: float
    server_cpu_s: float
    machine_busy_s: float
    machine_total_s: float


def snapshot(server: ServerProcess, pool: Workers, workers: range, recent: int = 0
             ) -> Snapshot:
    stats = server.stats(OBSERVER_KEY, recent)
    busy, total = machine_cpu_s()
    return Snapshot(time.time(), stats, pool.cpu_s(workers), process_cpu_s(server.pid), busy,
                    total)


def run_loop(pool: Workers, server: ServerProcess, spec: RunSpec, bar: tqdm
             ) -> dict[str, Any]:
    """One run: jobs → warm-up → barrier → timed steps (+ steady-load steps) → stop
    (the algorithm; reads top to bottom)."""
    num_tenants = spec.num_tenants
    label = f"{spec.mode}-k{spec.k}-{spec.variant}-{int(time.time())}"
    workers = range(num_tenants)
    for i in workers:
        pool.send(i, {"job": spec.tenant_job(server.base_url, server.base_model, i, label)})
    pool.wait_all(workers, "ready", timeout_s=3600)
    load_start = os.getloadavg()
    before = snapshot(server, pool, workers)
    t_go = time.time()
    for i in workers:
        pool.send(i, {"go": True})
    steps: list[dict[str, Any]] = []
    done: dict[int, float] = {}
    deciding: dict[int, float] = {}  # worker past its timed steps → when to send it "more"
    finished: set[int] = set()
    after: Snapshot | None = None
    while len(finished) < num_tenants:
        wait_s = max(0.01, min(deciding.values(), default=time.time() + 5) - time.time())
        try:
            event = pool.next_event(wait_s)
        except queue.Empty:  # time to decide on a waiting tenant
            event = None
        if event is not None and event.kind == "step":
            body = dict(event.body, worker=event.worker)
            steps.append(body)
            bar.update(1 if body["timed"] else 0)
            if body["index"] >= spec.timed_steps:
                # Tenants woken by the same cycle report within a moment of each other: wait a
                # little before keeping an early finisher busy with an untimed step.
                grace = min(5.0, max(0.5, 0.1 * (body["t1"] - body["t0"])))
                deciding[event.worker] = time.time() + grace
        elif event is not None and event.kind == "done":
            done[event.worker] = float(event.body["t"])
            if len(done) == num_tenants:
                after = snapshot(server, pool, workers, recent=4096)
        elif event is not None and event.kind == "finished":
            finished.add(event.worker)
        for worker, at in list(deciding.items()):
            if len(done) == num_tenants or at <= time.time():
                command = "stop" if len(done) == num_tenants else "more"
                pool.send(worker, {command: True})
                del deciding[worker]
    assert after is not None
    return summarize(spec, steps, done, t_go, before, after, load_start)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(spec: RunSpec, steps: list[dict[str, Any]], done: dict[int, float], t_go: float,
              before: Snapshot, after: Snapshot, load_start: tuple[float, ...]
              ) -> dict[str, Any]:
    t_end = max(done.values())
    window = t_end - t_go
    in_window = [s for s in steps if s["t1"] <= t_end + 1e-6]
    timed = [s for s in steps if s["timed"]]
    per_tenant = []
    for worker in range(spec.num_tenants):
        mine = [s for s in timed if s["worker"] == worker]
        latency = [s["t1"] - s["t0"] for s in mine]
        per_tenant.append({
            "tok_s": sum(s["trained_tokens"] for s in mine) / (done[worker] - t_go),
            "p50_s": statistics.median(latency), "p95_s": percentile(latency, 0.95)})
    latencies = [s["t1"] - s["t0"] for s in timed]
    rates = [t["tok_s"] for t in per_tenant]
    trained = sum(s["trained_tokens"] for s in in_window)
    server = server_delta(before, after, t_go, t_end)
    return {
        "mode": spec.mode, "k": spec.k, "variant": spec.variant,
        "num_tenants": spec.num_tenants, "timed_steps": spec.timed_steps,
        "window_s": window,
        "aggregate_tok_s": trained / window,
        # The span of the CPU counters is the window plus the end snapshot's stats call.
        "tok_per_server_cpu_s": trained / max(1e-9, server["server_cpu_s"]),
        "engine_s_per_ktok": server["utilization"] * window * 1000 / max(1, trained),
        "sampled_tok_s": sum(s["sampled_tokens"] for s in in_window) / window,
        "trained_tokens_per_step": timed[0]["trained_tokens"] if timed else 0,
        "steps_in_window": len(in_window),
        "step_latency_s": {"p50": statistics.median(latencies),
                           "p95": percentile(latencies, 0.95)},
        "tenants": per_tenant,
        "fairness": max(rates) / min(rates),
        **server,
        "load_avg": {"start": [round(x, 2) for x in load_start],
                     "end": [round(x, 2) for x in os.getloadavg()]},
    }


def server_delta(before: Snapshot, after: Snapshot, t_go: float, t_end: float
                 ) -> dict[str, Any]:
    """Engine time, utilization, packing and CPU shares between two snapshots."""
    span = after.t - before.t
    cores = os.cpu_count() or 1

    def delta(key: str) -> dict[str, float]:
        old = before.stats[key]
        return {kind: s - old.get(kind, 0.0) for kind, s in after.stats[key].items()}

    engine_s = delta("engine_s")
    section, old_section = after.stats["schedulers"][0], before.stats["schedulers"][0]
    records = section["recent_cycles"]
    cycles = [c for c in records
              if c["kind"] == "cycle" and c["num_tokens"] and t_go <= c["wall_time"] <= t_end]
    samples = [c for c in records if c["kind"] == "sample" and t_go <= c["wall_time"] <= t_end]
    # Engine-busy seconds inside the window: each plan's engine call clipped to it (a plan
    # starts its engine call right after it is made, at ``wall_time``).
    busy = sum(max(0.0, min(t_end, c["wall_time"] + c["engine_s"]) - max(t_go, c["wall_time"]))
               for c in records)
    clients = (after.tenants_cpu_s - before.tenants_cpu_s) / (span * cores)
    server = (after.server_cpu_s - before.server_cpu_s) / (span * cores)
    machine = (after.machine_busy_s - before.machine_busy_s) / (
        after.machine_total_s - before.machine_total_s)
    return {
        "utilization": busy / (t_end - t_go),
        "engine_s": {k: round(v, 3) for k, v in engine_s.items() if v},
        "engine_calls": delta("engine_calls"),
        "idle_s": section["idle_s"] - old_section["idle_s"],
        "scheduler_overhead_s": section["overhead_s"] - old_section["overhead_s"],
        "train_cycles": {
            "count": len(cycles),
            # a non-operator key sees only its own id in ``tenants``; ``num_tenants`` counts all
            "mean_tenants": (statistics.fmean(c["num_tenants"] for c in cycles)
                             if cycles else 0),
            "mean_tokens": statistics.fmean(c["num_tokens"] for c in cycles) if cycles else 0,
            "mean_engine_s": statistics.fmean(c["engine_s"] for c in cycles) if cycles else 0},
        "sample_plans": {
            "count": len(samples),
            "mean_engine_s": statistics.fmean(c["engine_s"] for c in samples) if samples else 0,
            # requests still decoding after each plan: the decode batch, in requests
            "mean_running": statistics.fmean(c["num_running"] for c in samples) if samples
            else 0},
        "client_cpu_share": clients, "server_cpu_share": server,
        "server_cpu_s": after.server_cpu_s - before.server_cpu_s,
        "machine_busy_share": machine,
        "other_cpu_share": max(0.0, machine - clients - server),
    }
