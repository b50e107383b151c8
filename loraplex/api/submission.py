"""Submitting training ops: the one path every seq_id-carrying request takes to the scheduler.

Once a request names a live model of the caller and a valid seq_id, it always takes its seq
slot: if building its op fails validation, a `FailedOp` takes the slot instead and its future
fails with a user error naming the field. Answering HTTP 400 there would leave a gap that
stalls every later op of that training client (the SDK never resends a rejected seq_id).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from loraplex.api.access import LiveRun, live_run
from loraplex.api.context import ServerContext
from loraplex.errors import UserError, user_error
from loraplex.scheduler.ops import FailedOp, Op, RequestKind, SaveOp, WorkItem


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex}"


def submit_training(
    ctx: ServerContext,
    tenant: str,
    model_id: Any,
    seq_id: Any,
    kind: RequestKind,
    build: Callable[[LiveRun, str], Op],
) -> dict[str, Any]:
    """Validate the address (HTTP errors), build the op (failures keep the slot), submit.

    Args:
        build: makes the op from the live run and the new request id; a UserError it raises
            becomes a FailedOp in the same slot.

    Returns:
        the submit response ``{"request_id", "model_id"}``.
    """
    if not isinstance(model_id, str) or not model_id:
        raise user_error("model_id", "required")
    if not isinstance(seq_id, int) or isinstance(seq_id, bool) or seq_id < 1:
        raise user_error("seq_id", f"must be an integer ≥ 1, got {seq_id!r}")
    live = live_run(ctx, tenant, model_id)
    scheduler = live.served.scheduler
    previous = scheduler.previous_admission(model_id, seq_id)
    if previous is not None:
        return {"request_id": previous.request_id, "model_id": model_id}
    request_id = new_request_id()
    try:
        op = build(live, request_id)
    except UserError as exc:
        op = FailedOp(exc)
    item = WorkItem(request_id, tenant, kind, op, model_id=model_id, seq_id=seq_id)
    try:
        admitted = scheduler.submit(item)
    except BaseException:
        _release(op, ctx)
        raise
    if admitted.request_id != item.request_id:
        _release(op, ctx)
    return {"request_id": admitted.request_id, "model_id": model_id}


def _release(op: Op, ctx: ServerContext) -> None:
    if isinstance(op, SaveOp):
        ctx.stores.checkpoints.abort(op.checkpoint)


def json_address(raw: bytes) -> dict[str, Any]:
    """The JSON object of a training request, read before full validation so that a request
    failing its schema still names the ``model_id`` / ``seq_id`` slot it occupies."""
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        raise user_error("body", "not JSON") from None
    if not isinstance(value, dict):
        raise user_error("body", "expected a JSON object")
    return value
