"""Where a training run of a lost worker restarts from: its latest ``save_state`` (a
``weights/`` checkpoint, which holds the optimizer state too), and what its failed ops say."""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.domain.ids import TinkerPath
from loraplex.domain.ops import WorkItem
from loraplex.domain.work import LoadWork
from loraplex.store.checkpoints import CheckpointStore


@dataclass(frozen=True)
class RestorePoint:
    """The checkpoint a run is restored from.

    Attributes:
        path: its ``tinker://`` path (named in the failed ops' errors).
        directory: its files (the new worker reads them).
    """

    path: TinkerPath
    directory: str

    @staticmethod
    def latest(checkpoints: CheckpointStore, model_id: str) -> RestorePoint | None:
        """The run's newest committed ``save_state``, if it has one."""
        saves = [c for c in checkpoints.list_for_run(model_id) if c.path.kind == "weights"]
        if not saves:
            return None
        newest = max(saves, key=lambda c: c.created_at)
        return RestorePoint(newest.path, newest.directory)

    def load_work(self, model_id: str) -> LoadWork:
        """Load it back with its optimizer state (the run continues exactly from it)."""
        return LoadWork(model_id, self.directory, with_optimizer=True)


def restore_message(worker: str, item: WorkItem, point: RestorePoint | None) -> str:
    """The retryable error of an op the lost worker held."""
    lost = f"engine worker {worker} was lost while it held this request; retry it"
    if item.model_id is None:
        return f"{lost} (another worker samples it)"
    if point is None:
        return (f"{lost}: training run {item.model_id!r} had no save_state, so its state is "
                "lost; start again from a checkpoint")
    return (f"{lost}: training run {item.model_id!r} was restored from {point.path} (its "
            "latest save_state, with optimizer state) on another worker; steps after that "
            "checkpoint are not in it")
