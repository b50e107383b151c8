"""How training and sampling share the one engine: stride scheduling over engine seconds.

Each class has a virtual time, advanced by the engine seconds its plans take divided by its
weight (``sample_share`` for sampling, ``1 - sample_share`` for training). When both have work
the class with the smaller virtual time goes next, so over any busy stretch each gets its share
of engine time, whatever one plan of either costs (a 2 s training cycle is followed by ~2 s of
decode steps at share 0.5, not by one 30 ms step). A class with nothing to do banks no credit:
its virtual time is pulled up to the busy one's. Every plan is charged at least ``MIN_CHARGE_S``
so near-free plans alternate instead of monopolizing the engine.
"""

from __future__ import annotations

from typing import Literal

WorkClass = Literal["train", "sample"]
MIN_CHARGE_S = 1e-3


class EngineShare:
    """Picks the next class of work.

    Args:
        sample_share: sampling's engine-time share while both classes wait, in [0, 1].
    """

    def __init__(self, sample_share: float) -> None:
        share = min(max(sample_share, 1e-3), 1 - 1e-3)
        self._weight: dict[WorkClass, float] = {"train": 1 - share, "sample": share}
        self._vtime: dict[WorkClass, float] = {"train": 0.0, "sample": 0.0}

    def pick(self, train_ready: bool, sample_ready: bool) -> WorkClass | None:
        if train_ready and sample_ready:
            return self.next_if_both()
        if not (train_ready or sample_ready):
            return None
        busy: WorkClass = "train" if train_ready else "sample"
        idle: WorkClass = "sample" if train_ready else "train"
        self._vtime[idle] = max(self._vtime[idle], self._vtime[busy])
        return busy

    def next_if_both(self) -> WorkClass:
        """The class that goes next when both have work."""
        return "sample" if self._vtime["sample"] < self._vtime["train"] else "train"

    def charge(self, cls: WorkClass, engine_s: float) -> None:
        self._vtime[cls] += max(engine_s, MIN_CHARGE_S) / self._weight[cls]
