"""Compute- and bandwidth-bound seconds, by hand."""

from __future__ import annotations

import math

import pytest

from loraplex.cost.cards.hardware import HardwareCard, get_hardware_card
from loraplex.cost.cards.models import get_model_card
from loraplex.cost.memory import ReplicaLayout, plan_layout
from loraplex.cost.timing import (
    bandwidth_seconds,
    compute_seconds,
    decode_seconds,
    kv_bytes_read_during_decode,
)
from loraplex.errors import UserError

H100 = get_hardware_card("h100_sxm")
QWEN3_8B_TOTAL = 8_190_427_136
QWEN3_8B_EMBED = 151936 * 4096
KV_8B = 147_456


def test_compute_and_bandwidth_seconds() -> None:
    assert compute_seconds(989e12 * 8 * 0.5, H100, 8, 0.5) == pytest.approx(1.0)
    assert bandwidth_seconds(3.35e12 * 0.7, H100, 1, 0.7) == pytest.approx(1.0)
    with pytest.raises(UserError, match="mfu"):
        compute_seconds(1.0, H100, 1, 0.0)


def test_math_rl_decode_on_eight_single_gpu_replicas() -> None:
    card = get_model_card("Qwen/Qwen3-8B")
    layout = plan_layout(card, H100, weight_bytes_per_param=2.0)
    t = decode_seconds(card, layout, H100, rollouts=1024, context=241, new_tokens=512,
                       weight_bytes_per_param=2.0, mbu=0.7)
    # 128 rollouts per replica fit its KV cache at once: one wave of 512 iterations, each
    # streaming the weights except the embedding table (15.1 GB) from one GPU.
    assert (t.batch, t.waves) == (128, 1)
    weights = 512 * (QWEN3_8B_TOTAL - QWEN3_8B_EMBED) * 2 / (3.35e12 * 0.7)
    assert t.weights_s == pytest.approx(weights) and t.weights_s == pytest.approx(3.305, 1e-3)
    # Every rollout streams kv·(d·c + d²/2) bytes; all 8 GPUs share the work.
    kv = 1024 * KV_8B * (512 * 241 + 512**2 / 2) / (8 * 3.35e12 * 0.7)
    assert t.kv_s == pytest.approx(kv) and t.kv_s == pytest.approx(2.048, 1e-3)


def test_long_generations_decode_in_waves_when_the_kv_cache_is_full() -> None:
    card = get_model_card("Qwen/Qwen3-4B-Instruct-2507")
    layout = plan_layout(card, H100, weight_bytes_per_param=2.0)
    t = decode_seconds(card, layout, H100, rollouts=1024, context=1000, new_tokens=24576,
                       weight_bytes_per_param=2.0, mbu=0.7)
    fits = math.floor((72e9 - 2 * card.total_params) / (KV_8B * 25576))  # 16 sequences
    assert (t.batch, t.waves) == (fits, 128 // fits) == (16, 8)
    assert t.weights_s == pytest.approx(8 * 24576 * 2 * card.total_params / (3.35e12 * 0.7))


def test_moe_decode_reads_only_touched_experts() -> None:
    card = get_model_card("Qwen/Qwen3-30B-A3B")
    box = HardwareCard.custom("box", peak_flops=1e15, hbm_bandwidth=1e12, hbm_bytes=1e12)
    layout = ReplicaLayout(tensor_parallel=1, num_replicas=1, num_gpus=1, weight_bytes=0,
                           kv_capacity_bytes=1e12)
    t = decode_seconds(card, layout, box, rollouts=4, context=0, new_tokens=10,
                       weight_bytes_per_param=1.0, mbu=1.0)
    experts = card.routed_expert_params
    dense = card.total_params - experts - card.embedding_params
    touched = 1 - (1 - 8 / 128) ** 4
    assert t.weights_s == pytest.approx(10 * (dense + touched * experts) / 1e12)


def test_sliding_window_layers_stream_at_most_the_window() -> None:
    card = get_model_card("openai/gpt-oss-120b")
    full, sliding = card.kv_bytes_per_token(), card.kv_bytes_sliding_per_token()
    assert full == sliding == 18 * 2 * 8 * 64 * 2
    # After 1,000 tokens of context every sliding layer holds 128 tokens.
    assert kv_bytes_read_during_decode(card, 1000, 10) == full * (10 * 1000 + 50) + sliding * 1280


def test_a_sequence_larger_than_the_kv_cache_is_refused() -> None:
    card = get_model_card("Qwen/Qwen3-8B")
    layout = ReplicaLayout(1, 1, 1, weight_bytes=0, kv_capacity_bytes=KV_8B * 100)
    with pytest.raises(UserError, match="KV cache"):
        decode_seconds(card, layout, H100, rollouts=1, context=90, new_tokens=20,
                       weight_bytes_per_param=2.0, mbu=0.7)
