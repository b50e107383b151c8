"""The cost-validation prediction against hand-computed numbers on a toy card (1 layer, hidden 8,
2 heads of 4, 1 KV head, MLP 16, vocab 32, tied), and the markdown it renders."""

from __future__ import annotations

import pytest

from benchmarks.cost_validation.predict import (
    CALIBRATION,
    Measured,
    Settings,
    StepRecord,
    fit_decode_overhead,
    predict_phases,
    sample_step,
    train_step,
)
from benchmarks.cost_validation.report import markdown
from benchmarks.harness.result import Run
from benchmarks.probe import MachineProbe
from loraplex.cost.flops import TrainingMethod
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model_card import ModelCard

# N = q 64 + k 32 + v 32 + o 64 + MLP 3·128 + head 256 = 832 matmul params.
# Σ r·(d_in + d_out) at r = 2: (16 + 12 + 12 + 16 + 24 + 24 + 24 + 40) · 2 = 336 (= adapter params).
# Attention: 2 · heads · (4 + 4) = 32 FLOPs per attended position.
CARD = ModelCard("toy", num_layers=1, hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=4,
                 intermediate_size=16, vocab_size=32, tie_word_embeddings=True,
                 weight_bytes_per_param=4.0)
LORA = TrainingMethod(kind="lora", lora=LoraConfig(rank=2))


def probe(gflops: float, gbps: float, fwd_bwd_gflops: float | None = None) -> MachineProbe:
    return MachineProbe(load_avg_1m=1.0, load_avg_5m=1.0, num_threads=1, gemm_gflops=gflops,
                        gemm_fwd_bwd_gflops=gflops if fwd_bwd_gflops is None else fwd_bwd_gflops,
                        copy_gbps=gbps, torch_version="x", cpu="x")


def test_train_step_is_training_flops_at_the_probed_rate_plus_adamw_bytes() -> None:
    # One datum of 10 tokens: 2·(2N·10) + 3·(2·336·10) + 3·(32 · 10²/2) = 33,280 + 20,160 +
    # 4,800 = 58,240 FLOPs; AdamW 28 B × 336 = 9,408 B. The fwd+bwd probes average to
    # 2 GFLOP/s (the forward-only rate is not what training runs), the copy probes to 1 GB/s.
    m = Measured(engine_s=1e-4, fwd_bwd_s=8e-5, optim_s=2e-5, tokens={"trained_tokens": 10})
    rec = StepRecord("sft_train", m, (probe(9.0, 0.5, 1.0), probe(9.0, 1.5, 3.0)), (10,))
    got = train_step(CARD, LORA, rec)
    assert got["predicted_flops"] == 58_240
    assert got["fwd_bwd_predicted_s"] == pytest.approx(58_240 / 2e9)
    assert got["optim_predicted_s"] == pytest.approx(9_408 / 1e9)
    assert got["predicted_s"] == pytest.approx(29_120e-9 + 9_408e-9)


def test_sample_step_prefill_plus_the_slower_decode_bound() -> None:
    # 1 prompt of 4 tokens × G = 2, 3 tokens each. Prefill: 2N·4 + 32·16/2 = 6,912 FLOPs.
    # Decode FLOPs: 2 × (2N·3 + 32·(7² − 4²)/2) = 11,040. Bytes: 3 iterations × 832 params × 4 B
    # = 9,984 of weights; KV 2 rollouts × 16.5 positions × (2·1·4 values × 4 B) = 1,056.
    s = Settings(threads=1, rl_prompts=1, group_size=2, prompt_len=4)
    m = Measured(engine_s=1e-3, tokens={"prompt_tokens": 4, "cache_hit_tokens": 0,
                                        "sampled_tokens": 6})
    slow_flops = sample_step(CARD, s, StepRecord("rl_sample", m, (probe(2.0, 1.0, 0.1),) * 2))
    assert slow_flops["prefill_flops"] == 6_912
    assert slow_flops["decode_flops"] == pytest.approx(11_040)
    assert slow_flops["decode_weights_s"] + slow_flops["decode_kv_s"] == pytest.approx(11_040e-9)
    assert slow_flops["predicted_s"] == pytest.approx(3_456e-9 + 11_040e-9)  # bandwidth-bound
    fast_memory = sample_step(CARD, s, StepRecord("rl_sample", m, (probe(0.5, 10.0),) * 2))
    assert fast_memory["predicted_s"] == pytest.approx((6_912 + 11_040) / 0.5e9)  # compute


def test_result_document_ratios_calibration_and_markdown() -> None:
    s = Settings(threads=1, rounds=2, rank=2, rl_prompts=1, group_size=2, prompt_len=4)
    p = probe(1.0, 1.0)
    train = Measured(engine_s=2 * 58_240e-9 + 9_408e-9, fwd_bwd_s=2 * 58_240e-9,
                     optim_s=9_408e-9, tokens={"trained_tokens": 10})
    sample = Measured(engine_s=1e-4, tokens={"prompt_tokens": 4, "sampled_tokens": 6})
    records = [StepRecord("sft_train", train, (p, p), (10,)),
               StepRecord("rl_sample", sample, (p, p), decode_matmul_s=1e-5),
               StepRecord("rl_train", train, (p, p), (10,))] * 2
    result = predict_phases(CARD, records, s, goal=0.2)
    sft = result["phases"]["sft_train"]
    assert sft["num_steps"] == 2
    assert sft["efficiency_vs_probe"] == pytest.approx(0.5)
    assert sft["ratio"] == pytest.approx((2 * 58_240 + 9_408) / (58_240 + 9_408))
    assert not sft["within_goal"]
    # Calibrated on SFT's efficiency, GRPO train (same steps) is predicted exactly.
    assert result["calibrated"]["rl_train"]["ratio"] == pytest.approx(1.0)
    result["settings"] = {**vars(s), "quick": False}
    text = markdown(Run("cost_validation", probe=False).finish(result))
    assert "| SFT train (forward_backward + optim_step) | 2 |" in text
    assert "**1.86**" in text
    assert "| within 20% |" in text and "goal |ratio − 1| ≤\n   20%" in text  # the run's goal


def test_decode_overhead_fit_is_a_least_squares_line_per_iteration() -> None:
    # Overheads per iteration: (1.0 - 0.2) / 10 = 0.08 s at 4 rows, (2.0 - 0.4) / 10 = 0.16 s
    # at 12 rows: c1 = 0.08 / 8 = 0.01 s per row, c0 = 0.08 - 4 · 0.01 = 0.04 s.
    steps = [{"rows": 4, "iterations": 10, "measured_s": 1.0, "predicted_s": 0.2},
             {"rows": 12, "iterations": 10, "measured_s": 2.0, "predicted_s": 0.4}]
    fit = fit_decode_overhead(steps)
    assert fit["c0_s"] == pytest.approx(0.04)
    assert fit["c1_s_per_row"] == pytest.approx(0.01)
    one = fit_decode_overhead(steps[:1])  # one batch size: a constant per iteration
    assert (one["c0_s"], one["c1_s_per_row"]) == (pytest.approx(0.08), 0.0)
    assert fit_decode_overhead([])["points"] == []


def test_calibration_steps_fit_the_overhead_and_stay_out_of_the_phases() -> None:
    # Both steps sample 6 tokens over G = 2 rollouts (3 iterations) from a 4-token prompt;
    # the calibration step (1 prompt × G = 2, 2 rows) took 3 ms more than its roofline, so
    # c0 = 1 ms per iteration (one batch size: c1 = 0) and the GRPO step is predicted at its
    # roofline + 3 ms.
    s = Settings(threads=1, rounds=1, rank=2, rl_prompts=1, group_size=2, prompt_len=4)
    p = probe(1.0, 1.0)
    tokens = {"prompt_tokens": 4, "sampled_tokens": 6}
    roofline = sample_step(CARD, s, StepRecord("rl_sample", Measured(1.0, tokens=tokens),
                                               (p, p)))["predicted_s"]
    train = Measured(engine_s=1e-4, fwd_bwd_s=1e-4, optim_s=0.0, tokens={"trained_tokens": 10})
    records = [StepRecord(CALIBRATION, Measured(roofline + 3e-3, tokens=tokens), (p, p),
                          prompts=1, group_size=2),
               StepRecord("sft_train", train, (p, p), (10,)),
               StepRecord("rl_sample", Measured(roofline + 6e-3, tokens=tokens), (p, p)),
               StepRecord("rl_train", train, (p, p), (10,))]
    result = predict_phases(CARD, records, s, goal=0.2)
    assert result["phases"]["rl_sample"]["num_steps"] == 1
    fit = result["calibrated"]["decode_overhead_fit"]
    assert (fit["c0_s"], fit["c1_s_per_row"]) == (pytest.approx(1e-3), 0.0)
    fitted = result["calibrated"]["rl_sample_overhead_fitted"]
    assert fitted["predicted_s"] == pytest.approx(roofline + 3e-3)
    assert fitted["ratio"] == pytest.approx((roofline + 6e-3) / (roofline + 3e-3))
