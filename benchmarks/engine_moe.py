"""Mixture-of-experts engine benchmark: training and sampling on the built-in ``small-moe``
(Qwen3-MoE, 4 layers, hidden 512, 8 experts of width 512, top-2) vs transformers + PEFT.

One process, the same base weights on both sides, interleaved round by round (perf-anchors
§4), one torch thread by default. Candidates:

* train: one forward_backward (cross-entropy) + optim_step over 8 sequences of mixed lengths
  (mean 256), rank-16 LoRA on attention, every expert (Tinker's parameterisation: the hidden
  factor shared by a layer's experts) and the head, batch-invariant mode. Baseline:
  ``transformers`` ``Qwen3MoeForCausalLM`` (its default ``eager`` experts: a loop over the
  experts a batch hits) + PEFT with ``target_modules`` attention + ``lm_head`` and
  ``target_parameters`` the fused 3-D ``mlp.experts.gate_up_proj`` / ``down_proj`` (PEFT's
  MoE support, ``ParamWrapper``: a rank-16 LoRA per expert), ``torch.optim.AdamW``, the
  sequences right-padded with a mask. ``packed``: 8 adapters, one sequence each, in one batch.
* sample: 8 prompts × 128 tokens × G = 8 samples × 64 new tokens (temperature 1, no EOS).
  Ours: the KV-cache sampler; baseline: HF ``generate`` on the PEFT model (B ≠ 0 both sides).

Reported (JSON keys; a ratio is the median over rounds of that round's pair of runs, which
back to back see the same load): ``train_ratio`` (ours ÷ baseline tok/s, goal ≥ 1.5),
``sample_ratio`` (goal ≥ 2), ``roofline_fraction`` (ours ÷ the GEMM probe's FLOP/s over the
training FLOPs of a token on *active* parameters, `loraplex.cost.flops`; reported),
``packed_efficiency`` (8 adapters packed ÷ 1 adapter on the same batch, goal ≥ 0.9) and
``bytes_vs_theory`` (resident adapter + AdamW moments ÷ 12 bytes × the card's Tinker-scheme
parameter count, goal ≤ 1.1).

    python -m benchmarks.engine_moe [--rounds 3] [--train-rounds 5] [--threads 1]
        [--model-dir DIR]
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as engine_train: see there
if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import SCRATCH
from benchmarks.engine_sample import FANOUT
from benchmarks.engine_train import (
    GEMM_FLOPS,
    LORA,
    MIXED_LENGTHS,
    RANK,
    engine_step,
    flops_per_token,
    gemm_step,
    token_rows,
)
from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run
from benchmarks.harness.writer import write
from benchmarks.peft_baseline import (
    adapter_bytes,
    paired,
    peft_model,
    sample_rounds,
    train_rounds,
    train_step,
)
from loraplex.config import EngineConfig
from loraplex.engine.builtin.model import ensure_builtin_model
from loraplex.engine.executor import Engine

PEFT_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"]
PEFT_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
#: ≥ these, but ``bytes_vs_theory`` ≤ (engine_families judges its families by them too).
GOALS = {"train_ratio": 1.5, "sample_ratio": 2.0, "packed_efficiency": 0.9,
         "bytes_vs_theory": 1.1}


def measure_train(model_dir: str, rounds: int) -> dict[str, Any]:
    engine = Engine(model_dir, EngineConfig(batch_invariant=True))
    info = engine.model_info()
    mixed = token_rows(MIXED_LENGTHS, info.vocab_size)
    engine.create_adapter("a", LORA)
    for i in range(8):
        engine.create_adapter(f"p{i}", LORA)
    baseline, baseline_params = train_step(
        peft_model(model_dir, PEFT_MODULES, PEFT_PARAMETERS, train=True), mixed)
    steps = {"gemm": gemm_step(), "ours": engine_step(engine, [("a", mixed)]),
             "baseline": baseline,
             "packed": engine_step(engine, [(f"p{i}", [s]) for i, s in enumerate(mixed)])}
    times, cpu = train_rounds(steps, rounds, "train rounds")
    tokens = sum(MIXED_LENGTHS)
    tok_s = {n: tokens / statistics.median(ts) for n, ts in times.items() if n != "gemm"}
    gemm_flops_s = GEMM_FLOPS / statistics.median(times["gemm"])
    per_token = flops_per_token(info, MIXED_LENGTHS)
    measured, theory = adapter_bytes(engine, "a")
    return {"tok_s": tok_s, "seconds": times, "cpu_seconds": cpu,
            "gemm_gflops": gemm_flops_s / 1e9,
            "flops_per_token": per_token, "roofline_tok_s": gemm_flops_s / per_token,
            "bytes_per_adapter": measured, "bytes_theory": theory,
            "adapter_params": engine.bank.get("a").num_params,
            "peft_trainable_params": baseline_params,
            "active_params": info.card.active_params, "total_params": info.card.total_params}


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="sampling rounds")
    parser.add_argument("--train-rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--model-dir", type=Path,
                        default=SCRATCH / "bench" / "engine_moe" / "small-moe")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = ensure_builtin_model(args.model_dir.resolve(), "qwen3_moe", "small", seed=0)
    run = Run("engine_moe")
    train = measure_train(str(model_dir), args.train_rounds)
    sample = sample_rounds(model_dir, peft_model(str(model_dir), PEFT_MODULES, PEFT_PARAMETERS,
                                                 train=False), args.rounds, "sample rounds")
    t = train["tok_s"]
    payload = {
        "threads": args.threads, "rounds": args.rounds, "train_rounds": args.train_rounds,
        "goals": GOALS,
        "train_ratio": paired(train["seconds"]["baseline"], train["seconds"]["ours"]),
        "sample_ratio": paired(sample["hf_generate"]["seconds"], sample["ours"]["seconds"]),
        "roofline_fraction": t["ours"] / train["roofline_tok_s"],
        "packed_efficiency": paired(train["seconds"]["ours"], train["seconds"]["packed"]),
        "cpu_time_ratios": {  # the same pairs in process CPU seconds (1 thread: less load-bound)
            "train": paired(train["cpu_seconds"]["baseline"], train["cpu_seconds"]["ours"]),
            "packed": paired(train["cpu_seconds"]["ours"], train["cpu_seconds"]["packed"]),
            "sample": paired(sample["hf_generate"]["cpu_seconds"], sample["ours"]["cpu_seconds"])},
        "median_tok_s_ratios": {"train": t["ours"] / t["baseline"], "packed": t["packed"] / t[
            "ours"], "sample": (sample["ours"]["tok_s_median"]
                                / sample["hf_generate"]["tok_s_median"])},
        "bytes_vs_theory": train["bytes_per_adapter"] / train["bytes_theory"],
        "train": train, "sample": sample,
        "workload": {"model": "builtin small-moe (qwen3_moe, 8 experts, top-2)", "rank": RANK,
                     "alpha": LORA.alpha, "mixed_lengths": MIXED_LENGTHS,
                     "peft_target_modules": PEFT_MODULES,
                     "peft_target_parameters": PEFT_PARAMETERS,
                     "sample": {"prompts": FANOUT.num_prompts, "prompt_len": FANOUT.prompt_len,
                                "G": FANOUT.num_samples, "new_tokens": FANOUT.new_tokens}},
    }
    result = run.finish(payload, model=payload["workload"]["model"])
    write(result, markdown(result), args.out)
    print(markdown(result))
    return 0


def markdown(record: Result) -> str:
    r = record.payload
    t, s, c, g = r["train"], r["sample"], r["cpu_time_ratios"], r["goals"]
    keys = [("train_ratio", "ours ÷ transformers+PEFT fwd_bwd+optim tok/s"),
            ("sample_ratio", "ours ÷ HF generate+PEFT, 8 prompts × G=8 × 64"),
            ("roofline_fraction", "ours ÷ GEMM-probe roofline on active FLOPs"),
            ("packed_efficiency", "8 adapters packed ÷ 1 adapter, same batch"),
            ("bytes_vs_theory", "resident adapter + moments ÷ 12 B × card count")]
    lines = [
        "# MoE engine benchmark: built-in small-moe vs transformers + PEFT", "",
        f"`python -m benchmarks.engine_moe`, {r['threads']} thread(s), {r['train_rounds']} "
        f"training and {r['rounds']} sampling rounds, interleaved (ratios: medians of per-round "
        f"pairs). Model: {t['total_params']:,} parameters, {t['active_params']:,} active per "
        f"token; in-round GEMM probe {t['gemm_gflops']:.1f} GFLOP/s. {record.provenance()}", "",
        "| key | value | what | goal |", "|---|---|---|---|"]
    for k, what in keys:
        goal = "report" if k not in g else f"{'≤' if k == 'bytes_vs_theory' else '≥'} {g[k]:g}"
        lines.append(f"| `{k}` | **{r[k]:.3f}** | {what} | {goal} |")
    lines += [
        "", "| run | tok/s (median) |", "|---|---|",
        f"| train: ours (batch-invariant, 1 adapter) | {t['tok_s']['ours']:,.0f} |",
        f"| train: transformers + PEFT (eager experts, ParamWrapper) | "
        f"{t['tok_s']['baseline']:,.0f} |",
        f"| train: ours, 8 adapters packed | {t['tok_s']['packed']:,.0f} |",
        f"| train: roofline ({t['flops_per_token'] / 1e6:.1f} MFLOP/token) | "
        f"{t['roofline_tok_s']:,.0f} |",
        f"| sample: ours | {s['ours']['tok_s_median']:,.1f} |",
        f"| sample: HF generate + PEFT | {s['hf_generate']['tok_s_median']:,.1f} |", "",
        "The same per-round pairs in process CPU seconds (one thread, so less sensitive to "
        f"other load): train {c['train']:.3f}, packed {c['packed']:.3f}, sample "
        f"{c['sample']:.3f}.", "",
        f"Adapter: {t['adapter_params']:,} trainable parameters (Tinker's scheme, counted "
        f"as the cookbook counts it); {t['bytes_per_adapter']:,} bytes resident with its "
        f"AdamW moments vs {t['bytes_theory']:,.0f} theory. PEFT's per-expert LoRA on the fused "
        f"experts trains {t['peft_trainable_params']:,} parameters (its factors are not shared "
        "across experts), so the baseline adapter is not the same adapter; the base weights "
        "are. The machine is shared: compare only numbers of one run.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
