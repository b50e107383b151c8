"""`TilePlan`: a packed batch's attention as fixed-shape matmul tiles, KV block by KV block.

A query token at position ``p`` attends KV blocks ``0, 1, ..., p // block_size`` in that order
(the online softmax of `attention.py`). Tokens that read the same physical page at the same
step share tiles: a tile's rows are its tokens' query heads of one KV head (token-major). A
*segment* is a set of tokens that read the same page at every step of a step range: all new
tokens of a sequence (training, prefill), or the G samples of a request over their shared
prompt pages, which then split into one segment per sample on its private pages. So a shared
prefix is read once per step for all its readers, and a one-token decode step costs a 4-row
tile. A `TilePhase` batches the tiles of all segments that start at the same step and have the
same row count: one batched matmul per operand and step, the tiles' softmax state kept in tile
layout across its steps (tiles sorted so that the still-active ones are a prefix).

Row counts are multiples of `ROW_QUANTUM` (4): MKL gives a row the same bits in any such
matmul, wherever it sits and whatever the other rows hold, and every other step is row-local,
so how rows are grouped never changes a result (tests/engine/model/test_batch_invariance.py
checks the BLAS assumption). Knows nothing about weights or the cache's contents.
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
class _Run:
    """New tokens of one sequence at positions ``first .. end-1`` (row = ``row0 + position``)."""

    seq: int
    row0: int
    first: int
    end: int


@dataclass
class _Tile:
    rows: list[int]
    limits: list[int]
    end: int  # first step it no longer runs
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
    unit = ROW_QUANTUM // math.gcd(groups, ROW_QUANTUM)  # fewest tokens filling whole quanta
    max_tokens = max(unit, MAX_TILE_ROWS // groups // unit * unit)
    sizes = sorted({*(unit << k for k in range(max_tokens.bit_length()) if unit << k < max_tokens),
                    max_tokens})
    runs = [_Run(i, r - c, c, c + n) for i, (c, n, r)
            in enumerate(zip(seq_num_cached, seq_num_new, seq_row_start, strict=True))]
    phases: dict[tuple[int, int], list[_Tile]] = {}
    for first_step, seg_runs, pages in _segments(runs, tables, block_size):
        for tile in _cut(seg_runs, first_step, pages, block_size, max_tokens):
            size = next(s for s in sizes if s >= len(tile.rows))
            phases.setdefault((first_step, size), []).append(tile)
    return TilePlan(tuple(_phase(tiles, first, size, block_size, num_rows, num_heads,
                                 num_kv_heads, device)
                          for (first, size), tiles in sorted(phases.items())),
                    num_rows * num_heads)


def _segments(runs: list[_Run], tables: Sequence[Sequence[int]], block_size: int
              ) -> list[tuple[int, list[_Run], list[int]]]:
    """``(first step, runs, page per step)`` of every segment: runs that read the same page
    at each step; where their pages diverge, each page's runs continue as a new segment."""
    out = []
    pending = [(0, group) for group in _by_page(runs, tables, 0, block_size)]
    while pending:
        first_step, seg_runs = pending.pop()
        pages = [tables[seg_runs[0].seq][first_step]]
        step = first_step + 1
        while True:
            split = _by_page(seg_runs, tables, step, block_size)
            if len(split) != 1:
                pending += [(step, group) for group in split]
                break
            pages.append(tables[split[0][0].seq][step])
            step += 1
        out.append((first_step, seg_runs, pages))
    return out


def _by_page(runs: list[_Run], tables: Sequence[Sequence[int]], step: int, block_size: int
             ) -> list[list[_Run]]:
    """The runs' tokens that attend block ``step``, grouped by the page they read there."""
    by_page: dict[int, list[_Run]] = {}
    for run in runs:
        first = max(run.first, step * block_size)
        if first < run.end:
            by_page.setdefault(tables[run.seq][step], []).append(
                _Run(run.seq, run.row0, first, run.end))
    return list(by_page.values())


def _cut(runs: list[_Run], first_step: int, pages: list[int], block_size: int,
         max_tokens: int) -> list[_Tile]:
    """A segment's tiles, grouped by the step at which their tokens leave the segment: their
    last block, or the segment's last step for tokens that continue in later segments."""
    end_step = first_step + len(pages)
    tiles = []
    for block in range(end_step - 1, first_step - 1, -1):
        lo = block * block_size
        hi = lo + block_size if block < end_step - 1 else None  # None: up to the run's end
        rows: list[int] = []
        limits: list[int] = []
        for run in runs:
            first, end = max(run.first, lo), run.end if hi is None else min(run.end, hi)
            rows += range(run.row0 + first, run.row0 + end)
            limits += range(first + 1, end + 1)
        for k in range(0, len(rows), max_tokens):
            part = limits[k:k + max_tokens]
            tiles.append(_Tile(rows[k:k + max_tokens], part, block + 1,
                               min(part) <= lo + block_size, pages))
    return tiles


def _phase(tiles: list[_Tile], first_step: int, size: int, block_size: int, num_rows: int,
           num_heads: int, num_kv_heads: int, device: torch.device | str) -> TilePhase:
    """Index tensors of one phase; tiles are padded to ``size`` tokens with the zero row."""
    groups = num_heads // num_kv_heads
    # Longest-running first (active tiles are a prefix); among tiles ending at the same step,
    # the masked ones last (the mask covers a suffix).
    tiles = sorted(tiles, key=lambda t: (-t.end, t.is_masked, t.rows[0]))
    rows_N_T = torch.tensor([t.rows + [-1] * (size - len(t.rows)) for t in tiles])
    heads_K_G = torch.arange(num_heads).view(num_kv_heads, groups)
    index = rows_N_T[:, None, :, None] * num_heads + heads_K_G[None, :, None, :]
    index = torch.where(rows_N_T[:, None, :, None] < 0, num_rows * num_heads, index)
    steps = []
    for step in range(first_step, tiles[0].end):
        active = [t for t in tiles if t.end > step]
        pages = [t.pages[step - first_step] for t in active]
        masked = [t for t in active if t.is_masked and t.end == step + 1]
        mask = None
        if masked:  # pad rows: limit past the block (zero queries, nothing to hide)
            lo = step * block_size
            limits_M_T = torch.tensor([t.limits + [lo + block_size] * (size - len(t.limits))
                                       for t in masked])
            keys_B = lo + torch.arange(block_size)
            mask = (keys_B >= limits_M_T[:, :, None]).repeat_interleave(groups, dim=1)[:, None]
            mask = mask.to(device)
        is_range = pages == list(range(pages[0], pages[0] + len(pages)))
        steps.append(TileStep(len(active), torch.tensor(pages, dtype=torch.long, device=device),
                              (pages[0], pages[0] + len(pages)) if is_range else None, mask))
    return TilePhase(index.reshape(-1).to(device), (len(tiles), num_kv_heads, size * groups),
                     first_step, tuple(steps))
