"""Builds a `Scheduler` from its parts: the `SchedulerState` they share, the planning half
(`Planner` with its `WorkChoice`), the finishing half (`Completion`), the IO workers and the
logs. The one place that knows both halves, so `scheduler.py` and `completion.py` never import
each other.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from loraplex.config import SchedulerConfig
from loraplex.scheduler.completion import Completion
from loraplex.scheduler.effects import Effects
from loraplex.scheduler.executor import BatchExecutor
from loraplex.scheduler.futures import FutureStore
from loraplex.scheduler.io_workers import IoWorkers, ThreadedIo
from loraplex.scheduler.metrics import SchedulerMetrics
from loraplex.scheduler.planner import Planner
from loraplex.scheduler.residency import AdapterResidency
from loraplex.scheduler.sample_queue import SampleQueue
from loraplex.scheduler.scheduler import Scheduler, SchedulerParts
from loraplex.scheduler.scheduler_state import SchedulerState
from loraplex.scheduler.step_log import StepLog
from loraplex.scheduler.usage import UsageLog
from loraplex.scheduler.work_choice import WorkChoice


def build_scheduler(executor: BatchExecutor, config: SchedulerConfig, futures: FutureStore,
                    effects: Effects, clock: Callable[[], float] = time.monotonic,
                    io: IoWorkers | None = None) -> Scheduler:
    """A scheduler for one base model's executor.

    Args:
        executor: the engine (or a fake) for this base model.
        config: the scheduler's config slice.
        futures: the server-wide future store.
        effects: store side effects of finished ops.
        clock: monotonic seconds (tests inject their own).
        io: where saves and checkpoint reads run (default: ``config.io_threads`` threads).
    """
    samples = SampleQueue(config.sample_kv_budget_tokens, config.quantum_tokens,
                          executor.model_info().max_context,
                          config.sample_prefill_tokens_per_step,
                          config.sample_max_tenant_share, config.latency_fair_window_s)
    state = SchedulerState(samples, AdapterResidency(config.max_sampler_snapshots_per_model,
                                                     config.max_checkpoint_samplers))
    usage, steps = UsageLog(), StepLog()
    metrics = SchedulerMetrics(config.cycle_history, clock)
    completion = Completion(state, effects, executor=executor, futures=futures, usage=usage,
                            steps=steps, metrics=metrics, clock=clock)
    choice = WorkChoice(config)
    planner = Planner(state, choice, config.quantum_tokens, run_io_op=completion.run_io_op,
                      read_sampler_adapter=completion.read_sampler_adapter, clock=clock)
    parts = SchedulerParts(state, choice, planner, completion, io or ThreadedIo(config.io_threads),
                           usage, steps, metrics)
    return Scheduler(executor, config, futures, parts, clock)
