"""Per-layer fixed cost of a decode step and a training step: what is not a base-model GEMM.

    python -m benchmarks.step_overhead [--baseline REV] [--rounds 3] [--threads 1]
        [--model smollm2|small] [--out DIR]

A decode step (8 sequences × 1 new token after 128-token prompts, one rank-16 adapter with
B ≠ 0 on every linear and the head, batch-invariant mode: the ``batch 8 × G = 1`` workload of
``engine_sample``) and a training step (forward + backward of 8 × 128 tokens, same adapter) are
timed on the model, and so are the very GEMMs of the base model in that step, replayed alone
on the model's own weights and shapes (decode: every layer's seven linears at the step's
padded row count, and the LM head; training: those forwards plus their input-gradient GEMMs).
``overhead_ms_per_layer = (step − base GEMMs) ÷ layers``: everything else (LoRA, attention,
norms, RoPE, elementwise ops, allocation, Python, and the step's sampling or loss), spread over
the layers; each repeat times the step and then its GEMM replay back to back, and the median
of the per-repeat differences is reported.

``--baseline REV`` measures the code of git revision ``REV`` (its ``loraplex/`` extracted
under ``.scratch/step_overhead``) in the same session: each round runs the candidate and the
baseline in fresh subprocesses, alternately, each with the load average and the GEMM probe of
its own process. Writes ``benchmarks/results/step_overhead.{json,md}`` (``_small`` suffix for
the built-in small model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tqdm import tqdm

from benchmarks import REPO, SCRATCH
from benchmarks.adapters import nonzero_adapter
from benchmarks.base_gemms import base_gemm_replay
from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run, git_state
from benchmarks.harness.writer import write
from benchmarks.probe import load_average, probe_machine
from benchmarks.real_models import LABELS, MODELS, smollm2_dir

PROMPTS, PROMPT_LEN, TRAIN_LEN, RANK, ALPHA = 8, 128, 128, 16, 32


def cpu_ms(fn: Callable[[], object]) -> float:
    """Process CPU milliseconds of one call (1 thread: the compute it needed)."""
    t0 = time.process_time()
    fn()
    return (time.process_time() - t0) * 1e3


def paired(step: Callable[[], object], gemms: Callable[[], object], head: Callable[[], object],
           repeats: int, warmup: int = 1) -> dict[str, float]:
    """Medians of ``repeats`` rounds of (step, its layer GEMMs, its head GEMM), each round run
    back to back so that the difference sees the same machine state."""
    for _ in range(warmup):
        step(), gemms(), head()
    rounds = [(cpu_ms(step), cpu_ms(gemms), cpu_ms(head)) for _ in range(repeats)]
    return {"step_ms": statistics.median(r[0] for r in rounds),
            "base_gemm_ms": statistics.median(r[1] + r[2] for r in rounds),
            "layer_gemm_ms": statistics.median(r[1] for r in rounds),
            "head_gemm_ms": statistics.median(r[2] for r in rounds),
            "overhead_ms": statistics.median(r[0] - r[1] - r[2] for r in rounds)}


# ---- the child: measures whichever `loraplex` is first on sys.path --------------------------

def measure(model_dir: Path, steps: int, kinds: tuple[str, ...]) -> dict[str, Any]:
    """Decode step, training step and their base GEMMs (ms, process CPU time)."""
    from loraplex.config import EngineConfig
    from loraplex.engine.lora.bank import AdapterBank
    from loraplex.engine.model.loader import load_model

    try:  # what `loraplex serve` does at revisions that have it
        from loraplex.engine.host_allocator import retain_freed_memory
    except ImportError:
        pass
    else:
        retain_freed_memory()
    model = load_model(model_dir, EngineConfig(batch_invariant=True))
    bank = AdapterBank(model.spec, "cpu", max_rank=RANK)
    nonzero_adapter(bank, RANK, ALPHA)
    result: dict[str, Any] = {"layers": model.spec.num_layers}
    if "decode" in kinds:
        result["decode"] = _decode(model, bank, model_dir, steps)
    if "train" in kinds:
        result["train"] = _train(model, bank, steps)
    return result


def _decode(model: Any, bank: Any, model_dir: Path, steps: int) -> dict[str, float]:
    from array import array
    from dataclasses import replace

    import torch

    from loraplex.config import EngineConfig
    from loraplex.domain.sampling import SamplingParams, StopCondition
    from loraplex.domain.work import SampleWork
    from loraplex.engine.sampling.sampler import Sampler

    sampler = Sampler(model, bank, EngineConfig(kv_cache_blocks=1024), str(model_dir))
    params = SamplingParams(max_tokens=4 * steps + 8, temperature=1.0,
                            stop=StopCondition(use_eos=False))
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, model.spec.vocab_size, (PROMPTS, PROMPT_LEN),
                            generator=gen).tolist()
    sampler.step([SampleWork(f"r{i}", "policy", None, array("q", p), 1, replace(params, seed=i))
                  for i, p in enumerate(prompts)], 2)
    rows = -(-PROMPTS // model.options.row_multiple) * model.options.row_multiple
    gemms, head = base_gemm_replay(model, rows, backward=False)
    result: dict[str, Any] = paired(lambda: sampler.step([], 1), gemms, head, steps, warmup=2)
    result["profile_ms_per_step"] = profile_by_source(lambda: sampler.step([], 1), 3)
    return result


#: Where a decode step's time goes: (label, function names tried in order; cumulative time of
#: the first one the profile has). Function names of both this revision and older ones.
SOURCES = (
    ("decode step (sampler.step)", ("step",)),
    ("model forward (all layers)", ("forward",)),
    ("F.linear calls (LoRA GEMMs; base GEMMs too without the packed kernel)",
     ("<built-in method torch._C._nn.linear>",)),
    ("packed sgemm calls (base linears + head)", ("forward_no_grad",)),
    ("attention (the C kernel's forward, or the tiled torch one)", ("tiled_paged_attention",)),
    ("attention: KV page writes", ("write",)),
    ("attention: RoPE", ("apply_rope",)),
    ("LoRA deltas (their GEMMs included)", ("add_deltas", "add_delta")),
    ("RMSNorm", ("rms_norm",)),
    ("LM head logits (head GEMM + its LoRA)", ("logits",)),
    ("token sampling over the vocab", ("sample_tokens",)),
    ("packing: rows, KV slots, tile plan", ("pack_sequences",)),
    ("  of which tile plan", ("plan_tiles",)),
)


def profile_by_source(step: Callable[[], object], steps: int) -> dict[str, float]:
    """Cumulative ms per step (cProfile, so Python-heavy parts read high) of `SOURCES`; the
    second of two profiled runs (the first pays one-off costs of profiling itself)."""
    import cProfile
    import pstats

    for _ in range(2):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            step()
        profiler.disable()
    stats: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    cumulative: dict[str, float] = {}
    for (path, _, name), (_, _, _, cum, _) in stats.items():
        if path.startswith("~") or "loraplex" in path:
            cumulative[name] = max(cumulative.get(name, 0.0), cum)
    out = {}
    for label, names in SOURCES:
        found = next((cumulative[n] for n in names if n in cumulative), None)
        if found is not None:
            out[label] = round(found * 1e3 / steps, 2)
    return out


def _train(model: Any, bank: Any, steps: int) -> dict[str, float]:
    import torch

    from loraplex.engine.model.packed_batch import SequenceInput

    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(10, model.spec.vocab_size, (PROMPTS, TRAIN_LEN + 1),
                           generator=gen).tolist()
    adapter = bank.get("policy")

    def step() -> None:
        batch = model.pack([SequenceInput(t[:-1], "policy") for t in tokens])
        lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
        targets = batch.scatter_to_rows(torch.tensor([t[1:] for t in tokens]).reshape(-1))
        loss = -model.token_logprobs(model.forward(batch, lora), targets, lora).sum()
        loss.backward(inputs=list(adapter.parameters()))

    gemms, head = base_gemm_replay(model, PROMPTS * TRAIN_LEN, backward=True)
    return paired(step, gemms, head, max(3, steps // 2))


def child(source: Path, model_dir: Path, threads: int, steps: int, kinds: tuple[str, ...]
          ) -> None:
    """Measure the ``loraplex`` under ``source`` and print one JSON line."""
    sys.path.insert(0, str(source))
    import torch

    import loraplex

    assert Path(loraplex.__file__).resolve().is_relative_to(source.resolve()), loraplex.__file__
    torch.set_num_threads(threads)
    start = load_average()
    result = measure(model_dir, steps, kinds)
    probe = probe_machine()
    result.update(load_start=start, load_end=load_average(),
                  gemm_probe_gflops=probe.gemm_gflops, threads=threads)
    print(json.dumps(result))


# ---- the parent: interleaved subprocess rounds ------------------------------------------------

def baseline_source(rev: str) -> Path:
    """``loraplex/`` of git revision ``rev``, extracted once under .scratch/step_overhead."""
    sha = subprocess.run(["git", "rev-parse", rev], cwd=REPO, check=True, capture_output=True,
                         text=True).stdout.strip()
    target = SCRATCH / "step_overhead" / sha[:12]
    if not (target / "loraplex" / "__init__.py").is_file():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", sha, "loraplex"], cwd=REPO, check=True,
                                 capture_output=True).stdout
        tar_path = target / "src.tar"
        tar_path.write_bytes(archive)
        with tarfile.open(tar_path) as tar:
            tar.extractall(target, filter="data")
        tar_path.unlink()
    return target


def run_child(source: Path, model_dir: Path, threads: int, steps: int, kinds: tuple[str, ...]
              ) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE"}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(source),
                          "--model-dir", str(model_dir), "--threads", str(threads),
                          "--steps", str(steps), "--only", *kinds], check=True,
                         capture_output=True, text=True, env=env, cwd=REPO)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds, and the per-layer overheads."""
    layers = runs[0]["layers"]
    out: dict[str, Any] = {}
    for kind in [k for k in ("decode", "train") if k in runs[0]]:
        med = {k: statistics.median(r[kind][k] for r in runs) for k in runs[0][kind]
               if isinstance(runs[0][kind][k], float)}
        med["overhead_ms_per_layer"] = med["overhead_ms"] / layers
        out[kind] = med
    out["gemm_probe_gflops"] = [round(r["gemm_probe_gflops"], 1) for r in runs]
    out["load"] = [[round(x, 2) for x in (*r["load_start"], *r["load_end"])] for r in runs]
    return out


def markdown(record: Result) -> str:
    result = record.payload
    cand, base = result["candidate"], result.get("baseline")
    lines = [
        "# Step overhead: per-layer cost that is not a base-model GEMM",
        "",
        "`python -m benchmarks.step_overhead`, "
        f"{result['model_label']}, {result['threads']} thread(s), {result['rounds']} "
        "interleaved rounds (fresh process each), process CPU time, medians. Candidate "
        f"`{result['candidate_rev']}`" + (f", baseline `{result['baseline_rev']}`" if base else "")
        + ". Decode: 8 sequences × 1 token after 128-token prompts, rank-16 adapter (B ≠ 0) on "
        "every linear and the head, batch-invariant mode; training: forward + backward of "
        "8 × 128 tokens. `overhead` = (step − base GEMMs replayed alone) ÷ layers.",
        "",
        "| metric | " + ("baseline | candidate | candidate ÷ baseline |" if base else
                         "candidate |"),
        "|---|" + ("---|---|---|" if base else "---|"),
    ]
    for kind in [k for k in ("decode", "train") if k in cand]:
        for key in ("step_ms", "base_gemm_ms", "overhead_ms_per_layer"):
            label = f"{kind} {key.replace('_', ' ')}"
            c = cand[kind][key]
            if base:
                b = base[kind][key]
                lines.append(f"| {label} | {b:.2f} | {c:.2f} | {c / b:.2f} |")
            else:
                lines.append(f"| {label} | {c:.2f} |")
    lines += profile_table(result)
    lines += ["", "Load average (1/5 min at start, at end) and GEMM probe (GFLOP/s) per round:",
              ""]
    for name, runs in (("candidate", cand), ("baseline", base)):
        if runs:
            lines.append(f"* {name}: load {runs['load']}; GEMM probe {runs['gemm_probe_gflops']}")
    lines += ["", f"The machine is shared: compare only numbers of one run. "
              f"{record.provenance()}", ""]
    return "\n".join(lines)


def profile_table(result: dict[str, Any]) -> list[str]:
    """Markdown rows of the decode-step profile by source (first round of each side)."""
    sides = [(name, result["raw"][name][0]["decode"].get("profile_ms_per_step"))
             for name in ("baseline", "candidate") if name in result["raw"]]
    sides = [(name, prof) for name, prof in sides if prof]
    if not sides:
        return []
    lines = ["", "Where a decode step goes (cProfile of 3 steps in the first round, cumulative "
             "ms per step; parts nest; the profiler inflates Python-heavy parts):", "",
             "| part | " + " | ".join(name for name, _ in sides) + " |",
             "|---|" + "---|" * len(sides)]
    for label, _ in SOURCES:
        values = [prof.get(label) for _, prof in sides]
        lines.append(f"| {label} | " + " | ".join("–" if v is None else f"{v:.1f}"
                                                  for v in values) + " |")
    return lines


def git_rev(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8, help="decode steps timed per round")
    parser.add_argument("--model", choices=MODELS, default="smollm2")
    parser.add_argument("--only", nargs="+", choices=("decode", "train"),
                        default=["decode", "train"], help="which steps to measure")
    parser.add_argument("--baseline", help="git revision to compare against (interleaved)")
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.model_dir, args.threads, args.steps, tuple(args.only))
        return
    if args.model == "smollm2":
        model_dir = smollm2_dir()
    else:
        from loraplex.engine.builtin.model import ensure_builtin_model
        model_dir = ensure_builtin_model((SCRATCH / "bench" / "step_overhead" / "small").resolve(),
                                         "qwen3", "small", seed=0)
    run = Run("step_overhead", probe=False)  # each child process records its own
    sources = {"candidate": REPO}
    if args.baseline:
        sources["baseline"] = baseline_source(args.baseline)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
    for i in tqdm(range(args.rounds * len(sources)), desc="step_overhead"):
        name = list(sources)[(i + i // len(sources)) % len(sources)]  # alternate who goes first
        runs[name].append(run_child(sources[name], model_dir, args.threads, args.steps,
                                     tuple(args.only)))
    git = git_state()
    payload: dict[str, Any] = {
        "model_label": LABELS[args.model], "threads": args.threads, "rounds": args.rounds,
        "candidate_rev": git["commit"] + ("+dirty" if git["loraplex_dirty"] else ""),
        "baseline_rev": git_rev(args.baseline) if args.baseline else None,
        "candidate": summarise(runs["candidate"]),
        "baseline": summarise(runs["baseline"]) if args.baseline else None,
        "raw": runs,
    }
    result = run.finish(payload, model=LABELS[args.model], name="step_overhead" if
                        args.model == "smollm2" else "step_overhead_small")
    write(result, markdown(result), args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
