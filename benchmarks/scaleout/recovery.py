"""Losing an engine worker under load: K SDK tenants train against `loraplex serve --workers 2`
(tiny model, one key each), each running forward_backward + optim_step then save_state, over
and over; one worker's actor process gets SIGKILL; each tenant retries a failed op until it
succeeds.

Measured: from the kill to each affected tenant's first successful training step (its first op
after the kill fails with "worker ... was lost ... restored from ..."; the run is restored from
its latest save_state on the other worker), the gaps the other tenants saw, when the lost lane
left the stats endpoint and when a replacement worker joined. Then every save_state the SDK
acknowledged must be listed and loadable (`create_training_client_from_state_with_optimizer`);
`acknowledged_lost` counts those that are not. Tenants are threads of this process (one
`ServiceClient` each): their throughput is not measured here.
"""

from __future__ import annotations

import itertools
import os
import signal
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from benchmarks.scaleout.procs import engine_worker_pids
from benchmarks.scaleout.server import WorkerServer


def resolved(value: Any) -> Any:
    """SDK calls that return either the object or a future of it (versions differ)."""
    result = getattr(type(value), "result", None)
    return value.result() if callable(result) else value


@dataclass(frozen=True)
class Op:
    """One SDK op a tenant ran: wall-clock start and end, and its error (None: it succeeded)."""

    kind: str
    t0: float
    t1: float
    error: str | None = None


@dataclass
class Tenant:
    """One tenant thread: trains, saves state every step, retries whatever fails.

    Attributes:
        ops: every op so far (``train`` = forward_backward + optim_step, ``save_state``).
        acked: save_state paths the SDK acknowledged.
    """

    index: int
    url: str
    key: str
    base_model: str
    rank: int = 4
    seq_len: int = 16
    ops: list[Op] = field(default_factory=list)
    acked: list[str] = field(default_factory=list)
    model_id: str | None = None
    service: Any = None
    verify: dict[str, Any] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    failure: str | None = None

    def run(self) -> None:
        import tinker
        from tinker import types

        try:
            self.service = tinker.ServiceClient(base_url=self.url, api_key=self.key)
            tc = resolved(self.service.create_lora_training_client(
                base_model=self.base_model, rank=self.rank, seed=self.index))
            self.model_id = tc.model_id
            tokens = [(self.index * 37 + 11 * i) % 500 + 2 for i in range(self.seq_len + 1)]
            inputs: dict[str, Any] = {"target_tokens": tokens[1:],
                                      "weights": [1.0] * self.seq_len}
            data = [types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                loss_fn_inputs=inputs)]
            self._loop(tc, data, types.AdamParams(learning_rate=1e-3))
        except Exception as exc:  # reported by the driver, never swallowed
            self.failure = f"{type(exc).__name__}: {exc}"

    def _loop(self, tc: Any, data: list[Any], adam: Any) -> None:
        while not self.stop.is_set():
            if not self._op("train", lambda: (tc.forward_backward(data, "cross_entropy"),
                                              tc.optim_step(adam)), wait_all=True):
                continue
            name = f"step-{len(self.acked):04d}"
            path = self._op("save_state", lambda: (tc.save_state(name),))  # noqa: B023
            if path:
                self.acked.append(path)

    def _op(self, kind: str, submit: Any, wait_all: bool = False) -> Any:
        t0 = time.time()
        try:
            futures = submit()
            results = [f.result() for f in futures]
        except Exception as exc:
            # The SDK appends "for self.request_id=... and expected type ...": not the error.
            message = str(exc).split(" for self.request_id=")[0]
            self.ops.append(Op(kind, t0, time.time(), f"{type(exc).__name__}: {message}"[:600]))
            time.sleep(0.05)
            return None
        self.ops.append(Op(kind, t0, time.time()))
        return True if wait_all else results[-1].path

    def check_acknowledged(self) -> None:
        """Which acknowledged paths are listed, and which load (weights + optimizer); after
        the loop stopped."""
        import tinker

        if self.model_id is None:  # never got a training client: nothing was acknowledged
            return
        service = self.service
        rest = tinker.RestClient(base_url=self.url, api_key=self.key)
        listed = resolved(rest.list_checkpoints(self.model_id))
        paths = {c.tinker_path for c in listed.checkpoints}
        unloadable = []
        for path in self.acked:
            try:
                resolved(service.create_training_client_from_state_with_optimizer(path))
            except Exception as exc:
                unloadable.append(f"{path}: {type(exc).__name__}: {exc}"[:300])
        self.verify = {"acked": len(self.acked),
                       "not_listed": sorted(set(self.acked) - paths), "unloadable": unloadable}


@dataclass
class Monitor:
    """Polls the stats endpoint (operator key): live lanes and which tenants each serves."""

    server: WorkerServer
    period_s: float = 0.2
    samples: list[tuple[float, dict[str, list[str]]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                stats = self.server.stats()
                lanes = {s["worker"]: sorted(s["tenants"]) for s in stats["schedulers"]}
                self.samples.append((time.time(), lanes))
            except OSError:  # a stats call that timed out while a worker was being replaced
                pass
            self.stop.wait(self.period_s)

    def lanes_at(self, t: float) -> dict[str, list[str]]:
        return next((lanes for at, lanes in reversed(self.samples) if at <= t), {})

    def first_after(self, t: float, predicate: Any) -> float | None:
        return next((at for at, lanes in self.samples if at > t and predicate(lanes)), None)


def recovery_phase(server: WorkerServer, *, num_tenants: int, saves_before: int = 2,
                   steps_after: int = 2, timeout_s: float = 180.0) -> dict[str, Any]:
    """The kill and everything around it (see the module docstring), on ``server`` (ready,
    two workers); one of its workers is gone afterwards, replaced."""
    return _measure(server, server.tenant_keys[:num_tenants], saves_before, steps_after,
                    timeout_s)


def _measure(server: WorkerServer, keys: list[str], saves_before: int, steps_after: int,
             timeout_s: float) -> dict[str, Any]:
    tenants = [Tenant(i, server.url, key, server.base_model) for i, key in enumerate(keys)]
    monitor = Monitor(server)
    threads = [threading.Thread(target=t.run, name=f"tenant-{t.index}", daemon=True)
               for t in tenants] + [threading.Thread(target=monitor.run, daemon=True)]
    for thread in threads:
        thread.start()
    deadline = time.time() + timeout_s
    while min(len(t.acked) for t in tenants) < saves_before:
        _check(tenants, deadline, "the tenants' first save_states")
        time.sleep(0.1)
    pids = engine_worker_pids(server.pid)
    lanes_before = monitor.lanes_at(time.time())
    victim = pids[0]
    t_kill = time.time()
    os.kill(victim, signal.SIGKILL)
    # The tenants stop once each has trained past its failures (that bounds how many
    # checkpoints there are to load); then the replacement worker gets the time it takes.
    while not _recovered(tenants, t_kill, steps_after):
        _check(tenants, deadline, "recovery")
        time.sleep(0.1)
    for t in tenants:
        t.stop.set()
    for thread in threads[:-1]:
        thread.join(timeout=max(1.0, deadline - time.time()))
    _check(tenants, deadline, "the tenants to stop")
    if any(thread.is_alive() for thread in threads[:-1]):
        raise TimeoutError("a tenant did not stop")
    while _replaced_at(monitor, t_kill, lanes_before) is None and time.time() < deadline:
        time.sleep(0.2)
    monitor.stop.set()
    with ThreadPoolExecutor(len(tenants)) as pool:
        list(pool.map(Tenant.check_acknowledged, tenants))
    result = summarize(tenants, monitor, t_kill, lanes_before)
    result.update(victim_pid=victim, worker_pids_before=pids,
                  worker_pids_after=engine_worker_pids(server.pid))
    return result


def _check(tenants: list[Tenant], deadline: float, waiting_for: str) -> None:
    failed = [f"tenant {t.index}: {t.failure}" for t in tenants if t.failure]
    if failed:
        raise RuntimeError("; ".join(failed))
    if time.time() > deadline:
        raise TimeoutError(f"timed out waiting for {waiting_for}")


def _recovered(tenants: list[Tenant], t_kill: float, steps_after: int) -> bool:
    """Every tenant trained ``steps_after`` times past its last failure after the kill."""
    for t in tenants:
        ops = [o for o in list(t.ops) if o.t1 > t_kill]
        last_failure = max((o.t1 for o in ops if o.error), default=t_kill)
        if sum(1 for o in ops if o.kind == "train" and not o.error
               and o.t0 >= last_failure) < steps_after:
            return False
    return True


def _replaced_at(monitor: Monitor, t_kill: float, lanes_before: dict[str, list[str]]
                 ) -> float | None:
    """When as many lanes as before were live again, one of them new."""
    return monitor.first_after(t_kill, lambda lanes: len(lanes) >= len(lanes_before)
                               and set(lanes) != set(lanes_before))


def summarize(tenants: list[Tenant], monitor: Monitor, t_kill: float,
              lanes_before: dict[str, list[str]]) -> dict[str, Any]:
    """Per tenant: which lane it was on, its failures, time to its first successful step."""
    lost_at = monitor.first_after(t_kill, lambda lanes: not set(lanes_before) <= set(lanes))
    lanes_after = monitor.lanes_at(lost_at) if lost_at else {}
    lost_lanes = sorted(set(lanes_before) - set(lanes_after))
    lane_of = {name: lane for lane, names in lanes_before.items() for name in names}
    per_tenant = []
    for t in tenants:
        ops = list(t.ops)
        failures = [o for o in ops if o.error and o.t1 > t_kill]
        after = [o for o in ops if o.t0 > t_kill]
        first_ok = next((o for o in ops if o.kind == "train" and not o.error
                         and o.t0 >= (failures[0].t1 if failures else t_kill)), None)
        successes = [o.t1 for o in ops if not o.error]
        gaps = [b - a for a, b in itertools.pairwise(successes) if b > t_kill - 1]
        per_tenant.append({
            "tenant": f"tenant-{t.index}", "lane": lane_of.get(f"tenant-{t.index}"),
            "model_id": t.model_id, "failed_ops_after_kill": len(failures),
            "first_error": failures[0].error if failures else None,
            "errors": [f"{o.kind}: {o.error}" for o in failures][:6],
            "recovered_s": None if first_ok is None else first_ok.t1 - t_kill,
            "max_gap_s": max(gaps, default=None), "ops_after_kill": len(after),
            **t.verify,
            "timeline": [(round(o.t0 - t_kill, 3), round(o.t1 - t_kill, 3), o.kind,
                          o.error is None) for o in ops if o.t1 > t_kill - 10]})
    affected = [p for p in per_tenant if p["failed_ops_after_kill"]
                or (p["lane"] is not None and p["lane"] in lost_lanes)]
    lost = sorted({*[x for p in per_tenant for x in p.get("not_listed", [])],
                   *[x.split(": ")[0] for p in per_tenant for x in p.get("unloadable", [])]})
    times = [p["recovered_s"] for p in affected]
    replaced_at = _replaced_at(monitor, t_kill, lanes_before)
    return {
        "recovery_s": max(times) if times and None not in times else None,
        "acknowledged_lost": len(lost), "lost_paths": lost,
        "acknowledged": sum(len(t.acked) for t in tenants),
        "affected_tenants": [p["tenant"] for p in affected],
        # Every affected tenant was told its run was restored, and from which checkpoint.
        "errors_name_restore": all(any("restored from" in e for e in p["errors"])
                                   for p in affected if p["failed_ops_after_kill"]),
        "lanes_before": lanes_before, "lost_lanes": lost_lanes,
        "lane_gone_s": None if lost_at is None else lost_at - t_kill,
        "replacement_joined_s": None if replaced_at is None else replaced_at - t_kill,
        "unaffected_max_gap_s": max((p["max_gap_s"] or 0.0 for p in per_tenant
                                     if p not in affected), default=None),
        "median_recovered_s": statistics.median(times) if times and None not in times
        else None,
        "tenants": per_tenant,
    }
