"""bfloat16 weights on CPU against float32, side by side: the accuracy cost and the speed.

    python -m benchmarks bf16_weights [--rounds 3] [--threads 1] [--model smollm2|small]

Two engines on one model: ``engine.dtype = float32`` and ``bfloat16`` (the packed kernel's
weights held in bfloat16 and widened as they are read, everything computed in float32:
`loraplex.engine.model.weight_storage`). Measured in one process, interleaved round by round
(fp32, bf16, fp32, ...):

* accuracy: per-token logprobs of a fixed English text (`FIXED_TEXT`, the model's tokenizer)
  in a training forward, on the base model and with a rank-16 adapter (B ≠ 0): max and mean
  |Δ logprob| bf16 − fp32, and how often the greedy next token agrees;
* decode steps: the sampler's time per decode step at 1, 8 and 32 sequences (128-token prompts,
  the fan-out shape's 32), in batch-invariant and fast mode: ``decode_ratio`` = fp32 time ÷
  bf16 time per shape (goal ≥ 1.6 at the fan-out shape, issue 30);
* a 512-token prefill and a training step (forward_backward + optim_step on engine_train's
  mixed batch of 8 sequences, 2048 tokens);
* memory: bytes of the base weights and of their packed copies.

Writes ``benchmarks/results/bf16_weights[_smollm2].{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as engine_train (a shared 2-core box)
if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from tqdm import tqdm

from benchmarks import RESULTS, SCRATCH
from benchmarks.adapters import nonzero_adapter
from benchmarks.engine_train import MIXED_LENGTHS, engine_step, token_rows
from benchmarks.harness.result import Result, Run
from benchmarks.harness.writer import write
from benchmarks.real_models import LABELS, MODELS, result_stem, smollm2_dir
from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.domain.sampling import SamplingParams, StopCondition
from loraplex.domain.work import SampleWork
from loraplex.engine.builtin.model import ensure_builtin_model
from loraplex.engine.executor import Engine
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.sampling.sampler import Sampler

DTYPES = ("float32", "bfloat16")
RANK, ALPHA = 16, 32
#: Sequences decoding together: one stream, the batch shape, the fan-out shape (4 × G = 8).
DECODE_SHAPES = (1, 8, 32)
PROMPT_LEN, DECODE_STEPS, PREFILL_LEN = 128, 16, 512
GOALS = {"decode_ratio_fanout": 1.6}
#: The text whose logprobs are compared (a fixed paragraph; any English prose would do).
FIXED_TEXT = (
    "The old lighthouse stood at the edge of the cliff, its white paint peeling in long strips "
    "after decades of salt wind. Every evening the keeper climbed the spiral stairs, one hundred "
    "and twelve of them, to light the lamp and wind the clockwork that turned the great lens. "
    "Ships passing in the night saw the beam sweep across the water every twelve seconds, a "
    "rhythm as steady as a heartbeat. In the winter storms, when waves broke over the rocks and "
    "spray reached the gallery windows, the keeper stayed awake until dawn, writing in the log "
    "the direction of the wind, the height of the sea and the names of the vessels that "
    "signalled as they went by. When the lighthouse was automated, the log books were taken to "
    "the county museum, where they fill three shelves: a record of weather, of shipping and of "
    "one person's patience, kept in the same careful handwriting for thirty-one years. Visitors "
    "rarely ask to see them, but the archivist says that those who do tend to stay for hours, "
    "turning the pages slowly, as if listening for the sound of the sea.")


@dataclass
class Side:
    """One dtype's engine, and what it was built with."""

    dtype: str
    engine: Engine
    config: EngineConfig


def build(model_dir: Path, dtype: str, invariant: bool = True) -> Side:
    config = EngineConfig(dtype=dtype, batch_invariant=invariant, kv_cache_blocks=1024)
    engine = Engine(str(model_dir), config)
    nonzero_adapter(engine.bank, RANK, ALPHA)
    return Side(dtype, engine, config)


def text_logprobs(side: Side, tokens: list[int], adapter: str | None) -> torch.Tensor:
    """fp32 logprob of each next token of ``tokens`` in one training forward."""
    model = side.engine.model
    batch = model.pack([SequenceInput(tokens[:-1], adapter)])
    lora = side.engine.bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    with torch.no_grad():
        hidden = model.forward(batch, lora)
        logits = model.logits(hidden, lora)
    rows = batch.scatter_to_rows(torch.tensor(tokens[1:]))
    lp_R_V = torch.log_softmax(logits.float(), dim=-1)
    lp = lp_R_V.gather(1, rows[:, None]).squeeze(1)
    return batch.gather_from_rows(torch.stack([lp, lp_R_V.argmax(-1).float()], dim=1))


def accuracy(sides: list[Side], tokens: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"num_tokens": len(tokens) - 1}
    for adapter in (None, "policy"):
        fp32, bf16 = (text_logprobs(s, tokens, adapter) for s in sides)
        delta = (bf16[:, 0] - fp32[:, 0]).abs()
        out["base" if adapter is None else "adapter"] = {
            "max_abs_delta_logprob": delta.max().item(),
            "mean_abs_delta_logprob": delta.mean().item(),
            "mean_logprob_fp32": fp32[:, 0].mean().item(),
            "greedy_agreement": (bf16[:, 1] == fp32[:, 1]).float().mean().item()}
    return out


def decode_step_s(side: Side, sequences: int, seed: int) -> float:
    """Seconds per decode step of ``sequences`` sequences (after their prefill), on a fresh
    sampler."""
    engine = side.engine
    sampler = Sampler(engine.model, engine.bank, side.config, engine.model_dir)
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.model.spec.vocab_size
    params = SamplingParams(max_tokens=DECODE_STEPS + 8, stop=StopCondition(use_eos=False),
                            seed=seed)
    fanout = 8 if sequences >= 8 and sequences % 8 == 0 else 1
    works = [SampleWork(f"r{i}", "policy", None,
                        array("q", torch.randint(10, vocab, (PROMPT_LEN,), generator=gen)
                              .tolist()), fanout, params)
             for i in range(sequences // fanout)]
    sampler.step(works, 2)  # prefill, two decode steps
    start = time.perf_counter()
    sampler.step([], DECODE_STEPS)
    return (time.perf_counter() - start) / DECODE_STEPS


def prefill_s(side: Side, seed: int) -> float:
    engine = side.engine
    sampler = Sampler(engine.model, engine.bank, side.config, engine.model_dir)
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(10, engine.model.spec.vocab_size, (PREFILL_LEN,), generator=gen)
    params = SamplingParams(max_tokens=1, stop=StopCondition(use_eos=False), seed=seed)
    start = time.perf_counter()
    sampler.step([SampleWork("p", "policy", None, array("q", prompt.tolist()), 1, params)], 1)
    return time.perf_counter() - start


def training_step(side: Side) -> Callable[[], None]:
    side.engine.create_adapter("train", LoraConfig(rank=RANK, alpha=ALPHA, seed=0))
    return engine_step(side.engine, [("train", token_rows(MIXED_LENGTHS,
                                                          side.engine.model.spec.vocab_size))])


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(sides: dict[str, list[Side]], rounds: int, train: bool) -> dict[str, list[float]]:
    """Seconds of every measurement, round by round, fp32 and bf16 alternating."""
    plan: list[tuple[str, Callable[[int], float]]] = []
    for mode, pair in sides.items():
        for side in pair:
            for n in DECODE_SHAPES:
                plan.append((f"decode/{mode}/{n}/{side.dtype}",
                             lambda r, s=side, n=n: decode_step_s(s, n, r)))
    for side in sides["invariant"]:
        plan.append((f"prefill/{side.dtype}", lambda r, s=side: prefill_s(s, r)))
    if train:
        for side in sides["invariant"]:
            step = training_step(side)
            step()  # warm-up: the optimizer state, the allocator
            plan.append((f"train/{side.dtype}", lambda r, step=step: timed(step)))
    for name, fn in plan:  # warm-up, untimed
        if not name.startswith("train/"):
            fn(0)
    times: dict[str, list[float]] = {name: [] for name, _ in plan}
    for r in tqdm(range(rounds), desc="rounds"):
        for name, fn in tqdm(plan, desc=f"round {r + 1}", leave=False):
            times[name].append(fn(1 + r))
    return times


def summarise(times: dict[str, list[float]]) -> dict[str, Any]:
    med = {name: statistics.median(v) for name, v in times.items()}
    decode = {}
    for name in med:
        if name.startswith("decode/") and name.endswith("/float32"):
            key = name.removeprefix("decode/").removesuffix("/float32")
            fp32, bf16 = med[name], med[name.replace("/float32", "/bfloat16")]
            decode[key] = {"fp32_ms": 1e3 * fp32, "bf16_ms": 1e3 * bf16, "ratio": fp32 / bf16}
    out: dict[str, Any] = {"decode": decode,
                           "decode_ratio_fanout": decode["invariant/32"]["ratio"],
                           "prefill": {"fp32_s": med["prefill/float32"],
                                       "bf16_s": med["prefill/bfloat16"],
                                       "ratio": med["prefill/float32"] / med["prefill/bfloat16"]}}
    if "train/float32" in med:
        out["train"] = {"fp32_s": med["train/float32"], "bf16_s": med["train/bfloat16"],
                        "ratio": med["train/float32"] / med["train/bfloat16"],
                        "tok_s_fp32": sum(MIXED_LENGTHS) / med["train/float32"],
                        "tok_s_bf16": sum(MIXED_LENGTHS) / med["train/bfloat16"]}
    return out


def memory(sides: list[Side]) -> dict[str, Any]:
    return {s.dtype: {"weight_bytes": s.engine.model.weights.nbytes(),
                      "packed_bytes": s.engine.model.packed_bytes(),
                      "compute": s.engine.model.options.label(s.engine.model.device,
                                                              s.engine.model.dtype)}
            for s in sides}


def markdown(record: Result) -> str:
    r = record.payload
    acc, dec = r["accuracy"], r["summary"]["decode"]
    lines = [
        "# bfloat16 weights vs float32 on CPU", "",
        f"`python -m benchmarks bf16_weights`, {r['model_label']}, {r['threads']} thread(s), "
        f"{r['rounds']} interleaved rounds (medians). bf16: the packed kernel's weights held "
        "in bfloat16 and widened exactly as they are read; activations, sums, LoRA and AdamW "
        f"in float32. {record.provenance()}", "",
        f"Accuracy over a fixed {acc['num_tokens']}-token English text (training forward):", "",
        "| | max abs Δ logprob | mean abs Δ logprob | mean logprob (fp32) | greedy agreement |",
        "|---|---|---|---|---|"]
    for key in ("base", "adapter"):
        a = acc[key]
        lines.append(f"| {key} | {a['max_abs_delta_logprob']:.4f} | "
                     f"{a['mean_abs_delta_logprob']:.5f} | {a['mean_logprob_fp32']:.3f} | "
                     f"{a['greedy_agreement']:.3f} |")
    lines += ["", "| decode step (mode / sequences) | fp32 ms | bf16 ms | fp32 ÷ bf16 |",
              "|---|---|---|---|"]
    for key, d in dec.items():
        lines.append(f"| {key} | {d['fp32_ms']:.1f} | {d['bf16_ms']:.1f} | "
                     f"**{d['ratio']:.2f}** |")
    p = r["summary"]["prefill"]
    lines += ["", f"Prefill of {PREFILL_LEN} tokens: fp32 {p['fp32_s']:.3f} s, bf16 "
              f"{p['bf16_s']:.3f} s ({p['ratio']:.2f}×)."]
    if "train" in r["summary"]:
        t = r["summary"]["train"]
        lines.append(f"Training step (2048 tokens): fp32 {t['tok_s_fp32']:.0f} tok/s, bf16 "
                     f"{t['tok_s_bf16']:.0f} tok/s ({t['ratio']:.2f}×).")
    m = r["memory"]
    lines += ["", "| | base weights MB | packed copies MB | compute |", "|---|---|---|---|"]
    for dtype, v in m.items():
        lines.append(f"| {dtype} | {v['weight_bytes'] / 1e6:.0f} | "
                     f"{v['packed_bytes'] / 1e6:.0f} | `{v['compute']}` |")
    goal = r["goals"]["decode_ratio_fanout"]
    lines += ["", f"Goal: a fan-out decode step (32 sequences, invariant mode) ≥ {goal}× "
              f"faster in bf16: **{r['summary']['decode_ratio_fanout']:.2f}×**. The machine "
              "is shared: compare only numbers of one run.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", choices=MODELS, default="smollm2")
    parser.add_argument("--no-train", action="store_true", help="skip the training step")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = (smollm2_dir() if args.model == "smollm2" else ensure_builtin_model(
        (SCRATCH / "bench" / "bf16_weights" / "small-qwen3").resolve(), "qwen3", "small",
        seed=0))
    run = Run("bf16_weights")
    sides = {"invariant": [build(model_dir, d) for d in DTYPES],
             "fast": [build(model_dir, d, invariant=False) for d in DTYPES]}
    from tokenizers import Tokenizer

    tokens = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(FIXED_TEXT).ids
    acc = accuracy(sides["invariant"], tokens)
    times = measure(sides, args.rounds, not args.no_train)
    result = run.finish({"threads": args.threads, "rounds": args.rounds,
                         "model_label": LABELS[args.model], "goals": GOALS, "accuracy": acc,
                         "summary": summarise(times), "memory": memory(sides["invariant"]),
                         "times_s": times},
                        model=args.model, name=result_stem("bf16_weights", args.model))
    write(result, markdown(result), args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
