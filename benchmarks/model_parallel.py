"""A model-parallel group against one engine, on SmolLM2-135M (30 layers, tied head).

The group: ``LocalGroups(model_parallel=2)``, two local rank processes with one torch thread
each (this machine's 2 cores), gloo between them; the one-device engine: this process, two
threads. Measured, in one run:

- ``per_rank_weight_bytes_vs_theory``: base-weight bytes each rank holds (packed copies
  included) ÷ (the one engine's ÷ 2); goal ≤ 1.1.
- ``logprob_max_abs_diff_vs_one_device``: the same mixed batch (three adapters, 8
  sequences) through both; pipeline stages keep every bit, so the goal is 0.
- ``kl_sample_train``: samples drawn by the group from a snapshot, scored by the group's
  trainer: mean(sampler − trainer logprob), exactly 0.
- ``throughput_ratio_2v1``: training (8 × 256 tokens, forward_backward + optim_step) and
  sampling (4 prompts × G = 8 × 64 tokens) steps per second, group ÷ engine, interleaved
  rounds. Without micro-batches a pipeline of 2 runs one stage at a time, each on one core,
  against one engine using both cores: the ratio is bounded by about 0.5 plus whatever the
  engine loses to two-thread scaling.
- ``recovery_s``: from a rank's SIGKILL to a replacement group holding the run again (the
  loss detected by the next call, a new group started, the latest checkpoint installed).

    python -m benchmarks.model_parallel [--rounds 3]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks import REPO
from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run
from benchmarks.harness.writer import write

MODEL = "builtin:smollm2-135m"
VOCAB = 49152
GOALS = {"per_rank_weight_bytes_vs_theory": 1.1, "logprob_max_abs_diff_vs_one_device": 0.0,
         "kl_sample_train": 0.0}


def batch(seed: int, adapters: tuple[str, ...] = ("a", "b", "c"), n: int = 8,
          length: int = 256) -> list[Any]:
    from benchmarks.harness.works import ce_datum
    from benchmarks.harness.works import train_work as work

    gen = torch.Generator().manual_seed(seed)
    return [work(f"r{i}", adapters[i % len(adapters)], [ce_datum(gen, length, VOCAB)])
            for i in range(n)]


def sample_works(seed: int, adapter: str) -> list[Any]:
    from benchmarks.harness.works import NO_STOP, sample_work

    gen = torch.Generator().manual_seed(seed)
    return [sample_work(f"s{i}", torch.randint(3, 30000, (32,), generator=gen).tolist(),
                        adapter, num_samples=8, max_tokens=64, seed=seed + i, stop=NO_STOP)
            for i in range(4)]


def sample_all(executor: Any, works: list[Any]) -> dict[str, Any]:
    out = dict(executor.sample_step(works, 16).finished)
    while executor.num_running_samples():
        out.update(executor.sample_step([], 16).finished)
    return out


def train_step(executor: Any, seed: int) -> float:
    from loraplex.domain.optim import AdamParams
    from loraplex.domain.work import OptimStepWork

    start = time.perf_counter()
    executor.forward_backward(batch(seed))
    executor.optim_step([OptimStepWork(f"o{a}", a, AdamParams(learning_rate=1e-4))
                         for a in "abc"])
    return time.perf_counter() - start


def logprob_diff(engine: Any, group: Any) -> float:
    works = batch(100)
    one = engine.forward_backward([w for w in works])
    two = group.forward_backward([w for w in works])
    diffs = [float(torch.tensor(list(x)).sub(torch.tensor(list(y))).abs().max())
             for a, b in zip(one, two, strict=True) for x, y in zip(a.logprobs, b.logprobs,
                                                                     strict=True)]
    return max(diffs)


def tokens_datum(tokens: list[int]) -> Any:
    """A cross-entropy datum predicting each next token of ``tokens``."""
    from array import array

    from loraplex.domain.data import Datum, TensorData

    n = len(tokens) - 1
    return Datum(array("q", tokens[:-1]), {
        "target_tokens": TensorData("int64", (n,), array("q", tokens[1:])),
        "weights": TensorData("float32", (n,), array("f", [1.0] * n))})


def kl_sample_train(group: Any) -> float:
    """mean(sampler − trainer logprob) over every sampled token of a snapshot's samples."""
    from benchmarks.harness.works import train_work as work

    group.snapshot_adapter("a", "a@kl")
    works = {w.request_id: w for w in sample_works(7, "a@kl")}
    results = sample_all(group, list(works.values()))
    total, count = 0.0, 0
    for request_id, result in results.items():
        prompt = list(works[request_id].prompt)
        for seq in result.sequences:
            tokens = prompt + list(seq.tokens)
            [out] = group.forward_backward([work("kl", "a@kl", [tokens_datum(tokens)],
                                                 forward_only=True)])
            trained = torch.tensor(list(out.logprobs[0]))[-len(seq.tokens):]
            total += float((torch.tensor(list(seq.logprobs)) - trained).sum())
            count += len(seq.tokens)
    return total / count


def recovery(groups: Any, model_dir: str, tmp: Path) -> float:
    """SIGKILL a rank of a fresh group holding a saved run; seconds until a replacement
    group holds the run again (what a lane does: `scheduler.lanes`)."""
    from loraplex.domain.lora import LoraConfig
    from loraplex.domain.work import LoadWork, SaveWork
    from loraplex.errors import WorkerLostError

    group = groups.spawn(model_dir)
    group.create_adapter("x", LoraConfig(rank=16, seed=0))
    group.save_adapter(SaveWork("x", str(tmp / "x"), with_optimizer=True))
    start = time.perf_counter()
    os.kill(group.ranks[1].pid, signal.SIGKILL)
    with contextlib.suppress(WorkerLostError):  # the call that finds the group lost
        group.forward_backward(batch(1, ("x",), n=1, length=16))
    replacement = groups.spawn(model_dir)
    replacement.install_adapter("x", replacement.read_checkpoint(
        LoadWork("x", str(tmp / "x"), with_optimizer=True)))
    seconds = time.perf_counter() - start
    replacement.close()
    return seconds


def run(rounds: int, device: str) -> Result:
    from loraplex.cli.model_sources import resolve_source
    from loraplex.cluster.local_groups import LocalGroups
    from loraplex.config import EngineConfig
    from loraplex.domain.lora import LoraConfig
    from loraplex.engine.executor import Engine

    model_dir = resolve_source(MODEL, str(REPO / ".scratch" / "memory" / "data"))
    record = Run("model_parallel")
    engine = Engine(model_dir, EngineConfig(num_threads=2, kv_cache_blocks=256,
                                            device=device))
    groups = LocalGroups(EngineConfig(num_threads=1, kv_cache_blocks=256, device=device),
                         model_parallel=2)
    group = groups.spawn(model_dir)
    for executor in (engine, group):
        for i, name in enumerate("abc"):
            executor.create_adapter(name, LoraConfig(rank=16, seed=i))
    one_device = engine.model.weights.nbytes() + engine.model.packed_bytes()
    result: dict[str, Any] = {
        "device": device, "goals": GOALS,
        "weight_bytes_per_rank": group.weight_bytes, "weight_bytes_one_device": one_device,
        "per_rank_weight_bytes_vs_theory": max(group.weight_bytes) / (one_device / 2),
        "logprob_max_abs_diff_vs_one_device": logprob_diff(engine, group)}
    times: dict[str, list[float]] = {f"{kind}_{who}": [] for kind in ("train", "sample")
                                     for who in ("group", "engine")}
    for r in range(rounds):
        print(f"[model_parallel] round {r}", flush=True)
        for who, executor in (("group", group), ("engine", engine)):
            times[f"train_{who}"].append(train_step(executor, 10 + r))
            executor.snapshot_adapter("a", f"a@{r}")
            start = time.perf_counter()
            sample_all(executor, sample_works(20 + r, f"a@{r}"))
            times[f"sample_{who}"].append(time.perf_counter() - start)
    result["step_s"] = times
    result["throughput_ratio_2v1"] = {
        kind: statistics.median(times[f"{kind}_engine"]) / statistics.median(times[f"{kind}_group"])
        for kind in ("train", "sample")}
    result["kl_sample_train"] = kl_sample_train(group)
    group.close()
    with tempfile.TemporaryDirectory() as tmp:
        result["recovery_s"] = recovery(groups, model_dir, Path(tmp))
    return record.finish(result, model=MODEL)


def markdown(record: Result) -> str:
    r, g = record.payload, record.payload["goals"]
    ratio = r["throughput_ratio_2v1"]
    return "\n".join([
        "# Model parallel: a group of 2 ranks vs one engine, SmolLM2-135M", "",
        f"`python -m benchmarks.model_parallel`, device {r['device']}. {record.provenance()}",
        "", "| key | value | goal |", "|---|---|---|",
        *(f"| `{key}` | {r[key]:.4g} | {'≤' if key.startswith('per_rank') else '='} "
          f"{goal:g} |" for key, goal in g.items()),
        f"| `throughput_ratio_2v1` (train, sample) | {ratio['train']:.3f}, "
        f"{ratio['sample']:.3f} | |",
        f"| `recovery_s` | {r['recovery_s']:.1f} | |", ""])


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (two GPUs: NCCL)")
    args = parser.parse_args()
    result = run(args.rounds, args.device)
    write(result, markdown(result), args.out)
    print(json.dumps({k: result.payload[k] for k in (
        "per_rank_weight_bytes_vs_theory", "logprob_max_abs_diff_vs_one_device",
        "kl_sample_train", "throughput_ratio_2v1", "recovery_s")}, indent=2))


if __name__ == "__main__":
    main()
