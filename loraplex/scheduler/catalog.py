"""The served catalogue: each NAME a client may pass as ``base_model``, and the lanes (one
scheduler per engine worker, `Lanes`) of the model source it names. Several names may share
one source, and so one set of lanes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from loraplex.domain.model import ModelInfo
from loraplex.errors import user_error
from loraplex.scheduler.lanes import Lanes
from loraplex.scheduler.scheduler import Scheduler


@dataclass(frozen=True)
class ServedModel:
    """One catalogue entry.

    Attributes:
        name: what clients send and what the server echoes (HF-style repo id).
        source: ``--model`` SOURCE it was loaded from.
        lanes: the schedulers of that source's workers, behind one routing facade.
        info: static facts of the base model.
        model_dir: the resolved model directory (its ``tokenizer.json`` and
            ``tokenizer_config.json`` turn text into tokens for the OpenAI-compatible routes);
            None where no directory backs the model (test fakes).
    """

    name: str
    source: str
    lanes: Lanes
    info: ModelInfo
    model_dir: str | None = None


class Catalog:
    """Names → served models, plus the lanes to start and stop."""

    def __init__(self, models: list[ServedModel]) -> None:
        self._by_name = {m.name: m for m in models}
        self._lanes = list({id(m.lanes): m.lanes for m in models}.values())

    def get(self, name: str, field: str = "base_model") -> ServedModel:
        model = self._by_name.get(name)
        if model is None:
            raise user_error(field, f"unknown base model {name!r}; this server serves "
                             f"{sorted(self._by_name)}")
        return model

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(self._by_name.values())

    def lanes(self) -> list[Lanes]:
        """Each model source's lanes, once."""
        return list(self._lanes)

    def schedulers(self) -> list[Scheduler]:
        """Every scheduler whose usage must be metered: live lanes' and lost ones'."""
        return [s for lanes in self._lanes for s in lanes.all_schedulers()]

    def start(self) -> None:
        for lanes in self._lanes:
            lanes.start()

    def stop(self) -> None:
        for lanes in self._lanes:
            lanes.stop()
