"""The gated delta rule (Qwen3.5's linear attention) over packed sequences, chunk by chunk, with
the state a sequence carries from one forward to the next.

Per value head, with normalised keys ``k_t``, queries ``q_t`` (scaled by ``d_k ** -0.5``),
values ``v_t``, decay ``g_t ≤ 0`` and learning rate ``β_t``::

    S_t = exp(g_t) · S_{t-1} + k_t (β_t (v_t − S_{t-1}ᵀ exp(g_t) k_t))ᵀ,    o_t = S_tᵀ q_t

computed as transformers' ``torch_chunk_gated_delta_rule`` does: in chunks of `CHUNK`
positions, a unit-lower-triangular solve inside each chunk (the UT transform), a sequential
scan of the state over chunks. Chunks are aligned to absolute positions (chunk c holds a
sequence's positions ``c·CHUNK .. (c+1)·CHUNK − 1``) and every op has a fixed per-chunk shape
and is row-local or causal inside it: a position's output depends only on its own sequence's
earlier positions, never on the batch around it (batch invariance), and a decode step gives
the bits of a full forward — it reruns its partly filled chunk (the `Carry`'s rows, then the
new ones, zero-padded as a training forward pads a sequence's last chunk), starting from the
state at the chunk's start. A sequence's `Carry` (the sampler keeps one per sequence and
layer): the state at the start of its last, partly filled chunk, that chunk's rows so far,
and the last ``kernel − 1`` inputs of the causal convolution before it.

`causal_conv` is the short depthwise convolution in front (kernel 4), written as a fixed-order
sum over the taps so that a row's result never depends on how many rows share the call.
Knows nothing about weights, LoRA or the sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: Positions per chunk (transformers' default).
CHUNK = 64


@dataclass(frozen=True)
class ChunkRows:
    """Per-position inputs of the delta rule: ``q``, ``k`` ``[N, Hk, Dk]`` (normalised, ``q``
    scaled), ``v`` ``[N, Hv, Dv]``, ``g``, ``beta`` ``[N, Hv]`` (fp32)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor

    @property
    def num_rows(self) -> int:
        return self.q.shape[0]

    def slice(self, start: int, end: int) -> ChunkRows:
        return ChunkRows(self.q[start:end], self.k[start:end], self.v[start:end],
                         self.g[start:end], self.beta[start:end])

    @staticmethod
    def cat(parts: Sequence[ChunkRows]) -> ChunkRows:
        return ChunkRows(*(torch.cat([getattr(p, f) for p in parts])
                           for f in ("q", "k", "v", "g", "beta")))

    def detach(self) -> ChunkRows:
        return ChunkRows(self.q.detach(), self.k.detach(), self.v.detach(), self.g.detach(),
                         self.beta.detach())


@dataclass(frozen=True)
class Carry:
    """What one sequence carries into its next forward, per linear-attention layer.

    Attributes:
        state_H_K_V: the recurrent state at the start of the sequence's last chunk.
        rows: that chunk's rows so far (fewer than `CHUNK`).
        conv_W_C: the last ``kernel − 1`` convolution inputs (zeros before position 0).
    """

    state_H_K_V: torch.Tensor
    rows: ChunkRows
    conv_W_C: torch.Tensor


@dataclass(frozen=True)
class Segment:
    """One sequence's share of a call: its new rows ``start .. start + length`` of the packed
    layout, and its `Carry` from earlier positions (None: it starts at position 0)."""

    start: int
    length: int
    carry: Carry | None = None


def causal_conv(x_R_C: torch.Tensor, weight_C_K: torch.Tensor, segments: Sequence[Segment]
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """SiLU of the depthwise causal convolution of each segment's rows (rows outside every
    segment: zeros), and each segment's last ``kernel − 1`` inputs (for its next `Carry`).

    ``out[t] = Σ_j w[:, j] · x[t − (K − 1) + j]``, the taps summed in order ``j = 0 .. K−1``.
    """
    num_rows, channels = x_R_C.shape
    kernel = weight_C_K.shape[1]
    history = kernel - 1
    windows = [s.carry.conv_W_C if s.carry is not None
               else x_R_C.new_zeros(history, channels) for s in segments]
    # Source rows: the packed rows, every segment's window, a zero row last.
    source = torch.cat([x_R_C, *windows, x_R_C.new_zeros(1, channels)])
    zero = source.shape[0] - 1
    index = torch.full((num_rows, kernel), zero, dtype=torch.long)
    for i, s in enumerate(segments):
        window_start = num_rows + i * history
        own = torch.cat([torch.arange(window_start, window_start + history),
                         torch.arange(s.start, s.start + s.length)])
        # row t of the segment reads own[t .. t + K - 1]
        index[s.start:s.start + s.length] = own.unfold(0, kernel, 1)
    taps_R_K_C = source[index.to(x_R_C.device)]
    out = taps_R_K_C[:, 0] * weight_C_K[:, 0]
    for j in range(1, kernel):
        out = out + taps_R_K_C[:, j] * weight_C_K[:, j]
    tails = [torch.cat([w, x_R_C[s.start:s.start + s.length]])[-history:]
             for w, s in zip(windows, segments, strict=True)]
    return torch.nn.functional.silu(out), tails


def chunked_delta_rule(rows: ChunkRows, segments: Sequence[Segment], keep_carry: bool
                       ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ChunkRows]]]:
    """The delta rule's output ``[R, Hv, Dv]`` (fp32; zeros on rows outside every segment)
    and, with ``keep_carry``, each segment's (state at its last chunk's start, that chunk's
    rows) for its next `Carry`.

    ``rows`` holds every packed row's inputs; a segment's carried rows are prepended to its
    new ones so that its chunks start at multiples of `CHUNK`.
    """
    num_rows, num_k_heads, k_dim = rows.q.shape
    num_v_heads, v_dim = rows.v.shape[1:]
    device = rows.q.device
    plans = [_ChunkPlan.of(s, num_rows) for s in segments]
    carried = [s.carry.rows for s in segments if s.carry is not None]
    zero = ChunkRows(rows.q.new_zeros(1, num_k_heads, k_dim),
                     rows.k.new_zeros(1, num_k_heads, k_dim),
                     rows.v.new_zeros(1, num_v_heads, v_dim), rows.g.new_zeros(1, num_v_heads),
                     rows.beta.new_zeros(1, num_v_heads))
    source = ChunkRows.cat([rows, *carried, zero])
    # Rows of every chunk: [num_chunks · CHUNK] indices into `source`.
    offsets, index = num_rows, []
    for plan, s in zip(plans, segments, strict=True):
        index.append(plan.source_rows(offsets, source.num_rows - 1))
        offsets += 0 if s.carry is None else s.carry.rows.num_rows
    flat = torch.cat(index).to(device)
    chunk = _IntraChunk.of(source, flat, num_k_heads, num_v_heads)
    out_N_H_C_V, states = _scan(chunk, segments, plans, num_v_heads, k_dim, v_dim, keep_carry)
    out_R_H_V = rows.v.new_zeros(num_rows + 1, num_v_heads, v_dim, dtype=torch.float32)
    target = torch.cat([p.target_rows(num_rows) for p in plans]).to(device)
    out_R_H_V = out_R_H_V.index_copy(0, target, out_N_H_C_V.permute(0, 2, 1, 3).reshape(
        -1, num_v_heads, v_dim))[:num_rows]
    carries = []
    if keep_carry:
        for plan, s, state in zip(plans, segments, states, strict=True):
            all_rows = (ChunkRows.cat([s.carry.rows, rows.slice(s.start, s.start + s.length)])
                        if s.carry is not None else rows.slice(s.start, s.start + s.length))
            carries.append((state, all_rows.slice(plan.last_chunk_start, plan.num_rows)
                            .detach()))
    return out_R_H_V, carries


@dataclass(frozen=True)
class _ChunkPlan:
    """A segment laid out in chunks: its carried rows then its new ones."""

    start: int
    length: int
    num_carried: int

    @staticmethod
    def of(segment: Segment, num_rows: int) -> _ChunkPlan:
        carried = 0 if segment.carry is None else segment.carry.rows.num_rows
        assert carried < CHUNK
        return _ChunkPlan(segment.start, segment.length, carried)

    @property
    def num_rows(self) -> int:
        return self.num_carried + self.length

    @property
    def num_chunks(self) -> int:
        return -(-self.num_rows // CHUNK)

    @property
    def last_chunk_start(self) -> int:
        """Row (of carried + new) where the last chunk that is not full starts; a full last
        chunk hands a fresh, empty chunk to the next forward."""
        return (self.num_rows // CHUNK) * CHUNK

    def source_rows(self, carried_at: int, zero: int) -> torch.Tensor:
        rows = torch.cat([torch.arange(carried_at, carried_at + self.num_carried),
                          torch.arange(self.start, self.start + self.length)])
        pad = self.num_chunks * CHUNK - self.num_rows
        return torch.cat([rows, torch.full((pad,), zero, dtype=torch.long)])

    def target_rows(self, discard: int) -> torch.Tensor:
        """Where each chunk row's output goes: its packed row, or ``discard``."""
        pad = self.num_chunks * CHUNK - self.num_rows
        return torch.cat([torch.full((self.num_carried,), discard, dtype=torch.long),
                          torch.arange(self.start, self.start + self.length),
                          torch.full((pad,), discard, dtype=torch.long)])


@dataclass(frozen=True)
class _IntraChunk:
    """Every chunk's intra-chunk quantities, ``[N, H, C, ·]`` (N chunks, H value heads)."""

    q_dec: torch.Tensor
    k_dec: torch.Tensor
    intra: torch.Tensor
    new_values: torch.Tensor
    k_cumdecay: torch.Tensor
    chunk_decay: torch.Tensor

    @staticmethod
    def of(source: ChunkRows, flat: torch.Tensor, num_k_heads: int, num_v_heads: int
           ) -> _IntraChunk:
        groups = num_v_heads // num_k_heads

        def chunked(x: torch.Tensor, repeat: int = 1) -> torch.Tensor:
            x = x.index_select(0, flat).float()
            if repeat > 1:
                x = x.repeat_interleave(repeat, dim=1)
            x = x.view(-1, CHUNK, *x.shape[1:])  # [N, C, H, ...]
            return x.transpose(1, 2).contiguous()  # [N, H, C, ...]

        q, k, v = chunked(source.q, groups), chunked(source.k, groups), chunked(source.v)
        g, beta = chunked(source.g), chunked(source.beta)
        k_beta, v_beta = k * beta[..., None], v * beta[..., None]
        upper = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
        cum = g.cumsum(dim=-1)
        pairwise = (cum[..., :, None] - cum[..., None, :]).masked_fill(upper, float("-inf")).exp()
        ut = (k_beta @ k.transpose(-1, -2)) * pairwise
        intra = (q @ k.transpose(-1, -2)) * pairwise
        decayed_k_beta = k_beta * cum.exp()[..., None]
        new_values = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
        k_cumdecay = torch.linalg.solve_triangular(ut, decayed_k_beta, upper=False,
                                                   unitriangular=True)
        return _IntraChunk(q_dec=q * cum.exp()[..., None],
                           k_dec=k * (cum[..., -1:] - cum).exp()[..., None], intra=intra,
                           new_values=new_values, k_cumdecay=k_cumdecay,
                           chunk_decay=cum[..., -1].exp()[..., None, None])


def _scan(chunk: _IntraChunk, segments: Sequence[Segment], plans: Sequence[_ChunkPlan],
          num_heads: int, k_dim: int, v_dim: int, keep_carry: bool
          ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The sequential scan over each segment's chunks, all segments' chunk ``i`` at once:
    outputs ``[N, H, C, Dv]`` and each segment's state at its last chunk's start."""
    firsts, first = [], 0
    for plan in plans:
        firsts.append(first)
        first += plan.num_chunks
    device = chunk.q_dec.device
    states = [s.carry.state_H_K_V.float() if s.carry is not None
              else chunk.q_dec.new_zeros(num_heads, k_dim, v_dim) for s in segments]
    state_B = torch.stack(states)
    outs: list[torch.Tensor] = [chunk.q_dec.new_empty(0)] * first
    kept = list(states)
    for i in range(max(p.num_chunks for p in plans)):
        active = [b for b, p in enumerate(plans) if p.num_chunks > i]
        rows = torch.tensor([firsts[b] + i for b in active], device=device)
        s_B = state_B[active] if len(active) < len(plans) else state_B
        v_new = chunk.new_values[rows] - chunk.k_cumdecay[rows] @ s_B
        out = chunk.q_dec[rows] @ s_B + chunk.intra[rows] @ v_new
        new_s = s_B * chunk.chunk_decay[rows] + chunk.k_dec[rows].transpose(-1, -2) @ v_new
        for j, b in enumerate(active):
            outs[firsts[b] + i] = out[j]
            if keep_carry and (i + 1) * CHUNK <= plans[b].num_rows:
                kept[b] = new_s[j]  # a full chunk: the next one starts from here
        state_B = state_B.index_copy(0, torch.tensor(active, device=device), new_s)
    return torch.stack(outs), kept
