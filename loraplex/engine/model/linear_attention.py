"""`LinearAttention`: one gated-DeltaNet layer (Qwen3.5's linear attention) over a packed batch,
with LoRA on its projections as Tinker trains them.

transformers' ``Qwen3_5GatedDeltaNet``, row by row: the input projections (``in_proj_qkv`` →
q ‖ k ‖ v, ``in_proj_z`` → the output gate, ``in_proj_b`` → β = sigmoid(b), ``in_proj_a`` →
the decay g = −exp(A_log)·softplus(a + dt_bias)) run as ONE base GEMM of their stacked weights
(the bits of the separate ones: an output column depends on its weight row only); the causal
depthwise convolution and SiLU over q ‖ k ‖ v; L2-normalised q and k (q scaled by
``d_k ** -0.5``); the chunked delta rule (`delta_net`); an RMSNorm of each value head gated by
SiLU(z); ``out_proj``. LoRA adapts ``in_proj_q``, ``in_proj_k``, ``in_proj_v`` (the three
slices of ``in_proj_qkv``, separate adapters as Tinker exports them), ``in_proj_z`` and
``out_proj``; never b, a, the convolution or the decay.

A sampler forward reads each sequence's `Carry` from `LinearStates` (positions it has
already computed) and stores the one at its new end; a training forward starts every
sequence at position 0 and stores nothing. Knows nothing about files or scheduling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loraplex.engine.kernels.packed_linear import FrozenLinear, GemmKernel
from loraplex.engine.model.delta_net import (
    Carry,
    ChunkRows,
    DeltaLayout,
    causal_conv,
    chunked_delta_rule,
)
from loraplex.engine.model.delta_net_weights import DeltaNetWeights
from loraplex.engine.model.linear_attention_spec import LinearAttentionSpec
from loraplex.engine.model.linear_states import LinearStates
from loraplex.engine.model.lora_batch import LoraBatch
from loraplex.engine.model.packed_batch import PackedBatch

#: Tinker's LoRA targets of a linear-attention layer, in the order they are applied.
LINEAR_TARGETS = ("in_proj_q", "in_proj_k", "in_proj_v", "in_proj_z", "out_proj")
INPUT_TARGETS = LINEAR_TARGETS[:4]
L2_EPS = 1e-6


class LinearAttention:
    """One linear-attention layer (see the module docstring).

    Args:
        spec: the linear layers' shape.
        weights: this layer's tensors (its projection fields become views of the stack).
        layer: the layer's index in the model (its key in `LinearStates`).
        lora_index: the layer's position among the linear layers (its LoRA layer index).
        kernel: the packed GEMM kernel (None: F.linear).
        eps: the gated norm's epsilon.
    """

    def __init__(self, spec: LinearAttentionSpec, weights: DeltaNetWeights, layer: int,
                 lora_index: int, kernel: GemmKernel | None, eps: float) -> None:
        self.spec, self.layer, self.lora_index, self.eps = spec, layer, lora_index, eps
        stacked = torch.cat([weights.in_proj_qkv, weights.in_proj_z, weights.in_proj_b,
                             weights.in_proj_a])
        self.in_proj = FrozenLinear(stacked, kernel)
        qkv_rows = spec.conv_dim
        z_rows = spec.value_dim
        (weights.in_proj_qkv, weights.in_proj_z, weights.in_proj_b,
         weights.in_proj_a) = self.in_proj.weight.split(
            (qkv_rows, z_rows, spec.num_v_heads, spec.num_v_heads))
        self.out_proj = FrozenLinear(weights.out_proj, kernel)
        self.conv_C_K = weights.conv_C_1_K[:, 0, :]
        self.weights = weights

    def layout(self, batch: PackedBatch) -> DeltaLayout:
        """The forward's `DeltaLayout` (the same for every linear layer of a model)."""
        return DeltaLayout.of(batch.seq_row_start, batch.seq_num_new, batch.seq_num_cached,
                              batch.num_rows, self.spec.conv_kernel, batch.tokens_R.device)

    def __call__(self, h_R_D: torch.Tensor, batch: PackedBatch, layout: DeltaLayout,
                 lora: LoraBatch | None, states: LinearStates | None) -> torch.Tensor:
        spec, rows = self.spec, h_R_D.shape[0]
        q, k, v, z, b, a = self.in_proj(h_R_D).split(spec.projection_sizes(), dim=1)
        if lora is not None:
            q, k, v, z = lora.add_deltas([q, k, v, z], h_R_D, INPUT_TARGETS, self.lora_index)
        carries = self._carries(batch, states)
        mixed_R_C, conv_tails = causal_conv(
            torch.cat([q, k, v], dim=1), self.conv_C_K, layout,
            [None if c is None else c.conv_W_C for c in carries])
        q, k, v = mixed_R_C.split((spec.key_dim, spec.key_dim, spec.value_dim), dim=1)
        w = self.weights
        beta = torch.sigmoid(b).float()
        g = -w.a_log_H.float().exp() * F.softplus(a.float() + w.dt_bias_H)
        chunk_rows = ChunkRows(
            q=_l2norm(q.float().view(rows, spec.num_k_heads, -1)) * spec.k_head_dim ** -0.5,
            k=_l2norm(k.float().view(rows, spec.num_k_heads, -1)),
            v=v.float().view(rows, spec.num_v_heads, -1), g=g, beta=beta)
        core_R_H_V, kept = chunked_delta_rule(chunk_rows, layout, carries,
                                              keep_carry=states is not None)
        if states is not None:
            for i, ((state, tail_rows), conv) in enumerate(zip(kept, conv_tails, strict=True)):
                states.put(batch.seq_state_key[i], self.layer,
                           Carry(state.detach(), tail_rows, conv))
        out = self._gated_norm(core_R_H_V.to(h_R_D.dtype), z.view(rows, spec.num_v_heads, -1))
        y_R_D = self.out_proj(out.reshape(rows, spec.value_dim))
        if lora is not None:
            y_R_D = lora.add_delta(y_R_D, out.reshape(rows, spec.value_dim), "out_proj",
                                   self.lora_index)
        return y_R_D

    def _carries(self, batch: PackedBatch, states: LinearStates | None) -> list[Carry | None]:
        """Each sequence's carry where it has cached positions (None: it starts at 0)."""
        if not any(batch.seq_num_cached):
            return [None] * batch.num_sequences
        assert states is not None, "cached positions without a state store"
        return [states.get(key, self.layer) if cached else None
                for key, cached in zip(batch.seq_state_key, batch.seq_num_cached, strict=True)]

    def _gated_norm(self, x_R_H_V: torch.Tensor, z_R_H_V: torch.Tensor) -> torch.Tensor:
        """transformers' ``Qwen3_5RMSNormGated``: RMSNorm over each head, times SiLU(z)."""
        x32 = x_R_H_V.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weights.norm_D * x32.to(x_R_H_V.dtype)
        return (out * F.silu(z_R_H_V.to(torch.float32))).to(x_R_H_V.dtype)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """transformers' (and FLA's) ``l2norm``: ``x · rsqrt(Σx² + 1e-6)``."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)
