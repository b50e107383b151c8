"""The load benchmark's three phases against a running server and its worker processes: the
soak (many SDK clients, every op recorded), the wait for abandoned sessions to expire, and the
flood (normal tenants' baseline A, flood, drain, baseline B); plus the recorder of the workers'
events and the timeline of phases with their CPU shares.

Returns measurements (wall-clock times); `load/__main__.py` turns them into the result.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import asdict
from typing import Any

from tqdm import tqdm

from benchmarks.harness.procs import machine_cpu_s, process_cpu_s
from benchmarks.harness.server_process import ServerProcess
from benchmarks.harness.workers import Event, Workers
from benchmarks.load.client import ClientSpec, Workload
from benchmarks.load.server import MODEL_NAME, OBSERVER_KEY
from benchmarks.load.settings import SDK_HEARTBEAT_S, Settings
from benchmarks.load.summary import (
    error_summary,
    latency_stats,
    per_kind,
    step_windows,
)
from loraplex.scheduler.futures import FETCHED_GRACE_S

MARGIN_S = 1.0  # on top of every computed server deadline (sweep and release plan latency)
SETUP_TIMEOUT_S = 600.0


class Recorder:
    """Every event the workers send, kept by kind: ops (tagged with the phase they ran in),
    first-iteration times, the flooder's progress; drives the progress bar's counters."""

    def __init__(self) -> None:
        self.phase = "setup"
        self.ops: list[dict[str, Any]] = []
        self.warm: dict[str, float] = {}
        self.flood_progress: list[dict[str, Any]] = []

    def add(self, event: Event) -> None:
        body = {k: v for k, v in event.body.items() if k != "event"}
        if event.kind == "op":
            self.ops.append({**body, "phase": self.phase})
        elif event.kind == "warm":
            self.warm[body["c"]] = body["t"]
        elif event.kind == "progress":
            self.flood_progress.append(body)

    def phase_ops(self, phase: str) -> list[dict[str, Any]]:
        return [op for op in self.ops if op["phase"] == phase]


class Timeline:
    """Named phases (wall clock) and CPU counters at their edges."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.phases: list[dict[str, Any]] = []

    def begin(self, name: str) -> None:
        busy, total = machine_cpu_s()
        self.phases.append({"name": name, "start": time.time(), "server_cpu_s":
                            process_cpu_s(self.server_pid), "machine": (busy, total)})

    def end(self) -> None:
        phase, (busy0, total0) = self.phases[-1], self.phases[-1].pop("machine")
        busy, total = machine_cpu_s()
        phase["end"] = time.time()
        span = phase["end"] - phase["start"]
        phase["server_cpu_share"] = ((process_cpu_s(self.server_pid) - phase.pop("server_cpu_s"))
                                     / max(1e-9, span * (os.cpu_count() or 1)))
        phase["machine_busy_share"] = (busy - busy0) / max(1e-9, total - total0)


def phase_spans(phases: list[dict[str, Any]], names: tuple[str, ...] | None = None
                ) -> dict[str, tuple[float, float]]:
    """(start, end) wall clock of each named phase (all of them without ``names``)."""
    return {p["name"]: (p["start"], p["end"]) for p in phases
            if names is None or p["name"] in names}


def run_for(workers: Workers, recorder: Recorder, seconds: float, desc: str) -> None:
    """Pump worker events for ``seconds``, with a progress bar of elapsed seconds and ops."""
    start, end = time.time(), time.time() + seconds
    with tqdm(total=round(seconds, 1), desc=desc, unit="s", leave=False,
              mininterval=0.5 if sys.stderr.isatty() else 10.0,
              bar_format="{desc}: {bar} {n:.0f}/{total:.0f} s{postfix}") as bar:
        while (now := time.time()) < end:
            workers.pump(min(end, now + 0.5))
            failed = sum(not op["ok"] for op in recorder.ops)
            bar.set_postfix_str(f"ops {len(recorder.ops)}, errors {failed}", refresh=False)
            bar.update(round(min(seconds, time.time() - start), 1) - bar.n)


def soak_clients(settings: Settings, run_id: str) -> list[ClientSpec]:
    """Even clients train, odd ones sample; in each role every other client closes its
    session at the end, the rest abandon theirs (their sessions expire)."""
    return [ClientSpec(name=f"soak-{i:02d}", api_key=f"tml-load-{run_id}-soak-{i:02d}",
                       role="train" if i % 2 == 0 else "sample", seed=i,
                       close_session=(i // 2) % 2 == 0)
            for i in range(settings.clients)]


def client_setup(server: ServerProcess, specs: list[ClientSpec], workload: Workload
                 ) -> dict[str, Any]:
    return {"setup": {"base_url": server.base_url, "base_model": MODEL_NAME,
                      "clients": [asdict(s) for s in specs], "workload": asdict(workload)}}


def soak_phase(settings: Settings, server: ServerProcess, workers: Workers, recorder: Recorder,
               timeline: Timeline, run_id: str) -> dict[str, Any]:
    """Set up the soak clients, run them for ``soak_s``, stop them; their sessions'
    creation and the processes' exit times bound when the server may release them."""
    specs = soak_clients(settings, run_id)
    names = [f"soak-proc-{p}" for p in range(settings.num_processes)]
    n = settings.clients_per_process  # contiguous chunks: each process has both roles
    groups = {name: specs[p * n:(p + 1) * n] for p, name in enumerate(names)}
    for name, group in groups.items():
        workers.send(name, client_setup(server, group, settings.workload))
    ready = workers.wait_all(names, "ready", SETUP_TIMEOUT_S)
    created = {c: t for event in ready.values() for c, t in event.body["sessions"].items()}
    recorder.phase = "soak"
    timeline.begin("soak")
    for name in names:
        workers.send(name, {"go": True})
    run_for(workers, recorder, settings.soak_s, "soak")
    client_cpu_s = workers.cpu_s(names)  # before they exit (an exited process reads 0)
    timeline.end()
    timeline.begin("stopping")
    stopped = workers.stop(names, "stopped", SETUP_TIMEOUT_S)
    timeline.end()
    releases = server.stats(OBSERVER_KEY).get("engine_calls", {}).get("release", 0)
    exited = {s.name: stopped[proc].body["t"] for proc, group in groups.items() for s in group}
    closed = {c for event in stopped.values() for c in event.body["closed"]}
    soak = timeline.phases[-2]
    return {"specs": specs, "created": created, "exited": exited, "closed": closed,
            "client_cpu_s": client_cpu_s, "release_plans_at_stop": releases,
            "client_cpu_share": client_cpu_s / ((soak["end"] - soak["start"])
                                                * (os.cpu_count() or 1))}


def retention_deadlines(settings: Settings, soak: dict[str, Any], last_fetch: float
                        ) -> tuple[float, float]:
    """(expired_at, final_at): when the server has released every abandoned session at the
    latest (its last heartbeat: none if its process lived under one heartbeat period, else at
    most at exit; + the idle timeout + one housekeeping interval), and when the final RSS is
    read (with ``wait_fetched_grace`` also after fetched futures are dropped,
    `FETCHED_GRACE_S` after the last fetch)."""
    deadlines = [max(soak["exited"].values())]
    for spec in soak["specs"]:
        if spec.name in soak["closed"]:
            continue
        created, exited = soak["created"][spec.name], soak["exited"][spec.name]
        last_beat = created if exited - created < SDK_HEARTBEAT_S else exited
        deadlines.append(last_beat + settings.session_idle_s)
    expired_at = max(deadlines) + settings.housekeeping_s + MARGIN_S
    if not settings.wait_fetched_grace:
        return expired_at, expired_at
    return expired_at, max(expired_at, last_fetch + FETCHED_GRACE_S + settings.housekeeping_s
                           + MARGIN_S)


def expiry_phase(settings: Settings, workers: Workers, recorder: Recorder,
                 timeline: Timeline, soak: dict[str, Any]) -> dict[str, float]:
    """Wait, idle, until the abandoned sessions are released (and, with
    ``wait_fetched_grace``, until fetched futures are dropped), plus ``settle_s``."""
    last_fetch = max((op["t1"] for op in recorder.ops), default=time.time())
    expired_at, final_at = retention_deadlines(settings, soak, last_fetch)
    recorder.phase = "expiry"
    timeline.begin("expiry")
    run_for(workers, recorder, final_at + settings.settle_s - time.time(), "sessions expire")
    timeline.end()
    return {"expired_at": expired_at, "final_at": final_at,
            "fetched_grace_s": FETCHED_GRACE_S if settings.wait_fetched_grace else 0.0}


def open_tenant(key: str) -> str:
    """The tenant an ``--open`` server makes of an unknown key (`loraplex.store.keys`)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def tenant_counters(server: ServerProcess, keys: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Our tenants' server counters (engine seconds, ops, rejections) by our names, each read
    with the tenant's own key (the stats a plain key sees include its own tenant)."""
    out = {}
    for name, key in keys.items():
        tenants = server.stats(key).get("tenants", {})
        own = tenants.get(open_tenant(key))
        if own is None and len(tenants) == 1:
            [own] = tenants.values()
        own = own or {}
        out[name] = {"engine_s": own.get("engine_s", 0.0), "ops": own.get("ops", {}),
                     "rejected": own.get("rejected", {})}
    return out


def flood_setup(settings: Settings, server: ServerProcess, workers: Workers, run_id: str
                ) -> dict[str, str]:
    """The normal tenants' clients (warmed up) and the flooder's model, ready; their keys by
    our names."""
    specs = [ClientSpec(name=f"normal-{i}", api_key=f"tml-load-{run_id}-normal-{i}",
                        role="steady", seed=1000 + i) for i in range(settings.steady_tenants)]
    flood_key = f"tml-load-{run_id}-flooder"
    w = settings.workload
    workers.send("steady", client_setup(server, specs, w))
    workers.send("flood", {"setup": {
        "base_url": server.base_url, "base_model": MODEL_NAME, "api_key": flood_key,
        "batch": w.batch, "seq_len": w.seq_len_max, "rank": w.rank,
        "vocab_limit": w.vocab_limit, "concurrency": settings.flood_concurrency,
        "retrievers": settings.flood_retrievers, "retry_s": settings.flood_retry_s,
        "nice": settings.flood_nice}})
    workers.wait_all(["steady", "flood"], "ready", SETUP_TIMEOUT_S)
    return {s.name: s.api_key for s in specs} | {"flooder": flood_key}


def flood_phase(settings: Settings, server: ServerProcess, workers: Workers, recorder: Recorder,
                timeline: Timeline, run_id: str) -> dict[str, Any]:
    """Normal tenants throughout: baseline A, flood, drain (the flooder stopped, its queue
    emptying), baseline B; server counters read around the flood and its drain. The normal
    tenants are left running (`openai_phase` stops them)."""
    keys = flood_setup(settings, server, workers, run_id)
    recorder.phase = "flood_phase"
    timeline.begin("baseline_a")
    workers.send("steady", {"go": True})
    run_for(workers, recorder, settings.baseline_half_s, "baseline A")
    timeline.end()
    before = tenant_counters(server, keys)
    flood_cpu0 = workers.cpu_s(["flood"])
    timeline.begin("flood")
    workers.send("flood", {"go": True})
    run_for(workers, recorder, settings.flood_s, "flood")
    timeline.end()
    timeline.begin("drain")
    drained = workers.stop(["flood"], "drained", settings.drain_timeout_s)["flood"].body
    flood_cpu_s = workers.cpu_s(["flood"]) - flood_cpu0
    timeline.end()
    after = tenant_counters(server, keys)
    timeline.begin("baseline_b")
    run_for(workers, recorder, settings.baseline_half_s, "baseline B")
    timeline.end()  # the normal tenants go on into the OpenAI phase
    windows = phase_spans(timeline.phases, ("baseline_a", "flood", "baseline_b"))
    return flood_summary(recorder.phase_ops("flood_phase"), windows, drained, before, after,
                         flood_cpu_s)


def flood_summary(normal_ops: list[dict[str, Any]], windows: dict[str, tuple[float, float]],
                  drained: dict[str, Any], before: dict[str, dict[str, Any]],
                  after: dict[str, dict[str, Any]], flood_cpu_s: float) -> dict[str, Any]:
    """The normal tenants' windows and errors, the flooder's counters and rates, and each
    tenant's engine time and share over the flood and its drain."""
    steps = [op for op in normal_ops if op["ok"] and op["k"] == "train_step"]
    span = drained["t"] - windows["flood"][0]
    engine = {name: after[name]["engine_s"] - before[name]["engine_s"] for name in after}
    busy = sum(engine.values())
    return {
        "normal": step_windows(steps, windows, "flood", ("baseline_a", "baseline_b")),
        "normal_errors": error_summary(normal_ops),
        "flooder": {**{k: v for k, v in drained.items() if k not in ("t", "t_stop")},
                    "flood_s": drained["t_stop"] - windows["flood"][0],
                    "drain_s": drained["t"] - drained["t_stop"],
                    "requests_per_s": drained["requests"] / max(1e-9, span),
                    "accepted_per_s": drained["accepted"] / max(1e-9, span),
                    "cpu_s": flood_cpu_s, "server_rejected": after["flooder"]["rejected"]},
        "engine_s_flood_and_drain": engine,
        "engine_share_flood_and_drain": {k: v / busy for k, v in engine.items()} if busy else {},
    }


def openai_phase(settings: Settings, server: ServerProcess, workers: Workers, recorder: Recorder,
                 timeline: Timeline, run_id: str) -> dict[str, Any]:
    """The flood phase's normal tenants go on: ``openai_clients`` OpenAI-API clients
    (`load/openai_clients.py`) for ``openai_s``, stopped, then baseline C; then the normal tenants
    stop. Their steps in the OpenAI window against baselines B (just before) and C."""
    keys = [f"tml-load-{run_id}-openai-{i:02d}" for i in range(settings.openai_clients)]
    workers.send("openai", {"setup": {"base_url": server.base_url, "model": MODEL_NAME,
                                      "keys": keys, "max_tokens": settings.openai_max_tokens,
                                      "nice": settings.flood_nice}})
    workers.wait_all(["openai"], "ready", SETUP_TIMEOUT_S)
    recorder.phase = "openai_phase"
    timeline.begin("openai")
    workers.send("openai", {"go": True})
    run_for(workers, recorder, settings.openai_s, "OpenAI clients")
    timeline.end()
    timeline.begin("openai_stop")
    workers.stop(["openai"], "stopped", SETUP_TIMEOUT_S)
    timeline.end()
    timeline.begin("baseline_c")
    run_for(workers, recorder, settings.baseline_half_s, "baseline C")
    timeline.end()
    workers.stop(["steady"], "stopped", SETUP_TIMEOUT_S)
    windows = phase_spans(timeline.phases, ("baseline_b", "openai", "baseline_c"))
    steady = [op for op in recorder.ops if op["c"].startswith("normal-")]
    users = [op for op in recorder.phase_ops("openai_phase") if op["c"].startswith("openai-")]
    steps = [op for op in steady if op["ok"] and op["k"] == "train_step"]
    return {"normal": step_windows(steps, windows, "openai", ("baseline_b", "baseline_c")),
            "normal_errors": error_summary(
                [op for op in steady if op["phase"] == "openai_phase"]),
            "clients": per_kind(users), "client_errors": error_summary(users),
            "ttft": {k: latency_stats([op["ttft"] for op in users if op["k"] == k and op["ok"]
                                       and op.get("ttft") is not None])
                     for k in ("completion_stream", "chat_stream")},
            "tokens": sum(op.get("tokens", 0) for op in users if op["ok"]),
            "requests_per_s": sum(op["ok"] for op in users) / settings.openai_s}
