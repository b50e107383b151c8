"""Empirical validation of the cost model (`loraplex.cost`) against loraplex's own server.

    python -m benchmarks.cost_validation [--quick] [--threads N] [--out benchmarks/results]

Starts ``loraplex serve`` on the built-in ``small`` model (``--model small-moe``: the
Qwen3-MoE built-in, priced on its active parameters; results ``cost_validation_moe.*``) (a
subprocess, ``--open``), drives a
short SFT run and a short GRPO run (sample G completions per prompt → reward → group-centred
advantages → ``importance_sampling`` forward_backward + optim_step) through the official
``tinker`` SDK, and reads what the engine actually spent per phase from the server
(``/api/v1/loraplex/stats`` engine seconds per plan kind and cycle records; token counts from
``/api/v1/loraplex/usage``). The prediction is the cost model's, on a hardware card built from
this machine's GEMM rate and copy bandwidth measured in the same run, around each phase.
Writes ``cost_validation.json`` and ``cost_validation.md``.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("TINKER_TELEMETRY", "0")

import httpx
from tqdm import tqdm

from benchmarks.cost_validation.predict import (
    CALIBRATION,
    Measured,
    Settings,
    Snapshot,
    StepRecord,
    model_card,
    predict_phases,
)
from benchmarks.cost_validation.report import markdown
from benchmarks.harness import cli
from benchmarks.harness.result import Run
from benchmarks.harness.server_process import serve_loraplex
from benchmarks.harness.writer import write
from benchmarks.probe import MachineProbe, median_seconds, probe_machine
from loraplex.domain.model_card import ModelCard

API_KEY = "tml-cost-validation"
MODEL_NAME = "small"
GOAL = 0.20
MOE_NOTES = """\
## The MoE model

`small-moe` (8 experts of width 512, top-2, every layer sparse) is priced on its *active*
parameters: N counts the router and the 2 routed experts a token passes
(`ModelCard.matmul_params`), not all 8, and the adapter terms count Tinker's LoRA on every
expert (the hidden-side factor shared by a layer's experts, `ModelCard.lora_rank_widths`).
Training carries over as for the dense model (the calibrated GRPO ratio). A decode iteration
costs more beyond its matmuls than the dense model's: each sparse layer also routes (router
GEMM, top-k), sorts the assignments by expert, pads every expert's group (and every expert ×
adapter group of the LoRA layout) to 16 rows for batch invariance, and gathers rows in and out
of those layouts; at a decode batch of 32 rows (64 assignments) half the rows are pad. That is
the per-iteration overhead the fitted term absorbs; the calculator's GPU presets leave it at 0.
"""


# ---- reading the server ------------------------------------------------------------------------

def snapshot(base_url: str) -> Snapshot:
    headers = {"X-API-Key": API_KEY}
    stats = httpx.get(f"{base_url}/api/v1/loraplex/stats", params={"recent": 4096},
                      headers=headers, trust_env=False, timeout=60).json()
    usage = httpx.get(f"{base_url}/api/v1/loraplex/usage", headers=headers, trust_env=False,
                      timeout=60).json()
    cycles = [c for s in stats["schedulers"] for c in s["recent_cycles"]]
    return Snapshot(
        engine_s={k: float(v) for k, v in stats["engine_s"].items()},
        train_s=sum(c["train_s"] for c in cycles),
        optim_s=sum(c["optim_s"] for c in cycles),
        tokens={k: int(v) for k, v in usage["totals"]["tokens"].items()})


def measure(base_url: str, into: Measured, kind: str, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (which waits for its futures) between two snapshots; add the difference."""
    before = snapshot(base_url)
    result = fn()
    into.add(before, snapshot(base_url), kind)
    return result


# ---- the workloads -----------------------------------------------------------------------------

def sft_data(types: Any, lengths: tuple[int, ...], vocab: int, seed: int) -> list[Any]:
    """Cross-entropy datums of the given input lengths, every target weighted 1."""
    rng = random.Random(seed)
    data = []
    for n in lengths:
        tokens = [rng.randrange(1, vocab) for _ in range(n + 1)]
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * n}))
    return data


def train_step(tc: Any, types: Any, data: list[Any], loss_fn: str, lr: float) -> None:
    fb = tc.forward_backward(data, loss_fn)
    op = tc.optim_step(types.AdamParams(learning_rate=lr))
    fb.result()
    op.result()


def reward(tokens: list[int], vocab: int) -> float:
    """A toy verifiable reward: the share of generated ids in the lower half of the vocabulary
    (the cost of a step does not depend on what is rewarded)."""
    return sum(t < vocab // 2 for t in tokens) / max(1, len(tokens))


def grpo_data(types: Any, prompts: list[list[int]], responses: list[Any], vocab: int
              ) -> list[Any]:
    """The cookbook's layout: input = prompt + completion[:-1], targets shifted by one; sampling
    logprobs and the group-centred advantage on completion positions, zeros on the prompt."""
    data = []
    for prompt, response in zip(prompts, responses, strict=True):
        seqs = response.sequences
        rewards = [reward(list(s.tokens), vocab) for s in seqs]
        mean = statistics.fmean(rewards)
        for seq, r in zip(seqs, rewards, strict=True):
            completion = list(seq.tokens)
            full = prompt + completion
            pad = [0.0] * (len(prompt) - 1)
            data.append(types.Datum(
                model_input=types.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={"target_tokens": full[1:],
                                "logprobs": pad + list(seq.logprobs or [0.0] * len(completion)),
                                "advantages": pad + [r - mean] * len(completion)}))
    return data


def decode_matmul_seconds(card: ModelCard, rows: int, repeats: int = 5) -> float:
    """Median seconds of one decode iteration's base-model matmuls alone, at ``rows`` rows:
    every weight matrix of ``card`` (distinct tensors, fp32, ~4·N bytes, so they stream from
    DRAM as in the engine) applied once to a ``rows × d_in`` input. No LoRA, no attention."""
    import torch
    import torch.nn.functional as F

    weights = [torch.randn(g.d_out, g.d_in) for g in card.linear_groups()
               for _ in range(g.num_active)]
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}

    def one_iteration() -> None:
        for w in weights:
            F.linear(inputs[w.shape[1]], w)

    return median_seconds(one_iteration, repeats=repeats, warmup=1)


def grpo_sample(scl: Any, types: Any, prompts: list[list[int]], s: Settings, seed: int,
                group_size: int | None = None) -> list[Any]:
    """Every prompt's G samples in flight at once, as a GRPO rollout step submits them."""
    futures = [scl.sample(types.ModelInput.from_ints(p), group_size or s.group_size,
                          types.SamplingParams(max_tokens=s.max_tokens, temperature=1.0,
                                               seed=seed + i))
               for i, p in enumerate(prompts)]
    return [f.result() for f in futures]


def run_workloads(base_url: str, s: Settings, card: ModelCard, model: str = MODEL_NAME
                  ) -> list[StepRecord]:
    """Two training runs on one server (an SFT run and a GRPO run, one LoRA each), their steps
    interleaved round by round so both see the same machine; every step runs alone between two
    server snapshots and two machine probes (the server idle while probing)."""
    import tinker
    import torch
    from tinker import types

    torch.set_num_threads(s.threads)  # the probes run at the server's thread count
    sc = tinker.ServiceClient(base_url=base_url, api_key=API_KEY)
    sft_tc = sc.create_lora_training_client(base_model=model, rank=s.rank,
                                            seed=s.seed).result()
    rl_tc = sc.create_lora_training_client(base_model=model, rank=s.rank,
                                           seed=s.seed + 1).result()
    rng, vocab = random.Random(s.seed + 1), card.vocab_size
    sft = sft_data(types, s.sft_lengths, vocab, s.seed)

    def prompts(n: int = s.rl_prompts) -> list[list[int]]:
        return [[rng.randrange(1, vocab) for _ in range(s.prompt_len)] for _ in range(n)]

    records: list[StepRecord] = []
    last: list[MachineProbe] = []  # empty during the warm-up: steps run untimed

    def run_step(phase: str, fn: Callable[[], Any], lengths: tuple[int, ...] = (),
                 decode_rows: int = 0, shape: tuple[int, int] = (0, 0)) -> Any:
        if not last:
            return fn()
        m = Measured()
        kind = "sample" if phase in ("rl_sample", CALIBRATION) else "cycle"
        result = measure(base_url, m, kind, fn)
        decode_s = decode_matmul_seconds(card, decode_rows) if decode_rows else 0.0
        after = probe_machine()
        records.append(StepRecord(phase, m, (last[-1], after), lengths, decode_s, *shape))
        last.append(after)
        return result

    def sft_step() -> None:
        run_step("sft_train", lambda: train_step(sft_tc, types, sft, "cross_entropy",
                                                 s.learning_rate), lengths=s.sft_lengths)

    def grpo_step(seed: int) -> None:
        scl = rl_tc.save_weights_and_get_sampling_client().result()
        batch = prompts()
        responses = run_step("rl_sample", lambda: grpo_sample(scl, types, batch, s, seed),
                             decode_rows=s.rl_prompts * s.group_size)
        data = grpo_data(types, batch, responses, vocab)
        run_step("rl_train", lambda: train_step(rl_tc, types, data, "importance_sampling",
                                                s.learning_rate),
                 lengths=tuple(len(d.model_input.to_ints()) for d in data))

    # Warm-up (untimed): first calls allocate the KV pool, build plans, fill allocator caches.
    sft_step()
    grpo_step(seed=10**6)
    last.append(probe_machine())
    scl = rl_tc.save_weights_and_get_sampling_client().result()
    for j, (n, g) in enumerate(s.calibration_shapes):  # the decode-overhead fit's steps
        batch = prompts(n)
        run_step(CALIBRATION, functools.partial(grpo_sample, scl, types, batch, s, 10**5 + j, g),
                 shape=(n, g))
    for i in tqdm(range(s.rounds), desc="rounds (SFT step + GRPO step)", file=sys.stderr):
        sft_step()
        grpo_step(seed=1000 * i)
    return records


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.parser(__doc__)
    p.add_argument("--quick", action="store_true", help="smoke run: tiny shapes, one RL step")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads of the server and of the GEMM probe (same on both; "
                        "1 by default: 2-thread OpenMP collapses on a shared 2-core box)")
    p.add_argument("--model", choices=(MODEL_NAME, "small-moe"), default=MODEL_NAME,
                   help="the built-in served (and its results' file name suffix)")
    p.add_argument("--data-dir", default=None,
                   help="server data dir (reuse one to skip building the built-in model)")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    settings = Settings.quick(args.threads) if args.quick else Settings(args.threads)
    run = Run("cost_validation", probe=False)  # every step is probed before and after
    with tempfile.TemporaryDirectory(prefix="cost_validation_") as tmp:
        data_dir = Path(args.data_dir) if args.data_dir else Path(tmp)
        data_dir.mkdir(parents=True, exist_ok=True)
        print(f"starting loraplex serve ({args.model}, {args.threads} threads) in {data_dir}",
              file=sys.stderr)
        threads = {"OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
        with serve_loraplex(args.model, f"builtin:{args.model}", data_dir, env=threads,
                            timeout_s=args.startup_timeout) as server:
            card = model_card(data_dir / "models" / f"builtin-{args.model}" / "config.json",
                              args.model)
            records = run_workloads(server.base_url, settings, card, args.model)
    result = predict_phases(card, records, settings, GOAL)
    result["settings"] = asdict(settings) | {"quick": args.quick}
    name = "cost_validation" + ("_moe" if args.model != MODEL_NAME else "") + (
        "_quick" if args.quick else "")
    record = run.finish(result, model=f"builtin:{args.model}", name=name)
    write(record, markdown(record, MOE_NOTES if args.model != MODEL_NAME else ""),
          args.out)
    for phase, row in result["phases"].items():
        print(f"{phase:10s} predicted {row['predicted_s']:8.2f} s  measured "
              f"{row['measured_s']:8.2f} s  ratio {row['ratio']:.2f}", file=sys.stderr)
    print(f"wrote {args.out / name}.json and .md", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
