"""`WorkChoice`: training or sampling next (the scheduler's policy 3).

Two mechanisms decide it: `EngineShare` splits engine time between the classes while both have
work, and `SampleAnticipation` holds training for a moment after a sampling step finished
requests, for those clients' next ones. The hold is charged to sampling's share.
"""

from __future__ import annotations

import time

from loraplex.config import SchedulerConfig
from loraplex.domain.ops import CyclePlan, Plan, SamplePlan
from loraplex.scheduler.anticipation import SampleAnticipation
from loraplex.scheduler.engine_share import EngineShare, WorkClass
from loraplex.scheduler.metrics import work_class_of


class WorkChoice:
    """Picks the next class of work; told what each plan cost (times are monotonic seconds:
    client latency is real time, whatever clock the scheduler was given).

    Attributes:
        hold_s: how long the last `pick` that answered None holds training (0: no hold).
    """

    def __init__(self, config: SchedulerConfig) -> None:
        self._share = EngineShare(config.sample_share)
        self._anticipation = SampleAnticipation(config.sample_anticipation_s,
                                                config.sample_anticipation_cycle_fraction)
        self.hold_s = 0.0

    def pick(self, train_ready: bool, sample_ready: bool) -> WorkClass | None:
        """The class to plan next; None while nothing is ready or training is held."""
        self.hold_s = 0.0
        if train_ready and not sample_ready and self._share.next_if_both() == "sample":
            self.hold_s = self._anticipation.remaining(time.monotonic())
            if self.hold_s > 0:
                self._anticipation.hold()
                return None
        if train_ready or sample_ready:
            held = self._anticipation.end(time.monotonic())
            if held:
                self._share.charge("sample", held)
        return self._share.pick(train_ready, sample_ready)

    def plan_done(self, plan: Plan, engine_s: float, finished_any: bool) -> None:
        """``plan`` took ``engine_s`` of the engine; ``finished_any``: it finished requests."""
        work_class = work_class_of(plan)
        if work_class is not None:
            self._share.charge(work_class, engine_s)
        if isinstance(plan, CyclePlan):
            self._anticipation.cycle_done(engine_s)
        elif isinstance(plan, SamplePlan) and finished_any:
            self._anticipation.samples_finished(time.monotonic())
