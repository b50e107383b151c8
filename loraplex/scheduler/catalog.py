"""The served catalogue: each NAME a client may pass as ``base_model``, and the scheduler (one
per loaded model source) that runs its work. Several names may share one scheduler.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from loraplex.domain.model import ModelInfo
from loraplex.errors import user_error
from loraplex.scheduler.clock import ClockLoop
from loraplex.scheduler.scheduler import Scheduler


@dataclass(frozen=True)
class ServedModel:
    """One catalogue entry.

    Attributes:
        name: what clients send and what the server echoes (HF-style repo id).
        source: ``--model`` SOURCE it was loaded from.
        scheduler: the scheduler of that source's executor.
        info: static facts of the base model.
    """

    name: str
    source: str
    scheduler: Scheduler
    info: ModelInfo


class Catalog:
    """Names → served models, plus the clock loops to start and stop."""

    def __init__(self, models: list[ServedModel]) -> None:
        self._by_name = {m.name: m for m in models}
        schedulers = {id(m.scheduler): m.scheduler for m in models}
        self._loops = [ClockLoop(s, name=f"loraplex-clock-{i}")
                       for i, s in enumerate(schedulers.values())]

    def get(self, name: str, field: str = "base_model") -> ServedModel:
        model = self._by_name.get(name)
        if model is None:
            raise user_error(field, f"unknown base model {name!r}; this server serves "
                             f"{sorted(self._by_name)}")
        return model

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._by_name.values())

    def schedulers(self) -> list[Scheduler]:
        return [loop.scheduler for loop in self._loops]

    def start(self) -> None:
        for loop in self._loops:
            loop.start()

    def stop(self) -> None:
        for loop in self._loops:
            loop.stop()
