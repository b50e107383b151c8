"""What the OpenAI-compatible routes answer, as pydantic models: the completion and chat bodies
and their stream chunks (the error body is `api.error_bodies.OpenAIError`). ``/openapi.json``
documents them. They are sent as ``model_dump(exclude_unset=True)`` (`wire`): a field a
response does not carry (a chat delta's ``role`` after the first chunk, ``token_ids`` unless
asked for, ``usage`` outside the usage chunk) is left out rather than sent as null, as OpenAI
and vLLM send them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from loraplex.domain.json_value import JSONObject

FinishReason = Literal["stop", "length"]


class ResponseHead(BaseModel):
    """What every body and chunk of one response shares."""

    id: str
    created: int
    model: str


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """Legacy completions' logprobs: per shown token (an echoed prompt's first: null)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


class TopLogprob(BaseModel):
    token: str
    logprob: float | None
    bytes: list[int]


class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatLogprob]
    refusal: None


class CompletionChoice(BaseModel):
    index: int
    finish_reason: FinishReason
    logprobs: CompletionLogprobs | None
    text: str
    token_ids: list[int] | None = None  # vLLM's ``return_token_ids``


class ChatMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    finish_reason: FinishReason
    logprobs: ChatLogprobs | None
    message: ChatMessage
    token_ids: list[int] | None = None


class CompletionResponse(ResponseHead):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage


class ChatCompletionResponse(ResponseHead):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(ResponseHead):
    """One server-sent event of a streamed completion (``choices`` empty in the usage chunk)."""

    object: Literal["text_completion"]
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class ChatCompletionChunk(ResponseHead):
    object: Literal["chat.completion.chunk"]
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


Response = CompletionResponse | ChatCompletionResponse
Chunk = CompletionChunk | ChatCompletionChunk


def wire(message: BaseModel) -> JSONObject:
    """``message`` as the JSON object sent: the fields it was given, in declaration order."""
    return message.model_dump(mode="json", exclude_unset=True)
