"""Sampling requests and results, shaped like Tinker's SamplingParams and SampleResponse."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Literal

from loraplex.errors import UserError, user_error

StopReason = Literal["stop", "length"]
MAX_INT32 = 2**31 - 1
MAX_STOP_BYTES = 4096
"""Most UTF-8 bytes of all stop strings of a request together (no bound on their count, as
vLLM has none: lm-eval sends every ``until`` string plus EOS)."""
"""Bound of ``max_tokens`` and ``top_k`` (the engine keeps them in integer tensors)."""


@dataclass(frozen=True)
class StopCondition:
    """When a sequence stops, besides ``max_tokens``.

    Attributes:
        strings: stop when the detokenized completion contains any of these.
        token_ids: stop when one of these tokens is sampled (it is kept in the output).
        use_eos: also stop on the model's EOS tokens (the SDK's ``stop=None`` default).
    """

    strings: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()
    use_eos: bool = True

    def validate(self, field: str) -> StopCondition:
        """Non-empty strings of at most `MAX_STOP_BYTES` together; the same rule for the
        Tinker route and ``/v1``."""
        if any(s == "" for s in self.strings):
            raise user_error(field, "stop strings must not be empty")
        size = sum(len(s.encode("utf-8", "surrogatepass")) for s in self.strings)
        if size > MAX_STOP_BYTES:
            raise user_error(field, f"stop strings total {size} bytes; at most {MAX_STOP_BYTES}")
        return self


@dataclass(frozen=True)
class SamplingParams:
    """Tinker's SamplingParams after decoding.

    Attributes:
        max_tokens: completion budget (None: the server default, bounded by the context).
        temperature: 0 means greedy.
        top_k: keep the k most likely tokens; -1 (or 0) disables.
        top_p: nucleus mass in (0, 1].
        seed: same seed → same tokens; None draws a fresh seed.
        stop: stop strings / token ids / EOS.
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop: StopCondition = StopCondition()

    def validate(self, field: str = "sampling_params") -> SamplingParams:
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or not 0 <= self.max_tokens <= MAX_INT32
        ):
            raise user_error(f"{field}.max_tokens", f"must be in [0, 2^31), got "
                             f"{self.max_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise user_error(f"{field}.temperature", f"must be ≥ 0, got {self.temperature!r}")
        if not (0 < self.top_p <= 1):
            raise user_error(f"{field}.top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or not -1 <= self.top_k <= MAX_INT32:
            raise user_error(f"{field}.top_k", f"must be -1 (off) or in [0, 2^31), got "
                             f"{self.top_k!r}")
        self.stop.validate(f"{field}.stop")
        return self


@dataclass(frozen=True)
class TopkLogprobs:
    """k alternatives per position: ``token_ids``/``logprobs`` flat, row-major ``[length, k]``.

    Empty slots carry the SDK's sentinel (token 0, logprob -99999.0).
    """

    k: int
    length: int
    token_ids: array[int]  # typecode "i"
    logprobs: array[float]  # typecode "f"


@dataclass(frozen=True)
class PromptAltTokens:
    """``k`` independent draws at every prompt position after the first: ``tokens``
    (typecode ``q``) and ``logprobs`` (typecode ``f``) flat, row-major ``[rows, k]``; row ``i``
    holds alternatives to prompt token ``i + 1`` and their logprobs under the distribution
    they were drawn from."""

    k: int
    rows: int
    tokens: array[int]
    logprobs: array[float]


@dataclass(frozen=True)
class SampledSequence:
    """One completion: tokens, the logprob of each under the sampling adapter, why it stopped."""

    tokens: array[int]  # typecode "i"
    logprobs: array[float]  # typecode "f"
    stop_reason: StopReason
    topk_logprobs: TopkLogprobs | None = None


@dataclass(frozen=True)
class SampleResult:
    """Everything one sample request returns.

    Attributes:
        sequences: ``num_samples`` completions, in request order.
        prompt_logprobs: per prompt token, NaN at index 0 and at unscored positions.
        topk_prompt_logprobs: alternatives per prompt position, when asked.
        prompt_cache_hit_tokens: prompt tokens whose KV came from the prefix cache.
        prompt_alt_tokens: random alternatives per prompt position, when asked.
    """

    sequences: tuple[SampledSequence, ...]
    prompt_logprobs: array[float] | None = None
    topk_prompt_logprobs: TopkLogprobs | None = None
    prompt_cache_hit_tokens: int = 0
    prompt_alt_tokens: PromptAltTokens | None = None


def cancelled_error() -> UserError:
    """What a cancelled sample request finishes with (its client stopped reading)."""
    return UserError("cancelled: the client stopped reading the stream")


@dataclass(frozen=True)
class SequenceDelta:
    """Completion tokens one running sequence of a streamed request gained since it last
    reported: completion positions ``start .. start + len(tokens) - 1``. Tokens, once sampled,
    never change (a preempted sequence keeps them), so deltas only append.

    Attributes:
        request_id: the request's future.
        index: the sample within the request.
        start: completion position of ``tokens[0]``.
        tokens, logprobs: typecodes ``i`` and ``f``, as in `SampledSequence`.
        topk_logprobs: the alternatives of those positions, when asked.
    """

    request_id: str
    index: int
    start: int
    tokens: array[int]
    logprobs: array[float]
    topk_logprobs: TopkLogprobs | None = None
