"""`SampleLimits` and `check_sample_work`: what a sample request may ask of this engine.

Every problem is a `UserError` naming the field as the SDK spells it (``prompt[3]``,
``sampling_params.top_p``, ``topk_sample_logprobs``...), raised before anything is allocated,
so a bad request fails alone. The API layer checks the same things it can know; the engine
re-checks because it is the one that knows the vocabulary, context and cache size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loraplex.domain.tokens import check_token_range
from loraplex.domain.work import SampleWork
from loraplex.errors import user_error

#: Most alternatives per position (vLLM's default ``max_logprobs`` is 20; SDFT-style top-K
#: distillation asks for tens).
MAX_TOPK_LOGPROBS = 128


@dataclass(frozen=True)
class SampleLimits:
    """What this engine can serve.

    Attributes:
        vocab_size: valid token ids are ``0 ≤ id < vocab_size``.
        max_context: longest prompt + completion (the model's limit, the configured limit and
            the KV cache's size, whichever is smallest).
        num_blocks, block_size: KV cache pages (a request's prompt and per-sample tails must
            fit at once).
        has_tokenizer: stop strings can be detokenized.
    """

    vocab_size: int
    max_context: int
    num_blocks: int
    block_size: int
    has_tokenizer: bool


def check_sample_work(work: SampleWork, limits: SampleLimits) -> None:
    """Raise a field-named `UserError` for anything this engine cannot do as asked."""
    prompt = np.asarray(work.prompt, dtype=np.int64)
    if prompt.size == 0:
        raise user_error("prompt", "empty prompt")
    if prompt.size > limits.max_context - 1:
        raise user_error("prompt", f"{prompt.size} tokens leave no room for a completion in "
                         f"the context of {limits.max_context}")
    check_token_range(prompt, limits.vocab_size, "prompt")
    params = work.params.validate("sampling_params")
    check_token_range(np.asarray(params.stop.token_ids, dtype=np.int64), limits.vocab_size,
                      "sampling_params.stop")
    if any(s == "" for s in params.stop.strings):
        raise user_error("sampling_params.stop", "stop strings must not be empty")
    if params.stop.strings and not limits.has_tokenizer:
        raise user_error("sampling_params.stop", "stop strings need the model's tokenizer.json; "
                         "pass stop token ids instead")
    if work.num_samples < 1:
        raise user_error("num_samples", f"must be ≥ 1, got {work.num_samples}")
    for name in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
        k = getattr(work, name)
        if not 0 <= k <= min(MAX_TOPK_LOGPROBS, limits.vocab_size):
            raise user_error(name, f"must be in [0, {min(MAX_TOPK_LOGPROBS, limits.vocab_size)}]"
                             f", got {k}")
    last_n = work.prompt_logprobs_last_n
    if last_n is not None and not (work.prompt_logprobs and 1 <= last_n <= prompt.size - 1):
        raise user_error("prompt_logprobs_last_n",
                         f"needs prompt_logprobs and 1 ≤ n ≤ {prompt.size - 1}, got {last_n}")
    size = limits.block_size
    blocks = -(-prompt.size // size) + (work.num_samples - 1) * (prompt.size % size > 0)
    if blocks > limits.num_blocks:
        raise user_error("num_samples", f"the prompt and {work.num_samples} samples need "
                         f"{blocks} KV-cache blocks at once; the cache has {limits.num_blocks}")
