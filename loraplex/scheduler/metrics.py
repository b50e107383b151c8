"""Observability of one scheduler: a record per engine plan in a bounded ring, monotonic
counters (per plan kind and per tenant), recent queue waits (per class and per tenant),
refused submits, and engine utilization.

Written by the clock thread on every completed plan, read by the stats and Prometheus routes
from other threads (one lock). Utilization is the engine-busy fraction of wall time: the
seconds spent inside executor calls that fall in a window, divided by the window.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import assert_never

from loraplex.domain.ops import (
    ControlPlan,
    CyclePlan,
    ExpirePlan,
    InstallPlan,
    Plan,
    ReleasePlan,
    SamplePlan,
    WorkItem,
)
from loraplex.domain.usage import OpUsage, UsageCounts
from loraplex.scheduler.admission_log import AdmissionLog
from loraplex.scheduler.engine_share import WorkClass
from loraplex.scheduler.histogram import Histogram
from loraplex.scheduler.runner import PlanOutcome
from loraplex.scheduler.tenant_waits import TenantWaits

PLAN_KINDS = ("cycle", "control", "sample", "install", "io", "expire", "release")
"""``cycle``: a training clock cycle (packed forward/forward_backward batch, then optim steps);
``control``: one create / snapshot op; ``sample``: a continuous-batching step; ``install``:
checkpoints read off the clock thread put into the engine; ``io``: a save or checkpoint read on
an IO thread (engine time 0); ``expire``: ops failed by the seq gap timeout; ``release``:
adapters dropped."""


@dataclass(frozen=True)
class CycleRecord:
    """One plan the clock loop ran.

    Attributes:
        index: position in the scheduler's history (0, 1, 2, ...).
        kind: one of `PLAN_KINDS`.
        started_at: the scheduler clock (monotonic) when the plan was made.
        wall_time: ``time.time()`` at the same moment (for display).
        engine_s: seconds inside executor calls.
        train_s, optim_s: the forward_backward and optim_step parts of a cycle's engine time.
        io_s: seconds an ``io`` record's file work took on its IO thread.
        idle_s: seconds the engine sat idle before this plan (nothing was ready).
        overhead_s: scheduler bookkeeping of this plan (planning and completion).
        tenants: distinct tenants with ops in it.
        num_models: distinct training models in it.
        num_ops: ops carried (batch + optim steps; admitted + finished samples).
        num_tokens: datum tokens of the batch, or prompt tokens admitted.
        num_running: sampling requests still in the decode batch afterwards.
        max_wait_s: longest queue wait of an op started by this plan.
    """

    index: int
    kind: str
    started_at: float
    wall_time: float
    engine_s: float
    train_s: float = 0.0
    optim_s: float = 0.0
    io_s: float = 0.0
    idle_s: float = 0.0
    overhead_s: float = 0.0
    tenants: tuple[str, ...] = ()
    num_models: int = 0
    num_ops: int = 0
    num_tokens: int = 0
    num_running: int = 0
    max_wait_s: float = 0.0


@dataclass
class TenantCounters:
    """Monotonic per-tenant totals since the server started: finished, failed and refused ops
    per request kind, and the usage they metered."""

    ops: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)
    usage: UsageCounts = field(default_factory=UsageCounts)

    def add(self, op: OpUsage) -> None:
        self.ops[op.kind] += 1
        if op.failed:
            self.failed[op.kind] += 1
        self.usage += op.counts

    def copy(self) -> TenantCounters:
        return TenantCounters(Counter(self.ops), Counter(self.failed), Counter(self.rejected),
                              self.usage)


class SchedulerMetrics:
    """Cycle ring, counters and waits of one scheduler.

    Args:
        max_records: cycle records kept in the ring.
        clock: the scheduler's monotonic clock.
    """

    def __init__(self, max_records: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ring: deque[CycleRecord] = deque(maxlen=max(1, max_records))
        self._next_index = 0
        self.calls: Counter[str] = Counter()
        self.engine_s: defaultdict[str, float] = defaultdict(float)
        self.idle_s = 0.0
        self.overhead_s = 0.0
        self.ops: Counter[str] = Counter()
        self.tenant_slots: Counter[str] = Counter()
        self.tenants: defaultdict[str, TenantCounters] = defaultdict(TenantCounters)
        self._wait_hist: defaultdict[str, Histogram] = defaultdict(Histogram)
        self._latency_hist: defaultdict[str, Histogram] = defaultdict(Histogram)
        self._waits: dict[str, deque[float]] = {"train": deque(maxlen=4096),
                                                "sample": deque(maxlen=4096)}
        self.tenant_waits = TenantWaits()
        self.admissions = AdmissionLog()
        self.started_at = clock()
        self._idle_since = self.started_at

    def record(self, cycle: CycleRecord, ops: list[OpUsage], waits: dict[str, list[float]]
               ) -> CycleRecord:
        """Append ``cycle`` (its index assigned here) with its ops' usage and queue waits."""
        with self._lock:
            cycle = replace(cycle, index=self._next_index)
            self._next_index += 1
            self._ring.append(cycle)
            self.calls[cycle.kind] += 1
            self.engine_s[cycle.kind] += cycle.engine_s
            self.ops[cycle.kind] += cycle.num_ops
            self.tenant_slots[cycle.kind] += len(cycle.tenants)
            self.idle_s += cycle.idle_s
            self.overhead_s += cycle.overhead_s
            for op in ops:
                self.tenants[op.tenant].add(op)
            for cls, values in waits.items():
                self._waits[cls].extend(values)
                for value in values:
                    self._wait_hist[cls].observe(value)
        return cycle

    def totals(self) -> tuple[dict[str, int], dict[str, float], float, float]:
        """Since start: plans per kind, engine seconds per kind, idle and overhead seconds."""
        with self._lock:
            return dict(self.calls), dict(self.engine_s), self.idle_s, self.overhead_s

    def packing(self) -> tuple[dict[str, int], dict[str, int]]:
        """Since start, per plan kind: ops carried, and distinct tenants summed over plans."""
        with self._lock:
            return dict(self.ops), dict(self.tenant_slots)

    @property
    def capacity(self) -> int:
        """Most records the ring keeps."""
        return self._ring.maxlen or 0

    def tenants_snapshot(self) -> dict[str, TenantCounters]:
        """A consistent copy of the per-tenant counters."""
        with self._lock:
            return {t: c.copy() for t, c in self.tenants.items()}

    def idle_since(self, now: float) -> float:
        """Seconds the engine has had nothing to do before ``now`` (a new plan's idle time)."""
        with self._lock:
            return max(0.0, now - self._idle_since)

    def plan_done(self, plan: Plan, outcome: PlanOutcome, finished: list[WorkItem],
                  ops: list[OpUsage], num_running: int, complete_s: float) -> CycleRecord:
        """Record a completed plan (its `PlanStart` says when it was made) with its ops'
        usage; returns the record."""
        start = plan.start
        started = started_items(plan)
        waits = [start.at - it.enqueued_at for it in started]
        self.tenant_waits.observe(work_class_of(plan) or "train",
                                  [(it.tenant, w) for it, w in zip(started, waits, strict=True)])
        record = replace(plan_record(plan, outcome, finished, num_running),
                         started_at=start.at, idle_s=start.idle_s,
                         overhead_s=start.plan_s + complete_s, max_wait_s=max(waits, default=0.0))
        with self._lock:
            self._idle_since = self._clock()
        return self.record(record, ops, {work_class_of(plan) or "train": waits} if waits else {})

    def io_done(self, item: WorkItem, io_s: float, usage: OpUsage, started_at: float,
                wait_s: float) -> CycleRecord:
        """Record a save or checkpoint read that ran on an IO thread (engine time 0: the engine
        kept running other plans meanwhile)."""
        record = CycleRecord(index=-1, kind="io", started_at=started_at,
                             wall_time=time.time() - io_s, engine_s=0.0, io_s=io_s,
                             tenants=(item.tenant,), num_models=1, num_ops=1, max_wait_s=wait_s)
        self.tenant_waits.observe("train", [(item.tenant, wait_s)])
        return self.record(record, [usage], {"train": [wait_s]})

    def rejected(self, tenant: str, kind: str, reason: str = "") -> None:
        """A submit refused by backpressure (HTTP 429), and why."""
        with self._lock:
            self.tenants[tenant].rejected[kind] += 1
        self.admissions.refused(tenant, kind, reason)

    def recent(self, n: int = 100) -> list[CycleRecord]:
        with self._lock:
            return list(self._ring)[-n:] if n > 0 else []

    def after(self, index: int, limit: int) -> list[CycleRecord]:
        """The newest ``limit`` kept records whose index is above ``index``, oldest first (a
        poller passes the last index it has; -1: from the start)."""
        with self._lock:
            if not self._ring or limit <= 0:
                return []
            first = self._ring[0].index
            start = max(index + 1 - first, len(self._ring) - limit, 0)
            return list(itertools.islice(self._ring, start, None))

    def utilization(self, window_s: float, now: float | None = None) -> float:
        """Engine-busy fraction of the last ``window_s`` seconds (plans in the ring only)."""
        now = self._clock() if now is None else now
        start = max(now - window_s, self.started_at)
        if now <= start:
            return 0.0
        return min(1.0, self._busy_between(start, now) / (now - start))

    def busy_series(self, bucket_s: float, num_buckets: int, now: float | None = None
                    ) -> list[float]:
        """Engine-busy fraction per bucket, oldest first, the last bucket ending now."""
        now = self._clock() if now is None else now
        start = now - bucket_s * num_buckets
        busy = [0.0] * num_buckets
        with self._lock:
            spans = [(c.started_at, c.started_at + c.engine_s) for c in self._since(start)]
        for a, b in spans:  # one pass: each plan adds to the few buckets it overlaps
            a, b = max(a, start), min(b, now)
            if b <= a:
                continue
            last = min(num_buckets - 1, int((b - start) // bucket_s))
            for i in range(int((a - start) // bucket_s), last + 1):
                low = start + i * bucket_s
                busy[i] += max(0.0, min(b, low + bucket_s) - max(a, low))
        return [min(1.0, x / bucket_s) for x in busy]

    def share(self, window_s: float, now: float | None = None) -> dict[str, float]:
        """Engine seconds per plan kind in the last ``window_s`` seconds."""
        now = self._clock() if now is None else now
        out: defaultdict[str, float] = defaultdict(float)
        with self._lock:
            for c in self._since(now - window_s):
                out[c.kind] += _overlap(c, now - window_s, now)
        return dict(out)

    def op_finished(self, kind: str, latency_s: float) -> None:
        """An op of request type ``kind`` finished ``latency_s`` after it was submitted."""
        with self._lock:
            self._latency_hist[kind].observe(latency_s)

    def histograms(self) -> tuple[dict[str, Histogram], dict[str, Histogram]]:
        """Copies of the queue-wait histograms (per class: train, sample) and the op-latency
        histograms (per request type) since start."""
        with self._lock:
            return ({k: h.copy() for k, h in self._wait_hist.items()},
                    {k: h.copy() for k, h in self._latency_hist.items()})

    def waits(self) -> dict[str, list[float]]:
        """Recent queue waits (seconds) of training ops and of sampling requests."""
        with self._lock:
            return {cls: list(values) for cls, values in self._waits.items()}

    def _busy_between(self, start: float, end: float) -> float:
        with self._lock:
            return sum(_overlap(c, start, end) for c in self._since(start))

    def _since(self, start: float) -> Iterator[CycleRecord]:
        """The ring's records, newest first, up to the first engine plan that ended before
        ``start`` (engine plans run one after another on the clock thread, so they sit in the
        ring in time order; ``io`` records, appended out of order, hold no engine time). So a
        60 s window costs the plans of the last minute, not the whole ring. Caller holds the
        lock."""
        for c in reversed(self._ring):
            if c.engine_s > 0 and c.started_at + c.engine_s < start:
                return
            yield c


def _overlap(cycle: CycleRecord, start: float, end: float) -> float:
    """Engine seconds of ``cycle`` inside [start, end] (its engine time follows planning)."""
    busy_from = cycle.started_at
    busy_to = busy_from + cycle.engine_s
    return max(0.0, min(busy_to, end) - max(busy_from, start))



def plan_record(plan: Plan, outcome: PlanOutcome, finished: list[WorkItem],
                num_running: int) -> CycleRecord:
    """The record of a completed plan (timing fields the scheduler fills in)."""
    items = list(finished)
    tokens = 0
    match plan:
        case CyclePlan():
            kind, tokens = "cycle", sum(it.num_tokens for it in plan.batch)
        case SamplePlan():
            kind, tokens = "sample", sum(it.num_tokens for it in plan.admit)
            items = list({it.request_id: it for it in (*plan.admit, *finished)}.values())
        case ControlPlan():
            kind = "control"
        case InstallPlan():
            kind = "install"
        case ExpirePlan():
            kind = "expire"
        case ReleasePlan():
            kind = "release"
        case _:
            assert_never(plan)
    return CycleRecord(
        index=-1, kind=kind, started_at=time.monotonic() - outcome.engine_s,
        wall_time=time.time() - outcome.engine_s, engine_s=outcome.engine_s,
        train_s=outcome.train_s, optim_s=outcome.optim_s,
        tenants=tuple(sorted({it.tenant for it in items})),
        num_models=len({it.model_id for it in items if it.model_id is not None}),
        num_ops=len(items), num_tokens=tokens, num_running=num_running)


def started_items(plan: Plan) -> tuple[WorkItem, ...]:
    """The items a plan starts (their queue waits end when it is made)."""
    match plan:
        case CyclePlan():
            return plan.items
        case ControlPlan():
            return (plan.item,)
        case SamplePlan():
            return plan.admit
        case InstallPlan() | ExpirePlan() | ReleasePlan():
            return ()
        case _:
            assert_never(plan)


def work_class_of(plan: Plan) -> WorkClass | None:
    """Which share of engine time a plan is charged to (None: upkeep, charged to nobody)."""
    match plan:
        case CyclePlan() | ControlPlan():
            return "train"
        case SamplePlan():
            return "sample"
        case InstallPlan() | ExpirePlan() | ReleasePlan():
            return None
        case _:
            assert_never(plan)
