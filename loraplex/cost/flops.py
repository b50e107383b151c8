"""FLOP accounting for dense and MoE transformers (2 FLOPs per multiply-add).

Per token, a forward pass costs ``2·N`` in matmuls (N = `ModelCard.matmul_params`: blocks and
output head with routed experts at top-k; the embedding lookup is free) plus attention,
``2·heads·(d_qk + d_v)`` per attended position per layer. A causal sequence of length s
attends ``s²/2`` positions in total; tokens appended after ``c`` cached ones attend
``n·c + n²/2`` (sliding-window layers cap each token's span at the window).

Training a sequence: full fine-tuning is ``6·N`` per token (forward 2N, activation grads 2N,
weight grads 2N); LoRA on a frozen base skips the base weight grads, ``4·N``, plus
``6·r·(d_in + d_out)`` per adapted matrix. Attention has no weights: its backward is twice its
forward, ``3×`` in total either way. Activation checkpointing adds one forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from loraplex.domain.lora import LoraConfig
from loraplex.domain.model_card import ModelCard
from loraplex.errors import user_error


def attended_positions(start: float, new: float, window: float | None = None) -> float:
    """Positions attended in total by ``new`` tokens appended after ``start`` cached ones.

    Token i (1-based) attends ``start + i`` positions, or at most ``window``; summed in the
    continuum this is ``∫ min(x, window) dx`` over ``[start, start + new]``.
    """
    if start < 0 or new < 0:
        raise user_error("tokens", f"token counts must be ≥ 0, got start={start}, new={new}")
    end = start + new
    if window is None or end <= window:
        return (end * end - start * start) / 2.0
    if start >= window:
        return window * new
    return (window * window - start * start) / 2.0 + window * (end - window)


def attention_flops(card: ModelCard, new: float, start: float = 0.0) -> float:
    """Attention FLOPs (``QKᵀ`` and ``P·V``) of ``new`` tokens after ``start`` cached ones; a
    hybrid's linear-attention layers cost the same for every token, whatever the context."""
    per_layer = card.attention_flops_per_position_per_layer
    full = card.num_full_attention_layers * attended_positions(start, new)
    sliding = card.num_sliding_layers * attended_positions(start, new, card.sliding_window)
    linear = card.num_linear_layers * card.linear_flops_per_token_per_layer * new
    return per_layer * (full + sliding) + linear


def forward_flops(card: ModelCard, new: float, start: float = 0.0) -> float:
    """Forward FLOPs of ``new`` tokens after ``start`` cached ones (a prefill chunk, or a whole
    sequence with ``start = 0``)."""
    return 2.0 * card.matmul_params * new + attention_flops(card, new, start)


@dataclass(frozen=True)
class TrainingMethod:
    """How the policy is trained.

    Attributes:
        kind: ``lora`` (frozen base, adapters trained) or ``full`` (every weight trained).
        lora: adapter rank and targets (LoRA only; Tinker adapts attention, MLP/experts and the
            output head by default).
        activation_checkpointing: recompute activations in the backward (+1 forward).
    """

    kind: Literal["lora", "full"] = "lora"
    lora: LoraConfig = field(default_factory=lambda: LoraConfig(rank=32))
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("lora", "full"):
            raise user_error("training.kind", f"expected 'lora' or 'full', got {self.kind!r}")


def adapter_flops_per_token_per_pass(card: ModelCard, method: TrainingMethod) -> float:
    """One pass (forward, or one kind of gradient) through the adapters a token meets:
    ``2·Σ r·(d_in + d_out)``. Zero for full fine-tuning."""
    if method.kind == "full":
        return 0.0
    c = method.lora
    return 2.0 * card.lora_rank_widths(c.rank, attn=c.train_attn, mlp=c.train_mlp,
                                       unembed=c.train_unembed)


def training_flops(card: ModelCard, seq_len: float, method: TrainingMethod) -> float:
    """FLOPs of one forward_backward over a causal sequence of ``seq_len`` tokens.

    LoRA: ``(4·N + 6·r·W)·s + 3·A(s)``; full: ``6·N·s + 3·A(s)``, with ``W`` the summed
    widths of the adapted matrices and ``A(s)`` the causal attention FLOPs. Checkpointing adds
    a forward, ``(2·N + 2·r·W)·s + A(s)``.
    """
    linear_fwd = 2.0 * card.matmul_params * seq_len
    adapter_pass = adapter_flops_per_token_per_pass(card, method) * seq_len
    attn_fwd = attention_flops(card, seq_len)
    linear = 3.0 * linear_fwd if method.kind == "full" else 2.0 * linear_fwd + 3.0 * adapter_pass
    total = linear + 3.0 * attn_fwd
    if method.activation_checkpointing:
        total += linear_fwd + adapter_pass + attn_fwd
    return total


def policy_forward_flops(card: ModelCard, seq_len: float, method: TrainingMethod) -> float:
    """A no-grad forward of the trained policy (base + adapters) over a sequence, as in an
    old-policy logprob recompute."""
    adapter_pass = adapter_flops_per_token_per_pass(card, method) * seq_len
    return forward_flops(card, seq_len) + adapter_pass
