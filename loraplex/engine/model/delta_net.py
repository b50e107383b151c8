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
and the last ``kernel − 1`` inputs of the causal convolution before it. Where every row goes
(`DeltaLayout`) is worked out once per forward, for all its linear layers.

`causal_conv` is the short depthwise convolution in front (kernel 4), written as a fixed-order
sum over the taps so that a row's result never depends on how many rows share the call.
Knows nothing about weights, LoRA or the sampler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: Positions per chunk. transformers uses 64 (fewer sequential steps for a GPU); a decode
#: step reruns its partly filled chunk, whose cost grows with the square of this: 16 made
#: the small Qwen3.5 built-in's decode 1.8× faster than 64 on this CPU (measured: 64
#: sequences, 15 steps, 1.94 s → 1.07 s), for 4× the chunks in a training scan.
CHUNK = 16


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
class DeltaLayout:
    """Where every row of a forward's segments goes, computed once per forward (every
    linear layer of it shares the segments: their carries hold the same positions).

    Attributes:
        num_rows: rows of the packed layout.
        conv_index_R_K: per packed row, the rows of ``[packed rows; the segments' windows
            (``kernel − 1`` rows each); a zero row]`` its convolution taps read.
        tail_index: the same source's rows that form each segment's next window, flattened.
        chunk_index: per chunk row, its row in ``[packed rows; the segments' carried rows;
            a zero row]`` (chunks of `CHUNK`, segment by segment).
        target: per chunk row, its packed row (its output), or ``num_rows`` (discarded).
        first_chunk, num_chunks, num_carried, num_total: per segment.
        carry_index: the chunk rows (of ``chunk_index``) each segment carries on, flattened;
            ``carry_sizes`` how many per segment.
    """

    num_rows: int
    kernel: int
    conv_index_R_K: torch.Tensor
    tail_index: torch.Tensor
    chunk_index: torch.Tensor
    target: torch.Tensor
    first_chunk: tuple[int, ...]
    num_chunks: tuple[int, ...]
    num_total: tuple[int, ...]
    carry_index: torch.Tensor
    carry_sizes: tuple[int, ...]

    @staticmethod
    def of(starts: Sequence[int], lengths: Sequence[int], cached: Sequence[int], num_rows: int,
           kernel: int, device: torch.device) -> DeltaLayout:
        """The layout of segments (rows ``starts[i] ..`` of ``lengths[i]``, after ``cached[i]``
        positions) for a convolution of ``kernel`` taps."""
        history = kernel - 1
        conv_zero = num_rows + history * len(starts)
        conv = [[conv_zero] * kernel for _ in range(num_rows)]
        tails: list[int] = []
        chunk_rows: list[int] = []
        target: list[int] = []
        carry_rows: list[int] = []
        firsts, counts, totals, carry_sizes = [], [], [], []
        carried_at = num_rows
        carried = [c % CHUNK for c in cached]
        chunk_zero = num_rows + sum(carried)
        for i, (start, n, m) in enumerate(zip(starts, lengths, carried, strict=True)):
            window = num_rows + i * history
            own = [*range(window, window + history), *range(start, start + n)]
            for t in range(n):
                conv[start + t] = own[t:t + kernel]
            tails += own[-history:]
            total = m + n
            chunks = -(-total // CHUNK)
            pad = chunks * CHUNK - total
            firsts.append(len(chunk_rows) // CHUNK)
            counts.append(chunks)
            totals.append(total)
            base = len(chunk_rows)
            chunk_rows += [*range(carried_at, carried_at + m), *range(start, start + n),
                           *[chunk_zero] * pad]
            target += [num_rows] * m + list(range(start, start + n)) + [num_rows] * pad
            keep_from = (total // CHUNK) * CHUNK
            carry_rows += range(base + keep_from, base + total)
            carry_sizes.append(total - keep_from)
            carried_at += m

        def tensor(values: list[int] | list[list[int]]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return DeltaLayout(num_rows, kernel, tensor(conv).view(num_rows, kernel), tensor(tails),
                           tensor(chunk_rows), tensor(target), tuple(firsts), tuple(counts),
                           tuple(totals), tensor(carry_rows), tuple(carry_sizes))


def causal_conv(x_R_C: torch.Tensor, weight_C_K: torch.Tensor, layout: DeltaLayout,
                windows: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """SiLU of the depthwise causal convolution of each segment's rows (rows outside every
    segment: zeros), and each segment's last ``kernel − 1`` inputs (for its next `Carry`);
    ``windows``: each segment's carried inputs (None: zeros, position 0).

    ``out[t] = Σ_j w[:, j] · x[t − (K − 1) + j]``, the taps summed in order ``j = 0 .. K−1``.
    """
    channels, history = x_R_C.shape[1], layout.kernel - 1
    zeros = x_R_C.new_zeros(history, channels)
    source = torch.cat([x_R_C, *(zeros if w is None else w for w in windows),
                        x_R_C.new_zeros(1, channels)])
    taps_R_K_C = source[layout.conv_index_R_K]
    out = taps_R_K_C[:, 0] * weight_C_K[:, 0]
    for j in range(1, layout.kernel):
        out = out + taps_R_K_C[:, j] * weight_C_K[:, j]
    tails = list(source.index_select(0, layout.tail_index).detach().split(history))
    return torch.nn.functional.silu(out), tails


def chunked_delta_rule(rows: ChunkRows, layout: DeltaLayout,
                       carries: Sequence[Carry | None], keep_carry: bool
                       ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, ChunkRows]]]:
    """The delta rule's output ``[R, Hv, Dv]`` (fp32; zeros on rows outside every segment)
    and, with ``keep_carry``, each segment's (state at its last chunk's start, that chunk's
    rows) for its next `Carry`.

    ``rows`` holds every packed row's inputs; a segment's carried rows are prepended to its
    new ones so that its chunks start at multiples of `CHUNK`.
    """
    num_rows, num_k_heads, k_dim = rows.q.shape
    num_v_heads, v_dim = rows.v.shape[1:]
    zero = ChunkRows(rows.q.new_zeros(1, num_k_heads, k_dim),
                     rows.k.new_zeros(1, num_k_heads, k_dim),
                     rows.v.new_zeros(1, num_v_heads, v_dim), rows.g.new_zeros(1, num_v_heads),
                     rows.beta.new_zeros(1, num_v_heads))
    source = ChunkRows.cat([rows, *(c.rows for c in carries if c is not None), zero])
    chunk = _IntraChunk.of(source, layout.chunk_index, num_k_heads, num_v_heads)
    states = [c.state_H_K_V.float() if c is not None
              else rows.q.new_zeros(num_v_heads, k_dim, v_dim, dtype=torch.float32)
              for c in carries]
    out_N_H_C_V, kept = _scan(chunk, layout, torch.stack(states), keep_carry)
    out_R_H_V = rows.v.new_zeros(num_rows + 1, num_v_heads, v_dim, dtype=torch.float32)
    out_R_H_V = out_R_H_V.index_copy(0, layout.target, out_N_H_C_V.permute(0, 2, 1, 3).reshape(
        -1, num_v_heads, v_dim))[:num_rows]
    if not keep_carry:
        return out_R_H_V, []
    tails = source.detach()
    picked = layout.chunk_index.index_select(0, layout.carry_index)
    fields = [getattr(tails, f).index_select(0, picked).split(layout.carry_sizes)
              for f in ("q", "k", "v", "g", "beta")]
    return out_R_H_V, [(kept[b], ChunkRows(*(f[b] for f in fields)))
                       for b in range(len(carries))]


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


def _scan(chunk: _IntraChunk, layout: DeltaLayout, state_B_H_K_V: torch.Tensor,
          keep_carry: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The sequential scan over each segment's chunks, all segments' chunk ``i`` at once:
    outputs ``[N, H, C, Dv]`` and each segment's state at its last chunk's start."""
    device = chunk.q_dec.device
    num_segments = len(layout.num_chunks)
    out_N = chunk.new_values.new_empty(chunk.new_values.shape)
    kept = state_B_H_K_V
    for i in range(max(layout.num_chunks)):
        active = [b for b in range(num_segments) if layout.num_chunks[b] > i]
        rows = torch.tensor([layout.first_chunk[b] + i for b in active], device=device)
        every = len(active) == num_segments
        which = None if every else torch.tensor(active, device=device)
        s_B = state_B_H_K_V if which is None else state_B_H_K_V.index_select(0, which)
        v_new = chunk.new_values[rows] - chunk.k_cumdecay[rows] @ s_B
        out_N = out_N.index_copy(0, rows, chunk.q_dec[rows] @ s_B + chunk.intra[rows] @ v_new)
        new_s = s_B * chunk.chunk_decay[rows] + chunk.k_dec[rows].transpose(-1, -2) @ v_new
        if keep_carry:  # a full chunk: the next one starts from its end state
            full = [j for j, b in enumerate(active) if (i + 1) * CHUNK <= layout.num_total[b]]
            if full:
                pick = torch.tensor(full, device=device)
                into = torch.tensor([active[j] for j in full], device=device)
                kept = kept.index_copy(0, into, new_s.index_select(0, pick))
        state_B_H_K_V = (new_s if which is None
                         else state_B_H_K_V.index_copy(0, which, new_s))
    return out_N, list(kept.unbind(0))
