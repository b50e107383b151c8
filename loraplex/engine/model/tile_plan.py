"""`TilePlan`: attention work of a packed batch as fixed-shape query tiles.

Each sequence's new positions are cut into tiles of ``tile_size`` positions aligned on absolute
position (position ``p`` sits at tile row ``p % tile_size``), so a decoded token occupies the
same tile row as in a full forward. Tiles are sorted by the number of KV blocks they attend to,
descending, so the tiles still active at KV block ``b`` are a prefix (``active_tiles[b]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TilePlan:
    """Attention work in fixed-shape tiles.

    Attributes:
        rows_N_T: row index of each tile slot's query (``num_rows`` = the zero pad row).
        limits_N_T: keys visible to each tile slot (``position + 1``; 1 for pad slots).
        block_table_N_B: KV-cache block ids of each tile's sequence (padded with block 0).
        active_tiles: tiles attending to KV block ``b`` (a non-increasing prefix count).
        slot_of_row_R: each row's slot in the flattened ``[N * T]`` tile output (pad rows point
            past the end, at an appended zero slot).
    """

    rows_N_T: torch.Tensor
    limits_N_T: torch.Tensor
    block_table_N_B: torch.Tensor
    active_tiles: tuple[int, ...]
    slot_of_row_R: torch.Tensor

    @property
    def num_tiles(self) -> int:
        return self.rows_N_T.shape[0]


def plan_tiles(seq_num_cached: Sequence[int], seq_num_new: Sequence[int],
               seq_row_start: Sequence[int], tables: Sequence[Sequence[int]], num_rows: int,
               block_size: int, tile_size: int, device: torch.device | str) -> TilePlan:
    """Position-aligned query tiles of every sequence's new tokens, sorted by KV blocks needed.

    Args:
        seq_num_cached, seq_num_new, seq_row_start: per sequence: cached positions, new tokens,
            row of its first new token (its new tokens occupy consecutive rows).
        tables: per sequence block table (ids of the cache blocks in position order).
        num_rows: rows of the batch (the index of the zero pad row).
    """
    found: list[tuple[int, int, int]] = []  # (num_blocks, seq, tile)
    for i, (cached, new) in enumerate(zip(seq_num_cached, seq_num_new, strict=True)):
        for t in range(cached // tile_size, (cached + new - 1) // tile_size + 1):
            found.append(((t * tile_size) // block_size + 1, i, t))
    found.sort(key=lambda x: -x[0])  # stable: input order within equal block counts
    width = max(len(t) for t in tables)
    rows, limits, tile_tables = [], [], []
    slot_of_row = [len(found) * tile_size] * num_rows  # default: the appended zero slot
    for n, (_, i, t) in enumerate(found):
        first_pos, cached, new = t * tile_size, seq_num_cached[i], seq_num_new[i]
        tile_rows, tile_limits = [num_rows] * tile_size, [1] * tile_size
        for k in range(max(0, cached - first_pos), min(tile_size, cached + new - first_pos)):
            row = seq_row_start[i] + first_pos + k - cached
            tile_rows[k], tile_limits[k] = row, first_pos + k + 1
            slot_of_row[row] = n * tile_size + k
        rows.append(tile_rows)
        limits.append(tile_limits)
        tile_tables.append([*tables[i], *[0] * (width - len(tables[i]))])
    active = tuple(sum(1 for f in found if f[0] > b) for b in range(found[0][0]))

    def tensor(values: Sequence[int] | Sequence[Sequence[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return TilePlan(rows_N_T=tensor(rows), limits_N_T=tensor(limits),
                    block_table_N_B=tensor(tile_tables), active_tiles=active,
                    slot_of_row_R=tensor(slot_of_row))
