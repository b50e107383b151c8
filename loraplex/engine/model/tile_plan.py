"""`TilePlan`: a packed batch's attention as fixed-shape matmul tiles, KV block by KV block.

A query token at position ``p`` attends KV blocks ``0, 1, ..., p // block_size`` in that order
(the online softmax of `attention.py`). Tokens that read the same physical page at the same
step share tiles: a tile's rows are its tokens' query heads of one KV head (token-major). A
*segment* is a set of tokens that read the same page at every step of a step range: all new
tokens of a sequence (training, prefill), or the G samples of a request over their shared
prompt pages, which then split into one segment per sample on its private pages. So a shared
prefix is read once per step for all its readers, and a one-token decode step costs a tile of
its query heads per KV head padded with zero rows to the 4-row quantum. A `TilePhase`
batches the tiles of all segments that start at the same step and have the same row count:
one batched matmul per operand and step, the tiles' softmax state kept in tile layout across
its steps (tiles sorted so that the still-active ones are a prefix).

Row counts are multiples of `ROW_QUANTUM` (4): MKL gives a row the same bits in any such
matmul, wherever it sits and whatever the other rows hold, and every other step is row-local,
so how rows are grouped never changes a result (tests/engine/model/test_batch_invariance.py
checks the BLAS assumption). Knows nothing about weights or the cache's contents.

Worked example: ``block_size`` 4 and one query head per KV head (a tile row is a token; tiles
have 4, 8, ... rows). Sequence A trains on 6 tokens (scratch pages 0 1); B and C are two
samples of one request decoding position 5, over their shared prompt page 2 and their private
copies 3 and 4 of its partial page. A token reads one page per KV step, up to its own block::

    row  seq  pos   step 0   step 1
     0    A    0    page 0     ·
     1    A    1    page 0     ·
     2    A    2    page 0     ·
     3    A    3    page 0     ·
     4    A    4    page 0   page 1
     5    A    5    page 0   page 1
     6    B    5    page 2   page 3
     7    C    5    page 2   page 4

Segments: s1 = rows 0-5 over steps 0-1 (pages 0 1); s2 = rows 6 7 at step 0 (page 2, read
once for both samples); their pages diverge at step 1: s3 = row 6 (page 3), s4 = row 7 (page
4). Tiles cut a segment by the step its tokens leave it (their last block, or the segment's
last step): s1 → t1 = rows 4 5 (steps 0-1) and t2 = rows 0-3 (step 0 only); s2 → t3 = rows
6 7; s3 → t4 = row 6; s4 → t5 = row 7; each padded to 4 rows with the zero row. A phase
batches the tiles starting at the same step with the same row count, longest-running first,
masked last; a mask hides the keys a tile's tokens must not see in their last block::

    phase (first step, rows)  tiles      step 0                 step 1
    (0, 4)                    t1 t3 t2   pages 0 2 0, mask t2   page 1, mask t1
    (1, 4)                    t4 t5                             pages 3 4 (one view), mask both

Rows 6 and 7 leave phase (0, 4) after step 0; phase (1, 4) takes up their softmax state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: Tile rows are a multiple of this (the smallest row count MKL treats like any larger one).
ROW_QUANTUM = 4
#: Most rows in one tile (tokens × query heads per KV head).
MAX_TILE_ROWS = 128


@dataclass(frozen=True)
class TileStep:
    """One KV step of a phase: its first `num_tiles` tiles read one page each.

    Attributes:
        num_tiles: active tiles (a prefix of the phase's tiles).
        pages_N: the page each active tile reads.
        page_range: ``(first, end)`` when `pages_N` is consecutive ascending (read as a view).
        mask_M_1_R_B: True for keys the rows of the LAST M active tiles must not see (their
            tokens' last, partly visible block); the others see the whole block. None: M = 0.
    """

    num_tiles: int
    pages_N: torch.Tensor
    page_range: tuple[int, int] | None
    mask_M_1_R_B: torch.Tensor | None


@dataclass(frozen=True)
class TilePhase:
    """Tiles with fixed query rows, run over consecutive KV steps from `first_step`.

    Attributes:
        index_P: flat query row (``token_row * num_heads + head``) of every tile row, in
            ``[tile, kv_head, row]`` order; pad rows point at the zero row
            (`TilePlan.num_query_rows`).
        shape: ``(tiles, kv_heads, rows)``.
        first_step: the KV block index of `steps[0]`; rows of a phase starting later carry
            the softmax state of their earlier phase.
        steps: the phase's steps, in order.
    """

    index_P: torch.Tensor
    shape: tuple[int, int, int]
    first_step: int
    steps: tuple[TileStep, ...]


@dataclass(frozen=True)
class TilePlan:
    """Attention work in fixed-shape tiles.

    Attributes:
        phases: ordered by `TilePhase.first_step` (a row's phases run in step order).
        num_query_rows: token rows × query heads; also the index of the zero pad row.
    """

    phases: tuple[TilePhase, ...]
    num_query_rows: int

    @property
    def num_tiles(self) -> int:
        return sum(p.shape[0] for p in self.phases)


@dataclass
class _Span:
    """New tokens of one sequence, at positions ``start .. end-1`` (one row each: the token at
    position ``p`` is row ``row_offset + p``)."""

    seq: int
    row_offset: int
    start: int
    end: int


@dataclass
class _Segment:
    """Spans that read the same page at every KV step ``first_step ..`` (``pages[i]`` at step
    ``first_step + i``); their tokens that go on past the last step continue in new segments."""

    first_step: int
    spans: list[_Span]
    pages: list[int]


@dataclass
class _Tile:
    """Up to ``max_tokens`` tokens of one segment that leave it at the same step."""

    rows: list[int]  # batch row of each token
    key_limits: list[int]  # each token sees key positions < its limit (its position + 1)
    end_step: int  # first step it no longer runs
    is_masked: bool  # its last step is its tokens' last (partly visible) block
    pages: list[int]  # its segment's page per step from the phase's first step


def plan_tiles(seq_num_cached: Sequence[int], seq_num_new: Sequence[int],
               seq_row_start: Sequence[int], tables: Sequence[Sequence[int]], *, num_rows: int,
               block_size: int, num_heads: int, num_kv_heads: int,
               device: torch.device | str) -> TilePlan:
    """Segments of every sequence's new tokens, cut into tiles and batched into phases.

    Args:
        seq_num_cached, seq_num_new, seq_row_start: per sequence: cached positions, new tokens,
            row of its first new token (its new tokens occupy consecutive rows).
        tables: per sequence block table (ids of the cache blocks in position order).
        num_rows: rows of the batch.
        num_heads, num_kv_heads: query heads and KV heads (GQA groups = their ratio).
    """
    groups = num_heads // num_kv_heads
    min_tokens = ROW_QUANTUM // math.gcd(groups, ROW_QUANTUM)  # fewest filling whole quanta
    max_tokens = max(min_tokens, MAX_TILE_ROWS // groups // min_tokens * min_tokens)
    # Powers of two from one token (a decode token's tile: its query heads, padded with zero
    # rows to the quantum), and the largest tile.
    tile_sizes = sorted({*(1 << k for k in range(max_tokens.bit_length())
                           if 1 << k < max_tokens), max_tokens})
    spans = [_Span(i, r - c, c, c + n) for i, (c, n, r)
             in enumerate(zip(seq_num_cached, seq_num_new, seq_row_start, strict=True))]
    tiles_by_phase: dict[tuple[int, int], list[_Tile]] = {}
    for segment in _find_segments(spans, tables, block_size):
        for tile in _cut_tiles(segment, block_size, max_tokens):
            size = next(s for s in tile_sizes if s >= len(tile.rows))
            tiles_by_phase.setdefault((segment.first_step, size), []).append(tile)
    return TilePlan(tuple(_build_phase(tiles, first, size, block_size, num_rows, num_heads,
                                       num_kv_heads, device)
                          for (first, size), tiles in sorted(tiles_by_phase.items())),
                    num_rows * num_heads)


def _find_segments(spans: list[_Span], tables: Sequence[Sequence[int]], block_size: int
                   ) -> list[_Segment]:
    """Every segment: spans that read the same page at each step; where their pages diverge,
    each page's spans continue as a new segment."""
    out = []
    pending = [(0, group) for group in _spans_by_page(spans, tables, 0, block_size)]
    while pending:
        first_step, group = pending.pop()
        pages = [tables[group[0].seq][first_step]]
        step = first_step + 1
        while True:
            split = _spans_by_page(group, tables, step, block_size)
            if len(split) != 1:
                pending += [(step, later) for later in split]
                break
            pages.append(tables[split[0][0].seq][step])
            step += 1
        out.append(_Segment(first_step, group, pages))
    return out


def _spans_by_page(spans: list[_Span], tables: Sequence[Sequence[int]], step: int,
                   block_size: int) -> list[list[_Span]]:
    """The spans' tokens that attend block ``step``, grouped by the page they read there."""
    by_page: dict[int, list[_Span]] = {}
    for span in spans:
        start = max(span.start, step * block_size)
        if start < span.end:
            by_page.setdefault(tables[span.seq][step], []).append(
                _Span(span.seq, span.row_offset, start, span.end))
    return list(by_page.values())


def _cut_tiles(segment: _Segment, block_size: int, max_tokens: int) -> list[_Tile]:
    """A segment's tiles, grouped by the step at which their tokens leave the segment: their
    last block, or the segment's last step for tokens that continue in later segments."""
    first_step, pages = segment.first_step, segment.pages
    end_step = first_step + len(pages)
    tiles = []
    for block in range(end_step - 1, first_step - 1, -1):
        block_start = block * block_size
        # Tokens whose last block this is; at the segment's last step, all that remain.
        block_end = block_start + block_size if block < end_step - 1 else None
        rows: list[int] = []
        key_limits: list[int] = []
        for span in segment.spans:
            start = max(span.start, block_start)
            end = span.end if block_end is None else min(span.end, block_end)
            rows += range(span.row_offset + start, span.row_offset + end)
            key_limits += range(start + 1, end + 1)
        for k in range(0, len(rows), max_tokens):
            limits = key_limits[k:k + max_tokens]
            tiles.append(_Tile(rows[k:k + max_tokens], limits, block + 1,
                               min(limits) <= block_start + block_size, pages))
    return tiles


def _build_phase(tiles: list[_Tile], first_step: int, size: int, block_size: int,
                 num_rows: int, num_heads: int, num_kv_heads: int, device: torch.device | str
                 ) -> TilePhase:
    """Index tensors of one phase; tiles are padded to ``size`` tokens with the zero row."""
    groups = num_heads // num_kv_heads
    # Longest-running first (active tiles are a prefix); among tiles ending at the same step,
    # the masked ones last (the mask covers a suffix).
    tiles = sorted(tiles, key=lambda t: (-t.end_step, t.is_masked, t.rows[0]))
    rows_N_T = torch.tensor([t.rows + [-1] * (size - len(t.rows)) for t in tiles])
    heads_Hkv_G = torch.arange(num_heads).view(num_kv_heads, groups)
    index = rows_N_T[:, None, :, None] * num_heads + heads_Hkv_G[None, :, None, :]
    index = torch.where(rows_N_T[:, None, :, None] < 0, num_rows * num_heads, index)
    tile_rows = -(-size * groups // ROW_QUANTUM) * ROW_QUANTUM  # zero rows pad to the quantum
    index = _pad_rows(index.reshape(len(tiles), num_kv_heads, size * groups), -1, tile_rows,
                      num_rows * num_heads)
    steps = []
    for step in range(first_step, tiles[0].end_step):
        active = [t for t in tiles if t.end_step > step]
        pages = [t.pages[step - first_step] for t in active]
        masked = [t for t in active if t.is_masked and t.end_step == step + 1]
        mask = None
        if masked:  # pad rows: limit past the block (zero queries, nothing to hide)
            block_start = step * block_size
            limits_M_T = torch.tensor([
                t.key_limits + [block_start + block_size] * (size - len(t.key_limits))
                for t in masked])
            keys_B = block_start + torch.arange(block_size)
            mask = (keys_B >= limits_M_T[:, :, None]).repeat_interleave(groups, dim=1)
            mask = _pad_rows(mask, 1, tile_rows, False)[:, None].to(device)
        is_range = pages == list(range(pages[0], pages[0] + len(pages)))
        steps.append(TileStep(len(active), torch.tensor(pages, dtype=torch.long, device=device),
                              (pages[0], pages[0] + len(pages)) if is_range else None, mask))
    return TilePhase(index.reshape(-1).to(device), (len(tiles), num_kv_heads, tile_rows),
                     first_step, tuple(steps))


def _pad_rows(x: torch.Tensor, dim: int, rows: int, value: int | bool) -> torch.Tensor:
    """``x`` with its tile-row dimension ``dim`` padded with ``value`` to ``rows``."""
    missing = rows - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_full(shape, value)], dim=dim)
