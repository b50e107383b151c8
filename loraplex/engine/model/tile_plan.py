"""`TilePlan`: a packed batch's attention as fixed-shape matmul tiles, KV block by KV block.

A query token at position ``p`` attends KV blocks ``0, 1, ..., p // block_size`` in that order
(the online softmax of `attention.py`). At KV step ``b`` the tokens that read the same physical
page are cut into tiles; a tile's rows are its tokens' query heads of one KV head (token-major),
and one batched matmul per operand runs all tiles of a `TileGroup` (equal row counts). Tokens
of different sequences share a tile when their block tables share the page (the G samples of a
request over their prompt), so a shared prefix is read once per step, not once per sequence;
a one-token decode step costs a 4-row tile, not a 16-row one.

Row counts are multiples of `ROW_QUANTUM` (4): MKL gives a row the same bits in any such
matmul, wherever it sits and whatever the other rows hold, and every other step is row-local,
so regrouping rows never changes a result (tests/engine/model/test_batch_invariance.py checks
the BLAS assumption). Knows nothing about weights or the cache's contents.
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
class TileGroup:
    """The tiles of one KV step that have the same row count: one batched matmul per operand.

    Attributes:
        index_P: flat query row (``token_row * num_heads + head``) of every tile row, in
            ``[tile, kv_head, row]`` order; pad rows point at the zero row
            (`TilePlan.num_query_rows`).
        shape: ``(tiles, kv_heads, rows)``.
        pages_N: the page every tile reads.
        page_range: ``(first, end)`` when `pages_N` is consecutive ascending (read as a view).
        mask_M_1_R_B: True for keys the rows of the first M tiles must not see (their tokens'
            last, partly visible block); later tiles see their whole block. None when M = 0.
    """

    index_P: torch.Tensor
    shape: tuple[int, int, int]
    pages_N: torch.Tensor
    page_range: tuple[int, int] | None
    mask_M_1_R_B: torch.Tensor | None


@dataclass(frozen=True)
class TilePlan:
    """Attention work in fixed-shape tiles.

    Attributes:
        steps: per KV block index ``b`` (in order), the tile groups reading block ``b``.
        num_query_rows: token rows × query heads; also the index of the zero pad row.
    """

    steps: tuple[tuple[TileGroup, ...], ...]
    num_query_rows: int

    @property
    def num_tiles(self) -> int:
        return sum(g.shape[0] for groups in self.steps for g in groups)


@dataclass
class _Tile:
    page: int
    is_masked: bool
    rows: list[int]
    limits: list[int]


def plan_tiles(seq_num_cached: Sequence[int], seq_num_new: Sequence[int],
               seq_row_start: Sequence[int], tables: Sequence[Sequence[int]], *, num_rows: int,
               block_size: int, num_heads: int, num_kv_heads: int,
               device: torch.device | str) -> TilePlan:
    """Tiles of every sequence's new tokens, step by step (the algorithm).

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
    last_block = max((c + n - 1) // block_size
                     for c, n in zip(seq_num_cached, seq_num_new, strict=True))
    steps = []
    for b in range(last_block + 1):
        first_key, end_key = b * block_size, (b + 1) * block_size
        by_page: dict[int, _Tile] = {}
        full_by_page: dict[int, list[int]] = {}
        for i, (cached, new) in enumerate(zip(seq_num_cached, seq_num_new, strict=True)):
            first = max(cached, first_key)
            if first >= cached + new:
                continue
            page = tables[i][b]
            row0 = seq_row_start[i] - cached
            diagonal_end = min(cached + new, end_key)  # tokens whose last block is b
            if first < diagonal_end:
                tile = by_page.setdefault(page, _Tile(page, True, [], []))
                tile.rows += range(row0 + first, row0 + diagonal_end)
                tile.limits += range(first + 1, diagonal_end + 1)
            full_by_page.setdefault(page, []).extend(
                range(row0 + max(first, diagonal_end), row0 + cached + new))
        tiles = [_Tile(t.page, True, t.rows[k:k + max_tokens], t.limits[k:k + max_tokens])
                 for t in by_page.values() for k in range(0, len(t.rows), max_tokens)]
        tiles += [_Tile(page, False, rows[k:k + max_tokens], [])
                  for page, rows in full_by_page.items() for k in range(0, len(rows), max_tokens)]
        by_size: dict[int, list[_Tile]] = {}
        for tile in tiles:
            by_size.setdefault(next(s for s in sizes if s >= len(tile.rows)), []).append(tile)
        steps.append(tuple(
            _group(sorted(ts, key=lambda t: (not t.is_masked, t.page)), size, first_key,
                   block_size, num_rows, num_heads, num_kv_heads, device)
            for size, ts in sorted(by_size.items())))
    return TilePlan(tuple(steps), num_rows * num_heads)


def _group(tiles: list[_Tile], size: int, first_key: int, block_size: int, num_rows: int,
           num_heads: int, num_kv_heads: int, device: torch.device | str) -> TileGroup:
    """Index tensors of one group; tiles are padded to ``size`` tokens with the zero row."""
    groups = num_heads // num_kv_heads
    rows_N_T = torch.tensor([t.rows + [-1] * (size - len(t.rows)) for t in tiles])
    heads_K_G = torch.arange(num_heads).view(num_kv_heads, groups)
    index = rows_N_T[:, None, :, None] * num_heads + heads_K_G[None, :, None, :]
    index = torch.where(rows_N_T[:, None, :, None] < 0, num_rows * num_heads, index)
    pages = [t.page for t in tiles]
    is_range = pages == list(range(pages[0], pages[0] + len(pages)))
    mask = None
    masked = [t for t in tiles if t.is_masked]
    if masked:  # pad rows: limit past the block (zero queries, nothing to hide)
        limits_M_T = torch.tensor([t.limits + [first_key + block_size] * (size - len(t.limits))
                                   for t in masked])
        keys_B = first_key + torch.arange(block_size)
        mask = (keys_B >= limits_M_T[:, :, None]).repeat_interleave(groups, dim=1)[:, None]
        mask = mask.to(device)
    return TileGroup(index_P=index.reshape(-1).to(device),
                     shape=(len(tiles), num_kv_heads, size * groups),
                     pages_N=torch.tensor(pages, dtype=torch.long, device=device),
                     page_range=(pages[0], pages[0] + len(pages)) if is_range else None,
                     mask_M_1_R_B=mask)
