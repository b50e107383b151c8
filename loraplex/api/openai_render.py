"""Sample results → OpenAI response bodies and stream chunks (completions and chat).

With ``echo`` (legacy completions), a choice's text, tokens and logprobs start with its
prompt's, the first prompt token without a logprob (``null``), as vLLM and OpenAI show them.
A completion is cut before the first stop string it contains (OpenAI returns text without the
stop string; Tinker keeps the tokens that produced it), and a final EOS token is not shown. The
tokens dropped that way still count in ``usage.completion_tokens``: they were sampled and are
metered. Knows nothing of HTTP or the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from loraplex.api.openai_responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprob,
    ChatLogprobs,
    ChatMessage,
    Chunk,
    CompletionChoice,
    CompletionChunk,
    CompletionChunkChoice,
    CompletionLogprobs,
    CompletionResponse,
    FinishReason,
    Response,
    ResponseHead,
    TopLogprob,
    Usage,
)
from loraplex.api.openai_text import ModelText
from loraplex.domain.sampling import SampledSequence, SampleResult, TopkLogprobs

Kind = Literal["completion", "chat"]
SENTINEL_LOGPROB = -99999.0
"""What an empty top-k slot carries (the SDK's sentinel)."""


@dataclass(frozen=True)
class Choice:
    """One completion as OpenAI shows it.

    Attributes:
        pieces: the text each shown token adds (the last one cut at a stop string).
        logprobs: per shown token (None: an echoed prompt's first token, which has none).
        topk: alternatives per shown token (None inside: that first prompt token).
        topk_k: alternatives per token asked for (None: no logprobs asked).
    """

    index: int
    tokens: list[int]
    pieces: list[str]
    logprobs: list[float | None]
    topk: list[list[tuple[int, float]] | None] | None
    topk_k: int | None
    finish_reason: FinishReason | None  # None: a choice still sampling
    num_sampled: int

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def choices(results: Sequence[SampleResult], text: ModelText, eos: Sequence[int],
            stops: list[str] | None, topk_k: int | None,
            echo_prompts: Sequence[list[int]] | None = None) -> list[Choice]:
    """The choices of one request, prompt-major (``index = prompt * n + sample``); with
    ``echo_prompts`` (one per result, asked with prompt logprobs) each starts with its prompt."""
    out: list[Choice] = []
    for i, result in enumerate(results):
        for seq in result.sequences:
            choice = _choice(len(out), seq, text, eos, stops, topk_k)
            if echo_prompts is not None:
                choice = _echoed(echo_prompts[i], result, choice, text)
            out.append(choice)
    return out


def _echoed(prompt: list[int], result: SampleResult, c: Choice, text: ModelText) -> Choice:
    """``c`` preceded by its prompt: the prompt's tokens, text and logprobs (None at 0)."""
    assert result.prompt_logprobs is not None, "echo asks for prompt logprobs"
    logprobs: list[float | None] = [None, *(float(x) for x in result.prompt_logprobs[1:])]
    topk = None
    if c.topk is not None or result.topk_prompt_logprobs is not None:
        rows = (topk_rows(result.topk_prompt_logprobs, len(prompt))
                if result.topk_prompt_logprobs is not None else [[] for _ in prompt])
        topk = [None, *rows[1:], *(c.topk or [])]
    return Choice(c.index, [*prompt, *c.tokens], [*text.text_deltas(prompt), *c.pieces],
                  [*logprobs, *c.logprobs], topk, c.topk_k, c.finish_reason, c.num_sampled)


def _choice(index: int, seq: SampledSequence, text: ModelText, eos: Sequence[int],
            stops: list[str] | None, topk_k: int | None) -> Choice:
    tokens = list(seq.tokens)
    shown = len(tokens) - 1 if seq.stop_reason == "stop" and tokens and tokens[-1] in eos \
        else len(tokens)
    pieces = text.text_deltas(tokens[:shown])
    full = "".join(pieces)
    cut = min((at for at in (full.find(s) for s in stops or ()) if at >= 0), default=-1)
    if seq.stop_reason == "stop" and cut >= 0:
        pieces, shown = _clip(pieces, cut)
    topk = topk_rows(seq.topk_logprobs, shown) if seq.topk_logprobs is not None else None
    return Choice(index, tokens[:shown], pieces[:shown], list(seq.logprobs[:shown]), topk,
                  topk_k, "stop" if seq.stop_reason == "stop" else "length", len(tokens))


def topk_rows(topk: TopkLogprobs, shown: int) -> list[list[tuple[int, float]] | None]:
    """The flat ``[length, k]`` alternatives as rows, sentinel slots dropped."""
    k = topk.k
    return [[(int(t), float(lp)) for t, lp in zip(topk.token_ids[i * k:(i + 1) * k],
                                                  topk.logprobs[i * k:(i + 1) * k], strict=True)
             if lp > SENTINEL_LOGPROB]
            for i in range(min(shown, topk.length))]


def _clip(pieces: list[str], cut: int) -> tuple[list[str], int]:
    """The pieces up to text offset ``cut``: the tokens before it, the one it falls in cut."""
    kept: list[str] = []
    at = 0
    for piece in pieces:
        if at >= cut:
            break
        kept.append(piece[:cut - at])
        at += len(piece)
    return kept, len(kept)


def usage(prompt_lengths: Sequence[int], n: int, made: Sequence[Choice]) -> Usage:
    prompt = sum(prompt_lengths) * n
    completion = sum(c.num_sampled for c in made)
    return Usage(prompt_tokens=prompt, completion_tokens=completion,
                 total_tokens=prompt + completion)


def body(kind: Kind, head: ResponseHead, made: list[Choice], text: ModelText, counts: Usage,
         with_token_ids: bool) -> Response:
    """A whole (non-streamed) response."""
    if kind == "completion":
        return CompletionResponse(**dict(head), object="text_completion", usage=counts,
                                  choices=[_completion_choice(c, text, with_token_ids)
                                           for c in made])
    return ChatCompletionResponse(**dict(head), object="chat.completion", usage=counts,
                                  choices=[_chat_choice(c, text, with_token_ids) for c in made])


def _finished(c: Choice) -> FinishReason:
    if c.finish_reason is None:
        raise RuntimeError(f"choice {c.index} is rendered whole before it finished")
    return c.finish_reason


def _completion_choice(c: Choice, text: ModelText, with_token_ids: bool) -> CompletionChoice:
    logprobs = None if c.topk_k is None else _completion_logprobs(c, text, range(len(c.tokens)))
    choice = CompletionChoice(index=c.index, finish_reason=_finished(c), logprobs=logprobs,
                              text=c.text)
    if with_token_ids:  # vLLM's ``return_token_ids`` extension
        choice.token_ids = c.tokens
    return choice


def _chat_choice(c: Choice, text: ModelText, with_token_ids: bool) -> ChatChoice:
    logprobs = None if c.topk_k is None else _chat_logprobs(c, text, range(len(c.tokens)))
    choice = ChatChoice(index=c.index, finish_reason=_finished(c), logprobs=logprobs,
                        message=ChatMessage(role="assistant", content=c.text))
    if with_token_ids:
        choice.token_ids = c.tokens
    return choice


def chunks(kind: Kind, head: ResponseHead, made: list[Choice], text: ModelText,
           counts: Usage | None) -> Iterator[Chunk]:
    """The stream of whole choices: per choice a role chunk (chat), one chunk per shown
    token, a chunk with the finish reason; then the usage chunk when asked for. (A stream
    sent while sampling sends the same chunks, those of different choices interleaved.)"""
    for c in made:
        if kind == "chat":
            yield role_chunk(head, c.index)
        offset = 0
        for i, piece in enumerate(c.pieces):
            yield token_chunk(kind, head, c, text, i, offset)
            offset += len(piece)
        yield finish_chunk(kind, head, c)
    if counts is not None:
        yield usage_chunk(kind, head, counts)


def role_chunk(head: ResponseHead, index: int) -> ChatCompletionChunk:
    """A chat stream's first chunk of a choice."""
    return ChatCompletionChunk(**dict(head), object="chat.completion.chunk", choices=[
        ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content=""),
                        logprobs=None, finish_reason=None)])


def token_chunk(kind: Kind, head: ResponseHead, c: Choice, text: ModelText, i: int,
                offset: int) -> Chunk:
    """The chunk of ``c``'s shown token ``i`` (``c`` holds at least its first ``i + 1``),
    whose text starts at ``offset`` of the choice's text."""
    piece = c.pieces[i]
    if kind == "completion":
        logprobs = None if c.topk_k is None else _completion_logprobs(c, text, [i], offset)
        return CompletionChunk(**dict(head), object="text_completion", choices=[
            CompletionChunkChoice(index=c.index, text=piece, logprobs=logprobs,
                                  finish_reason=None)])
    chat_logprobs = None if c.topk_k is None else _chat_logprobs(c, text, [i])
    return ChatCompletionChunk(**dict(head), object="chat.completion.chunk", choices=[
        ChatChunkChoice(index=c.index, delta=ChatDelta(content=piece), logprobs=chat_logprobs,
                        finish_reason=None)])


def finish_chunk(kind: Kind, head: ResponseHead, c: Choice) -> Chunk:
    if kind == "completion":
        return CompletionChunk(**dict(head), object="text_completion", choices=[
            CompletionChunkChoice(index=c.index, text="", logprobs=None,
                                  finish_reason=_finished(c))])
    return ChatCompletionChunk(**dict(head), object="chat.completion.chunk", choices=[
        ChatChunkChoice(index=c.index, delta=ChatDelta(), logprobs=None,
                        finish_reason=_finished(c))])


def usage_chunk(kind: Kind, head: ResponseHead, counts: Usage) -> Chunk:
    if kind == "completion":
        return CompletionChunk(**dict(head), object="text_completion", choices=[], usage=counts)
    return ChatCompletionChunk(**dict(head), object="chat.completion.chunk", choices=[],
                               usage=counts)


def _alternatives(c: Choice, positions: Sequence[int]) -> list[list[tuple[int, float]] | None]:
    """Each position's shown alternatives (None: an echoed prompt's first token)."""
    return [None if c.topk is not None and c.topk[i] is None
            else [] if c.topk is None else (c.topk[i] or [])[:c.topk_k]
            for i in positions]


def _chat_logprobs(c: Choice, text: ModelText, positions: Sequence[int]) -> ChatLogprobs:
    content = [ChatLogprob(**dict(_entry(text, c.tokens[i], c.logprobs[i])),
                           top_logprobs=[_entry(text, t, lp) for t, lp in alts or []])
               for i, alts in zip(positions, _alternatives(c, positions), strict=True)]
    return ChatLogprobs(content=content, refusal=None)


def _completion_logprobs(c: Choice, text: ModelText, positions: Sequence[int],
                         offset: int = 0) -> CompletionLogprobs:
    """The logprobs of ``positions`` (consecutive; the first one's text starts at ``offset``)."""
    alternatives = _alternatives(c, positions)
    offsets, at = [], offset
    for i in positions:
        offsets.append(at)
        at += len(c.pieces[i])
    top = ([None if alts is None else {text.token_text(t): lp for t, lp in alts}
            for alts in alternatives] if c.topk_k else None)
    return CompletionLogprobs(tokens=[text.token_text(c.tokens[i]) for i in positions],
                              token_logprobs=[c.logprobs[i] for i in positions],
                              top_logprobs=top, text_offset=offsets)


def _entry(text: ModelText, token: int, logprob: float | None) -> TopLogprob:
    piece = text.token_text(token)
    return TopLogprob(token=piece, logprob=logprob, bytes=list(piece.encode()))
