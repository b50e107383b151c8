"""Throughput of one Tinker-compatible server, measured through the official `tinker` SDK.

Works with SDK 0.25 (what SkyRL 0.4.0 accepts) and 0.38 (loraplex), so the same script measures
both; it imports nothing from this repo. Phases, each after untimed warm-up rounds that absorb
JIT compiles: forward_backward + optim_step steps on a fixed batch of mixed-length sequences
(tokens/s), then sampling from the trained adapter: a fan-out round (P prompts × num_samples) and
a batch round (P' prompts × 1 sample), all requests in flight at once (generated tokens/s).
Token ids are deterministic pseudo-random ints; shapes stay fixed across rounds. With
``--sample-past-eos`` every sample runs to ``--max-tokens`` (SDK ``stop=[]``), so servers that
do and do not stop at EOS by default generate the same tokens.
usage: python client_bench.py --base-url URL --base-model NAME --out result.json [options]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from typing import Any

DEFAULT_TRAIN_LENGTHS = (128, 160, 192, 256, 256, 320, 352, 384)  # mean 256


def train_token_lists(lengths: list[int], vocab_limit: int, seed: int) -> list[list[int]]:
    """One token list of length+1 per sequence (inputs are [:-1], targets [1:])."""
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab_limit) for _ in range(n + 1)] for n in lengths]


def prompt_token_lists(num_prompts: int, length: int, vocab_limit: int,
                       seed: int) -> list[list[int]]:
    rng = random.Random(seed + 1_000_003)
    return [[rng.randrange(1, vocab_limit) for _ in range(length)] for _ in range(num_prompts)]


def make_datums(types: Any, token_lists: list[list[int]]) -> list[Any]:
    """Cross-entropy datums: every target token has weight 1."""
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
        )
        for tokens in token_lists
    ]


def resolved(client_or_future: Any) -> Any:
    """The client itself: newer SDKs return futures of clients, 0.25 returns the client."""
    result = getattr(type(client_or_future), "result", None)
    return client_or_future.result() if callable(result) else client_or_future


def _to_list(value: Any) -> list[float]:
    return list(value.tolist()) if hasattr(value, "tolist") else list(value)


def mean_nll(output: Any) -> float | None:
    """Token-mean negative log-likelihood from forward_backward's per-datum `logprobs`."""
    total, count = 0.0, 0
    for item in getattr(output, "loss_fn_outputs", None) or []:
        if "logprobs" not in item:
            return None
        logprobs = _to_list(item["logprobs"])
        total -= sum(logprobs)
        count += len(logprobs)
    return total / count if count else None


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def log(message: str) -> None:
    print(f"[client_bench] {message}", file=sys.stderr, flush=True)


def train_phase(tc: Any, types: Any, args: argparse.Namespace) -> dict[str, Any]:
    lengths = [int(x) for x in args.train_lengths.split(",")]
    data = make_datums(types, train_token_lists(lengths, args.vocab_limit, args.seed))
    num_tokens = sum(lengths)
    adam = types.AdamParams(learning_rate=args.learning_rate)

    def step() -> tuple[float, float, float | None]:
        t0 = time.perf_counter()
        fb = tc.forward_backward(data, "cross_entropy")
        op = tc.optim_step(adam)
        out = fb.result(timeout=args.timeout)
        fb_s = time.perf_counter() - t0
        op.result(timeout=args.timeout)
        return fb_s, time.perf_counter() - t0, mean_nll(out)

    warmup = []
    for i in range(args.warmup_steps):
        warmup.append(step())
        log(f"train warm-up {i + 1}/{args.warmup_steps}: {warmup[-1][1]:.2f} s")
    timed = []
    for i in range(args.steps):
        timed.append(step())
        log(f"train step {i + 1}/{args.steps}: {timed[-1][1]:.2f} s, nll {timed[-1][2]}")
    # Pipelined: all steps in flight at once, as Tinker clients are meant to submit them.
    pipelined_steps = args.steps if args.pipelined_steps is None else args.pipelined_steps
    t0 = time.perf_counter()
    futures = []
    for _ in range(pipelined_steps):
        futures.append(tc.forward_backward(data, "cross_entropy"))
        futures.append(tc.optim_step(adam))
    for future in futures:
        future.result(timeout=args.timeout)
    pipelined_s = time.perf_counter() - t0
    step_s = [t[1] for t in timed]
    median_step = statistics.median(step_s)
    pipelined = {"steps": pipelined_steps, "s": round(pipelined_s, 3),
                 "tok_per_s": round(num_tokens * pipelined_steps / pipelined_s, 1)
                 if pipelined_steps else None}
    return {
        "lengths": lengths, "num_sequences": len(lengths), "tokens_per_step": num_tokens,
        "warmup_step_s": [round(t[1], 3) for t in warmup],
        "step_s": [round(s, 3) for s in step_s],
        "forward_backward_s": [round(t[0], 3) for t in timed],
        "nll": [t[2] for t in warmup + timed],
        "median_step_s": round(median_step, 3),
        "tok_per_s": round(num_tokens / median_step, 1),
        # The fastest step: on a shared machine, the least disturbed reading.
        "best_tok_per_s": round(num_tokens / min(step_s), 1),
        "pipelined": pipelined,
    }


def sample_round(scl: Any, types: Any, prompts: list[list[int]], num_samples: int,
                 args: argparse.Namespace, seed: int) -> tuple[float, int]:
    """All prompts in flight at once; returns (wall seconds, generated tokens)."""
    stop: dict[str, Any] = {"stop": []} if args.sample_past_eos else {}
    t0 = time.perf_counter()
    futures = [
        scl.sample(types.ModelInput.from_ints(prompt), num_samples,
                   types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0,
                                        seed=seed + i, **stop))
        for i, prompt in enumerate(prompts)
    ]
    responses = [f.result(timeout=args.timeout) for f in futures]
    seconds = time.perf_counter() - t0
    return seconds, sum(len(s.tokens) for r in responses for s in r.sequences)


def sample_workload(scl: Any, types: Any, num_prompts: int, num_samples: int,
                    args: argparse.Namespace, seed: int) -> dict[str, Any]:
    prompts = prompt_token_lists(num_prompts, args.prompt_len, args.vocab_limit, seed)
    warm = [sample_round(scl, types, prompts, num_samples, args, seed)
            for _ in range(args.warmup_rounds)]
    rounds = []
    for i in range(args.rounds):
        rounds.append(sample_round(scl, types, prompts, num_samples, args, seed + 100 * (i + 1)))
        log(f"sample x{num_samples} round {i + 1}/{args.rounds}: {rounds[-1][0]:.2f} s, "
            f"{rounds[-1][1]} tokens")
    total_s = sum(r[0] for r in rounds)
    total_tokens = sum(r[1] for r in rounds)
    return {
        "num_prompts": num_prompts, "prompt_len": args.prompt_len, "num_samples": num_samples,
        "max_tokens": args.max_tokens, "past_eos": args.sample_past_eos,
        "max_new_tokens_per_round": num_prompts * num_samples * args.max_tokens,
        "warmup_round_s": [round(w[0], 3) for w in warm],
        "round_s": [round(r[0], 3) for r in rounds], "gen_tokens": [r[1] for r in rounds],
        "median_round_s": round(statistics.median(r[0] for r in rounds), 3),
        "tok_per_s": round(total_tokens / total_s, 1),
        "best_tok_per_s": round(max(r[1] / r[0] for r in rounds), 1),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--base-model", required=True, help="model name as the server lists it")
    p.add_argument("--out", required=True, help="JSON result path")
    p.add_argument("--api-key", default="tml-client-bench")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--vocab-limit", type=int, default=2048, help="token ids drawn from [1, N)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-lengths", default=",".join(map(str, DEFAULT_TRAIN_LENGTHS)),
                   help="comma-separated input lengths of the fixed training batch")
    p.add_argument("--learning-rate", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--pipelined-steps", type=int, default=None,
                   help="steps of the pipelined phase (default --steps; 0 skips it)")
    p.add_argument("--num-prompts", type=int, default=8, help="prompts of the fan-out round")
    p.add_argument("--batch-prompts", type=int, default=None,
                   help="prompts of the batch round (default --num-prompts)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--fanout-samples", type=int, default=8, help="num_samples of the fan-out round")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--sample-past-eos", action="store_true",
                   help="stop=[]: every sample runs to --max-tokens")
    p.add_argument("--train-unembed", choices=("sdk", "true", "false"), default="sdk",
                   help="LoRA on the output head (default: the SDK's default)")
    p.add_argument("--warmup-rounds", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-sample", action="store_true")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per future")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    import tinker
    from tinker import types

    result: dict[str, Any] = {
        "sdk_version": tinker.__version__, "python": platform.python_version(),
        "base_url": args.base_url, "base_model": args.base_model, "rank": args.rank,
        "load_avg": {"start": load_avg()},
    }
    log(f"tinker {tinker.__version__} → {args.base_url} ({args.base_model}), rank {args.rank}")
    sc = tinker.ServiceClient(base_url=args.base_url, api_key=args.api_key)
    t0 = time.perf_counter()
    unembed = {} if args.train_unembed == "sdk" else {"train_unembed": args.train_unembed == "true"}
    result["train_unembed"] = args.train_unembed
    tc = resolved(sc.create_lora_training_client(base_model=args.base_model, rank=args.rank,
                                                 seed=0, **unembed))
    result["create_training_client_s"] = round(time.perf_counter() - t0, 2)
    log(f"training client ready in {result['create_training_client_s']} s")
    if not args.skip_train:
        result["train"] = train_phase(tc, types, args)
        result["load_avg"]["after_train"] = load_avg()
    if not args.skip_sample:
        t0 = time.perf_counter()
        scl = resolved(tc.save_weights_and_get_sampling_client())
        result["sampling_client_s"] = round(time.perf_counter() - t0, 2)
        batch_prompts = args.batch_prompts or args.num_prompts
        result["sample_fanout"] = sample_workload(scl, types, args.num_prompts,
                                                  args.fanout_samples, args, 10_000)
        result["load_avg"]["after_fanout"] = load_avg()
        result["sample_batch"] = sample_workload(scl, types, batch_prompts, 1, args, 20_000)
    result["load_avg"]["end"] = load_avg()
    result["summary"] = {
        "fwd_bwd_tok_s": result.get("train", {}).get("tok_per_s"),
        "fwd_bwd_pipelined_tok_s": result.get("train", {}).get("pipelined", {}).get("tok_per_s"),
        "sample_fanout_tok_s": result.get("sample_fanout", {}).get("tok_per_s"),
        "sample_batch_tok_s": result.get("sample_batch", {}).get("tok_per_s"),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    log(f"summary {json.dumps(result['summary'])}; wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
    # The result is written. Skip interpreter finalization: the SDK's background threads can
    # abort it (SIGABRT after "wrote ..." in 2 of 8 runs of SDK 0.38 against a fast server).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
