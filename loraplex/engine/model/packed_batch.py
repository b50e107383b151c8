"""`PackedBatch`: many variable-length sequences laid out as GEMM rows and attention tiles.

Built by `pack_sequences` from `SequenceInput`s (new tokens, adapter id or None, tokens already
in the KV cache, block table). Row layout (all linears, norms, the LM head): sequences grouped
into per-adapter segments in order of first appearance, base-model (no adapter) rows last, the
total padded with zero rows to a multiple of ``row_multiple``; MKL sgemm gives a row the same
bits for every row count that is a multiple of 8 (of 4 at one or two threads), wherever the row
sits; the loader checks the multiple on the machine (`row_quantum`). Where every dense GEMM
over the rows runs on the packed kernel, whose rows never depend on the row count, the total is
not padded (``batch_multiple`` 1: a one-sequence decode step is one row, not eight).

The LoRA segment GEMMs need each segment padded to ``row_multiple`` too (`LoraRows`, defined
in `lora_batch`). When that costs little (training), segments are padded in place in the row
layout (also a decode step of one adapter: its padding is the batch's own); when it would
multiply the rows (decode: one row per adapter), rows stay compact and the LoRA rows are
gathered into a padded layout and their deltas scattered back. Both give every
row the same bits. Attention works on a `TilePlan`. Knows nothing about weights; inconsistent
cache metadata is a UserError.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from loraplex.engine.kernels.attention_kernel import AttentionRuns
from loraplex.engine.model.image_rows import BatchImages, ImageSpan, batch_images, rope_positions
from loraplex.engine.model.lora_batch import LoraRows
from loraplex.engine.model.tile_plan import TilePlan, plan_tiles
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
        state_key: names the sequence's linear-attention state in the sampler's
            `LinearStates` (hybrid models); None in training.
        images: the sequence's images (all of them, wherever the new tokens are: they place
            its M-RoPE positions); their tokens among the new ones take the tower's output.
    """

    tokens: Sequence[int]
    adapter_id: str | None = None
    num_cached: int = 0
    block_table: Sequence[int] | None = None
    state_key: Hashable | None = None
    images: Sequence[ImageSpan] = ()


@dataclass(frozen=True)
class PackedBatch:
    """Token rows + attention plan for one forward (see module docstring).

    Attributes:
        tokens_R, positions_R: ``[num_rows]`` token id and absolute position of each row.
        seq_row_start, seq_num_new, seq_num_cached: per input sequence (input order).
        lora_rows: the adapter segments (None when every row is a base-model row).
        block_tables_B_N: per-sequence KV block ids (N: the longest table; padded with 0).
        write_rows_W, write_block_W, write_offset_W: rows whose keys/values are stored, and where.
        num_scratch_blocks: blocks of the training scratch pages; None with a persistent cache.
        block_size, row_multiple: the layout parameters used.
        tiles: the attention tile plan (the torch kernel's forward, and the backward).
        seq_state_key: per input sequence, its `SequenceInput.state_key`.
        rope_positions_3_R: M-RoPE (time, row, column) positions of each row when a sequence
            has images; None: ``positions_R`` on all three axes.
        images: the rows images fill (None: none).
    """

    tokens_R: torch.Tensor
    positions_R: torch.Tensor
    seq_row_start: tuple[int, ...]
    seq_num_new: tuple[int, ...]
    seq_num_cached: tuple[int, ...]
    lora_rows: LoraRows | None
    block_tables_B_N: torch.Tensor
    write_rows_W: torch.Tensor
    write_block_W: torch.Tensor
    write_offset_W: torch.Tensor
    num_scratch_blocks: int | None
    block_size: int
    row_multiple: int
    tiles: TilePlan
    seq_state_key: tuple[Hashable | None, ...] = field(default=())
    rope_positions_3_R: torch.Tensor | None = None
    images: BatchImages | None = None

    @cached_property
    def attention_runs(self) -> AttentionRuns:
        """The rows as the C attention kernel reads them (built on first use)."""
        return AttentionRuns.of(self.num_rows, self.seq_row_start, self.seq_num_new,
                                self.seq_num_cached, self.block_tables_B_N)

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
    num_heads: int = 1,
    num_kv_heads: int = 1,
    device: torch.device | str = "cpu",
    batch_multiple: int | None = None,
) -> PackedBatch:
    """Lay out sequences as rows and tiles (the algorithm; reads top to bottom).

    Args:
        seqs: the sequences, in the order results are wanted.
        row_multiple: pad every adapter segment of the LoRA layout, and the rows, to a
            multiple of this; 8 in batch-invariant mode, 1 in fast mode.
        batch_multiple: pad the rows as a whole to a multiple of this instead (default
            ``row_multiple``): 1 where no GEMM over all rows needs the padding (a model
            whose every dense GEMM runs on the packed kernel, `Transformer.pack`).
        block_size: KV positions per cache block (attention's KV block).
        num_heads, num_kv_heads: the model's query and KV heads (the tile plan's row layout).

    Raises:
        UserError: empty sequence, inconsistent block tables, or mixing scratch and cache mode.
    """
    _validate(seqs, block_size)
    is_scratch = all(s.block_table is None for s in seqs)

    row_start, tokens, positions, lora_rows = _lay_out_rows(
        seqs, row_multiple, row_multiple if batch_multiple is None else batch_multiple, device)
    num_rows = len(tokens)
    tables, next_scratch = _block_tables(seqs, block_size)
    width = max(len(t) for t in tables)
    block_tables = [[*t, *[0] * (width - len(t))] for t in tables]
    write_rows, write_block, write_offset = _kv_writes(seqs, row_start, tables, block_size)

    def tensor(values: Sequence[int] | Sequence[Sequence[int]]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return PackedBatch(
        tokens_R=tensor(tokens),
        positions_R=tensor(positions),
        seq_row_start=tuple(row_start),
        seq_num_new=tuple(len(s.tokens) for s in seqs),
        seq_num_cached=tuple(s.num_cached for s in seqs),
        lora_rows=lora_rows,
        block_tables_B_N=tensor(block_tables),
        write_rows_W=tensor(write_rows),
        write_block_W=tensor(write_block),
        write_offset_W=tensor(write_offset),
        num_scratch_blocks=next_scratch if is_scratch else None,
        block_size=block_size,
        row_multiple=row_multiple,
        tiles=plan_tiles([s.num_cached for s in seqs], [len(s.tokens) for s in seqs],
                         row_start, tables, num_rows=num_rows, block_size=block_size,
                         num_heads=num_heads, num_kv_heads=num_kv_heads, device=device),
        seq_state_key=tuple(s.state_key for s in seqs),
        rope_positions_3_R=_rope_positions(seqs, row_start, positions, device),
        images=batch_images([s.images for s in seqs], row_start,
                            [s.num_cached for s in seqs], [len(s.tokens) for s in seqs],
                            device),
    )


def _block_tables(seqs: Sequence[SequenceInput], block_size: int
                  ) -> tuple[list[list[int]], int]:
    """Each sequence's block table: its own, or consecutive scratch blocks (then also how many
    scratch blocks there are)."""
    tables: list[list[int]] = []
    next_scratch = 0
    for s in seqs:
        if s.block_table is not None:
            tables.append(list(s.block_table))
        else:
            n = -(-(s.num_cached + len(s.tokens)) // block_size)
            tables.append(list(range(next_scratch, next_scratch + n)))
            next_scratch += n
    return tables, next_scratch


def _kv_writes(seqs: Sequence[SequenceInput], row_start: Sequence[int],
               tables: Sequence[Sequence[int]], block_size: int
               ) -> tuple[list[int], list[int], list[int]]:
    """Every new token's row, cache block and offset in the block (the KV writes)."""
    write_rows, write_block, write_offset = [], [], []
    for i, s in enumerate(seqs):
        for j in range(len(s.tokens)):
            pos = s.num_cached + j
            write_rows.append(row_start[i] + j)
            write_block.append(tables[i][pos // block_size])
            write_offset.append(pos % block_size)
    return write_rows, write_block, write_offset


def _rope_positions(seqs: Sequence[SequenceInput], row_start: Sequence[int],
                    positions: Sequence[int], device: torch.device | str
                    ) -> torch.Tensor | None:
    """Every row's M-RoPE positions when some sequence has images (others: their own
    position on each axis; pad rows 0)."""
    if not any(s.images for s in seqs):
        return None
    out = torch.tensor(positions, dtype=torch.long).expand(3, -1).clone()
    for s, start in zip(seqs, row_start, strict=True):
        if s.images:
            out[:, start:start + len(s.tokens)] = rope_positions(s.images, s.num_cached,
                                                                 len(s.tokens))
    return out.to(device)


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


#: Pad segments in place while that adds at most this fraction of rows to the compact layout;
#: else gather LoRA rows.
MAX_IN_PLACE_PADDING = 0.125


def _in_place_extra_rows(sizes: Sequence[int], num_real: int, row_multiple: int,
                         batch_multiple: int) -> int:
    """Rows that padding every adapter segment in place adds to the compact layout (whose
    total is padded once, to ``batch_multiple``): zero for one adapter and no base rows, as
    in a decode step, where the two multiples are one."""
    def padded(n: int, multiple: int) -> int:
        return -(-n // multiple) * multiple

    num_base = num_real - sum(sizes)
    return (sum(padded(n, row_multiple) for n in sizes) + padded(num_base, batch_multiple)
            - padded(num_real, batch_multiple))


def _lay_out_rows(seqs: Sequence[SequenceInput], row_multiple: int, batch_multiple: int,
                  device: torch.device | str
                  ) -> tuple[list[int], list[int], list[int], LoraRows | None]:
    """Row order (adapter segments, then base rows), row contents, and the LoRA layout."""
    order: list[str] = []
    for s in seqs:
        if s.adapter_id is not None and s.adapter_id not in order:
            order.append(s.adapter_id)
    sizes = [sum(len(s.tokens) for s in seqs if s.adapter_id == a) for a in order]
    num_real = sum(len(s.tokens) for s in seqs)
    in_place = _in_place_extra_rows(sizes, num_real, row_multiple, batch_multiple) <= (
        MAX_IN_PLACE_PADDING * num_real)
    row_start = [0] * len(seqs)
    tokens: list[int] = []
    positions: list[int] = []
    ends: list[int] = []
    for adapter in [*order, None]:
        for i, s in enumerate(seqs):
            if s.adapter_id == adapter:
                row_start[i] = len(tokens)
                tokens += s.tokens
                positions += range(s.num_cached, s.num_cached + len(s.tokens))
        if adapter is None or in_place:
            pad = -len(tokens) % (batch_multiple if adapter is None else row_multiple)
            tokens += [0] * pad
            positions += [0] * pad
        if adapter is not None:
            ends.append(len(tokens))
    if not order:
        return row_start, tokens, positions, None
    if in_place:
        return row_start, tokens, positions, LoraRows(tuple(order), ends[-1], tuple(ends))
    gather: list[int] = []
    real: list[int] = []
    lora_ends: list[int] = []
    for start, end in zip([0, *ends[:-1]], ends, strict=True):
        real += range(len(gather), len(gather) + end - start)
        gather += range(start, end)
        gather += [0] * (-(end - start) % row_multiple)
        lora_ends.append(len(gather))

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return row_start, tokens, positions, LoraRows(tuple(order), ends[-1], tuple(lora_ends),
                                                  tensor(gather), tensor(real))
