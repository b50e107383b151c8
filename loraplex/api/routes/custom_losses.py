"""``create_custom_loss`` (flag ``custom_loss_server_side``): store a session's traced loss.

The graph is checked structurally (`domain.custom_loss.check_graph`: allow-listed functions and
methods only, bounded sizes, references to earlier nodes only) before it is stored; a graph
that fails is an HTTP 400 naming the node, and nothing is stored. The answer is a future that
resolves at once to ``{"type": "create_custom_loss", "loss_id"}``; forward_backward with
``loss_fn="custom"`` and ``loss_fn_config={"loss_id": ...}`` then runs it on the server.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from loraplex.api import schemas
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.context import ServerContext
from loraplex.api.submission import new_request_id
from loraplex.domain.custom_loss import (
    MAX_NAME_CHARS,
    CustomLoss,
    LossNode,
    check_graph,
    loss_id,
)
from loraplex.domain.ops import CustomLossCreated
from loraplex.errors import ConflictError, QuotaError, user_error

router = APIRouter(prefix="/api/v1")


def _check_room(ctx: ServerContext, loss: CustomLoss) -> None:
    """Raises QuotaError (HTTP 403) when the session already stores its quota of losses (a
    retried create of a stored one is let through)."""
    limit = ctx.config.quotas.max_custom_losses_per_session
    store = ctx.stores.custom_losses
    if store.count_for_session(loss.session_id) >= limit and not store.exists(loss.loss_id):
        raise QuotaError(f"session {loss.session_id} already stores {limit} custom losses "
                         "(quotas.max_custom_losses_per_session); reuse their handles")


@router.post("/create_custom_loss")
async def create_custom_loss(request: Request, tenant: Tenant) -> dict[str, str]:
    ctx, body = await parse_body(request, schemas.CreateCustomLossRequest)
    ctx.stores.sessions.get_open(body.session_id, tenant)
    if not 0 < len(body.name) <= MAX_NAME_CHARS:
        raise user_error("name", f"must be 1 to {MAX_NAME_CHARS} characters")
    if body.custom_loss_seq_id < 0:
        raise user_error("custom_loss_seq_id", "must be ≥ 0")
    nodes = [LossNode(n.op, n.name, n.target, tuple(n.args), dict(n.kwargs))
             for n in body.graph.nodes]
    inputs = [(i.name, int(i.rank)) for i in body.inputs]
    check_graph(nodes, inputs)
    loss = CustomLoss(loss_id(body.session_id, body.custom_loss_seq_id), tenant,
                      body.session_id, body.name, tuple(inputs), tuple(nodes))
    _check_room(ctx, loss)
    stored = ctx.stores.custom_losses.insert(loss)
    request_id = new_request_id()
    ctx.futures.create(request_id, tenant, "CreateCustomLoss")
    if (stored.name, stored.inputs, stored.nodes) != (loss.name, loss.inputs, loss.nodes):
        # A retry resends the same loss; another loss under the same seq id is a client bug
        # (a failed future, not a 409, which the SDK's HTTP layer would retry).
        ctx.futures.fail(request_id, ConflictError(
            f"custom_loss_seq_id: {body.custom_loss_seq_id} already names another loss in "
            "this session", field="custom_loss_seq_id"))
    else:
        ctx.futures.resolve(request_id, CustomLossCreated(loss.loss_id))
    return {"request_id": request_id}
