"""What a LoRA adapter is, independent of where its tensors live.

Tinker's `LoraConfig` (rank, seed, train_attn/mlp/unembed) plus the scaling numerator alpha
(scale = alpha / rank, "LoRA Without Regret" uses alpha = 32 for every rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from loraplex.errors import user_error

DEFAULT_LORA_ALPHA = 32.0


@dataclass(frozen=True)
class LoraConfig:
    """Shape and trainable targets of one adapter.

    Attributes:
        rank: LoRA rank r (1 ≤ r ≤ the engine's configured maximum).
        alpha: scaling numerator; the delta is (alpha / rank) · B·A·x.
        train_attn: adapt q/k/v/o projections.
        train_mlp: adapt gate/up/down projections.
        train_unembed: adapt the output head (named ``unembed_tokens`` on export).
        seed: seeds A's init (B starts at zero, so a fresh adapter equals the base model).
    """

    rank: int
    alpha: float = DEFAULT_LORA_ALPHA
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    seed: int | None = None

    def validate(self, max_rank: int, field: str = "lora_config") -> LoraConfig:
        if not isinstance(self.rank, int) or self.rank < 1:
            raise user_error(f"{field}.rank", f"must be a positive integer, got {self.rank!r}")
        if self.rank > max_rank:
            raise user_error(f"{field}.rank", f"{self.rank} exceeds the server maximum {max_rank}")
        if not (self.train_attn or self.train_mlp or self.train_unembed):
            raise user_error(field, "one of train_attn, train_mlp, train_unembed must be true")
        return self

    @property
    def scale(self) -> float:
        return self.alpha / self.rank
