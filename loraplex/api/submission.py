"""Submitting training ops: the one path every seq_id-carrying request takes to the scheduler.

A route reads as: decode → ``training_slot`` (the address: a live model of the caller and a
valid seq_id, else HTTP 4xx) → build the op (a function decorated with `keeps_slot`) →
``submit_training``. Once the address is valid the request always takes its seq slot: if
building its op fails validation, a `FailedOp` takes the slot instead and its future fails
with a user error naming the field. Answering HTTP 400 there would leave a gap that stalls
every later op of that training client (the SDK never resends a rejected seq_id).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec

from fastapi import Request

from loraplex.api.access import LiveRun, live_run
from loraplex.api.body import request_body
from loraplex.api.context import ServerContext
from loraplex.domain.ops import Admitted, FailedOp, Op, RequestKind, SaveOp, WorkItem
from loraplex.errors import LoraplexError, user_error

P = ParamSpec("P")


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class TrainingSlot:
    """A valid address in a live model's order, and the request id its op will carry.

    Attributes:
        previous: the admission of an earlier submit of the same seq_id (a retry), if any.
    """

    live: LiveRun
    seq_id: int
    request_id: str
    previous: Admitted | None

    @property
    def model_id(self) -> str:
        return self.live.run.model_id


def training_slot(ctx: ServerContext, tenant: str, model_id: object, seq_id: object
                  ) -> TrainingSlot:
    """Check a training request's address.

    Raises:
        UserError / NotFoundError: a missing or malformed ``model_id`` / ``seq_id``, or a model
            that is not the caller's live training run (HTTP 4xx: no slot is taken).
    """
    if not isinstance(model_id, str) or not model_id:
        raise user_error("model_id", "required")
    if not isinstance(seq_id, int) or isinstance(seq_id, bool) or seq_id < 1:
        raise user_error("seq_id", f"must be an integer ≥ 1, got {seq_id!r}")
    live = live_run(ctx, tenant, model_id)
    previous = live.served.lanes.previous_admission(model_id, seq_id)
    return TrainingSlot(live, seq_id, new_request_id(), previous)


def json_slot(ctx: ServerContext, tenant: str, raw: bytes) -> TrainingSlot:
    """The slot of a JSON training request (its address is read before the schema, so a
    request failing its schema still names the slot it occupies)."""
    address = json_address(raw)
    return training_slot(ctx, tenant, address.get("model_id"), address.get("seq_id"))


def keeps_slot(build: Callable[P, Op]) -> Callable[P, Op]:
    """Decorate an op builder: a `LoraplexError` it raises (bad input, a full disk while
    reserving a checkpoint, a quota) becomes a `FailedOp` in the slot."""

    @functools.wraps(build)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Op:
        try:
            return build(*args, **kwargs)
        except LoraplexError as exc:
            return FailedOp(exc.detached())

    return wrapper


def submit_training(ctx: ServerContext, tenant: str, slot: TrainingSlot, kind: RequestKind,
                    op: Op) -> dict[str, str]:
    """Submit ``op`` in ``slot``; a retried submit answers the original request id.

    Returns:
        the submit response ``{"request_id", "model_id"}``.
    """
    admitted = slot.previous
    if admitted is None:
        item = WorkItem(slot.request_id, tenant, kind, op, model_id=slot.model_id,
                        seq_id=slot.seq_id)
        try:
            admitted = slot.live.served.lanes.submit(item)
        except BaseException:
            _release(ctx, op)
            raise
    if admitted.request_id != slot.request_id:
        _release(ctx, op)
    return {"request_id": admitted.request_id, "model_id": slot.model_id}


async def submit_json(request: Request, tenant: str, kind: RequestKind,
                      build: Callable[[ServerContext, TrainingSlot, bytes], Op]
                      ) -> dict[str, str]:
    """A JSON training request end to end: its slot (`json_slot`), its op (``build``, a
    `keeps_slot` function of the body), the submit."""
    ctx, raw = await request_body(request)
    slot = json_slot(ctx, tenant, raw)
    return submit_training(ctx, tenant, slot, kind, build(ctx, slot, raw))


def _release(ctx: ServerContext, op: Op) -> None:
    """Give back what building ``op`` reserved (a checkpoint directory) when it is not run."""
    if isinstance(op, SaveOp):
        ctx.stores.checkpoints.abort(op.checkpoint)


def json_address(raw: bytes) -> dict[str, Any]:
    """The JSON object of a training request, read before full validation so that a request
    failing its schema still names the ``model_id`` / ``seq_id`` slot it occupies."""
    try:
        value = json.loads(raw or b"{}")
    except (ValueError, RecursionError):
        raise user_error("body", "not JSON (or nested too deeply)") from None
    if not isinstance(value, dict):
        raise user_error("body", "expected a JSON object")
    return value
