"""Memory per token of a training step, before and after the windowed head and layer
recomputation (issue 24), on SmolLM2-135M served by ``loraplex serve`` and trained by the
official SDK, as a user would.

Per point (tokens N ∈ 1K, 2K, 4K, 8K): a fresh server (``--threads 2``), one SDK client, one
datum of N tokens, ``forward_backward`` (cross_entropy) + ``optim_step``; the server's VmHWM
(peak resident set) after the step, and the step's time. "before" is the revision of
``--baseline`` (today's main before this work) in a git worktree, run in the same session;
its 8K point is not run (≈ 28 GB extrapolated on a 24 GB machine): it is extrapolated from
its 2K→4K slope. ``theory_bytes`` per point is written out term by term: the server's
resident set after start (Python, torch, the weights and their packed copies), the adapter
(weights, gradients, two AdamW moments), the saved layer inputs (layers × N × hidden × 4 B),
one layer's recomputed activations and their gradients (measured: bytes autograd saves per
token and layer without recomputation, × 2), and one head window (logits, log-softmax and
their gradient: 3 × rows × vocab × 4 B). Also: ``recompute_time_cost`` (step time with
``engine.recompute = layer`` ÷ ``none``, 2,048 tokens, interleaved fresh servers) and
``max_context_trained`` (SmolLM2 at 8,192; ``builtin:small-long`` at 32,768).

    python -m benchmarks.memory [--tokens 1024,2048,4096,8192] [--baseline REV] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import REPO
from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run, git_state
from benchmarks.harness.server_process import ServerProcess, free_port
from benchmarks.harness.writer import pyplot, write
from benchmarks.probe import load_average

SCRATCH = REPO / ".scratch" / "memory"
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: The "after" servers recompute every layer (what this benchmark measures); the default,
#: ``auto``, keeps as many layers' activations as ``engine.activation_memory`` holds.
RECOMPUTE_ALL = {"LORAPLEX_ENGINE_RECOMPUTE": "layer"}
GOALS = {"peak_over_theory": 1.5, "peak_bytes_8k": 5 << 30, "recompute_time_cost": 1.35,
         "max_context_smollm2": 8192, "max_context_small_long": 32768}


def vm_kib(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` field in KiB (VmHWM, VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


class GpuPeak:
    """The largest GPU memory ``nvidia-smi`` reports for a process while the block runs
    (None without a GPU): polled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> GpuPeak:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(0.2):
            query = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                    "--format=csv,noheader,nounits"], capture_output=True,
                                   text=True).stdout
            for line in query.splitlines():
                pid, _, mib = line.partition(",")
                if pid.strip() == str(self.pid):
                    self.peak = max(self.peak or 0, int(mib) << 20)


def worktree(revision: str) -> Path:
    """A checkout of ``revision`` under .scratch (made once)."""
    path = SCRATCH / f"rev-{revision}"
    if not (path / "loraplex").is_dir():
        SCRATCH.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(path), revision], cwd=REPO,
                       check=True, capture_output=True)
    return path


def serve(code: Path, data_dir: Path, source: str, env: dict[str, str], tag: str
          ) -> ServerProcess:
    port = free_port()
    cmd = [sys.executable, "-m", "loraplex", "serve", "--port", str(port), "--data-dir",
           str(data_dir), "--open", "--threads", "2", "--model", source]
    full_env = {**os.environ, **env, "PYTHONPATH": str(code), "NO_PROXY": "127.0.0.1,localhost"}
    log = SCRATCH / f"{tag}.log"
    # Run from the revision's own tree: ``python -m`` puts the working directory on sys.path
    # before PYTHONPATH, so from this tree a "before" server would run today's code.
    return ServerProcess.start(cmd, full_env, log, base_url=f"http://127.0.0.1:{port}",
                               base_model=source, cwd=code)


def train(server: ServerProcess, model: str, num_tokens: int, steps: int = 1,
          vocab_size: int = 49152) -> list[float]:
    """Seconds of each step (forward_backward + optim_step of one ``num_tokens`` datum of
    random tokens below ``vocab_size``)."""
    import numpy as np
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=server.base_url, api_key="tml-memory-bench")
    tc = service.create_lora_training_client(base_model=model, rank=16, seed=0).result()
    tokens = np.random.default_rng(0).integers(3, vocab_size, num_tokens + 1).tolist()
    datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={"target_tokens": tokens[1:],
                                        "weights": [1.0] * num_tokens})
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        tc.forward_backward([datum], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()
        times.append(time.perf_counter() - start)
    with contextlib.suppress(Exception):  # its heartbeats would outlive the server
        service.close("success").result(timeout=90)
    return times


def resumable(key: str, measure: Any) -> Any:
    """``measure()``, or its result from an earlier run of this revision that got that far
    (``.scratch/memory/done.json``; a crash late in a long run keeps what it measured)."""
    path = SCRATCH / "done.json"
    revision = git_state()["commit"]
    done = json.loads(path.read_text()) if path.is_file() else {}
    if done.get("revision") != revision:
        done = {"revision": revision}
    if key in done:
        print(f"[memory] {key}: from the earlier run", flush=True)
        return done[key]
    done[key] = measure()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(done, indent=2))
    return done[key]


def point(code: Path, data_dir: Path, num_tokens: int, tag: str,
          env: dict[str, str] | None = None) -> dict[str, Any]:
    """One fresh server, one step: its peak and time."""
    return resumable(f"{tag}-{num_tokens}", lambda: _point(code, data_dir, num_tokens, tag, env))


def _point(code: Path, data_dir: Path, num_tokens: int, tag: str,
           env: dict[str, str] | None) -> dict[str, Any]:
    print(f"[memory] {tag}: {num_tokens} tokens ...", flush=True)
    with serve(code, data_dir, "builtin:smollm2-135m", env or {}, f"{tag}-{num_tokens}") as s:
        pid = s.process.pid
        started = {"hwm": vm_kib(pid, "VmHWM") << 10, "rss": vm_kib(pid, "VmRSS") << 10}
        gpu = GpuPeak(pid)
        with gpu:
            seconds = train(s, SMOLLM2, num_tokens)
        out = {"tokens": num_tokens, "peak_bytes": vm_kib(pid, "VmHWM") << 10,
               "gpu_peak_bytes": gpu.peak,
               "rss_after_start": started["rss"], "hwm_after_start": started["hwm"],
               "step_s": seconds[0], "load_avg": load_average()}
    print(f"[memory] {tag}: {num_tokens} tokens: peak {out['peak_bytes'] / 2**30:.2f} GiB, "
          f"{out['step_s']:.0f} s", flush=True)
    return out


def activation_bytes_per_token_layer(model_dir: str, num_tokens: int = 256) -> float:
    """Bytes autograd saves per token and decoder layer without recomputation (the storages
    its saved-tensor hooks see, the layer inputs and the head windows' included: an upper
    bound for one layer), measured on the engine in this process."""
    import torch

    from benchmarks.harness.works import ce_datum
    from benchmarks.harness.works import train_work as work
    from loraplex.config import EngineConfig
    from loraplex.domain.lora import LoraConfig
    from loraplex.engine.executor import Engine

    engine = Engine(model_dir, EngineConfig(num_threads=2, recompute="none"))
    engine.create_adapter("a", LoraConfig(rank=16, seed=0))
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    gen = torch.Generator().manual_seed(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        engine.forward_backward([work("r", "a", [ce_datum(gen, num_tokens, 49152)])])
    return sum(seen.values()) / num_tokens / engine.model.spec.num_layers


def theory(model_dir: str, num_tokens: int, rss_after_start: int, per_token_layer: float
           ) -> dict[str, int]:
    """The theory's terms for one step (see the module docstring)."""
    from loraplex.domain.lora import LoraConfig
    from loraplex.engine.lora.adapter import LoraAdapter
    from loraplex.engine.model.head_chunks import rows_per_window
    from loraplex.engine.model.spec import ModelSpec

    spec = ModelSpec.from_dir(model_dir)
    adapter = LoraAdapter.create(spec, LoraConfig(rank=16, seed=0))
    terms = {
        "server_after_start": rss_after_start,
        "adapter_state": 4 * 4 * adapter.num_params,
        "saved_layer_inputs": (spec.num_layers + 1) * num_tokens * spec.hidden_size * 4,
        "one_layer_recomputed": int(2 * per_token_layer * num_tokens),
        "one_head_window": 3 * rows_per_window(spec.vocab_size, 8) * spec.vocab_size * 4,
    }
    terms["total"] = sum(terms.values())
    return terms


def recompute_cost(data_dir: Path, rounds: int, num_tokens: int = 2048) -> dict[str, Any]:
    """Step time with recompute ÷ without: interleaved fresh servers of this revision, the
    second step of each timed (the first grows the heap)."""
    times: dict[str, list[float]] = {"none": [], "layer": []}
    for r in range(rounds):
        for mode in ("none", "layer"):
            print(f"[memory] recompute={mode} round {r}", flush=True)
            def measure(mode: str = mode, r: int = r) -> float:
                with serve(REPO, data_dir, "builtin:smollm2-135m",
                           {"LORAPLEX_ENGINE_RECOMPUTE": mode}, f"recompute-{mode}-{r}") as s:
                    return train(s, SMOLLM2, num_tokens, steps=2)[1]

            times[mode].append(resumable(f"recompute-{mode}-{r}", measure))
    return {"tokens": num_tokens, "step_s": times,
            "ratio": statistics.median(times["layer"]) / statistics.median(times["none"])}


def small_long_32k(data_dir: Path) -> dict[str, Any]:
    """A 32,768-token datum on builtin:small-long through the SDK."""
    print("[memory] small-long: 32768 tokens ...", flush=True)
    source = "Qwen/Qwen3-8B=builtin:small-long"
    with serve(REPO, data_dir, source, RECOMPUTE_ALL, "small-long") as s:
        seconds = train(s, "Qwen/Qwen3-8B", 32768, vocab_size=8192)
        return {"tokens": 32768, "step_s": seconds[0],
                "peak_bytes": vm_kib(s.process.pid, "VmHWM") << 10}


def run(args: argparse.Namespace) -> Result:
    from loraplex.cli.model_sources import resolve_source

    data_dir = SCRATCH / "data"
    model_dir = resolve_source("builtin:smollm2-135m", str(data_dir))
    record = Run("memory")
    tokens = [int(t) for t in args.tokens.split(",")]
    before_code = None if args.skip_baseline else worktree(args.baseline)
    per_token_layer = activation_bytes_per_token_layer(model_dir)
    points = []
    for n in tokens:  # interleaved: before then after at each size
        before = None if n > 4096 or before_code is None else point(
            before_code, data_dir, n, "before", {"LORAPLEX_ENGINE_KV_CACHE_BLOCKS": "256"})
        after = point(REPO, data_dir, n, "after", RECOMPUTE_ALL)
        after["theory"] = theory(model_dir, n, after["rss_after_start"], per_token_layer)
        after["peak_over_theory"] = after["peak_bytes"] / after["theory"]["total"]
        points.append({"tokens": n, "before": before, "after": after})
    result: dict[str, Any] = {
              "baseline": args.baseline, "goals": GOALS, "points": points,
              "activation_bytes_per_token_layer": per_token_layer}
    result["before_8k_extrapolated_bytes"] = extrapolate_before(points)
    last = points[-1]["after"]
    result["peak_bytes_8k"] = last["peak_bytes"] if points[-1]["tokens"] == 8192 else None
    result["peak_over_theory"] = last["peak_over_theory"]
    result["recompute"] = recompute_cost(data_dir, args.rounds)
    result["recompute_time_cost"] = result["recompute"]["ratio"]
    long = None if args.no_small_long else resumable("small-long",
                                                     lambda: small_long_32k(data_dir))
    result["small_long"] = long
    result["max_context_trained"] = {"smollm2-135m": max(p["tokens"] for p in points),
                                     "small-long": long["tokens"] if long else None}
    return record.finish(result, model=SMOLLM2)


def extrapolate_before(points: list[dict[str, Any]]) -> int | None:
    known = [(p["tokens"], p["before"]["peak_bytes"]) for p in points if p["before"]]
    if len(known) < 2:
        return None
    (n1, b1), (n2, b2) = known[-2:]
    return int(b2 + (b2 - b1) / (n2 - n1) * (8192 - n2))


def markdown(record: Result) -> str:
    result = record.payload
    gib = 2 ** 30
    lines = ["# memory: peak RSS of a SmolLM2-135M training step (loraplex serve + SDK)", "",
             f"Against {result['baseline']}; 2 threads. {record.provenance()}", "",
             "| tokens | before: peak GiB | after: peak GiB | theory GiB | peak ÷ theory | "
             "after: step s | before: step s |", "|---|---|---|---|---|---|---|"]
    for p in result["points"]:
        b, a = p["before"], p["after"]
        extrapolated = (result["before_8k_extrapolated_bytes"] or 0) / gib
        lines.append(f"| {p['tokens']} | {b['peak_bytes'] / gib:.2f} " if b else
                     f"| {p['tokens']} | not run (≈{extrapolated:.1f} extrapolated) ")
        lines[-1] += (f"| {a['peak_bytes'] / gib:.2f} | {a['theory']['total'] / gib:.2f} | "
                      f"{a['peak_over_theory']:.2f} | {a['step_s']:.0f} | "
                      f"{b['step_s']:.0f} |" if b else
                      f"| {a['peak_bytes'] / gib:.2f} | {a['theory']['total'] / gib:.2f} | "
                      f"{a['peak_over_theory']:.2f} | {a['step_s']:.0f} | — |")
    last = result["points"][-1]["after"]["theory"]
    lines += ["", f"Theory at {result['points'][-1]['tokens']} tokens, term by term (GiB): "
              + ", ".join(f"{k} {v / gib:.3f}" for k, v in last.items()), "",
              f"recompute_time_cost (layer ÷ none, 2,048 tokens): "
              f"{result['recompute_time_cost']:.2f} (steps {result['recompute']['step_s']})",
              f"max_context_trained: {result['max_context_trained']}" + (
                  f" (small-long 32K step {result['small_long']['step_s']:.0f} s, peak "
                  f"{result['small_long']['peak_bytes'] / gib:.2f} GiB)"
                  if result["small_long"] else "")]
    return "\n".join(lines) + "\n"


def figure(result: dict[str, Any]) -> Any:
    plt = pyplot()

    gib = 2 ** 30
    pts = result["points"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    before = [(p["tokens"], p["before"]["peak_bytes"] / gib) for p in pts if p["before"]]
    if before:
        ax.plot([n for n, _ in before], [g for _, g in before], "o-", label="before (main)")
    ax.plot([p["tokens"] for p in pts], [p["after"]["peak_bytes"] / gib for p in pts], "o-",
            label="after: windowed head + recompute")
    ax.plot([p["tokens"] for p in pts], [p["after"]["theory"]["total"] / gib for p in pts],
            "k--", label="theory")
    if before and result["before_8k_extrapolated_bytes"]:
        ax.plot([before[-1][0], 8192], [before[-1][1],
                result["before_8k_extrapolated_bytes"] / gib], "C0:", label="before, extrapolated")
    ax.axhline(5, color="grey", lw=0.8)
    ax.set_xlabel("tokens in the step")
    ax.set_ylabel("server peak RSS (GiB)")
    ax.set_title("SmolLM2-135M training step, loraplex serve + SDK")
    ax.legend()
    fig.tight_layout()
    return fig


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--tokens", default="1024,2048,4096,8192")
    parser.add_argument("--baseline", default="487e456")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-baseline", action="store_true",
                        help="run this revision only (scripts/gpu_check.sh)")
    parser.add_argument("--no-small-long", action="store_true",
                        help="skip the 32K-token step on builtin:small-long")
    args = parser.parse_args()
    result = run(args)
    write(result, markdown(result), args.out, figure=figure(result.payload))
    print(json.dumps({k: result.payload[k] for k in ("peak_bytes_8k", "peak_over_theory",
                                             "recompute_time_cost", "max_context_trained")}))


if __name__ == "__main__":
    main()
