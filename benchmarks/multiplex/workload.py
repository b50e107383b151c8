"""`Workload`: what one tenant of the multiplex benchmark does per step, the fields of its
`tenant.Job` a run sets; the scale-out benchmark's throughput phase runs the same tenants.

Plain data; knows nothing of servers or runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Workload:
    """What one tenant does per step.

    Attributes:
        sft_batch, seq_len: SFT sequences per step and tokens per sequence.
        grpo_prompts, group_size, prompt_len, max_tokens: GRPO prompts per step, samples per
            prompt, prompt tokens, new tokens per sample.
        rank: LoRA rank.
        vocab_limit: token ids are drawn from [1, vocab_limit) (the served model's vocabulary
            must be larger).
        warmup_steps: untimed steps per tenant before its timed ones.
    """

    sft_batch: int = 2
    seq_len: int = 128
    grpo_prompts: int = 1
    group_size: int = 4
    prompt_len: int = 48
    max_tokens: int = 16
    rank: int = 16
    vocab_limit: int = 2048
    warmup_steps: int = 1

    def job(self, mode: str, batch_multiplier: int = 1) -> dict[str, Any]:
        """The `tenant.Job` fields of a ``mode`` loop (``sft`` or ``grpo``), ``batch`` times
        ``batch_multiplier`` (one tenant sending K tenants' batch)."""
        batch = self.sft_batch if mode == "sft" else self.grpo_prompts
        return {"mode": mode, "batch": batch * batch_multiplier, "seq_len": self.seq_len,
                "prompt_len": self.prompt_len, "group_size": self.group_size,
                "max_tokens": self.max_tokens, "rank": self.rank,
                "vocab_limit": self.vocab_limit, "warmup_steps": self.warmup_steps}

    def tokens_per_step(self, mode: str) -> int:
        """Trained tokens of one tenant step."""
        if mode == "sft":
            return self.sft_batch * self.seq_len
        return self.grpo_prompts * self.group_size * (self.prompt_len + self.max_tokens - 1)
