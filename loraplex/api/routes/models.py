"""Training-run creation and description: create_model (a future) and get_info (direct),
tinker-api.md §5.1. The served NAME is echoed as ``model_name`` and ``tokenizer_id``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from tinker import types as sdk

from loraplex.api import convert, schemas
from loraplex.api.access import check_run_quota
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.responses.training_run_info import GetInfoResponse
from loraplex.api.submission import new_request_id
from loraplex.domain import ids
from loraplex.domain.ops import CreateModelOp, WorkItem
from loraplex.domain.training_run import TrainingRun

router = APIRouter(prefix="/api/v1")


@router.post("/create_model", response_model_exclude_unset=True)
async def create_model(request: Request, tenant: Tenant) -> sdk.UntypedAPIFuture:
    ctx, body = await parse_body(request, schemas.CreateModelRequest)
    ctx.stores.sessions.get_open(body.session_id, tenant)
    served = ctx.catalog.get(body.base_model)
    check_run_quota(ctx, tenant)
    model_id = ids.model_id(body.session_id, convert.model_seq_id(body.model_seq_id))
    run = TrainingRun(
        model_id=model_id, tenant=tenant, session_id=body.session_id, base_model=served.name,
        lora=convert.lora_config(body.lora_config),
        optimizer_config=convert.optimizer_config(body.optimizer_config),
        user_metadata=body.user_metadata or {})
    item = WorkItem(new_request_id(), tenant, "CreateModel", CreateModelOp(run),
                    model_id=model_id, seq_id=0)
    admitted = served.lanes.submit(item)
    return sdk.UntypedAPIFuture(request_id=admitted.request_id, model_id=model_id)


@router.post("/get_info", response_model_exclude_unset=True)
async def get_info(request: Request, tenant: Tenant) -> GetInfoResponse:
    ctx, body = await parse_body(request, schemas.GetInfoRequest)
    run = ctx.stores.runs.get(body.model_id, tenant).run
    arch = ctx.catalog.get(run.base_model).info.arch
    return GetInfoResponse(
        type="get_info", model_id=run.model_id,
        model_data=sdk.ModelData(arch=arch, model_name=run.base_model,
                                 tokenizer_id=run.base_model),
        is_lora=True, lora_rank=run.lora.rank, model_name=run.base_model,
        optimizer_config=dict(run.optimizer_config))
