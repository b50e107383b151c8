"""`PackedBatch`: many variable-length sequences laid out as GEMM rows and attention tiles.

Built by `pack_sequences` from `SequenceInput`s (new tokens, adapter id or None, tokens
already in the KV cache, block table). Two layouts of the same tokens:

* **Rows** (all linears, norms, the LM head): sequences grouped into per-adapter segments in
  order of first appearance, base-model (no adapter) rows last; each segment padded with zero
  rows to a multiple of ``row_multiple``. A row's GEMM results then do not depend on the
  segment sizes around it (MKL sgemm is row-invariant for row counts that are multiples of 16).
* **Tiles** (attention): each sequence's new positions in tiles of ``tile_size`` positions
  aligned on absolute position (position ``p`` sits at tile row ``p % tile_size``), so a
  decoded token occupies the same tile row as in a full forward. Tiles are sorted by the
  number of KV blocks they attend to, descending, so the active tiles of KV block ``b`` are a
  prefix (``active_tiles[b]``).

Knows nothing about weights; refuses inconsistent cache metadata with a UserError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from loraplex.errors import user_error


@dataclass(frozen=True)
class SequenceInput:
    """One sequence's share of a forward.

    Attributes:
        tokens: new token ids to run (positions ``num_cached ..``).
        adapter_id: the LoRA adapter applied to these rows, None for the bare base model.
        num_cached: positions ``0 .. num_cached-1`` already hold keys/values in the cache.
        block_table: cache blocks covering positions ``0 .. num_cached+len(tokens)-1``; None
            in a training forward without persistent cache (scratch blocks are assigned).
    """

    tokens: Sequence[int]
    adapter_id: str | None = None
    num_cached: int = 0
    block_table: Sequence[int] | None = None


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


@dataclass(frozen=True)
class PackedBatch:
    """Token rows + attention plan for one forward (see module docstring).

    Attributes:
        tokens_R, positions_R: ``[num_rows]`` token id and absolute position of each row.
        seq_row_start, seq_num_new, seq_num_cached: per input sequence (input order).
        segment_adapter_ids: adapters with rows, in row order (the base segment is not listed).
        segment_row_ends: cumulative end row of each adapter segment.
        num_lora_rows: rows covered by adapter segments (base rows follow).
        block_tables_S_B: per-sequence KV block ids (padded with 0).
        write_rows_W, write_block_W, write_offset_W: rows whose keys/values are stored, and where.
        num_scratch_blocks: blocks of the training scratch pages; None with a persistent cache.
        block_size, tile_size, row_multiple: the layout parameters used.
        tiles: the attention tile plan.
    """

    tokens_R: torch.Tensor
    positions_R: torch.Tensor
    seq_row_start: tuple[int, ...]
    seq_num_new: tuple[int, ...]
    seq_num_cached: tuple[int, ...]
    segment_adapter_ids: tuple[str, ...]
    segment_row_ends: tuple[int, ...]
    num_lora_rows: int
    block_tables_S_B: torch.Tensor
    write_rows_W: torch.Tensor
    write_block_W: torch.Tensor
    write_offset_W: torch.Tensor
    num_scratch_blocks: int | None
    block_size: int
    tile_size: int
    row_multiple: int
    tiles: TilePlan

    @property
    def num_rows(self) -> int:
        return self.tokens_R.shape[0]

    @property
    def num_sequences(self) -> int:
        return len(self.seq_row_start)

    def row_index(self) -> torch.Tensor:
        """``[T]`` row of every new token, sequences in input order (tokens in order)."""
        parts = [torch.arange(s, s + n) for s, n in zip(self.seq_row_start, self.seq_num_new,
                                                        strict=True)]
        return torch.cat(parts).to(self.tokens_R.device) if parts else self.tokens_R[:0]

    def scatter_to_rows(self, values_T: torch.Tensor, fill: float | int = 0) -> torch.Tensor:
        """Put per-token values (input order) into row order; pad rows get ``fill``."""
        out = values_T.new_full((self.num_rows, *values_T.shape[1:]), fill)
        return out.index_copy(0, self.row_index(), values_T)

    def gather_from_rows(self, values_R: torch.Tensor) -> torch.Tensor:
        """Per-token values in input order from a row-ordered tensor."""
        return values_R.index_select(0, self.row_index())


def pack_sequences(
    seqs: Sequence[SequenceInput],
    *,
    row_multiple: int,
    block_size: int,
    tile_size: int = 16,
    device: torch.device | str = "cpu",
) -> PackedBatch:
    """Lay out sequences as rows and tiles (the algorithm; reads top to bottom).

    Args:
        seqs: the sequences, in the order results are wanted.
        row_multiple: pad every adapter segment (and the base segment) to a multiple of this;
            16 in batch-invariant mode, 1 in fast mode.
        block_size: KV positions per cache block (attention's KV block).
        tile_size: query positions per attention tile; must divide ``block_size``.

    Raises:
        UserError: empty sequence, inconsistent block tables, or mixing scratch and cache mode.
    """
    if block_size % tile_size:
        raise user_error("kv_block_size", f"{block_size} is not a multiple of tile {tile_size}")
    _validate(seqs, block_size)
    is_scratch = all(s.block_table is None for s in seqs)

    # Row layout: adapter segments in order of first appearance, base rows last.
    order: list[str | None] = []
    for s in seqs:
        if s.adapter_id not in order and s.adapter_id is not None:
            order.append(s.adapter_id)
    if any(s.adapter_id is None for s in seqs):
        order.append(None)
    row_start = [0] * len(seqs)
    segment_ends: list[int] = []
    tokens: list[int] = []
    positions: list[int] = []
    for adapter in order:
        for i, s in enumerate(seqs):
            if s.adapter_id == adapter:
                row_start[i] = len(tokens)
                tokens += list(s.tokens)
                positions += range(s.num_cached, s.num_cached + len(s.tokens))
        pad = -len(tokens) % row_multiple
        tokens += [0] * pad
        positions += [0] * pad
        if adapter is not None:
            segment_ends.append(len(tokens))
    num_rows = len(tokens)

    # Block tables: the sequence's own, or consecutive scratch blocks.
    tables: list[list[int]] = []
    next_scratch = 0
    for s in seqs:
        if s.block_table is not None:
            tables.append(list(s.block_table))
        else:
            n = -(-(s.num_cached + len(s.tokens)) // block_size)
            tables.append(list(range(next_scratch, next_scratch + n)))
            next_scratch += n
    width = max(len(t) for t in tables)
    block_tables = [t + [0] * (width - len(t)) for t in tables]

    # KV writes: every new token's row and cache slot.
    write_rows, write_block, write_offset = [], [], []
    for i, s in enumerate(seqs):
        for j in range(len(s.tokens)):
            pos = s.num_cached + j
            write_rows.append(row_start[i] + j)
            write_block.append(tables[i][pos // block_size])
            write_offset.append(pos % block_size)

    tiles = _plan_tiles(seqs, row_start, tables, width, num_rows, block_size, tile_size)

    def tensor(values: Sequence[int] | Sequence[Sequence[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return PackedBatch(
        tokens_R=tensor(tokens),
        positions_R=tensor(positions),
        seq_row_start=tuple(row_start),
        seq_num_new=tuple(len(s.tokens) for s in seqs),
        seq_num_cached=tuple(s.num_cached for s in seqs),
        segment_adapter_ids=tuple(a for a in order if a is not None),
        segment_row_ends=tuple(segment_ends),
        num_lora_rows=segment_ends[-1] if segment_ends else 0,
        block_tables_S_B=tensor(block_tables),
        write_rows_W=tensor(write_rows),
        write_block_W=tensor(write_block),
        write_offset_W=tensor(write_offset),
        num_scratch_blocks=next_scratch if is_scratch else None,
        block_size=block_size,
        tile_size=tile_size,
        row_multiple=row_multiple,
        tiles=TilePlan(rows_N_T=tensor(tiles[0]), limits_N_T=tensor(tiles[1]),
                       block_table_N_B=tensor(tiles[2]), active_tiles=tiles[3],
                       slot_of_row_R=tensor(tiles[4])),
    )


def _validate(seqs: Sequence[SequenceInput], block_size: int) -> None:
    if not seqs:
        raise user_error("sequences", "a batch needs at least one sequence")
    has_table = [s.block_table is not None for s in seqs]
    if any(has_table) and not all(has_table):
        raise user_error("block_table", "either every sequence has a block table or none does")
    for i, s in enumerate(seqs):
        if not s.tokens:
            raise user_error(f"sequences[{i}].tokens", "must not be empty")
        if s.num_cached < 0:
            raise user_error(f"sequences[{i}].num_cached", "must be ≥ 0")
        if s.block_table is None:
            if s.num_cached:
                raise user_error(f"sequences[{i}].num_cached",
                                 "cached positions need a block table")
            continue
        needed = -(-(s.num_cached + len(s.tokens)) // block_size)
        if len(s.block_table) < needed:
            raise user_error(f"sequences[{i}].block_table",
                             f"{len(s.block_table)} blocks cannot hold "
                             f"{s.num_cached + len(s.tokens)} positions")


_TileLists = tuple[list[list[int]], list[list[int]], list[list[int]], tuple[int, ...], list[int]]


def _plan_tiles(seqs: Sequence[SequenceInput], row_start: list[int], tables: list[list[int]],
                width: int, num_rows: int, block_size: int, tile_size: int) -> _TileLists:
    """Position-aligned query tiles, sorted by KV blocks needed (descending)."""
    found: list[tuple[int, int, int]] = []  # (num_blocks, seq, tile)
    for i, s in enumerate(seqs):
        first, last = s.num_cached, s.num_cached + len(s.tokens) - 1
        for t in range(first // tile_size, last // tile_size + 1):
            found.append(((t * tile_size) // block_size + 1, i, t))
    found.sort(key=lambda x: -x[0])  # stable: input order within equal block counts
    rows, limits, tables_n = [], [], []
    slot_of_row = [-1] * num_rows
    for n, (_, i, t) in enumerate(found):
        s = seqs[i]
        tile_rows, tile_limits = [], []
        for k in range(tile_size):
            pos = t * tile_size + k
            j = pos - s.num_cached
            if 0 <= j < len(s.tokens):
                row = row_start[i] + j
                tile_rows.append(row)
                tile_limits.append(pos + 1)
                slot_of_row[row] = n * tile_size + k
            else:
                tile_rows.append(num_rows)
                tile_limits.append(1)
        rows.append(tile_rows)
        limits.append(tile_limits)
        tables_n.append(tables[i] + [0] * (width - len(tables[i])))
    pad_slot = len(found) * tile_size
    slot_of_row = [pad_slot if x < 0 else x for x in slot_of_row]
    max_blocks = found[0][0]
    active = tuple(sum(1 for f in found if f[0] > b) for b in range(max_blocks))
    return rows, limits, tables_n, active, slot_of_row
