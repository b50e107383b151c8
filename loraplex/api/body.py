"""Reading request bodies within the configured size (`LimitsConfig.max_body_bytes`).

A declared ``Content-Length`` over the limit is refused before a byte is read; a body without
one (chunked) is read until it passes the limit, then refused. Either way: HTTP 413 with a
message naming the limit, and nothing more is buffered.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from fastapi import Request
from pydantic import BaseModel

from loraplex.api.context import ServerContext, ctx_of
from loraplex.api.schemas import parse
from loraplex.config import LimitsConfig
from loraplex.errors import PayloadTooLargeError, user_error


async def read_body(request: Request, limits: LimitsConfig) -> bytes:
    """The whole body, at most ``limits.max_body_bytes``.

    Raises:
        PayloadTooLargeError: the body is larger than the limit (HTTP 413).
        UserError: a malformed Content-Length.
    """
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise user_error("Content-Length", f"not a byte count: {declared[:40]!r}")
        if int(declared) > limit:
            raise _too_large(limit, int(declared))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


M = TypeVar("M", bound=BaseModel)


async def request_body(request: Request) -> tuple[ServerContext, bytes]:
    """The server context and the request's body, read within the limit."""
    ctx = ctx_of(request)
    return ctx, await read_body(request, ctx.config.limits)


OFF_LOOP_BYTES = 256 << 10
"""JSON bodies larger than this are validated on a worker thread, not the event loop."""


async def parse_body(request: Request, model: type[M]) -> tuple[ServerContext, M]:
    """The server context and the JSON body validated as ``model`` (HTTP 400 naming the
    field); a large body is parsed off the event loop."""
    ctx, raw = await request_body(request)
    if len(raw) > OFF_LOOP_BYTES:
        return ctx, await asyncio.to_thread(parse, model, raw)
    return ctx, parse(model, raw)


def _too_large(limit: int, declared: int | None = None) -> PayloadTooLargeError:
    size = "the body" if declared is None else f"{declared} bytes"
    return PayloadTooLargeError(f"body: {size} exceeds the server's limit of {limit} bytes "
                                "(server.limits.max_body_bytes)", field="body")
