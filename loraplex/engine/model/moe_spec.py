"""`ExpertSpec`: the routed-experts numbers of a mixture-of-experts base model (Qwen3-MoE).

Parsed from ``config.json`` keys ``num_experts`` (transformers 5 writes ``num_local_experts``),
``num_experts_per_tok``, ``moe_intermediate_size``, ``norm_topk_prob``, ``decoder_sparse_step``
and ``mlp_only_layers``: layer ``i`` routes its tokens to experts when ``i`` is not in
``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0`` (transformers'
``Qwen3MoeDecoderLayer``); the other layers keep a dense MLP of ``intermediate_size``.
Knows no tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    """

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    norm_topk_prob: bool
    sparse_layers: tuple[int, ...]

    def is_sparse(self, layer: int) -> bool:
        return layer in self.sparse_layers

    def layer_params(self, hidden_size: int) -> int:
        """Router + experts of one sparse layer."""
        e, d, f = self.num_experts, hidden_size, self.expert_intermediate_size
        return e * d + e * 3 * d * f


def parse_experts(config: Mapping[str, Any], num_layers: int) -> ExpertSpec:
    """The experts of a ``qwen3_moe`` config.

    Raises:
        UserError: missing or inconsistent expert keys (named), or shared experts (a
            different family: Qwen2-MoE).
    """
    if config.get("shared_expert_intermediate_size"):
        raise user_error("config.shared_expert_intermediate_size",
                         "shared experts are not supported by this engine")
    num_experts = config.get("num_experts") or config.get("num_local_experts")
    if not isinstance(num_experts, int) or num_experts < 1:
        raise user_error("config.num_experts", f"must be a positive integer, got {num_experts!r}")
    top_k = config.get("num_experts_per_tok")
    if not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise user_error("config.num_experts_per_tok",
                         f"must be in [1, num_experts={num_experts}], got {top_k!r}")
    size = config.get("moe_intermediate_size")
    if not isinstance(size, int) or size < 1:
        raise user_error("config.moe_intermediate_size",
                         f"must be a positive integer, got {size!r}")
    step = int(config.get("decoder_sparse_step") or 1)
    if step < 1:
        raise user_error("config.decoder_sparse_step", f"must be ≥ 1, got {step}")
    dense_only = {int(i) for i in config.get("mlp_only_layers") or ()}
    sparse = tuple(i for i in range(num_layers) if i not in dense_only and (i + 1) % step == 0)
    return ExpertSpec(num_experts=num_experts, top_k=top_k, expert_intermediate_size=size,
                      norm_topk_prob=bool(config.get("norm_topk_prob", False)),
                      sparse_layers=sparse)
