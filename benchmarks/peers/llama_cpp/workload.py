"""The shapes both sides sample, and the prompts: the same token ids go to both (llama.cpp is fed
ids, never text), drawn from a seeded generator so every round has fresh prompts (neither
side's prefix cache carries over from the round before)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    """``num_prompts`` prompts of ``prompt_len`` tokens, ``num_samples`` samples of each, each
    ``new_tokens`` long (EOS ignored)."""

    name: str
    num_prompts: int
    prompt_len: int
    num_samples: int
    new_tokens: int

    @property
    def num_sequences(self) -> int:
        return self.num_prompts * self.num_samples

    @property
    def generated(self) -> int:
        return self.num_sequences * self.new_tokens

    def label(self) -> str:
        return (f"{self.num_prompts} × {self.prompt_len} prompt × G = {self.num_samples} × "
                f"{self.new_tokens} new")


#: Issue 30's shapes: fan-out as engine_sample's SmolLM2 fan-out, batch 8 × 64, single stream.
WORKLOADS = {
    "fanout": Workload("fanout", 4, 128, 8, 64),
    "batch": Workload("batch", 8, 128, 1, 64),
    "single": Workload("single", 1, 128, 1, 128),
}
#: Sampling modes: temperature 1 (seeded; the RL policy distribution) and greedy.
TEMPERATURES = {"sample": 1.0, "greedy": 0.0}
#: First ids of the vocabulary (special tokens) are never drawn into a prompt.
FIRST_ID = 10


def prompts(workload: Workload, seed: int, vocab_size: int) -> list[list[int]]:
    """``workload.num_prompts`` random prompts of ``workload.prompt_len`` ids."""
    rng = random.Random(seed)
    return [[rng.randrange(FIRST_ID, vocab_size) for _ in range(workload.prompt_len)]
            for _ in range(workload.num_prompts)]
