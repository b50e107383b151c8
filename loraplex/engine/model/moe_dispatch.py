"""Top-k routing of a sparse layer's tokens and the row layouts of its grouped expert GEMMs.

Every real token (pad rows of the batch are not routed) goes to its ``k`` experts: ``N·k``
*assignments* (token, slot). `Dispatch` sorts them by (expert, adapter segment, token, slot)
and lays them out twice:

* the **base layout** ``P``: one group per expert, each padded to the row multiple, for the
  experts' own GEMMs (``F.grouped_mm`` with one group per expert, no loop over experts), so
  tenants' tokens share each expert's base GEMM;
* the **LoRA layout** ``Q``: one group per (expert × adapter) pair (expert-major, the order of
  the stacked per-expert LoRA factors), each padded to the row multiple, for the LoRA deltas;
  assignments of base-model rows have none. When it coincides with the base layout (one
  adapter on every row, no padding differences) no copy is made.

Padding groups to the row multiple is what batch invariance needs: MKL gives a row the same
bits in any GEMM whose row count is a multiple of the row multiple (`packed_batch`), and
every other step is row-local. Routing is row-local too: the router GEMM's output width is
padded to 16 columns by the caller, and softmax and ``torch.topk`` work row by row (the same
``torch.topk`` on the same fp32 probabilities as transformers' ``Qwen3MoeTopKRouter``, so
ties between experts go the same way). Worked example (``k`` = 1, 2 experts, row multiple 4;
tokens t0..t2 of adapter a, t3 of the base model; t0, t2 → expert 1, t1, t3 → expert 0)::

    base layout:  [t1 t3 ·  · | t0 t2 ·  ·]          offsets (4, 8)
    LoRA layout:  [t1 ·  ·  · | t0 t2 ·  ·]          offsets (4, 8): (e0, a), (e1, a)

Knows nothing about weights or adapters beyond segment numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loraplex.engine.model.lora_batch import LoraBatch
from loraplex.engine.model.packed_batch import PackedBatch


@dataclass(frozen=True)
class TokenRows:
    """The routed rows of a forward (the same in every sparse layer).

    Attributes:
        real_N: batch rows holding real tokens, ascending.
        segment_N: each one's adapter segment (``num_segments`` for base-model rows).
        num_segments: adapter segments of the batch (0 without adapters).
        num_rows: rows of the batch.
    """

    real_N: torch.Tensor
    segment_N: torch.Tensor
    num_segments: int
    num_rows: int

    @property
    def is_every_row(self) -> bool:
        """No pad rows: the routed rows are the batch rows themselves."""
        return self.real_N.shape[0] == self.num_rows

    @staticmethod
    def of(batch: PackedBatch, lora: LoraBatch | None) -> TokenRows:
        real_N = torch.sort(batch.row_index()).values
        num_segments = 0 if lora is None else len(lora.rows.segment_ends)
        segment_R = torch.full((batch.num_rows,), num_segments, dtype=torch.long,
                               device=real_N.device)
        if lora is not None:
            n = lora.rows.num_rows
            ends = torch.tensor(lora.rows.segment_ends, device=real_N.device)
            pos = (torch.arange(n, device=real_N.device) if lora.rows.real_P is None
                   else lora.rows.real_P)
            segment_R[:n] = torch.searchsorted(ends, pos, right=True)
        return TokenRows(real_N, segment_R.index_select(0, real_N), num_segments,
                         batch.num_rows)


@dataclass(frozen=True)
class Routing:
    """Each routed token's experts ``[N, k]`` (descending weight) and their weights."""

    experts_N_K: torch.Tensor
    weights_N_K: torch.Tensor


def route(h_R_D: torch.Tensor, tokens: TokenRows, router_W_D: torch.Tensor, num_experts: int,
          top_k: int, norm_topk_prob: bool, bias_E: torch.Tensor | None = None,
          softmax_after_topk: bool = False) -> Routing:
    """transformers' ``Qwen3MoeTopKRouter`` on the routed rows: fp32 softmax of the router
    logits, top-k, optionally renormalised (summed slot by slot: row-local), weights in the
    compute dtype. With ``softmax_after_topk`` (gpt-oss's ``GptOssTopKRouter``): the top-k of
    the logits (plus ``bias_E``), softmaxed in the compute dtype.

    The router GEMM runs on all batch rows (a multiple of the row multiple in batch-invariant
    mode, where a GEMM over just the real rows would not be row-invariant), then keeps the
    real ones.
    ``router_W_D`` may carry zero rows past ``num_experts`` (batch-invariant width padding).
    """
    logits_R_X = torch.nn.functional.linear(h_R_D, router_W_D)
    if not tokens.is_every_row:
        logits_R_X = logits_R_X.index_select(0, tokens.real_N)
    logits_N_E = logits_R_X[:, :num_experts].contiguous()
    if bias_E is not None:
        logits_N_E = logits_N_E + bias_E
    if softmax_after_topk:
        top_N_K, experts_N_K = torch.topk(logits_N_E, top_k, dim=-1)
        return Routing(experts_N_K, torch.softmax(top_N_K, dim=-1, dtype=top_N_K.dtype))
    probs_N_E = torch.softmax(logits_N_E, dim=-1, dtype=torch.float32)
    weights_N_K, experts_N_K = torch.topk(probs_N_E, top_k, dim=-1)
    if norm_topk_prob:
        total_N = weights_N_K[:, 0]
        for j in range(1, top_k):
            total_N = total_N + weights_N_K[:, j]
        weights_N_K = weights_N_K / total_N[:, None]
    return Routing(experts_N_K, weights_N_K.to(h_R_D.dtype))


@dataclass(frozen=True)
class LoraDispatch:
    """The LoRA layout ``Q`` (see the module docstring).

    Attributes:
        offsets_G: int32 ends of the (expert × segment) groups, expert-major (``E·S``).
        rows_Q: batch row of each LoRA row (pads → a real row; their values are dropped).
        slot_row_N_K: LoRA row of each assignment; ``Q`` (one past the end: a zero row the
            caller appends) for tokens of base-model rows.
        from_base_Q: base-layout row of each LoRA row; None when the layouts coincide.
        to_base_P: LoRA row of each base row (``Q`` for rows without an adapter); None then.
    """

    offsets_G: torch.Tensor
    rows_Q: torch.Tensor
    slot_row_N_K: torch.Tensor
    from_base_Q: torch.Tensor | None
    to_base_P: torch.Tensor | None

    @property
    def num_rows(self) -> int:
        return self.rows_Q.shape[0]


@dataclass(frozen=True)
class Dispatch:
    """The base layout ``P`` of one sparse layer's assignments, and its LoRA layout.

    Attributes:
        rows_P: batch row of each base row (pads → a real row).
        offsets_E: int32 ends of the expert groups (``F.grouped_mm`` offsets).
        slot_row_N_K: base row of each assignment (token ``n``'s slot ``j``).
        lora: the LoRA layout; None when the batch has no adapter segment.
    """

    rows_P: torch.Tensor
    offsets_E: torch.Tensor
    slot_row_N_K: torch.Tensor
    lora: LoraDispatch | None

    @staticmethod
    def of(routing: Routing, tokens: TokenRows, num_experts: int, row_multiple: int
           ) -> Dispatch:
        experts_N_K = routing.experts_N_K
        n, k = experts_N_K.shape
        device = experts_N_K.device
        a = n * k
        token_A = torch.arange(n, device=device).repeat_interleave(k)
        expert_A = experts_N_K.reshape(-1)
        s = tokens.num_segments
        segment_A = tokens.segment_N.repeat_interleave(k)
        order = torch.argsort((expert_A * (s + 1) + segment_A) * a
                              + torch.arange(a, device=device))
        row_A, size = _place(expert_A, order, num_experts, row_multiple)
        rows_P = tokens.real_N[:1].expand(size).clone()
        rows_P[row_A] = tokens.real_N.index_select(0, token_A)
        offsets_E = torch.cumsum(_padded_counts(expert_A, num_experts, row_multiple)[1],
                                 0).to(torch.int32)
        lora = None
        if s:
            lora = _lora_dispatch(expert_A * s + segment_A, segment_A < s, order, row_A, rows_P,
                                  num_experts * s, row_multiple, size, k)
        return Dispatch(rows_P, offsets_E, row_A.view(n, k), lora)


def _padded_counts(group_A: torch.Tensor, num_groups: int, multiple: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Assignments per group, and that rounded up to ``multiple``."""
    counts = torch.bincount(group_A, minlength=num_groups)
    return counts, (counts + multiple - 1) // multiple * multiple


def _place(group_A: torch.Tensor, order: torch.Tensor, num_groups: int, multiple: int
           ) -> tuple[torch.Tensor, int]:
    """Row of each assignment when the groups (``order`` is group-major) are padded to
    ``multiple`` rows each; and the layout's row count."""
    counts, padded = _padded_counts(group_A.index_select(0, order), num_groups, multiple)
    group_sorted = group_A.index_select(0, order)
    first_sorted = torch.cumsum(counts, 0) - counts
    start = torch.cumsum(padded, 0) - padded
    rank = torch.arange(order.shape[0], device=order.device) - first_sorted[group_sorted]
    row_A = torch.empty(group_A.shape[0], dtype=torch.long, device=order.device)
    row_A[order] = start[group_sorted] + rank
    return row_A, int(padded.sum())


def _lora_dispatch(group_A: torch.Tensor, adapted_A: torch.Tensor, order: torch.Tensor,
                   base_row_A: torch.Tensor, rows_P: torch.Tensor, num_groups: int,
                   multiple: int, base_size: int, k: int) -> LoraDispatch:
    """The LoRA layout of the adapted assignments (``group_A``: expert · S + segment)."""
    ordered = order[adapted_A.index_select(0, order)]  # adapted assignments, group-major
    placed, size = _place(group_A, ordered, num_groups, multiple)
    lora_rows = placed.index_select(0, ordered)
    slot_row_A = torch.full_like(base_row_A, size)
    slot_row_A[ordered] = lora_rows
    offsets = torch.cumsum(_padded_counts(group_A.index_select(0, ordered), num_groups,
                                          multiple)[1], 0).to(torch.int32)
    if size == base_size and bool(adapted_A.all()) and torch.equal(slot_row_A, base_row_A):
        return LoraDispatch(offsets, rows_P, slot_row_A.view(-1, k), None, None)
    from_base_Q = torch.zeros(size, dtype=torch.long, device=order.device)
    from_base_Q[lora_rows] = base_row_A.index_select(0, ordered)
    to_base_P = torch.full((base_size,), size, dtype=torch.long, device=order.device)
    to_base_P[from_base_Q[lora_rows]] = lora_rows
    return LoraDispatch(offsets, rows_P.index_select(0, from_base_Q), slot_row_A.view(-1, k),
                        from_base_Q, to_base_P)
