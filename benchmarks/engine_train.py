"""Engine training benchmark: our packed multi-LoRA training path vs transformers + PEFT.

One process, everything side by side, interleaved round-robin (ABAB…) so load swings on a
shared machine hit every candidate alike. Workload: the built-in ``small`` Qwen3 model
(created into a scratch directory), rank-16 LoRA on attention, MLP and the output head,
8 sequences of mixed lengths averaging 256 tokens, one forward_backward (cross-entropy)
plus one optim_step per iteration. Candidates:

* ``ours``: `Engine.forward_backward` + `optim_step`, batch-invariant mode (the default);
* ``ours_fast``: the same in fast mode (compact rows, SDPA attention);
* ``baseline``: ``transformers`` + ``peft`` + ``torch.optim.AdamW`` as a user writes it: the
  8 sequences right-padded into one ``[8, max_len]`` batch with an attention mask;
* ``packed``: 8 adapters, one sequence each, in one engine batch (+ 8 optim steps), against
  ``ours`` (one adapter, the same 8 sequences);
* ``ours_uniform`` / ``baseline_uniform``: 8 × 256 tokens (no padding to waste).

Writes ``benchmarks/results/engine_train.json`` and ``.md`` (``engine_train_smollm2.*`` with
``--model smollm2``: the real SmolLM2-135M-Instruct, see `benchmarks.real_models`). Usage::

    .venv/bin/python benchmarks/engine_train.py [--rounds 5] [--model small|smollm2]
        [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

# On a shared machine, spinning OpenMP workers steal the core their sibling needs: 2-thread
# steps ran 3-4x slower under load with libgomp's default active wait (measured). Set before
# torch loads libgomp; override from the environment. Both candidates run under it alike.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import RESULTS
from benchmarks.harness.result import Result, Run
from benchmarks.harness.writer import write
from benchmarks.real_models import LABELS, MODELS, result_stem, smollm2_dir
from loraplex.config import EngineConfig
from loraplex.cost.flops import TrainingMethod, training_flops
from loraplex.domain.data import Datum, TensorData
from loraplex.domain.lora import LoraConfig
from loraplex.domain.model import ModelInfo
from loraplex.domain.optim import AdamParams
from loraplex.domain.work import ForwardBackwardWork, OptimStepWork
from loraplex.engine.builtin.model import create_builtin_model
from loraplex.engine.executor import Engine

RANK = 16
LORA = LoraConfig(rank=RANK, alpha=32.0, seed=0)
ADAM = AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-12)
#: Mixed lengths, mean 256: the batch benchmarks/peers measured SkyRL tx on (skyrl_peer.md).
MIXED_LENGTHS = (128, 160, 192, 256, 256, 320, 352, 384)
UNIFORM_LENGTHS = (256,) * 8
PEFT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "lm_head"]

#: ≥ these, but ``bytes_ratio`` ≤.
GOALS = {"ratio": 1.3, "roofline_fraction": 0.8, "packed_efficiency": 0.95, "bytes_ratio": 1.1}

Step = Callable[[], None]
SMALL_LABEL = "builtin small qwen3 (tied)"


def token_rows(lengths: tuple[int, ...], vocab: int, seed: int = 0) -> list[list[int]]:
    """``length + 1`` random tokens per sequence (inputs and shifted targets)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n + 1,), generator=gen).tolist() for n in lengths]


def datum(tokens: list[int]) -> Datum:
    n = len(tokens) - 1
    return Datum(array("q", tokens[:-1]), {
        "target_tokens": TensorData("int64", (n,), array("q", tokens[1:])),
        "weights": TensorData("float32", (n,), array("f", [1.0] * n))})


def engine_step(engine: Engine, groups: list[tuple[str, list[list[int]]]]) -> Step:
    """One forward_backward over every (adapter, sequences) group, then their optim_steps."""
    works = [ForwardBackwardWork(f"fb-{a}", a, tuple(datum(t) for t in seqs), "cross_entropy",
                                 {}, False) for a, seqs in groups]
    steps = [OptimStepWork(f"opt-{a}", a, ADAM) for a, _ in groups]

    def step() -> None:
        for outcome in [*engine.forward_backward(works), *engine.optim_step(steps)]:
            if isinstance(outcome, Exception):
                raise outcome

    return step


def baseline_step(model_dir: str, sequences: list[list[int]]) -> Step:
    """transformers + PEFT + torch AdamW on a right-padded batch with an attention mask."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, PeftLoraConfig(r=RANK, lora_alpha=LORA.alpha, lora_dropout=0.0,
                                                target_modules=PEFT_TARGETS))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=ADAM.learning_rate, betas=(ADAM.beta1, ADAM.beta2),
                                  eps=ADAM.eps, weight_decay=0.0)
    width = max(len(s) for s in sequences)
    input_ids = torch.zeros(len(sequences), width, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for i, s in enumerate(sequences):
        input_ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    labels = input_ids.masked_fill(mask == 0, -100)

    def step() -> None:
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def gemm_step(m: int = 4096, k: int = 512, n: int = 512, repeats: int = 8) -> Step:
    """`probe_machine`'s roofline GEMM (fp32 ``F.linear`` M×K→N fwd + bwd, frozen W),
    ``repeats`` times: timed in the same rounds as the candidates, so it sees the same load."""
    x_M_K = torch.randn(m, k, requires_grad=True)
    w_N_K = torch.randn(n, k)

    def step() -> None:
        for _ in range(repeats):
            torch.nn.functional.linear(x_M_K, w_N_K).sum().backward()

    return step


def packed_gemm_step(m: int = 4096, k: int = 512, n: int = 512, repeats: int = 8) -> Step | None:
    """`gemm_step` through loraplex's packed kernel (forward on the packed weight, the input
    gradient on the weight as it is), as the engine runs its base GEMMs; None where the
    kernel is not available. The roofline takes the faster of the two."""
    from loraplex.engine.kernels.gemm_order import gemm_kernel
    from loraplex.engine.kernels.packed_linear import FrozenLinear

    kernel = gemm_kernel((k,), torch.device("cpu"), torch.float32)
    if kernel is None:
        return None
    x_M_K = torch.randn(m, k, requires_grad=True)
    linear = FrozenLinear(torch.randn(n, k), kernel)

    def step() -> None:
        for _ in range(repeats):
            linear(x_M_K).sum().backward()

    return step


GEMM_FLOPS = 8 * 4 * 4096 * 512 * 512  # the default gemm_step: repeats × 4·M·K·N


def run_interleaved(steps: dict[str, Step], rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each step, round-robin; ``warmup`` untimed rounds first."""
    from tqdm import tqdm

    times: dict[str, list[float]] = {name: [] for name in steps}
    with tqdm(total=(rounds + warmup) * len(steps), desc="engine_train", unit="step") as bar:
        for r in range(warmup + rounds):
            for name, step in steps.items():
                bar.set_postfix_str(name)
                t0 = time.perf_counter()
                step()
                if r >= warmup:
                    times[name].append(time.perf_counter() - t0)
                bar.update()
    return times


def flops_per_token(info: ModelInfo, lengths: tuple[int, ...]) -> float:
    """LoRA training FLOPs per token, attention included (`loraplex.cost.flops`)."""
    card = info.card
    method = TrainingMethod(kind="lora", lora=LORA)
    return sum(training_flops(card, n, method) for n in lengths) / sum(lengths)


def adapter_bytes(engine: Engine, adapter_id: str) -> tuple[int, int]:
    """(measured resident bytes of adapter + optimizer state, theory params + 2 moments)."""
    adapter = engine.bank.get(adapter_id)
    state = engine.trainer.optimizer_state(adapter_id)
    measured = adapter.nbytes() + (state.nbytes if state is not None else 0)
    return measured, 3 * 4 * adapter.num_params


def summarize(times: dict[str, list[float]], tokens: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, ts in times.items():
        out[name] = {"tokens": tokens[name], "median_s": statistics.median(ts), "min_s": min(ts),
                     "tok_s": tokens[name] / statistics.median(ts),
                     "best_tok_s": tokens[name] / min(ts), "times_s": ts}
    return out


def build(model_dir: str, dtype: str = "auto"
          ) -> tuple[dict[str, Step], dict[str, int], Engine, ModelInfo]:
    invariant = Engine(model_dir, EngineConfig(batch_invariant=True, dtype=dtype))
    fast = Engine(model_dir, EngineConfig(batch_invariant=False, dtype=dtype))
    info = invariant.model_info()
    mixed = token_rows(MIXED_LENGTHS, info.vocab_size)
    uniform = token_rows(UNIFORM_LENGTHS, info.vocab_size, seed=1)
    for engine in (invariant, fast):
        engine.create_adapter("a", LORA)
    for i in range(8):
        invariant.create_adapter(f"p{i}", LoraConfig(rank=RANK, alpha=LORA.alpha, seed=i))
    packed_gemm = packed_gemm_step()
    steps = {
        "gemm": gemm_step(),
        **({"gemm_packed": packed_gemm} if packed_gemm is not None else {}),
        "ours": engine_step(invariant, [("a", mixed)]),
        "baseline": baseline_step(model_dir, mixed),
        "ours_fast": engine_step(fast, [("a", mixed)]),
        "packed": engine_step(invariant, [(f"p{i}", [s]) for i, s in enumerate(mixed)]),
        "ours_uniform": engine_step(invariant, [("a", uniform)]),
        "baseline_uniform": baseline_step(model_dir, uniform),
    }
    tokens = {name: sum(UNIFORM_LENGTHS if "uniform" in name else MIXED_LENGTHS)
              for name in steps}
    tokens["gemm"] = tokens["gemm_packed"] = GEMM_FLOPS  # "tok/s" of the probes is FLOP/s
    return steps, tokens, invariant, info


def measure(model_dir: str, rounds: int, warmup: int, dtype: str = "auto") -> dict[str, Any]:
    steps, tokens, invariant, info = build(model_dir, dtype)
    times = run_interleaved(steps, rounds, warmup)
    runs = summarize(times, tokens)
    tok_s = {name: r["tok_s"] for name, r in runs.items()}
    per_token = flops_per_token(info, MIXED_LENGTHS)
    mkl_gemm = tok_s.pop("gemm") / 1e9
    packed_gemm = tok_s.pop("gemm_packed", 0.0) / 1e9
    gemm = max(mkl_gemm, packed_gemm)
    roofline = gemm * 1e9 / per_token
    measured_bytes, theory_bytes = adapter_bytes(invariant, "a")
    return {
        "ours_tok_s": tok_s["ours"],
        "baseline_tok_s": tok_s["baseline"],
        "ratio": tok_s["ours"] / tok_s["baseline"],
        "roofline_tok_s": roofline,
        "roofline_fraction": tok_s["ours"] / roofline,
        "packed_tok_s": tok_s["packed"],
        "one_adapter_same_batch_tok_s": tok_s["ours"],
        "packed_efficiency": tok_s["packed"] / tok_s["ours"],
        "bytes_per_adapter": measured_bytes,
        "bytes_per_adapter_theory": theory_bytes,
        "bytes_ratio": measured_bytes / theory_bytes,
        "fast_mode_tok_s": tok_s["ours_fast"],
        "invariant_over_fast": tok_s["ours"] / tok_s["ours_fast"],
        "fast_ratio": tok_s["ours_fast"] / tok_s["baseline"],
        "uniform_ours_tok_s": tok_s["ours_uniform"],
        "uniform_baseline_tok_s": tok_s["baseline_uniform"],
        "uniform_ratio": tok_s["ours_uniform"] / tok_s["baseline_uniform"],
        "flops_per_token": per_token,
        "gemm_fwd_bwd_gflops": gemm,
        "mkl_gemm_fwd_bwd_gflops": mkl_gemm,
        "packed_gemm_fwd_bwd_gflops": packed_gemm,
        "best_round": {"ours_tok_s": runs["ours"]["best_tok_s"],
                       "baseline_tok_s": runs["baseline"]["best_tok_s"],
                       "roofline_tok_s": max(runs[name]["best_tok_s"] for name in runs
                                             if name.startswith("gemm")) / per_token,
                       "uniform_ours_tok_s": runs["ours_uniform"]["best_tok_s"],
                       "uniform_baseline_tok_s": runs["baseline_uniform"]["best_tok_s"]},
        "goals": GOALS,
        "num_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "workload": {"model": SMALL_LABEL, "rank": RANK, "alpha": LORA.alpha,
                     "targets": PEFT_TARGETS, "mixed_lengths": MIXED_LENGTHS,
                     "baseline_padded_tokens": 8 * max(MIXED_LENGTHS),
                     "uniform_lengths": UNIFORM_LENGTHS, "rounds": rounds, "warmup": warmup,
                     "num_params": info.num_params},
        "runs": runs,
    }


def markdown(record: Result) -> str:
    r, w, g = record.payload, record.payload["workload"], record.payload["goals"]
    torch_version = (record.start.probe or {}).get("torch_version", "?")
    rows = [
        ("ours (invariant) tok/s", r["ours_tok_s"], ""),
        ("baseline transformers+PEFT tok/s", r["baseline_tok_s"], ""),
        ("ratio ours / baseline", r["ratio"], f"goal ≥ {g['ratio']:g}"),
        ("roofline tok/s", r["roofline_tok_s"],
         f"{r['gemm_fwd_bwd_gflops']:.0f} GFLOP/s ÷ {r['flops_per_token'] / 1e6:.1f} MFLOP/token"
         + (f" (the faster GEMM probe: MKL {r['mkl_gemm_fwd_bwd_gflops']:.0f}, loraplex's "
            f"packed kernel {r['packed_gemm_fwd_bwd_gflops']:.0f} GFLOP/s fwd+bwd)"
            if r.get("packed_gemm_fwd_bwd_gflops") else "")),
        ("roofline fraction", r["roofline_fraction"], f"goal ≥ {g['roofline_fraction']:g}"),
        ("8 adapters packed tok/s", r["packed_tok_s"], ""),
        ("1 adapter, same batch tok/s", r["one_adapter_same_batch_tok_s"], ""),
        ("packed efficiency", r["packed_efficiency"], f"goal ≥ {g['packed_efficiency']:g}"),
        ("bytes per adapter (measured)", r["bytes_per_adapter"], ""),
        ("bytes per adapter (params + 2 moments)", r["bytes_per_adapter_theory"], ""),
        ("bytes ratio", r["bytes_ratio"], f"goal ≤ {g['bytes_ratio']:g}"),
        ("fast mode tok/s", r["fast_mode_tok_s"], ""),
        ("invariant / fast", r["invariant_over_fast"], ""),
        ("uniform 8×256: ours tok/s", r["uniform_ours_tok_s"], ""),
        ("uniform 8×256: baseline tok/s", r["uniform_baseline_tok_s"], ""),
        ("uniform ratio", r["uniform_ratio"], "no padding for the baseline to waste"),
    ]
    lines = ["# Engine training benchmark", "",
             f"{w['model']} ({w['num_params'] / 1e6:.1f} M params), rank {w['rank']} "
             f"on {', '.join(w['targets'])}; 8 sequences of lengths {list(w['mixed_lengths'])} "
             f"(the baseline pads them to {w['baseline_padded_tokens']} positions); "
             f"{w['rounds']} interleaved rounds (medians), "
             f"{r['num_threads']} threads (OMP_WAIT_POLICY={r['omp_wait_policy']}), "
             f"torch {torch_version}. {record.provenance()}",
             "", "| metric | value | note |", "|---|---|---|"]
    for name, value, note in rows:
        text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}"
        lines.append(f"| {name} | {text} | {note} |")
    lines += ["", "| run | median s | best s | tok/s (median) | tok/s (best) |",
              "|---|---|---|---|---|"]
    for name, run in r["runs"].items():
        if name.startswith("gemm"):  # the roofline probes: GFLOP/s instead of tok/s
            label = "gemm probe" if name == "gemm" else "packed kernel probe"
            lines.append(f"| {label} (GFLOP/s) | {run['median_s']:.3f} | {run['min_s']:.3f} | "
                         f"{run['tok_s'] / 1e9:.1f} | {run['best_tok_s'] / 1e9:.1f} |")
            continue
        lines.append(f"| {name} | {run['median_s']:.3f} | {run['min_s']:.3f} | "
                     f"{run['tok_s']:,.0f} | {run['best_tok_s']:,.0f} |")
    best = r["best_round"]
    lines += ["", f"Best rounds: ours {best['ours_tok_s']:,.0f} vs baseline "
              f"{best['baseline_tok_s']:,.0f} tok/s, roofline {best['roofline_tok_s']:,.0f} "
              f"tok/s; uniform ours {best['uniform_ours_tok_s']:,.0f} vs baseline "
              f"{best['uniform_baseline_tok_s']:,.0f} tok/s. The machine is shared: compare "
              "only numbers of one run"]
    if w["model"] == SMALL_LABEL:
        lines[-1] += (" (benchmarks/results/skyrl_peer.md measured SkyRL tx on the same model at "
                      "241 tok/s mixed, 435 tok/s 8×256, in another run)")
    lines[-1] += "."
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--model-dir", help="reuse a built-in small model directory")
    parser.add_argument("--model", choices=MODELS, default="small",
                        help="the built-in small model, or the real SmolLM2-135M-Instruct")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="engine.dtype of ours (bfloat16: bf16 weights, fp32 compute); "
                             "a non-default one writes engine_train[_MODEL]_DTYPE")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="loraplex-bench-") as scratch:
        if args.model == "smollm2":
            model_dir = args.model_dir or str(smollm2_dir())
        else:
            model_dir = args.model_dir or str(create_builtin_model(
                Path(scratch) / "small-qwen3", "qwen3", "small", seed=0))
        run = Run("engine_train")
        payload = measure(model_dir, args.rounds, args.warmup, args.dtype)
    if args.model != "small":
        payload["workload"]["model"] = LABELS[args.model]
    payload["dtype"] = args.dtype
    result = run.finish(payload, model=payload["workload"]["model"],
                        name=result_stem("engine_train", args.model, args.dtype))
    md = markdown(result)
    write(result, md, Path(args.out))
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
