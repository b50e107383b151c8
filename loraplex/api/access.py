"""Tenant-scoped lookups shared by the routes: every object belongs to the tenant whose key
created it, another tenant gets the same 404 as for a missing one, and published checkpoints
are readable by everyone.
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.api.context import ServerContext
from loraplex.domain.ids import TinkerPath
from loraplex.domain.training_run import TrainingRun
from loraplex.errors import NotFoundError, QuotaError, user_error
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
    if not served.lanes.has_model(model_id):
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


def checkpoint_adapter_id(record: CheckpointRecord) -> str:
    """Engine id of a checkpoint-backed sampler adapter: one per committed version of a path
    (a checkpoint saved again under its name gets a new id)."""
    return f"{checkpoint_adapter_prefix(record.path)}{record.created_at!r}"


def checkpoint_adapter_prefix(path: TinkerPath) -> str:
    """What every engine id of ``path``'s versions starts with."""
    return f"ckpt:{path}@"


def forget_checkpoint(ctx: ServerContext, path: TinkerPath) -> None:
    """A checkpoint was deleted: drop its sampler adapters from every engine once no running
    sample uses them (samplers of it are refused from now on)."""
    for lanes in ctx.catalog.lanes():
        lanes.drop_sampler_adapters(checkpoint_adapter_prefix(path))


def owned_checkpoint(ctx: ServerContext, tenant: str, run_id: str, kind: str, name: str
                     ) -> CheckpointRecord:
    """The caller's own committed checkpoint ``{run_id}/{kind}/{name}`` (else 404)."""
    path = TinkerPath.from_checkpoint_id(run_id, f"{kind}/{name}")
    return ctx.stores.checkpoints.get_owned(path, tenant, "checkpoint_id")


def check_run_quota(ctx: ServerContext, tenant: str) -> None:
    """Raises QuotaError (HTTP 403) when the tenant already has its quota of live runs."""
    live = sum(lanes.num_models(tenant) for lanes in ctx.catalog.lanes())
    limit = ctx.config.quotas.max_training_runs
    if live >= limit:
        raise QuotaError(f"tenant has {live} live training runs (quota {limit}); finish "
                         "sessions it no longer needs (their checkpoints stay)")


def check_checkpoint_quota(ctx: ServerContext, tenant: str) -> None:
    """Raises QuotaError when the tenant's stored checkpoints are at its byte quota."""
    stored = ctx.stores.checkpoints.bytes_for_tenant(tenant)
    limit = ctx.config.quotas.max_checkpoint_bytes
    if stored >= limit:
        raise QuotaError(f"path: the tenant's checkpoints hold {stored} bytes (quota {limit});"
                         " delete some or let their TTL pass", field="path")


def release_session(ctx: ServerContext, session_id: str) -> None:
    """Free the engine memory of a session's training runs (records and checkpoints stay)."""
    for run in ctx.stores.runs.for_session(session_id):
        for served in ctx.catalog:
            served.lanes.release_model(run.run.model_id)
