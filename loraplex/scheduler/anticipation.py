"""`SampleAnticipation`: after a sampling step finishes requests, training waits a moment for
those clients' next requests instead of starting a cycle at once.

Why: a client sampling one request at a time (an RL rollout loop, a chat) submits its next
request 15–50 ms after its last one finished. Without a hold, the clock thread has already
started the next training cycle by then, and beside a training flood that request waits a whole
cycle (2–4 s on a CPU: 127× its solo latency, measured by ``benchmarks/sample_fairness.py``).
With it, the request is admitted by the next sampling step. The same reasoning as anticipatory
disk scheduling: a short, bounded idle wait beats a long wait behind the other class.

Bounds: a hold lasts at most ``cap_s`` and at most ``cycle_fraction`` of a recent training
cycle's engine time, and only one hold follows each sampling step; so training beside clients
that never come back loses at most ``cycle_fraction`` of its engine time. The time a hold
keeps training waiting is charged to sampling's share (`EngineShare`), so a client that keeps
coming back gets its share and no more.
"""

from __future__ import annotations

CYCLE_SMOOTHING = 0.25  # weight of the newest cycle in the running mean of cycle lengths


class SampleAnticipation:
    """The hold after a sampling step that finished requests.

    Args:
        cap_s: longest hold (0: never hold).
        cycle_fraction: longest hold as a part of the mean training cycle.
    """

    def __init__(self, cap_s: float, cycle_fraction: float) -> None:
        self.cap_s = cap_s
        self.cycle_fraction = cycle_fraction
        self._cycle_s = 0.0  # running mean of training cycles' engine seconds
        self._since: float | None = None  # when the last sampling step finished requests
        self._held = False  # training actually waited on this hold

    def cycle_done(self, engine_s: float) -> None:
        """A training cycle took ``engine_s``."""
        mean = self._cycle_s
        self._cycle_s = engine_s if mean == 0 else mean + CYCLE_SMOOTHING * (engine_s - mean)

    def samples_finished(self, now: float) -> None:
        """A sampling step finished requests at ``now`` (monotonic seconds, as every ``now``
        here: client latency is real time, whatever clock the scheduler was given)."""
        self._since = now
        self._held = False

    def hold_s(self) -> float:
        return min(self.cap_s, self.cycle_fraction * self._cycle_s)

    def remaining(self, now: float) -> float:
        """Seconds training should still wait (0 when no hold is on)."""
        if self._since is None:
            return 0.0
        return min(self.hold_s(), max(0.0, self._since + self.hold_s() - now))

    def hold(self) -> None:
        """Training was ready and waited on the hold."""
        self._held = True

    def end(self, now: float) -> float:
        """End the hold (a sample came, or it ran out); returns the seconds it kept training
        waiting, to charge to sampling (0 if training never waited on it)."""
        if self._since is None:
            return 0.0
        waited = min(now - self._since, self.hold_s()) if self._held else 0.0
        self._since, self._held = None, False
        return max(0.0, waited)
