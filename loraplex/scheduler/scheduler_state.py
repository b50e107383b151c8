"""`SchedulerState`: the queue and residency state one scheduler's submitting, planning and
finishing share, with the lock that guards it and the condition that announces changes.

`assembly.build_scheduler` builds it and hands it to the `Scheduler`, its `Planner` and its
`Completion` (which imports neither of the others). Everything here is read and written only
under `lock`: the methods below expect it held. It holds no policy: what to run next is
`Planner`'s, what finishing does is `Completion`'s.
"""

from __future__ import annotations

import threading
from collections import Counter

from loraplex.domain.ops import Install, WorkItem
from loraplex.errors import WorkerLostError
from loraplex.scheduler.model_queue import ModelQueue
from loraplex.scheduler.residency import AdapterResidency
from loraplex.scheduler.sample_queue import SampleQueue


class SchedulerState:
    """One scheduler's shared mutable state (see the module docstring).

    Attributes:
        lock: guards every attribute here.
        wakeup: the condition on ``lock`` the clock thread sleeps on between plans.
        generation: bumped by every wake-up, so a waiter never misses one.
        queues: each live training run's op queue, by model id.
        closing: runs released (session finished, run failed to start, evacuated) whose queues
            are dropped, with their adapters, once empty.
        samples: the sampling queue (waiting and running requests).
        residency: sampler adapters in the engine, their users, and those being read.
        inflight: per tenant, its ops queued or running (the admission limit counts them).
        installs: checkpoints read on IO threads, waiting for the clock thread to install them.
        lost: set once the engine worker is lost; the lane hands everything over.
        lost_io: saves and reads the worker died under (failed by the evacuation).
        evacuated: the evacuation ran; IO finishing late must fail its op itself.
    """

    def __init__(self, samples: SampleQueue, residency: AdapterResidency) -> None:
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.generation = 0
        self.queues: dict[str, ModelQueue] = {}
        self.closing: set[str] = set()
        self.samples = samples
        self.residency = residency
        self.inflight: Counter[str] = Counter()
        self.installs: list[Install] = []
        self.lost: WorkerLostError | None = None
        self.lost_io: list[WorkItem] = []
        self.evacuated = False

    def notify_locked(self) -> None:
        """Wake the clock thread: something it may plan changed."""
        self.generation += 1
        self.wakeup.notify_all()

    def queue_of(self, item: WorkItem) -> ModelQueue:
        assert item.model_id is not None
        return self.queues[item.model_id]

    def op_done(self, tenant: str) -> None:
        """One of ``tenant``'s ops left the scheduler (finished, failed or evacuated)."""
        self.inflight[tenant] -= 1
        if self.inflight[tenant] <= 0:
            del self.inflight[tenant]

    def close_model(self, model_id: str) -> None:
        """Drop a training run's adapters once its queued ops are done."""
        if model_id in self.queues:
            self.closing.add(model_id)
            self.notify_locked()

    def add_install(self, install: Install) -> bool:
        """Queue a read checkpoint for installing; False when the worker was lost and
        everything here was evacuated already (the caller fails its op)."""
        if self.evacuated:
            return False
        self.installs.append(install)
        self.notify_locked()
        return True

    def done_reading(self, adapter_id: str) -> None:
        self.residency.done_reading(adapter_id)
        self.notify_locked()

    def io_lost(self, item: WorkItem, error: WorkerLostError) -> bool:
        """A save or read found the worker dead: the lane stops, and the op is failed with the
        others by the evacuation (True), unless that already ran (False: fail it yourself)."""
        if self.evacuated:
            return False
        self.lost_io.append(item)
        if self.lost is None:
            self.lost = error
        self.notify_locked()
        return True
