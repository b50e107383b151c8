"""llama.cpp side by side: loraplex's sampler vs llama.cpp (llama-cpp-python, built from source
for this CPU in its own venv) on the same SmolLM2-135M-Instruct weights, same prompts (token
ids), same threads and cores, interleaved round by round.

    python -m benchmarks peers.llama_cpp [--rounds 3] [--threads 1] [--cores 0]
        [--dtype float32|bfloat16] [--gguf-type f32|f16|bf16] [--modes sample,greedy]

Shapes (EOS ignored on both sides, so every sequence runs its full length): ``fanout`` 4
prompts × 128 tokens × G = 8 samples × 64 new, ``batch`` 8 × 128 × G = 1 × 64, ``single``
1 × 128 × 1 × 128 (latency: time to first token, ms per later token). Modes: ``sample``
(temperature 1, seeded) and ``greedy``. llama.cpp runs two ways (`worker.py`): the high-level
``Llama`` one sequence at a time, and its own multi-sequence batching through the low-level
API; ``ratio_vs_llama_cpp`` per shape divides our median tok/s by the faster of the two.

Ours: the engine's default configuration (batch-invariant, its C kernels), and its fast mode
(``batch_invariant=False``) beside it; ``--dtype`` passed to ``EngineConfig(dtype=...)``. After
the rounds, our prefill and decode step are profiled (packed sgemm, attention kernel, rest) and
our base-GEMM floor is measured per shape, for the report's "where llama.cpp wins, and why".

llama.cpp's weights: an F32 GGUF holding bit for bit the fp32 weights ours loads
(`gguf_export.py`; ``--gguf-type`` defaults to match ``--dtype``), checked at the start of
every run: teacher-forced logprobs and greedy continuation of a chat prompt on both sides
(with llama.cpp's F32 KV cache and flash attention off, and as timed). Writes
``benchmarks/results/llama_cpp_smollm2.{json,md}`` (``_bf16``/``_f16`` suffix for the other
GGUF types).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch

from benchmarks import RESULTS, SCRATCH
from benchmarks.harness.result import Run
from benchmarks.harness.writer import write
from benchmarks.peers.llama_cpp import install
from benchmarks.peers.llama_cpp.gguf_export import ensure_exported
from benchmarks.peers.llama_cpp.ours import Ours
from benchmarks.peers.llama_cpp.peer import LlamaCppPeer
from benchmarks.peers.llama_cpp.report import markdown
from benchmarks.peers.llama_cpp.rounds import Plan, check_parity, measure
from benchmarks.real_models import LABELS, smollm2_dir
from loraplex.cli.wheel_models import fetch_gguf
from loraplex.engine.host_allocator import retain_freed_memory

DTYPE_GGUF = {"float32": "f32", "bfloat16": "bf16"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks peers.llama_cpp",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads on our side, n_threads and n_threads_batch on "
                             "llama.cpp's")
    parser.add_argument("--cores", type=str, default=None,
                        help="CPU ids both sides are pinned to, comma-separated (default: the "
                             "first --threads of this process's affinity)")
    parser.add_argument("--dtype", choices=tuple(DTYPE_GGUF), default="float32",
                        help="our engine's dtype (EngineConfig.dtype)")
    parser.add_argument("--gguf-type", choices=("f32", "f16", "bf16"), default=None,
                        help="llama.cpp's weights (default: f32 for float32, bf16 for bfloat16)")
    parser.add_argument("--modes", default="sample,greedy",
                        help="sampling modes, comma-separated: sample (temperature 1), greedy")
    parser.add_argument("--shapes", default="fanout,batch,single")
    parser.add_argument("--llama-modes", default="llama_batched,llama_high",
                        help="llama.cpp's ways to sample, comma-separated")
    parser.add_argument("--no-fast", action="store_true",
                        help="skip our fast mode (EngineConfig(batch_invariant=False))")
    parser.add_argument("--flash-attn", choices=("on", "off"), default="on",
                        help="llama.cpp's flash attention (on: what its default, auto, picks on "
                             "a CPU)")
    parser.add_argument("--scratch-dir", type=Path, default=SCRATCH / "peers" / "llama_cpp")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args()


def pin(threads: int, cores: str | None) -> list[int]:
    """Pin this process (and so the llama.cpp worker it starts) to ``cores``."""
    chosen = ([int(c) for c in cores.split(",")] if cores
              else sorted(os.sched_getaffinity(0))[:threads])
    os.sched_setaffinity(0, chosen)
    return chosen


def main() -> None:
    args = parse_args()
    cores = pin(args.threads, args.cores)
    torch.set_num_threads(args.threads)
    retain_freed_memory()  # as `loraplex serve` does
    gguf_type = args.gguf_type or DTYPE_GGUF[args.dtype]
    model_dir = smollm2_dir()
    source = fetch_gguf("smollm2-135m", str(SCRATCH / "bench" / "smollm2"))
    gguf = ensure_exported(source, args.scratch_dir / "models", gguf_type)
    python = install.install(args.scratch_dir)
    plan = Plan.parse(args.shapes, args.modes, args.llama_modes, fast=not args.no_fast)
    ours = {side: Ours.load(model_dir, args.dtype, batch_invariant=side == "ours")
            for side in plan.sides if side.startswith("ours")}
    run = Run("llama_cpp")
    with LlamaCppPeer(python, gguf, args.threads, args.scratch_dir / "worker.log",
                      flash_attn=args.flash_attn == "on") as peer:
        info = peer.request({"op": "info"})
        parity = check_parity(ours["ours"], peer, model_dir)
        measured = measure(ours, peer, plan, args.rounds)
    payload: dict[str, Any] = {
        "threads": args.threads, "cores": cores, "rounds": args.rounds,
        "dtype": args.dtype, "gguf_type": gguf_type, "gguf": str(gguf),
        "gguf_source": str(source), "model_label": LABELS["smollm2"],
        "ours_config": {"batch_invariant": ours["ours"].config.batch_invariant,
                        "native_kernels": ours["ours"].config.native_kernels,
                        "kv_dtype": str(ours["ours"].model.dtype).removeprefix("torch."),
                        "row_multiple": ours["ours"].model.options.effective_row_multiple},
        "llama_cpp": {**info, "install": install.install_record(args.scratch_dir)},
        "workloads": {name: dataclasses.asdict(w) for name, w in plan.workloads.items()},
        "parity": parity, **measured}
    stem = "llama_cpp_smollm2" + ("" if gguf_type == "f32" else f"_{gguf_type}")
    result = run.finish(payload, model=LABELS["smollm2"], name=stem)
    write(result, markdown(result), args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
