"""FLOP accounting against hand-computed values."""

from __future__ import annotations

import pytest

from loraplex.cost.cards.models import get_model_card
from loraplex.cost.flops import (
    TrainingMethod,
    adapter_flops_per_token_per_pass,
    attended_positions,
    attention_flops,
    forward_flops,
    policy_forward_flops,
    training_flops,
)
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model_card import ModelCard
from loraplex.errors import UserError

# L=2, hidden 8, 2 heads × 4, 1 KV head, MLP 16, vocab 10: matmul params 1,152 + 80 = 1,232;
# attention 2·2·(4+4) = 32 FLOPs per position per layer, 64 over both layers.
TINY = ModelCard(name="tiny", num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1,
                 head_dim=4, intermediate_size=16, vocab_size=10)
N, ATTN = 1232, 64
# Rank-2 LoRA on everything: Σ r·(d_in+d_out) = 2 · (2·128 + 18) = 548; one pass 2·548.
ADAPTER_PASS = 1096
LORA = TrainingMethod(lora=LoraConfig(rank=2))


def test_attended_positions_causal_and_windowed() -> None:
    assert attended_positions(0, 4) == 8             # ∫₀⁴ x dx
    assert attended_positions(2, 2) == 6             # (16 - 4) / 2
    assert attended_positions(0, 4, window=3) == 7.5  # 9/2 + 3·1
    assert attended_positions(5, 2, window=3) == 6    # every token capped at 3
    assert attended_positions(0, 2, window=3) == 2
    with pytest.raises(UserError):
        attended_positions(-1, 2)


def test_forward_of_a_sequence_and_of_a_cached_chunk() -> None:
    assert forward_flops(TINY, 10) == 2 * N * 10 + ATTN * 50
    # 3 new tokens after 7 cached attend ∫₇¹⁰ x dx = 25.5 positions.
    assert forward_flops(TINY, 3, start=7) == 2 * N * 3 + ATTN * 25.5
    assert attention_flops(TINY, 3, start=7) == ATTN * 25.5


def test_qwen3_8b_per_token_forward_at_1k_context() -> None:
    card = get_model_card("Qwen/Qwen3-8B")
    blocks = 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288)
    head = 4096 * 151936
    per_position = 36 * 2 * 32 * (128 + 128)  # 589,824: 0.59 GFLOP per 1K context
    # The 1,000th token attends ∫₉₉₉¹⁰⁰⁰ x dx = 999.5 positions.
    assert forward_flops(card, 1, start=999) == 2 * (blocks + head) + per_position * 999.5
    assert 2 * (blocks + head) == pytest.approx(15.14e9, rel=1e-3)


def test_lora_training_is_4n_plus_adapter_terms_plus_3x_attention() -> None:
    assert adapter_flops_per_token_per_pass(TINY, LORA) == ADAPTER_PASS
    expected = (4 * N + 3 * ADAPTER_PASS) * 10 + 3 * ATTN * 50
    assert training_flops(TINY, 10, LORA) == expected == 91760


def test_full_fine_tuning_is_6n_plus_3x_attention() -> None:
    full = TrainingMethod(kind="full")
    assert adapter_flops_per_token_per_pass(TINY, full) == 0
    assert training_flops(TINY, 10, full) == 6 * N * 10 + 3 * ATTN * 50 == 83520


def test_activation_checkpointing_adds_one_forward() -> None:
    ckpt = TrainingMethod(lora=LoraConfig(rank=2), activation_checkpointing=True)
    extra = (2 * N + ADAPTER_PASS) * 10 + ATTN * 50
    assert training_flops(TINY, 10, ckpt) == 91760 + extra


def test_policy_forward_includes_the_adapter() -> None:
    assert policy_forward_flops(TINY, 10, LORA) == (2 * N + ADAPTER_PASS) * 10 + ATTN * 50


def test_rank_32_lora_on_qwen3_8b_is_about_half_a_gflop_per_token() -> None:
    card = get_model_card("Qwen/Qwen3-8B")
    method = TrainingMethod(lora=LoraConfig(rank=32, train_unembed=False))
    widths = 36 * ((4096 + 4096) * 2 + (4096 + 1024) * 2 + (4096 + 12288) * 3)
    assert 3 * adapter_flops_per_token_per_pass(card, method) == 6 * 32 * widths
    assert 6 * 32 * widths == pytest.approx(0.524e9, rel=1e-3)


def test_moe_forward_uses_active_parameters_only() -> None:
    card = get_model_card("Qwen/Qwen3-30B-A3B")
    assert forward_flops(card, 1) == pytest.approx(2 * 3.04e9, rel=0.01)
    assert card.total_params > 9 * card.matmul_params


def test_unknown_training_kind() -> None:
    with pytest.raises(UserError, match=r"training\.kind"):
        TrainingMethod(kind="qlora")  # type: ignore[arg-type]
