"""pack_sequences: row layout, LoRA segment layouts, tiles, KV slots and input validation."""

from __future__ import annotations

import pytest
import torch

from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model import packed_batch
from loraplex.engine.model.compute_options import ComputeOptions
from loraplex.engine.model.packed_batch import SequenceInput, pack_sequences
from loraplex.engine.model.spec import ModelSpec, RopeSpec
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.model.weights import random_weights
from loraplex.errors import UserError


def pack(seqs: list[SequenceInput], row_multiple: int = 16):  # type: ignore[no-untyped-def]
    return pack_sequences(seqs, row_multiple=row_multiple, block_size=64)


def test_rows_group_adapters_in_first_appearance_order_with_base_last() -> None:
    seqs = [SequenceInput([1] * 30, None), SequenceInput([2] * 100, "b"),
            SequenceInput([3] * 200, "a"), SequenceInput([4] * 50, "b")]
    batch = pack(seqs)
    rows = batch.lora_rows
    assert rows is not None and rows.adapter_ids == ("b", "a")
    assert rows.gather_P is None  # 9 + 8 pad rows on 350 adapter tokens: padded in place
    assert rows.segment_ends == (160, 368) and rows.num_rows == 368
    assert batch.seq_row_start == (368, 0, 160, 100)
    assert batch.num_rows == 400 and batch.num_rows % 16 == 0
    assert batch.tokens_R[100:150].eq(4).all() and batch.tokens_R[150:160].eq(0).all()
    assert batch.positions_R[100:150].tolist() == list(range(50))
    values = torch.arange(380)
    assert torch.equal(batch.gather_from_rows(batch.scatter_to_rows(values, fill=-1)), values)


def test_small_segments_stay_compact_and_are_gathered_for_lora() -> None:
    seqs = [SequenceInput([i + 1], f"a{i}", 10, [0]) for i in range(5)]  # decode: 1 row each
    batch = pack(seqs)
    rows = batch.lora_rows
    assert batch.num_rows == 16 and rows is not None and rows.num_rows == 5
    assert rows.segment_ends == (16, 32, 48, 64, 80)
    assert rows.gather_P is not None and rows.real_P is not None
    assert rows.gather_P[[0, 16, 32]].tolist() == [0, 1, 2] and rows.gather_P[1] == 0
    assert rows.real_P.tolist() == [0, 16, 32, 48, 64]


def test_fast_mode_rows_are_unpadded() -> None:
    batch = pack([SequenceInput([1] * 7, "a"), SequenceInput([2] * 3)], row_multiple=1)
    assert batch.num_rows == 10
    assert batch.lora_rows is not None and batch.lora_rows.segment_ends == (7,)


def test_tiles_follow_sequences_block_by_block_and_mask_only_last_blocks() -> None:
    seqs = [SequenceInput([5] * 3, None, 37, [7]), SequenceInput([6] * 100, None, 0, [1, 2])]
    batch = pack_sequences(seqs, row_multiple=16, block_size=64, num_heads=2, num_kv_heads=1)
    zero_row = batch.num_rows * 2  # rows are (token row, head) pairs
    assert batch.tiles.num_query_rows == zero_row
    small, large = batch.tiles.phases  # seq 0's 3 tokens pad to 4; seq 1's 64-token tiles
    assert small.shape == (1, 1, 8) and small.first_step == 0
    assert small.index_P.tolist() == [0, 1, 2, 3, 4, 5, zero_row, zero_row]
    [only] = small.steps
    assert only.pages_N.tolist() == [7] and only.page_range == (7, 8)
    assert only.mask_M_1_R_B is not None
    visible = (~only.mask_M_1_R_B[0, 0]).sum(-1).tolist()
    assert visible == [38, 38, 39, 39, 40, 40, 64, 64]  # limits 38..40; pad rows unmasked
    # Seq 1 (rows 3..102): positions 64..99 run two steps, so their tile comes first; at
    # step 0 only positions 0..63 (the last active tile) see a partial block.
    assert large.shape == (2, 1, 128)
    assert large.index_P[:2].tolist() == [(3 + 64) * 2, (3 + 64) * 2 + 1]
    step0, step1 = large.steps
    assert step0.num_tiles == 2 and step0.pages_N.tolist() == [1, 1]
    assert step0.page_range is None
    assert step0.mask_M_1_R_B is not None and step0.mask_M_1_R_B.shape[0] == 1
    assert step1.num_tiles == 1 and step1.pages_N.tolist() == [2]
    assert step1.mask_M_1_R_B is not None and step1.mask_M_1_R_B.shape[0] == 1
    assert batch.write_block_W[:3].tolist() == [7, 7, 7]
    assert batch.write_offset_W[:3].tolist() == [37, 38, 39]


def test_sequences_sharing_a_page_share_a_tile() -> None:
    """Two decode tokens over a shared prompt page: one 4-row tile at block 0, then one
    masked tile each on their private pages (consecutive: read as a view)."""
    seqs = [SequenceInput([1], None, 70, [3, 4]), SequenceInput([2], None, 70, [3, 5])]
    batch = pack_sequences(seqs, row_multiple=16, block_size=64, num_heads=2, num_kv_heads=1)
    shared, private = batch.tiles.phases
    assert shared.shape == (1, 1, 4) and shared.index_P.tolist() == [0, 1, 2, 3]
    [step] = shared.steps
    assert step.pages_N.tolist() == [3] and step.mask_M_1_R_B is None
    assert private.shape == (2, 1, 4) and private.first_step == 1
    [step] = private.steps
    assert step.page_range == (4, 6)
    assert step.mask_M_1_R_B is not None and step.mask_M_1_R_B.shape[0] == 2


@pytest.mark.parametrize(("seqs", "field"), [
    ([], "sequences"),
    ([SequenceInput([])], "sequences[0].tokens"),
    ([SequenceInput([1], None, 3)], "sequences[0].num_cached"),
    ([SequenceInput([1] * 70, None, 0, [0])], "sequences[0].block_table"),
    ([SequenceInput([1], None, 0, [0]), SequenceInput([1])], "block_table"),
])
def test_invalid_inputs_name_the_field(seqs: list[SequenceInput], field: str) -> None:
    with pytest.raises(UserError) as err:
        pack(seqs)
    assert err.value.field == field


def test_in_place_and_gathered_lora_layouts_give_identical_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec(arch="qwen3", vocab_size=128, hidden_size=64, intermediate_size=96,
                     num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6,
                     rope=RopeSpec(1e6), tie_word_embeddings=False, max_position_embeddings=256)
    model = Transformer(spec, random_weights(spec, 0, std=0.2), ComputeOptions())
    bank = AdapterBank(spec, "cpu", 16)
    for name in ("a", "b"):
        with torch.no_grad():
            for p in bank.create(name, LoraConfig(rank=4, seed=1)).parameters():
                p.normal_(0, 0.1)
    seqs = [SequenceInput(list(range(1, 40)), "a"), SequenceInput(list(range(9, 12)), "b"),
            SequenceInput(list(range(3, 30)))]

    def logits(threshold: float) -> torch.Tensor:
        monkeypatch.setattr(packed_batch, "MAX_IN_PLACE_PADDING", threshold)
        batch = model.pack(seqs)
        lora = bank.stack(batch, rank_multiple=16, dtype=torch.float32)
        assert lora is not None and (lora.rows.gather_P is None) == (threshold > 1)
        with torch.no_grad():
            return batch.gather_from_rows(model.logits(model.forward(batch, lora), lora))

    assert torch.equal(logits(0.0), logits(10.0))


def test_one_adapter_decode_pads_its_segment_in_place_at_no_extra_rows() -> None:
    """8 decode rows of one adapter: the batch pads to 16 rows anyway, so the segment is padded
    in place (no per-linear gather/scatter); 8 adapters would add 7 × 16 rows: gathered."""
    one = pack([SequenceInput([i + 1], "a", 10, [0]) for i in range(8)])
    assert one.num_rows == 16 and one.lora_rows is not None
    assert one.lora_rows.gather_P is None and one.lora_rows.segment_ends == (16,)
    many = pack([SequenceInput([i + 1], f"a{i}", 10, [0]) for i in range(8)])
    assert many.num_rows == 16 and many.lora_rows is not None
    assert many.lora_rows.gather_P is not None
