"""A streamed OpenAI request: its sample requests' tokens → stream chunks while they sample.

One sample request per prompt, ``n`` choices each (`ChoiceStream` renders a choice). The feed
waits on the requests' futures (`wait_for_news`: a completion or new tokens), polls the
tokens that arrived, and finishes each choice from its request's final result. The first
chunks are awaited before the HTTP response starts, so a request that fails before producing
anything answers an HTTP error; a failure later is an ``error`` chunk. When the stream ends
early (the client went away, or a request failed) the requests still sampling are cancelled,
which frees their KV pages. Knows nothing of HTTP itself (the route turns chunks into events).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from loraplex.api import openai_render
from loraplex.api.context import ServerContext
from loraplex.api.error_bodies import OpenAIError
from loraplex.api.errors import http_status, openai_error
from loraplex.api.longpoll import wait_for_news
from loraplex.api.openai_render import Choice, Kind
from loraplex.api.openai_responses import Chunk, ResponseHead
from loraplex.api.openai_stream import ChoiceStream
from loraplex.api.openai_text import ModelText
from loraplex.domain.ops import Sampled
from loraplex.domain.sampling import SampleResult
from loraplex.errors import LoraplexError, ServerError
from loraplex.scheduler.catalog import ServedModel
from loraplex.scheduler.futures import FutureEntry, FutureStore

Event = Chunk | OpenAIError
"""What a stream sends: a chunk, or (last) the error that ended it."""


@dataclass(frozen=True)
class StreamShape:
    """What every chunk of one response shares, and what it asked to be shown.

    Attributes:
        head: ``id``, ``created`` and ``model`` of every chunk.
        n: choices per prompt.
        stops: stop strings (None: none); topk: alternatives per token (None: no logprobs).
        include_usage: end with a usage chunk.
    """

    kind: Kind
    head: ResponseHead
    n: int
    stops: list[str] | None
    topk: int | None
    include_usage: bool


def finished_sample(futures: FutureStore, entry: FutureEntry) -> SampleResult:
    """A completed sample future's result (marked fetched); a failed one raises its error."""
    futures.mark_fetched(entry.request_id)
    if entry.error is not None:
        raise entry.error.detached()
    if not isinstance(entry.result, Sampled):
        raise ServerError(f"future {entry.request_id} holds no sample")
    return entry.result.result


class StreamFeed:
    """The chunks of one streamed response (see the module docstring)."""

    def __init__(self, ctx: ServerContext, tenant: str, shape: StreamShape,
                 request_ids: list[str], text: ModelText, served: ServedModel,
                 prompt_lengths: list[int]) -> None:
        self._ctx, self._tenant, self._shape = ctx, tenant, shape
        self._request_ids, self._text, self._served = request_ids, text, served
        self._prompt_lengths = prompt_lengths
        self._streams = [ChoiceStream(shape.kind, shape.head, i, text, shape.stops, shape.topk)
                         for i in range(len(request_ids) * shape.n)]
        self._pending = list(range(len(request_ids)))  # prompts still sampling
        self._made: dict[int, Choice] = {}

    async def start(self) -> AsyncIterator[Event]:
        """Wait for the first tokens; a request that fails before any raises its error (and
        cancels the others). Returns the stream of chunks."""
        try:
            while True:
                first = self._poll()
                if first or not self._pending:
                    break
                await self._wait()
        except BaseException:
            self._cancel()
            raise
        return self._chunks(first)

    async def _chunks(self, first: list[Chunk]) -> AsyncIterator[Event]:
        try:
            if self._shape.kind == "chat":
                for i in range(len(self._streams)):
                    yield openai_render.role_chunk(self._shape.head, i)
            for chunk in first:
                yield chunk
            while self._pending:
                await self._wait()
                try:
                    chunks = self._poll()
                except LoraplexError as exc:
                    yield openai_error(exc, http_status(exc))
                    return
                for chunk in chunks:
                    yield chunk
            if self._shape.include_usage:
                made = [self._made[i] for i in range(len(self._streams))]
                counts = openai_render.usage(self._prompt_lengths, self._shape.n, made)
                yield openai_render.usage_chunk(self._shape.kind, self._shape.head, counts)
        finally:  # also when the client went away (the generator is closed or cancelled)
            self._cancel()

    async def _wait(self) -> None:
        await wait_for_news(self._ctx.futures, [self._request_ids[i] for i in self._pending],
                            self._ctx.config.long_poll_s)

    def _poll(self) -> list[Chunk]:
        """Chunks of the tokens that arrived and of the requests that finished; raises the
        error of a request that failed."""
        out: list[Chunk] = []
        n = self._shape.n
        for i in list(self._pending):
            rid = self._request_ids[i]
            for delta in self._ctx.futures.take_progress(rid, self._tenant):
                out += self._streams[i * n + delta.index].feed(delta)
            entry = self._ctx.futures.get(rid, self._tenant)
            if not entry.is_done:
                continue
            self._pending.remove(i)
            finals = openai_render.choices([finished_sample(self._ctx.futures, entry)],
                                           self._text, self._served.info.eos_token_ids,
                                           self._shape.stops, self._shape.topk)
            for j, final in enumerate(finals):
                final = replace(final, index=i * n + j)
                self._made[final.index] = final
                out += self._streams[final.index].finish(final)
        return out

    def _cancel(self) -> None:
        """Drop the requests still sampling (their client is gone, or one failed)."""
        for i in self._pending:
            self._served.lanes.cancel_sample(self._request_ids[i])
        self._pending = []
