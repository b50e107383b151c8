"""OpenAI-compatible sampling: ``POST /v1/completions`` and ``POST /v1/chat/completions``.

``model`` names what to sample: a ``tinker://…/sampler_weights/…`` path the caller may read, one
of the caller's sampling sessions (``{session}:sample:{n}``), or a served base model. Text is
tokenized with the served model's tokenizer (chat: its chat template); each prompt then goes
through `sampling.submit_sample`, the path Tinker's ``asample`` takes, so the same seed and
parameters give the same tokens and logprobs, metered as samples. ``echo`` asks the same
sample for its prompt logprobs (the bits `compute_logprobs` returns) and shows the prompt
first. ``stream`` answers server-sent events ending in ``data: [DONE]``, sent while the sampler
runs (`ChoiceStream`: the chunks a whole result would have, each once nothing later can change
it); a client that stops reading cancels its requests, which frees their KV pages. The response
starts with the first tokens (or the error, as an HTTP error, of a request that fails first);
a failure after that is an ``error`` event. An ``echo`` stream is sent once sampled.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from tinker import types as sdk

from loraplex.api import openai_render, openai_schemas
from loraplex.api.auth import Tenant
from loraplex.api.body import parse_body
from loraplex.api.context import ServerContext
from loraplex.api.convert import check_tokens
from loraplex.api.longpoll import wait_until_done
from loraplex.api.model_input import check_prompt_images
from loraplex.api.openai_render import Kind
from loraplex.api.openai_responses import (
    Chunk,
    ResponseHead,
    wire,
)
from loraplex.api.openai_schemas import OpenAIRequest
from loraplex.api.openai_text import ModelText, check_text_budget
from loraplex.api.sample_stream import Event, StreamFeed, StreamShape, finished_sample
from loraplex.api.samplers import Target, admit_sample, prepare_sample, resolve, sample_request
from loraplex.domain.sampling import SampleResult
from loraplex.errors import user_error

router = APIRouter(prefix="/v1")


@router.post("/completions")
async def completions(request: Request, tenant: Tenant) -> Response:
    ctx, body = await parse_body(request, openai_schemas.CompletionRequest)
    body.check_supported()
    target = resolve(request, ctx, tenant, body.model)
    texts = [body.prompt] if isinstance(body.prompt, str) else \
        [p for p in body.prompt if isinstance(p, str)]
    check_text_budget(texts, target.served.info.max_context, "prompt")
    prompts = await asyncio.to_thread(_completion_prompts, body.prompt, target.text)
    return await _respond(request, ctx, tenant, "completion", body, target, prompts,
                          body.max_tokens, body.logprobs, echo=body.echo)


@router.post("/chat/completions")
async def chat_completions(request: Request, tenant: Tenant) -> Response:
    ctx, body = await parse_body(request, openai_schemas.ChatCompletionRequest)
    body.check_supported()
    target = resolve(request, ctx, tenant, body.model)
    images: list[tuple[bytes, str, str]] = []
    messages = [{"role": m.role, "content": m.text(f"messages[{i}]", images)}
                for i, m in enumerate(body.messages)]
    check_text_budget(["".join(m["content"] for m in messages)],
                      target.served.info.max_context, "messages")
    prompt = await asyncio.to_thread(target.text.chat_prompt, messages,
                                     body.chat_template_kwargs)
    model_input = None
    if images:
        model_input = with_images(prompt, images, target.served.info.image_token_id)
        await asyncio.to_thread(check_prompt_images, model_input, ctx.config.limits)
    topk = (body.top_logprobs or 0) if body.logprobs else None
    return await _respond(request, ctx, tenant, "chat", body, target, [prompt],
                          body.completion_budget, topk, model_input=model_input)


def with_images(tokens: list[int], images: list[tuple[bytes, str, str]],
                image_token: int | None) -> sdk.ModelInput:
    """The rendered chat prompt with each image's placeholder token replaced by its chunk."""
    if image_token is None:
        raise user_error(images[0][2], "this model takes no images")
    at = [i for i, t in enumerate(tokens) if t == image_token]
    if len(at) != len(images):
        raise user_error("messages", f"{len(images)} images but {len(at)} image placeholders "
                         "in the rendered prompt (the chat template or the text adds some)")
    chunks: list[Any] = []
    start = 0
    for i, (data, fmt, _) in zip(at, images, strict=True):
        if i > start:
            chunks.append(sdk.EncodedTextChunk(tokens=tokens[start:i]))
        chunks.append(sdk.ImageChunk(data=data, format=fmt))  # type: ignore[arg-type]
        start = i + 1
    if start < len(tokens):
        chunks.append(sdk.EncodedTextChunk(tokens=tokens[start:]))
    return sdk.ModelInput(chunks=chunks)


def _completion_prompts(prompt: str | list[str] | list[int] | list[list[int]],
                        text: ModelText) -> list[list[int]]:
    if isinstance(prompt, str):
        return [text.encode(prompt)]
    if not prompt:
        raise user_error("prompt", "empty")
    if all(isinstance(p, str) for p in prompt):
        return [text.encode(p) for p in prompt]  # type: ignore[arg-type]
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    return [list(p) for p in prompt]  # type: ignore[arg-type]


async def _respond(request: Request, ctx: ServerContext, tenant: str, kind: Kind,
                   body: OpenAIRequest, target: Target,
                   prompts: list[list[int]], max_tokens: int | None, topk: int | None,
                   echo: bool = False, model_input: sdk.ModelInput | None = None) -> Response:
    stops = body.stop_strings()
    params = sdk.SamplingParams(max_tokens=max_tokens, temperature=body.temperature,
                                top_p=body.top_p, top_k=body.top_k, seed=body.seed, stop=stops)
    streamed = body.stream and not echo
    prepared = []
    for i, tokens in enumerate(prompts):  # every prompt checked before any is queued
        field = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        if not tokens:
            raise user_error(field, "empty prompt")
        check_tokens(tokens, target.served.info, field)
        sample = sample_request(tokens, body.n, params, topk or 0, echo)
        if model_input is not None:  # a chat with images: its chunks (decoded already)
            sample = sample.model_copy(update={"prompt": model_input})
        prepared.append(prepare_sample(ctx, tenant, sample, target.sampler, streamed,
                                       body.ignore_eos, images_decoded=True))
    lengths = [p.prompt_length for p in prepared]  # images as their tokens
    # all queued before any is awaited, so they can share a batch
    request_ids = [admit_sample(p).request_id for p in prepared]
    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    head = ResponseHead(id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()),
                        model=body.model)
    if streamed:
        feed = StreamFeed(ctx, tenant, StreamShape(kind, head, body.n, stops, topk,
                                                   body.include_usage_chunk),
                          request_ids, target.text, target.served, lengths)
        return StreamingResponse(_events(await feed.start()), media_type="text/event-stream")
    results = [await _result(ctx, tenant, rid) for rid in request_ids]
    made = openai_render.choices(results, target.text, target.served.info.eos_token_ids,
                                 stops, topk, prompts if echo else None)
    counts = openai_render.usage(lengths, body.n, made)
    if body.stream:
        chunks = openai_render.chunks(kind, head, made, target.text,
                                      counts if body.include_usage_chunk else None)
        return StreamingResponse(_events(_whole(chunks)), media_type="text/event-stream")
    return JSONResponse(wire(openai_render.body(kind, head, made, target.text, counts,
                                                body.return_token_ids)))


async def _result(ctx: ServerContext, tenant: str, request_id: str) -> SampleResult:
    """Wait for a sample's future; a failed one raises its error (OpenAI-shaped by the
    error handlers)."""
    entry = ctx.futures.get(request_id, tenant)
    while not entry.is_done:
        await wait_until_done(ctx.futures, request_id, ctx.config.long_poll_s)
        entry = ctx.futures.get(request_id, tenant)
    return finished_sample(ctx.futures, entry)


async def _whole(chunks: Iterator[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


async def _events(chunks: AsyncIterator[Event]) -> AsyncIterator[str]:
    async for chunk in chunks:
        yield f"data: {json.dumps(wire(chunk))}\n\n"
    yield "data: [DONE]\n\n"
