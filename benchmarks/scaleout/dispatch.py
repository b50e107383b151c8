"""What an engine call costs to dispatch to a Ray worker: one process, no HTTP, no engine work.

A cycle-shaped call (a forward_backward batch of K tenants' `ForwardBackwardWork`, as the
throughput phase's tenants send them, then the K `OptimStepWork` of the optim_step that
follows) goes through `RemoteExecutor.noop(payload)` (a real `EngineWorker` actor placed by
`RayWorkers`: the payload travels to the actor and back) and, right beside it, through the
in-process `NoopExecutor` of benchmarks/harness/fakes.py (the same payload, answered at once). The
difference of each back-to-back pair is the dispatch cost of that call. A training cycle is one
call (`run_cycle`: both payloads go together), so the per-cycle figure is that call's p50; the
two separate calls' sum is kept beside it (``two_calls_ms``), and the bare round trip
(``bare_call_ms``, no payload) is the floor.
Knows nothing of schedulers, servers or tenants.
"""

from __future__ import annotations

import pickle
import statistics
import time
from array import array
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.multiplex.workload import Workload
from loraplex.domain.data import Datum, TensorData
from loraplex.domain.losses import LossFnName
from loraplex.domain.optim import AdamParams
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork


def _datum(length: int, seed: int, grpo: bool) -> Datum:
    tokens = [(seed * 7919 + 31 * i) % 1000 + 1 for i in range(length)]
    inputs = {"target_tokens": TensorData.from_list(tokens[1:] + tokens[:1], "int64")}
    if grpo:
        inputs["logprobs"] = TensorData.from_list([-1.5] * length, "float32")
        inputs["advantages"] = TensorData.from_list([0.25] * length, "float32")
    else:
        inputs["weights"] = TensorData.from_list([1.0] * length, "float32")
    return Datum(array("q", tokens), inputs)


def cycle_works(workload: Workload, modes: tuple[str, ...], num_tenants: int
                ) -> tuple[list[ForwardBackwardWork], list[OptimStepWork]]:
    """One training cycle of ``num_tenants`` tenants (tenant i runs ``modes[i % len]``): the
    forward_backward batch the engine gets, and the optim_step batch after it."""
    fwd_bwd, optim = [], []
    for i in range(num_tenants):
        adapter = f"tenant-{i}:train:0"
        loss: LossFnName
        if modes[i % len(modes)] == "sft":
            data = tuple(_datum(workload.seq_len, i * 100 + j, False)
                         for j in range(workload.sft_batch))
            loss = "cross_entropy"
        else:
            length = workload.prompt_len + workload.max_tokens - 1
            data = tuple(_datum(length, i * 100 + j, True)
                         for j in range(workload.grpo_prompts * workload.group_size))
            loss = "importance_sampling"
        fwd_bwd.append(ForwardBackwardWork(f"fb-{i}", adapter, data, loss, {}, False))
        optim.append(OptimStepWork(f"opt-{i}", adapter, AdamParams()))
    return fwd_bwd, optim


def paired_ms(remote: Callable[[], object], local: Callable[[], object], num_calls: int,
              warmup: int = 20) -> dict[str, float]:
    """Back-to-back pairs (the order alternates): p50 of each side and of the difference."""
    for _ in range(warmup):
        remote()
        local()
    remote_ms, local_ms, diff_ms = [], [], []
    for i in range(num_calls):
        times = {}
        for name, call in ((("remote", remote), ("local", local)) if i % 2 else
                           (("local", local), ("remote", remote))):
            t0 = time.perf_counter()
            call()
            times[name] = (time.perf_counter() - t0) * 1000
        remote_ms.append(times["remote"])
        local_ms.append(times["local"])
        diff_ms.append(times["remote"] - times["local"])
    ordered = sorted(diff_ms)
    return {"remote_p50_ms": statistics.median(remote_ms),
            "local_p50_ms": statistics.median(local_ms),
            "diff_p50_ms": statistics.median(diff_ms),
            "diff_p95_ms": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]}


@contextmanager
def dispatch_worker(model_dir: Path) -> Iterator[Any]:
    """One engine worker of ``model_dir`` (its engine is never called) placed by `RayWorkers`
    on a fresh local Ray runtime of this process; the runtime ends with the block."""
    from loraplex.cluster.ray_workers import RayWorkers
    from loraplex.config import ClusterConfig, EngineConfig, SchedulerConfig

    workers = RayWorkers(ClusterConfig(workers=1), EngineConfig(num_threads=1),
                         SchedulerConfig())
    try:
        remote = workers.spawn(str(model_dir))
        try:
            yield remote
        finally:
            remote.close()
    finally:
        workers.shutdown()


def dispatch_phase(remote: Any, workload: Workload, modes: tuple[str, ...], num_tenants: int,
                   num_calls: int) -> dict[str, Any]:
    """``remote`` (a `RemoteExecutor`) timed against the in-process no-op executor."""
    from benchmarks.harness.fakes import NoopExecutor

    fwd_bwd, optim = cycle_works(workload, modes, num_tenants)
    local = NoopExecutor()
    calls = {
        "cycle": paired_ms(lambda: remote.noop((fwd_bwd, optim)),
                           lambda: local.run_cycle(fwd_bwd, optim), num_calls),
        "forward_backward": paired_ms(lambda: remote.noop(fwd_bwd),
                                      lambda: local.forward_backward(fwd_bwd), num_calls),
        "optim_step": paired_ms(lambda: remote.noop(optim), lambda: local.optim_step(optim),
                                num_calls),
        # The bare round trip: no payload, against a Python call that does nothing.
        "empty": paired_ms(lambda: remote.noop(None), lambda: None, num_calls),
    }
    return {
        "per_cycle_ms": calls["cycle"]["diff_p50_ms"],
        "two_calls_ms": calls["forward_backward"]["diff_p50_ms"]
        + calls["optim_step"]["diff_p50_ms"],
        "bare_call_ms": calls["empty"]["diff_p50_ms"],
        "calls": calls, "num_calls": num_calls, "num_tenants": num_tenants,
        "payload_bytes": {"cycle": len(pickle.dumps((fwd_bwd, optim))),
                          "forward_backward": len(pickle.dumps(fwd_bwd)),
                          "optim_step": len(pickle.dumps(optim))},
        "payload_tokens": sum(w.num_tokens for w in fwd_bwd),
    }
