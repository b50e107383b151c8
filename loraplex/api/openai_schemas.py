"""Request bodies of the OpenAI-compatible routes (``/v1/completions``, ``/v1/chat/completions``),
named and shaped as OpenAI's API reference names them.

Fields the server cannot honour (penalties, ``logit_bias``, ``best_of``, tools) are
rejected with a 400 naming the field rather than silently ignored; unknown extra fields are
ignored, as OpenAI-compatible servers do. Knows nothing of tokenizers or the scheduler.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from loraplex.api.model_input import data_url_image
from loraplex.domain.sampling import StopCondition
from loraplex.errors import user_error

MAX_TOP_LOGPROBS = 20
"""OpenAI's own bound for ``top_logprobs`` (and for ``logprobs`` of legacy completions)."""

MAX_N = 128
"""Most choices per prompt (the sampler's ``num_samples`` bound)."""

MAX_PROMPTS = 64
"""Most prompts in one ``/v1/completions`` request (each is one sample request)."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _SamplingFields(BaseModel):
    """What completions and chat completions share."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = -1
    """Not OpenAI's; vLLM's extension (``extra_body``), -1 disables."""
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    return_token_ids: bool = False
    """vLLM's extension: each choice also carries its ``token_ids``."""
    ignore_eos: bool = False
    """vLLM's extension: sample past EOS (stop strings still apply)."""

    def stop_strings(self) -> list[str] | None:
        """None: stop at EOS only; otherwise these strings, then EOS. Any number of them, as
        vLLM takes (OpenAI's cap of 4 is not kept), bounded in bytes like the Tinker route's."""
        if self.stop is None:
            return None
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        StopCondition(strings=tuple(stops)).validate("stop")
        return stops or None

    def check_supported(self) -> None:
        """Raises UserError naming a field this server does not implement."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise user_error(name, "not supported by this server (use 0 or leave it out)")
        if self.logit_bias:
            raise user_error("logit_bias", "not supported by this server")

    @property
    def include_usage_chunk(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``. ``prompt``: text, token ids, or a list of either."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if isinstance(self.prompt, list) and self.prompt and \
                not isinstance(self.prompt[0], int) and len(self.prompt) > MAX_PROMPTS:
            raise user_error("prompt", f"at most {MAX_PROMPTS} prompts per request")
        if self.best_of not in (None, self.n):
            raise user_error("best_of", "not supported by this server (leave it out)")
        if self.suffix:
            raise user_error("suffix", "not supported by this server")


#: What an ``image_url`` part becomes in the rendered text: Qwen-VL's markers around one
#: placeholder, which the route replaces by the image chunk.
IMAGE_MARK = "<|vision_start|><|image_pad|><|vision_end|>"


class ChatMessage(BaseModel):
    """One message; ``content`` as text or as a list of ``{"type": "text", "text": ...}`` and
    ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self, field: str, images: list[tuple[bytes, str, str]] | None = None) -> str:
        """The content as text; each image part (with ``images`` to collect them: (bytes,
        format, field)) as `IMAGE_MARK`."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for i, part in enumerate(self.content):
            where = f"{field}.content[{i}]"
            if part.get("type") == "image_url" and images is not None:
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str):
                    raise user_error(f"{where}.image_url.url", "required (a data: URL)")
                images.append((*data_url_image(url, f"{where}.image_url.url"), where))
                parts.append(IMAGE_MARK)
                continue
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise user_error(where, "only text and image_url parts are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, str | bool | int | float] | None = Field(default=None,
                                                                            max_length=16)
    """vLLM's extension: extra chat-template variables (e.g. ``enable_thinking``)."""

    def check_supported(self) -> None:
        super().check_supported()
        if self.tools:
            raise user_error("tools", "tool calling is not supported by this server")
        if self.response_format not in (None, {"type": "text"}):
            raise user_error("response_format", "only {'type': 'text'} is supported")
        if self.top_logprobs is not None and not self.logprobs:
            raise user_error("top_logprobs", "needs logprobs: true")

    @property
    def completion_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens


OpenAIRequest = CompletionRequest | ChatCompletionRequest

class TokenizeRequest(BaseModel):
    """``prompt`` (text) or ``messages`` (rendered with the chat template first)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    """Bounded by `openai_text.check_text_budget` before it is encoded."""
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]
