"""`ExpertSpec`: the routed-experts numbers of a mixture-of-experts base model (Qwen3-MoE,
Qwen3.5-MoE).

Parsed from ``config.json`` keys ``num_experts`` (transformers 5 writes ``num_local_experts``),
``num_experts_per_tok``, ``moe_intermediate_size``, ``norm_topk_prob``, ``decoder_sparse_step``
and ``mlp_only_layers``: layer ``i`` routes its tokens to experts when ``i`` is not in
``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (transformers'
``Qwen3MoeDecoderLayer``); the other layers keep a dense MLP of ``intermediate_size``.
Qwen3.5-MoE: every layer sparse, the top-k always renormalised, and a shared expert
(``shared_expert_intermediate_size``) beside the routed ones, its output scaled by
``sigmoid(shared_expert_gate · h)``. gpt-oss (``num_local_experts``, the experts' width in
``intermediate_size``): a router with a bias whose top-k *logits* are softmaxed, experts with
biases, and a clamped SwiGLU (``swiglu_limit``, ``swiglu_alpha``: ``(up + 1) · g·σ(α·g)`` with
``g ≤ limit``, ``|up| ≤ limit``). Knows no tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from loraplex.errors import user_error


@dataclass(frozen=True)
class ExpertSpec:
    """Routed experts of the sparse layers.

    Attributes:
        num_experts: experts per sparse layer (E).
        top_k: experts each token is routed to (k).
        expert_intermediate_size: hidden width of one expert's gated MLP.
        norm_topk_prob: renormalise the k routing weights to sum to 1 (else they are the
            softmax probabilities of the chosen experts as they are).
        sparse_layers: the model layers with routed experts, ascending.
        shared_intermediate_size: the shared expert's width (0: none).
        router: ``softmax_topk`` (top-k of the softmax, Qwen) or ``topk_softmax`` (softmax of
            the top-k logits, gpt-oss).
        biases: the router and the experts have biases (gpt-oss).
        swiglu_limit, swiglu_alpha: gpt-oss's clamped SwiGLU (None: plain SiLU · up).
    """

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    norm_topk_prob: bool
    sparse_layers: tuple[int, ...]
    shared_intermediate_size: int = 0
    router: Literal["softmax_topk", "topk_softmax"] = "softmax_topk"
    biases: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers

    def layer_params(self, hidden_size: int) -> int:
        """Router + experts (+ the shared expert and its gate) of one sparse layer."""
        e, d, f = self.num_experts, hidden_size, self.expert_intermediate_size
        shared = 3 * d * self.shared_intermediate_size + d if self.shared_intermediate_size else 0
        biases = e + e * (2 * f + d) if self.biases else 0
        return e * d + e * 3 * d * f + shared + biases


def parse_experts(config: Mapping[str, Any], num_layers: int, shared: bool = False,
                  renormalize: bool = False) -> ExpertSpec:
    """The experts of a ``qwen3_moe`` config, or with ``shared`` a ``qwen3_5_moe`` one (a
    shared expert; the top-k renormalised unless the config says otherwise).

    Raises:
        UserError: missing or inconsistent expert keys (named), or shared experts in a
            family without them (Qwen2-MoE's).
    """
    shared_size = int(config.get("shared_expert_intermediate_size") or 0)
    if shared_size and not shared:
        raise user_error("config.shared_expert_intermediate_size",
                         "shared experts are not supported by this engine for this family")
    num_experts, top_k = _routing(config, "num_experts", "num_local_experts")
    size = _positive_int(config, "moe_intermediate_size")
    step = int(config.get("decoder_sparse_step") or 1)
    if step < 1:
        raise user_error("config.decoder_sparse_step", f"must be ≥ 1, got {step}")
    dense_only = {int(i) for i in config.get("mlp_only_layers") or ()}
    sparse = tuple(i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0)
    return ExpertSpec(num_experts=num_experts, top_k=top_k, expert_intermediate_size=size,
                      norm_topk_prob=bool(config.get("norm_topk_prob", shared or renormalize)),
                      sparse_layers=sparse, shared_intermediate_size=shared_size)


def parse_gpt_oss_experts(config: Mapping[str, Any], num_layers: int) -> ExpertSpec:
    """The experts of a ``gpt_oss`` config (every layer sparse)."""
    num_experts, top_k = _routing(config, "num_local_experts", "num_experts")
    size = _positive_int(config, "intermediate_size")
    return ExpertSpec(num_experts=num_experts, top_k=top_k, expert_intermediate_size=size,
                      norm_topk_prob=False, sparse_layers=tuple(range(num_layers)),
                      router="topk_softmax", biases=True,
                      swiglu_limit=float(config.get("swiglu_limit", 7.0)),
                      swiglu_alpha=float(config.get("swiglu_alpha", 1.702)))


def _routing(config: Mapping[str, Any], experts_key: str, fallback_key: str) -> tuple[int, int]:
    """``(num_experts, top_k)``: ``experts_key`` (else ``fallback_key``), a positive integer,
    and ``num_experts_per_tok`` in ``[1, num_experts]``; errors name ``experts_key``."""
    num_experts = config.get(experts_key) or config.get(fallback_key)
    if not isinstance(num_experts, int) or num_experts < 1:
        raise user_error(f"config.{experts_key}",
                         f"must be a positive integer, got {num_experts!r}")
    top_k = config.get("num_experts_per_tok")
    if not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise user_error("config.num_experts_per_tok",
                         f"must be in [1, {experts_key}={num_experts}], got {top_k!r}")
    return num_experts, top_k


def _positive_int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or value < 1:
        raise user_error(f"config.{key}", f"must be a positive integer, got {value!r}")
    return value
