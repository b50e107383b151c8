"""`SparseMlp`: one mixture-of-experts layer's MLP over a packed batch, with every adapter's
LoRA on every expert.

Per layer: route the real tokens (`moe_dispatch.route`), lay their assignments out by expert
(`Dispatch`), run all experts' ``[gate; up]`` projections as one grouped GEMM and their down
projections as another, and sum each token's ``k`` outputs times its routing weights, slot by
slot (a fixed, row-local order). The LoRA deltas (Tinker's parameterisation, see
`engine.lora.experts`) are computed where each factor lives:

* gate/up: the shared ``A`` factor once per *token* (one grouped GEMM over the adapter
  segments of the batch rows, scaled by ``alpha/r``), then each assignment's expert-specific
  ``B`` in one grouped GEMM over the (expert × adapter) groups of the LoRA layout;
* down: the expert-specific ``A`` per assignment (grouped over (expert × adapter)), the ``k``
  results weighted and summed per token like the experts' outputs, then the shared ``B`` once
  per token (grouped over adapter segments): ``Σ_j w_j B A_j h_j = B Σ_j w_j A_j h_j``.

gpt-oss: the router and each expert's projections add biases (each base row takes its
expert's), the router softmaxes its top-k logits, and the activation is the clamped SwiGLU
``(clamp(up, ±limit) + 1) · g·σ(α·g)``, ``g = min(gate, limit)``.

A shared expert (Qwen3.5-MoE) is a dense gated MLP over every row, its output times
``sigmoid(gate · h)``, added to the routed experts' (transformers' order); LoRA adapts its
three projections (``shared_gate_proj``, ``shared_up_proj``, ``shared_down_proj``), not its gate.

Stacked LoRA tensors (`StackedTarget` of the expert targets, `engine.lora.stacking`): ``w1``,
``w3`` have ``a [L, S, Rk, d]`` (shared, by segment) and ``b [L, E·S, f, Rk]``; ``w2`` has
``a [L, E·S, Rk, f]`` and ``b [L, S, d, Rk]``; ``L`` counts the sparse layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loraplex.engine.kernels.packed_linear import FrozenLinear, GemmKernel
from loraplex.engine.model.expert_weights import ExpertWeights
from loraplex.engine.model.lora_batch import LoraBatch, grouped_linear
from loraplex.engine.model.moe_dispatch import Dispatch, LoraDispatch, TokenRows, route
from loraplex.engine.model.moe_spec import ExpertSpec

#: Router width padding in batch-invariant mode (MKL's row bits change below 16 columns).
ROUTER_COLUMN_MULTIPLE = 16
SHARED_TARGETS = ("shared_gate_proj", "shared_up_proj", "shared_down_proj")


class SparseMlp:
    """The routed MLP of one sparse layer.

    Args:
        experts: the model's expert numbers.
        weights: this layer's router and experts.
        index: the layer's position among the sparse layers (its LoRA layer index).
        row_multiple: group padding (the row multiple in batch-invariant mode, 1 in fast mode).
        kernel: the packed GEMM kernel for the shared expert (a dense MLP; None: F.linear).
    """

    def __init__(self, experts: ExpertSpec, weights: ExpertWeights, index: int,
                 row_multiple: int, kernel: GemmKernel | None = None) -> None:
        self.spec = experts
        self.weights = weights
        self.index = index
        self.row_multiple = row_multiple
        self.router_W_D = _padded_rows(weights.router_E_D, row_multiple)
        self.shared_gate_W_D = (None if weights.shared is None
                                else _padded_rows(weights.shared.gate_1_D, row_multiple))
        self.shared_linears: tuple[FrozenLinear, FrozenLinear] | None = None
        if weights.shared is not None:  # [gate; up] as one GEMM (the rows' bits unchanged)
            shared = weights.shared
            gate_up = FrozenLinear(torch.cat([shared.gate_proj, shared.up_proj]), kernel)
            shared.gate_proj, shared.up_proj = gate_up.weight.chunk(2)
            self.shared_linears = (gate_up, FrozenLinear(shared.down_proj, kernel))

    def __call__(self, h_R_D: torch.Tensor, tokens: TokenRows, lora: LoraBatch | None
                 ) -> torch.Tensor:
        e, biases = self.spec, self.weights.biases
        routing = route(h_R_D, tokens, self.router_W_D, e.num_experts, e.top_k,
                        e.norm_topk_prob, None if biases is None else biases.router_E,
                        softmax_after_topk=e.router == "topk_softmax")
        dispatch = Dispatch.of(routing, tokens, e.num_experts, self.row_multiple)
        expert_P = None if biases is None else _expert_of_rows(dispatch.offsets_E)
        lora_on = (lora is not None and dispatch.lora is not None
                   and "w1" in lora.targets and "w2" in lora.targets)
        x_P_D = h_R_D.index_select(0, dispatch.rows_P)
        y_P_2F = grouped_linear(x_P_D, self.weights.gate_up_E_2F_D, dispatch.offsets_E)
        if biases is not None:
            assert expert_P is not None
            y_P_2F = y_P_2F + biases.gate_up_E_2F.index_select(0, expert_P)
        if lora_on:
            assert lora is not None and dispatch.lora is not None
            y_P_2F = y_P_2F + self._gate_up_delta(h_R_D, lora, dispatch.lora)
        act_P_F = self._activation(y_P_2F)
        y_P_D = grouped_linear(act_P_F, self.weights.down_E_D_F, dispatch.offsets_E)
        if biases is not None:
            assert expert_P is not None
            y_P_D = y_P_D + biases.down_E_D.index_select(0, expert_P)
        out_R_D = self._to_rows(combine(y_P_D, dispatch.slot_row_N_K, routing.weights_N_K),
                                tokens)
        if lora_on:
            assert lora is not None and dispatch.lora is not None
            t_Q_Rk = self._down_shrink(act_P_F, lora, dispatch.lora)
            t_N_Rk = combine(F.pad(t_Q_Rk, (0, 0, 0, 1)), dispatch.lora.slot_row_N_K,
                             routing.weights_N_K)
            out_R_D = out_R_D + self._down_expand(self._to_rows(t_N_Rk, tokens), lora)
        if self.shared_gate_W_D is not None:
            out_R_D = out_R_D + self._shared(h_R_D, lora)
        return out_R_D

    def _activation(self, y_P_2F: torch.Tensor) -> torch.Tensor:
        """SiLU(gate)·up, or gpt-oss's clamped SwiGLU."""
        f, limit = self.spec.expert_intermediate_size, self.spec.swiglu_limit
        gate, up = y_P_2F[:, :f], y_P_2F[:, f:]
        if limit is None:
            return F.silu(gate) * up
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.spec.swiglu_alpha))

    def _shared(self, h_R_D: torch.Tensor, lora: LoraBatch | None) -> torch.Tensor:
        """The shared expert's output times its sigmoid gate, every row."""
        assert self.shared_linears is not None and self.shared_gate_W_D is not None
        gate_up, down = self.shared_linears
        gate, up = gate_up(h_R_D).chunk(2, dim=1)
        if lora is not None:
            gate, up = lora.add_deltas([gate, up], h_R_D, SHARED_TARGETS[:2], self.index)
        act_R_F = F.silu(gate) * up
        y_R_D = down(act_R_F)
        if lora is not None:
            y_R_D = lora.add_delta(y_R_D, act_R_F, SHARED_TARGETS[2], self.index)
        return torch.sigmoid(F.linear(h_R_D, self.shared_gate_W_D)[:, :1]) * y_R_D

    def _gate_up_delta(self, h_R_D: torch.Tensor, lora: LoraBatch, layout: LoraDispatch
                       ) -> torch.Tensor:
        """``[gate; up]`` LoRA deltas of every base-layout row (zeros on base-model rows)."""
        w1, w3, i = lora.targets["w1"], lora.targets["w3"], self.index
        rank = w1.a_L_S_Rk_I.shape[2]
        a_S_2Rk_D = torch.cat([w1.a_layers[i], w3.a_layers[i]], dim=1)
        s_L_2Rk = grouped_linear(lora.to_lora_rows(h_R_D), a_S_2Rk_D, lora.offsets_S)
        s_R_2Rk = lora.from_lora_rows(s_L_2Rk * lora.scale_P_1, h_R_D.shape[0])
        s_Q_2Rk = s_R_2Rk.index_select(0, layout.rows_Q)
        gate_Q_F = grouped_linear(s_Q_2Rk[:, :rank].contiguous(), w1.b_layers[i],
                                  layout.offsets_G)
        up_Q_F = grouped_linear(s_Q_2Rk[:, rank:].contiguous(), w3.b_layers[i],
                                layout.offsets_G)
        d_Q_2F = torch.cat([gate_Q_F, up_Q_F], dim=1)
        if layout.to_base_P is None:
            return d_Q_2F
        return F.pad(d_Q_2F, (0, 0, 0, 1)).index_select(0, layout.to_base_P)

    def _down_shrink(self, act_P_F: torch.Tensor, lora: LoraBatch, layout: LoraDispatch
                     ) -> torch.Tensor:
        """Each LoRA-layout row's ``A_e · act`` of the down projection (``[Q, Rk]``)."""
        act_Q_F = (act_P_F if layout.from_base_Q is None
                   else act_P_F.index_select(0, layout.from_base_Q))
        return grouped_linear(act_Q_F, lora.targets["w2"].a_layers[self.index],
                              layout.offsets_G)

    def _down_expand(self, t_R_Rk: torch.Tensor, lora: LoraBatch) -> torch.Tensor:
        """The shared down ``B`` on each token's weighted sum of its ``A_e`` outputs."""
        t_L_Rk = lora.to_lora_rows(t_R_Rk) * lora.scale_P_1
        d_L_D = grouped_linear(t_L_Rk, lora.targets["w2"].b_layers[self.index], lora.offsets_S)
        return lora.from_lora_rows(d_L_D, t_R_Rk.shape[0])

    @staticmethod
    def _to_rows(values_N_X: torch.Tensor, tokens: TokenRows) -> torch.Tensor:
        """Routed tokens' values → every batch row (zeros on pad rows)."""
        if tokens.is_every_row:
            return values_N_X
        out = values_N_X.new_zeros(tokens.num_rows, values_N_X.shape[1])
        return out.index_copy(0, tokens.real_N, values_N_X)


def _expert_of_rows(offsets_E: torch.Tensor) -> torch.Tensor:
    """The expert of every base-layout row (from the groups' ends)."""
    sizes_E = torch.diff(offsets_E.long(), prepend=offsets_E.new_zeros(1).long())
    return torch.repeat_interleave(torch.arange(offsets_E.shape[0], device=offsets_E.device),
                                   sizes_E)


def _padded_rows(weight_O_D: torch.Tensor, row_multiple: int) -> torch.Tensor:
    """``weight`` with zero rows up to a multiple of `ROUTER_COLUMN_MULTIPLE` output columns
    in batch-invariant mode (``row_multiple > 1``)."""
    pad = -weight_O_D.shape[0] % ROUTER_COLUMN_MULTIPLE if row_multiple > 1 else 0
    return F.pad(weight_O_D, (0, 0, 0, pad)) if pad else weight_O_D


def combine(y_P_X: torch.Tensor, slot_row_N_K: torch.Tensor, weights_N_K: torch.Tensor
            ) -> torch.Tensor:
    """``Σ_j weights[n, j] · y[slot_row[n, j]]``, summed slot by slot (row-local order)."""
    out_N_X = y_P_X.index_select(0, slot_row_N_K[:, 0]) * weights_N_K[:, :1]
    for j in range(1, slot_row_N_K.shape[1]):
        out_N_X = out_N_X + y_P_X.index_select(0, slot_row_N_K[:, j]) * weights_N_K[:, j:j + 1]
    return out_N_X
