"""Turning clamp prompts and completions into token sequences and Tinker datums.

Uses the served model's own chat template (through the tokenizer the SDK hands out), so what
is trained is what is sampled. A completion ends with the chat end-of-turn token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tinker

END_OF_TURN_CANDIDATES = ("<|im_end|>", "<|eot_id|>")


@dataclass(frozen=True)
class Renderer:
    """Chat-template rendering for one tokenizer.

    Attributes:
        tokenizer: a Hugging Face tokenizer (from `TrainingClient.get_tokenizer()`).
        end_token: the token that ends an assistant turn; sampling stops on it.
    """

    tokenizer: Any
    end_token: int

    @staticmethod
    def for_tokenizer(tokenizer: Any) -> Renderer:
        vocab = tokenizer.get_vocab()
        for name in END_OF_TURN_CANDIDATES:
            if name in vocab:
                return Renderer(tokenizer, vocab[name])
        return Renderer(tokenizer, int(tokenizer.eos_token_id))

    def prompt_tokens(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template applied to `messages`, with the assistant generation prompt."""
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def completion_tokens(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, tokens: list[int]) -> str:
        body = [t for t in tokens if t != self.end_token]
        return str(self.tokenizer.decode(body, skip_special_tokens=True))


def _ints(values: list[int]) -> tinker.TensorData:
    return tinker.TensorData(data=values, dtype="int64", shape=[len(values)])


def _floats(values: list[float]) -> tinker.TensorData:
    return tinker.TensorData(data=values, dtype="float32", shape=[len(values)])


def sft_datum(prompt: list[int], completion: list[int], end_token: int) -> tinker.Datum:
    """Next-token datum: weight 1 on completion tokens (and the end token), 0 on the prompt."""
    tokens = prompt + completion + [end_token]
    weights = [0.0] * (len(prompt) - 1) + [1.0] * (len(completion) + 1)
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": _ints(tokens[1:]), "weights": _floats(weights)},
    )


def rl_datum(
    prompt: list[int], completion: list[int], sampler_logprobs: list[float], advantage: float
) -> tinker.Datum:
    """Importance-sampling datum: sampler logprobs and the group-centred advantage on the
    completion tokens, zeros on the prompt (no loss there)."""
    tokens = prompt + completion
    n_prompt = len(prompt) - 1
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": _ints(tokens[1:]),
            "logprobs": _floats([0.0] * n_prompt + list(sampler_logprobs)),
            "advantages": _floats([0.0] * n_prompt + [advantage] * len(completion)),
        },
    )
