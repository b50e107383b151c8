"""Tenant-scoped lookups shared by the routes: every object belongs to the tenant whose key
created it, another tenant gets the same 404 as for a missing one, and published checkpoints
are readable by everyone.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.api.context import ServerContext
from loraplex.domain.ids import TinkerPath
from loraplex.domain.training_run import TrainingRun
from loraplex.errors import NotFoundError, user_error
from loraplex.scheduler.catalog import ServedModel
from loraplex.store.checkpoints import CheckpointRecord


@dataclass(frozen=True)
class LiveRun:
    """A training run of the caller whose adapter is in engine memory."""

    run: TrainingRun
    served: ServedModel


def live_run(ctx: ServerContext, tenant: str, model_id: str, field: str = "model_id"
             ) -> LiveRun:
    """Raises NotFoundError (unknown / foreign) or UserError (not in engine memory)."""
    run = ctx.stores.runs.identity(model_id, tenant, field)
    served = ctx.catalog.get(run.base_model)
    if not served.scheduler.has_model(model_id):
        raise user_error(field, f"training run {model_id!r} has no live state on this server "
                         "(its session ended or the server restarted); resume it from a "
                         "checkpoint with create_training_client_from_state")
    return LiveRun(run, served)


def readable_checkpoint(ctx: ServerContext, tenant: str, path: str, field: str = "path"
                        ) -> tuple[CheckpointRecord, TrainingRun]:
    """A committed checkpoint the tenant owns or that is published, and its training run."""
    parsed = TinkerPath.parse(path, field)
    record = ctx.stores.checkpoints.get_readable(parsed, tenant, field)
    run = ctx.stores.runs.find(parsed.run_id)
    if run is None:
        raise NotFoundError(f"{field}: no training run {parsed.run_id!r}", field=field)
    return record, run.run


def owned_checkpoint(ctx: ServerContext, tenant: str, run_id: str, kind: str, name: str
                     ) -> CheckpointRecord:
    """The caller's own committed checkpoint ``{run_id}/{kind}/{name}`` (else 404)."""
    path = TinkerPath.from_checkpoint_id(run_id, f"{kind}/{name}")
    return ctx.stores.checkpoints.get_owned(path, tenant, "checkpoint_id")
