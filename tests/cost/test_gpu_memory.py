"""Replica layout and training memory, by hand."""

from __future__ import annotations

import pytest

from loraplex.cost.cards.hardware import HardwareCard, get_hardware_card
from loraplex.cost.cards.models import get_model_card
from loraplex.cost.flops import TrainingMethod
from loraplex.cost.memory import plan_layout, require_training_fits, training_state_bytes
from loraplex.domain.lora import LoraConfig
from loraplex.errors import UserError

H100 = get_hardware_card("h100_sxm")


def test_small_dense_model_fills_a_node_with_single_gpu_replicas() -> None:
    card = get_model_card("Qwen/Qwen3-8B")
    layout = plan_layout(card, H100, weight_bytes_per_param=2.0)
    assert (layout.tensor_parallel, layout.num_replicas, layout.num_gpus) == (1, 8, 8)
    # 0.9 · 80 GB usable minus 8,190,427,136 params × 2 bytes.
    assert layout.kv_capacity_bytes == pytest.approx(72e9 - 2 * 8_190_427_136)


def test_qwen3_32b_needs_tp2_to_leave_a_quarter_for_kv() -> None:
    # 65.5 GB of bf16 weights > 0.75 · 72 GB = 54 GB on one GPU; fits on two.
    layout = plan_layout(get_model_card("Qwen/Qwen3-32B"), H100, weight_bytes_per_param=2.0)
    assert (layout.tensor_parallel, layout.num_replicas, layout.num_gpus) == (2, 4, 8)


def test_kimi_k2_fp8_on_16_gpus_and_whole_nodes_when_unspecified() -> None:
    card = get_model_card("moonshotai/Kimi-K2-Thinking")
    pinned = plan_layout(card, H100, weight_bytes_per_param=1.0, num_gpus=16,
                         tensor_parallel=16)
    assert pinned.kv_capacity_bytes == pytest.approx(16 * 72e9 - card.total_params)
    auto = plan_layout(card, H100, weight_bytes_per_param=1.0)
    # 1.03 TB / 54 GB per GPU → 19.01 → TP 32, four nodes of 8.
    assert (auto.tensor_parallel, auto.num_gpus) == (32, 32)


def test_layout_errors_name_the_field() -> None:
    card = get_model_card("moonshotai/Kimi-K2-Thinking")
    with pytest.raises(UserError, match="num_gpus"):
        plan_layout(card, H100, weight_bytes_per_param=2.0, num_gpus=8, tensor_parallel=8)
    with pytest.raises(UserError, match="num_gpus"):
        plan_layout(get_model_card("Qwen/Qwen3-8B"), H100, weight_bytes_per_param=2.0,
                    num_gpus=6, tensor_parallel=4)


def test_training_state_lora_vs_full() -> None:
    card = get_model_card("Qwen/Qwen3-8B")
    lora = TrainingMethod(lora=LoraConfig(rank=8))
    assert training_state_bytes(card, lora) == card.lora_params(8) * 16
    assert training_state_bytes(card, TrainingMethod(kind="full")) == card.total_params * 16


def test_full_fine_tuning_that_does_not_fit_is_refused() -> None:
    card = get_model_card("Qwen/Qwen3-32B")
    box = HardwareCard.custom("box", peak_flops=1e15, hbm_bandwidth=1e12, hbm_bytes=80e9,
                              node_size=8)
    layout = plan_layout(card, box, weight_bytes_per_param=2.0)
    require_training_fits(card, TrainingMethod(), layout, box)
    with pytest.raises(UserError, match="full training"):
        require_training_fits(card, TrainingMethod(kind="full"), layout, box)
