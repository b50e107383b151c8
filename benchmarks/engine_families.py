"""The new families' engine benchmark: training and sampling on each family's ``small`` built-in
(Qwen3.5: 3 gated-DeltaNet layers + 1 gated-attention layer, hidden 512; Qwen3.5-MoE: the
same with 8 routed experts of width 512 + a shared expert; gpt-oss: 4 layers alternating
48-key sliding windows and full attention, sinks, 8 biased experts) vs transformers + PEFT.

One process, the same base weights on both sides, interleaved round by round (perf-anchors
§4), one torch thread by default, per family:

* train: one forward_backward (cross-entropy) + optim_step over 8 sequences of mixed lengths
  (mean 256), rank-16 LoRA on every target Tinker adapts, batch-invariant mode. Baseline:
  transformers' own class for the checkpoint + PEFT + ``torch.optim.AdamW``, the sequences
  right-padded with a mask; PEFT adapts the attention and linear-attention projections
  (``in_proj_qkv`` whole: PEFT cannot split it as Tinker does), the MLPs, the head, and the
  fused 3-D experts through ``target_parameters``. ``packed``: 8 adapters, one sequence each,
  in one batch.
* sample: 8 prompts × 128 tokens × G = 8 samples × 64 new tokens (temperature 1, no EOS).
  Ours: the KV-cache sampler (the linear layers' states forked per sample); baseline: HF
  ``generate`` on the PEFT model (B ≠ 0 both sides).

Keys per family (a ratio is the median over rounds of that round's pair of runs):
``train_ratio`` (ours ÷ baseline tok/s, goal ≥ 1.5), ``sample_ratio`` (goal ≥ 2),
``packed_efficiency`` (8 adapters ÷ 1, goal ≥ 0.9), ``bytes_vs_theory`` (resident adapter
+ AdamW moments ÷ 12 B × the card's Tinker-scheme parameter count, goal ≤ 1.1).

    python -m benchmarks.engine_families [--families qwen3_5,qwen3_5_moe,gpt_oss]
        [--rounds 2] [--train-rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as engine_train: see there
if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import SCRATCH
from benchmarks.engine_moe import GOALS
from benchmarks.engine_sample import FANOUT
from benchmarks.engine_train import LORA, MIXED_LENGTHS, RANK, engine_step, token_rows
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

#: family → (PEFT target_modules, PEFT target_parameters: the fused 3-D experts).
PEFT: dict[str, tuple[list[str], list[str]]] = {
    "qwen3_5": (["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z",
                 "out_proj", "gate_proj", "up_proj", "down_proj", "lm_head"], []),
    "qwen3_5_moe": (["q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z",
                     "out_proj", "gate_proj", "up_proj", "down_proj", "lm_head"],
                    ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
    "gpt_oss": (["q_proj", "k_proj", "v_proj", "o_proj", "lm_head"],
                ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]),
}
EXCLUDE = r".*visual.*"  # a multimodal checkpoint's vision tower: text only


def measure_train(model_dir: str, family: str, rounds: int) -> dict[str, Any]:
    engine = Engine(model_dir, EngineConfig(batch_invariant=True))
    info = engine.model_info()
    mixed = token_rows(MIXED_LENGTHS, info.vocab_size)
    engine.create_adapter("a", LORA)
    for i in range(8):
        engine.create_adapter(f"p{i}", LORA)
    steps = {"ours": engine_step(engine, [("a", mixed)]),
             "baseline": train_step(peft_model(model_dir, *PEFT[family], train=True,
                                               exclude=EXCLUDE), mixed)[0],
             "packed": engine_step(engine, [(f"p{i}", [s]) for i, s in enumerate(mixed)])}
    times, _ = train_rounds(steps, rounds, f"{family} train")
    measured, theory = adapter_bytes(engine, "a")
    return {"seconds": times, "tokens": sum(MIXED_LENGTHS),
            "bytes_per_adapter": measured, "bytes_theory": theory,
            "adapter_params": engine.bank.get("a").num_params,
            "total_params": info.card.total_params}


def measure_family(family: str, args: argparse.Namespace) -> dict[str, Any]:
    model_dir = ensure_builtin_model(SCRATCH / "bench" / "engine_families" / family, family,
                                     "small", seed=0)
    train = measure_train(str(model_dir), family, args.train_rounds)
    peft = peft_model(str(model_dir), *PEFT[family], train=False, exclude=EXCLUDE)
    sample = sample_rounds(model_dir, peft, args.rounds, f"{family} sample")
    s = train["seconds"]
    return {"train_ratio": paired(s["baseline"], s["ours"]),
            "sample_ratio": paired(sample["hf_generate"]["seconds"], sample["ours"]["seconds"]),
            "packed_efficiency": paired(s["ours"], s["packed"]),
            "bytes_vs_theory": train["bytes_per_adapter"] / train["bytes_theory"],
            "train_tok_s": {n: train["tokens"] / min(ts) for n, ts in s.items()},
            "train": train, "sample": sample}


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--families", default=",".join(PEFT))
    parser.add_argument("--rounds", type=int, default=2, help="sampling rounds")
    parser.add_argument("--train-rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    run = Run("engine_families")
    families = {f: measure_family(f, args) for f in args.families.split(",")}
    result = run.finish({"threads": args.threads, "rounds": args.rounds,
                         "train_rounds": args.train_rounds, "goals": GOALS, "families": families,
                         "workload": {"rank": RANK, "alpha": LORA.alpha,
                                      "mixed_lengths": MIXED_LENGTHS, "sample": vars(FANOUT)}},
                        model=f"built-in small {args.families}")
    write(result, markdown(result), args.out)
    print(markdown(result))
    return 0


def markdown(record: Result) -> str:
    r = record.payload
    g = r["goals"]  # the goals of the run this result is, not today's
    lines = ["# engine_families: the new families' small built-ins vs transformers + PEFT", "",
             f"{r['threads']} thread(s), {r['train_rounds']} train / {r['rounds']} sample "
             f"rounds interleaved. {record.provenance()}", "",
             f"| family | train_ratio (≥ {g['train_ratio']:g}) | sample_ratio "
             f"(≥ {g['sample_ratio']:g}) | packed 8 ÷ 1 (≥ {g['packed_efficiency']:g}) | "
             f"bytes ÷ theory (≤ {g['bytes_vs_theory']:g}) | ours / baseline train tok/s |",
             "|---|---|---|---|---|---|"]
    for family, f in r["families"].items():
        t = f["train_tok_s"]
        lines.append(f"| {family} | {f['train_ratio']:.2f} | {f['sample_ratio']:.2f} | "
                     f"{f['packed_efficiency']:.2f} | {f['bytes_vs_theory']:.3f} | "
                     f"{t['ours']:.0f} / {t['baseline']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
