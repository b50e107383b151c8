"""vLLM's tokenizer endpoints: ``POST /tokenize``, ``POST /detokenize``, ``GET /tokenizer_info``,
under the same auth as ``/v1``, so clients such as lm-eval's remote tokenizer need no tokenizer
download. ``model`` (optional when the server serves one model) is what ``/v1`` takes: a served
base model, a sampler checkpoint path or a sampling session; its base model's tokenizer
answers."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from loraplex.api import openai_schemas
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.openai_text import ModelText, ModelTexts, check_text_budget
from loraplex.api.samplers import resolve
from loraplex.domain.tokens import check_token_range
from loraplex.errors import user_error
from loraplex.scheduler.catalog import ServedModel

router = APIRouter()


@router.post("/tokenize")
async def tokenize(request: Request, tenant: Tenant) -> dict[str, Any]:
    ctx, body = await parse_body(request, openai_schemas.TokenizeRequest)
    text, served = _text(request, ctx, tenant, body.model)
    if (body.prompt is None) == (body.messages is None):
        raise user_error("prompt", "give exactly one of prompt and messages")
    max_context = served.info.max_context
    if body.messages is not None:
        messages = [{"role": m.role, "content": m.text(f"messages[{i}]")}
                    for i, m in enumerate(body.messages)]
        check_text_budget(["".join(m["content"] for m in messages)], max_context, "messages")
        rendered = await asyncio.to_thread(text.chat_text, messages, body.add_generation_prompt)
        tokens = await asyncio.to_thread(text.encode_as, rendered, False)
    else:
        check_text_budget([body.prompt or ""], max_context, "prompt")
        tokens = await asyncio.to_thread(text.encode_as, body.prompt or "",
                                         body.add_special_tokens)
    strs = [text.token_text(t) for t in tokens] if body.return_token_strs else None
    return {"count": len(tokens), "max_model_len": max_context, "tokens": tokens,
            "token_strs": strs}


@router.post("/detokenize")
async def detokenize(request: Request, tenant: Tenant) -> dict[str, Any]:
    ctx, body = await parse_body(request, openai_schemas.DetokenizeRequest)
    text, served = _text(request, ctx, tenant, body.model)
    check_token_range(body.tokens, served.info.vocab_size, "tokens")
    if len(body.tokens) > served.info.max_context:
        raise user_error("tokens", f"{len(body.tokens)} tokens exceed the context of "
                         f"{served.info.max_context}")
    return {"prompt": await asyncio.to_thread(text.decode, body.tokens, False)}


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request, tenant: Tenant, model: str | None = None
                         ) -> dict[str, Any]:
    text, served = _text(request, ctx_of(request), tenant, model)
    return {**text.info(), "model_max_length": served.info.max_context}


def _model_name(ctx: ServerContext, model: str | None) -> str:
    if model is not None:
        return model
    names = [m.name for m in ctx.catalog]
    if len(names) != 1:
        raise user_error("model", f"required: this server serves {len(names)} models "
                         f"({', '.join(names)})")
    return names[0]


def _text(request: Request, ctx: ServerContext, tenant: str, model: str | None
          ) -> tuple[ModelText, ServedModel]:
    """The tokenizer and served model ``model`` names (a base model directly; a checkpoint
    or session through `resolve`, which checks the caller may read it)."""
    name = _model_name(ctx, model)
    if name in {m.name for m in ctx.catalog}:
        served = ctx.catalog.get(name, "model")
        texts: ModelTexts = request.app.state.model_texts
        return texts.of(served), served
    target = resolve(request, ctx, tenant, name)
    return target.text, target.served
