"""`Planner`: the scheduler's policy, the one place it lives: which engine call runs next.

It reads and advances the `SchedulerState` (always under its lock), never finishes anything
(that is `Completion`'s) and never runs file work itself: the IO jobs it starts are handed back
through `take_jobs`, to be submitted once the lock is released.

1. Saves and loads at a model's head start on an IO thread (`io_workers`): the file work
   (write, encrypt, commit; read) never runs on the clock thread, so other models' cycles go
   on meanwhile; the model stays busy until it is done, so its order is kept. A checkpoint
   read ends in an `InstallPlan` (putting the tensors into the engine is clock-thread work).
   Samples of a checkpoint whose adapter is not resident get it read the same way and wait
   (without holding back their tenant's other samples) until it is installed.
2. Then releases of unused adapters, installs, and ops stuck behind a seq_id missing for longer
   than ``seq_gap_timeout_s`` (they fail with a user error; the missing id is skipped).
3. Training and sampling share the engine by engine time (`WorkChoice`): while both have
   work, sampling gets ``sample_share`` of it and training the rest; alone, either gets all;
   after a sampling step finished requests, training waits briefly for their clients' next.
4. Training work is a clock cycle or one control op; they alternate when both are ready.
   A **clock cycle** is one engine ``forward_backward`` call packing the ready forward /
   forward_backward ops of many models — for each model its *run*: several consecutive ops
   (a call's chunks) when no optim_step / save / load sits between them — chosen by deficit
   round-robin over tenants up to ``token_budget`` datum tokens, then one ``optim_step`` call
   for every model whose run ended in an optim_step (or whose head is one). So a
   forward_backward and the optim_step submitted right after it complete in the same cycle:
   a pipelined client needs one cycle per step. ``timeslice`` packs one model per cycle.
5. A sampling step admits waiting requests by deficit round-robin over tenants while their KV
   reservations fit ``sample_kv_budget_tokens`` (`SampleQueue`), then decodes every running
   sequence for up to ``decode_steps_per_cycle`` steps; requests join and leave between steps.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from loraplex.config import SchedulerConfig
from loraplex.domain.ops import (
    ControlPlan,
    CyclePlan,
    ExpirePlan,
    InstallPlan,
    Plan,
    ReleasePlan,
    SamplePlan,
    WorkItem,
    does_file_work,
)
from loraplex.errors import user_error
from loraplex.scheduler.io_workers import Job
from loraplex.scheduler.packer import CyclePacker
from loraplex.scheduler.residency import sample_op
from loraplex.scheduler.scheduler_state import SchedulerState
from loraplex.scheduler.work_choice import WorkChoice


class Planner:
    """Plans one scheduler's engine calls (see the module docstring).

    Args:
        state: the scheduler's shared state; every method here runs under its lock.
        choice: training or sampling next (the scheduler tells it what each plan cost).
        quantum_tokens: the cycle packer's deficit round-robin quantum.
        run_io_op: the IO job of a save or load at a model's head, given when it started.
        read_sampler_adapter: the IO job reading a sampler adapter (its id and directory).
        clock: the scheduler's clock (sample admission's fairness window reads it).
    """

    def __init__(self, state: SchedulerState, choice: WorkChoice, quantum_tokens: int, *,
                 run_io_op: Callable[[WorkItem, float], None],
                 read_sampler_adapter: Callable[[str, str], None],
                 clock: Callable[[], float]) -> None:
        self._state = state
        self._choice = choice
        self._packer = CyclePacker(quantum_tokens)
        self._run_io_op = run_io_op
        self._read_sampler_adapter = read_sampler_adapter
        self._clock = clock
        self._last_training = "control"
        self._cancelled: set[str] = set()  # running samples to drop at the next sample step
        self._jobs: list[Job] = []  # IO jobs to submit once the lock is released

    def plan(self, now: float, config: SchedulerConfig) -> Plan | None:
        """The next engine call, its items marked started; None when there is nothing to do.

        Args:
            now: the clock reading this plan is made at.
            config: the scheduler's config slice, as it reads it now (like the packer's).
        """
        self._start_io(now)
        plan: Plan | None = (self._release_plan() or self._install_plan()
                             or self._expire_plan(now, config))
        if plan is None:
            work_class = self._choice.pick(self.has_training(), self._sample_ready())
            if work_class == "train":
                plan = self._build_training(now, config)
            elif work_class == "sample":
                plan = self._build_sample(config)
        return plan

    def take_jobs(self) -> list[Job]:
        """The IO jobs planning started since the last call."""
        jobs, self._jobs = self._jobs, []
        return jobs

    def cancel(self, request_id: str) -> None:
        """Drop this running sample at the next sample step."""
        self._cancelled.add(request_id)

    def has_training(self) -> bool:
        return any(q.head() is not None for q in self._state.queues.values())

    def _start_io(self, now: float) -> None:
        """Start the saves and loads at models' heads, and the checkpoint reads that waiting
        samples need, on IO threads (policy 1)."""
        for queue in self._state.queues.values():
            head = queue.head()
            if head is not None and does_file_work(head.op):
                queue.start([head], now)
                self._jobs.append(partial(self._run_io_op, head, now))
        residency = self._state.residency
        for item in self._state.samples.waiting_items():
            op = sample_op(item)
            work = op.work
            if residency.needs_read(op):
                assert work.adapter_id is not None and work.adapter_dir is not None
                residency.start_reading(work.adapter_id)
                self._jobs.append(partial(self._read_sampler_adapter, work.adapter_id,
                                          work.adapter_dir))

    def _is_ready(self, item: WorkItem) -> bool:
        return self._state.residency.is_ready(sample_op(item))

    def _sample_ready(self) -> bool:
        samples = self._state.samples
        return samples.num_running() > 0 or any(
            self._is_ready(it) for it in samples.waiting_items())

    def _release_plan(self) -> ReleasePlan | None:
        state = self._state
        released = state.residency.take_releasable()
        for model_id in sorted(state.closing):
            queue = state.queues[model_id]
            if not queue.is_busy and queue.num_waiting() == 0:
                del state.queues[model_id]
                state.closing.discard(model_id)
                state.residency.drop_model(model_id)
                released.append(model_id)
                released.extend(state.residency.take_releasable())
        return ReleasePlan(tuple(released)) if released else None

    def _install_plan(self) -> InstallPlan | None:
        installs, self._state.installs = self._state.installs, []
        return InstallPlan(tuple(installs)) if installs else None

    def _expire_plan(self, now: float, config: SchedulerConfig) -> ExpirePlan | None:
        timeout = config.seq_gap_timeout_s
        if timeout is None:
            return None
        for queue in self._state.queues.values():
            since = queue.stuck_since()
            if since is not None and now - since > timeout:
                missing = queue.next_seq
                items = queue.give_up_gap(now)
                error = user_error("seq_id", f"seq_id {missing} of model {queue.model_id!r} "
                                   f"never arrived within {timeout:g} s, so the "
                                   f"{len(items)} ops queued after it were failed")
                return ExpirePlan(tuple(items), error)
        return None

    def _build_training(self, now: float, config: SchedulerConfig) -> Plan | None:
        queues = self._state.queues
        runs = {m: r for m, q in queues.items() if (r := q.ready_run())}
        control = [h for q in queues.values()
                   if (h := q.head()) is not None and h.model_id not in runs]
        if control and (not runs or self._last_training == "cycle"):
            self._last_training = "control"
            item = min(control, key=lambda h: h.enqueued_at)
            self._state.queue_of(item).start([item], now)
            return ControlPlan(item)
        self._last_training = "cycle"
        return self._build_cycle(runs, now, config)

    def _build_cycle(self, runs: dict[str, list[WorkItem]], now: float,
                     config: SchedulerConfig) -> CyclePlan:
        packed = self._packer.pack(runs, config, now)
        for model_id, items in packed.started.items():
            self._state.queues[model_id].start(items, now)
        return CyclePlan(packed.batch, packed.optim)

    def _build_sample(self, config: SchedulerConfig) -> SamplePlan:
        samples = self._state.samples
        admit = samples.admit(self._is_ready, self._clock())
        for item in admit:
            self._state.residency.admit(sample_op(item))
        cancel, self._cancelled = tuple(sorted(self._cancelled)), set()
        steps = config.decode_steps_per_cycle
        if samples.any_streaming():
            steps = min(steps, config.stream_decode_steps)
        return SamplePlan(tuple(admit), steps, cancel=cancel)
