"""`python -m benchmarks.peers.side_by_side --model smollm2`: loraplex and SkyRL tx on the same
weights, the same threads and the same workloads, in interleaved rounds; `ratio_vs_skyrl`.

Both servers load one HF directory (``smollm2``: SmolLM2-135M-Instruct, the ``builtin:smollm2-135m``
GGUF imported once as fp32 safetensors, see `benchmarks.real_models`; ``small``: loraplex's
built-in small Qwen3), each pinned to the same ``--threads`` cores
(loraplex: ``--threads N``; SkyRL's XLA CPU client sizes its thread pool from the CPU affinity).
Each round runs `client_bench.py` once against each server, the order alternating (A B, B A, ...),
one server up at a time (SkyRL is started fresh each time and waited for until its engine has
loaded the weights; its JIT compiles fall in the warm-up):
forward_backward + optim_step on a fixed mixed-length batch, a fan-out sampling round and a batch
sampling round, each after untimed warm-up (which absorbs SkyRL's JIT compiles; the engine log's
compiles are recorded). Load average, a GEMM probe at start and end, each server's CPU seconds
and peak resident memory are recorded. Writes
``benchmarks/results/peers_<model>.{json,md}`` (`side_by_side_report.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import RESULTS, SCRATCH
from benchmarks.harness.result import Result
from benchmarks.harness.server_process import ServerProcess, free_port
from benchmarks.peers import skyrl
from benchmarks.peers.client import run_client

PEERS = ("loraplex", "skyrl")
SERVED_NAME = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct", "small": "loraplex/small"}
#: The issue's shapes: fan-out 4 prompts × G = 8 × 64 new, batch 8 prompts × 1 × 64, training the
#: mixed-length batch of 8 sequences (mean 256) every peers run uses; LoRA rank 16 on the seven
#: linears of every layer and not on the head (SkyRL cannot put LoRA on a tied head:
#: `init_lora_adapter` raises for train_unembed with tie_word_embeddings); every sample runs to
#: 64 tokens (loraplex would stop at EOS, SkyRL does not).
CLIENT_ARGS = ("--rank", "16", "--train-unembed", "false", "--warmup-steps", "1", "--steps", "2",
               "--pipelined-steps", "0", "--prompt-len", "128", "--num-prompts", "4",
               "--fanout-samples", "8", "--batch-prompts", "8", "--max-tokens", "64",
               "--sample-past-eos", "--warmup-rounds", "1", "--rounds", "1")
#: What each goal compares (the issue): loraplex ÷ SkyRL tokens/s.
GOALS = {"train": 3.0, "sample_fanout": 3.0, "sample_batch": 1.2}


def model_dir_for(model: str) -> Path:
    if model == "smollm2":
        from benchmarks.real_models import smollm2_dir

        return smollm2_dir()
    from benchmarks.peers.small_model import SMALL_MODEL_DIR, ensure_small_model

    return ensure_small_model(SMALL_MODEL_DIR)


def pinned(cmd: list[str], threads: int) -> list[str]:
    """`cmd` under `taskset` on cores 0..threads-1 (XLA sizes its pool from the affinity)."""
    return ["taskset", "-c", f"0-{threads - 1}", *cmd]


def start_loraplex(model_dir: Path, name: str, data_dir: Path, threads: int) -> ServerProcess:
    shutil.rmtree(data_dir, ignore_errors=True)  # no adapters or sessions from an earlier run
    data_dir.mkdir(parents=True)
    port = free_port()
    cmd = [sys.executable, "-m", "loraplex", "serve", "--model", f"{name}={model_dir}", "--open",
           "--data-dir", str(data_dir), "--port", str(port), "--threads", str(threads)]
    env = dict(os.environ, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    return ServerProcess.start(pinned(cmd, threads), env, data_dir / "server.log",
                               base_url=f"http://127.0.0.1:{port}", base_model=name)


def start_skyrl(model_dir: Path, scratch: Path, threads: int) -> ServerProcess:
    skyrl.install(scratch)
    server = skyrl.start(model_dir, None, scratch, skyrl.DEFAULT_BACKEND_CONFIG,
                         launch_prefix=pinned([], threads))
    try:
        skyrl.wait_engine_loaded(server)
    except BaseException:
        server.stop()
        raise
    return server


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of every live process in process group `pgid`."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def affinity(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return "?"


def group_peak_rss_mib(pgid: int) -> float:
    """Sum of the peak resident set (VmHWM) of every live process in process group `pgid`."""
    total_kib = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            stat = (status.parent / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[2]) == pgid:
            total_kib += next((int(line.split()[1]) for line in text.splitlines()
                               if line.startswith("VmHWM:")), 0)
    return total_kib / 1024


def start_peer(peer: str, model_dir: Path, args: argparse.Namespace,
               scratch: Path) -> ServerProcess:
    if peer == "loraplex":
        return start_loraplex(model_dir, SERVED_NAME[args.model], scratch / "loraplex-data",
                              args.threads)
    return start_skyrl(model_dir, args.skyrl_dir, args.threads)


def measure(peer: str, model_dir: Path, args: argparse.Namespace, scratch: Path, out: Path,
            client_args: list[str]) -> dict[str, Any]:
    """Start `peer` alone (the other server is stopped: two 30-layer servers do not fit in
    memory side by side here), run client_bench.py against it, record its CPU and memory,
    stop it."""
    python = sys.executable if peer == "loraplex" else skyrl.venv_python(args.skyrl_dir)
    env = dict(os.environ) if peer == "loraplex" else skyrl.server_env(args.skyrl_dir)
    t0 = time.monotonic()
    with start_peer(peer, model_dir, args, scratch) as server:
        startup_s = time.monotonic() - t0
        pid = server.process.pid
        cpu0, t1 = group_cpu_s(pid), time.monotonic()
        result = run_client(python, server.base_url, server.base_model, client_args, out,
                            env=env)
        wall = time.monotonic() - t1
        result.update(startup_s=round(startup_s, 1), wall_s=round(wall, 1),
                      server_cpu_s=round(group_cpu_s(pid) - cpu0, 1),
                      server_peak_rss_mib=round(group_peak_rss_mib(pid)),
                      affinity=affinity(pid), served_model=server.base_model)
    if peer == "skyrl":
        result["jit_compiles"] = skyrl.jit_compiles(server.log_path)
        result["server_log"] = str(server.log_path)
    return result


def pooled(rounds: list[dict[str, Any]], peer: str) -> dict[str, float | None]:
    """tokens/s per workload over every timed step/round of every round: training tokens ÷
    the median step, sampling generated tokens ÷ their seconds."""
    runs = [r[peer] for r in rounds]
    steps = [s for r in runs for s in r.get("train", {}).get("step_s", [])]
    out: dict[str, float | None] = {"train": None, "sample_fanout": None, "sample_batch": None}
    if steps:
        out["train"] = runs[0]["train"]["tokens_per_step"] / statistics.median(steps)
    for key in ("sample_fanout", "sample_batch"):
        secs = sum(s for r in runs for s in r.get(key, {}).get("round_s", []))
        toks = sum(t for r in runs for t in r.get(key, {}).get("gen_tokens", []))
        out[key] = toks / secs if secs else None
    return out


def ratios(ours: dict[str, float | None], theirs: dict[str, float | None]
           ) -> dict[str, float | None]:
    return {k: (ours[k] / theirs[k]) if ours.get(k) and theirs.get(k) else None for k in GOALS}


def per_round_ratios(rounds: list[dict[str, Any]]) -> list[dict[str, float | None]]:
    return [ratios(pooled([r], "loraplex"), pooled([r], "skyrl")) for r in rounds]


def run(args: argparse.Namespace) -> Result:
    from benchmarks.harness.result import Run, git_state

    model_dir = model_dir_for(args.model)
    scratch = args.scratch_dir / args.model
    client_args = [*CLIENT_ARGS, *args.client_args]
    record = Run(f"peers_{args.model}")
    print(f"[side_by_side] probe {record.start.probe}", file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "model": args.model, "model_dir": str(model_dir), "threads": args.threads,
        "cores": os.cpu_count(), "client_args": client_args, "goals": GOALS,
        "git": git_state(),
        "skyrl": {"version": skyrl.SKYRL_VERSION, "backend": "jax",
                  "backend_config": skyrl.DEFAULT_BACKEND_CONFIG,
                  "install": skyrl.install_record(args.skyrl_dir)},
        "rounds": [],
    }
    for i in range(args.rounds):
        order = PEERS if i % 2 == 0 else PEERS[::-1]
        entry: dict[str, Any] = {"order": list(order)}
        for peer in order:
            print(f"[side_by_side] round {i + 1}/{args.rounds}: {peer}", file=sys.stderr,
                  flush=True)
            entry[peer] = measure(peer, model_dir, args, scratch,
                                  scratch / f"round{i + 1}-{peer}.json", client_args)
        result["rounds"].append(entry)
    served = Path(result["rounds"][0]["skyrl"]["served_model"])
    result["skyrl"]["served_model_dir"] = str(served)
    result["skyrl"]["dtype"] = json.loads((served / "config.json").read_text()).get("dtype")
    result["affinity"] = {p: result["rounds"][0][p]["affinity"] for p in PEERS}
    summary = {p: pooled(result["rounds"], p) for p in PEERS}
    result["tok_per_s"] = summary
    result["ratio_vs_skyrl"] = ratios(summary["loraplex"], summary["skyrl"])
    result["ratio_vs_skyrl_per_round"] = per_round_ratios(result["rounds"])
    return record.finish(result, model=SERVED_NAME[args.model])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("smollm2", "small"), default="smollm2")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="cores (and torch threads) each server gets (default: all)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    p.add_argument("--scratch-dir", type=Path, default=SCRATCH / "peers" / "side_by_side")
    p.add_argument("--skyrl-dir", type=Path, default=skyrl.DEFAULT_SCRATCH_DIR)
    p.add_argument("--out", type=Path, help="JSON path (default results/peers_<model>.json)")
    p.add_argument("client_args", nargs="*", help="extra client_bench.py arguments (after --)")
    args = p.parse_args(argv)
    if not 1 <= args.threads <= (os.cpu_count() or 1):
        p.error(f"--threads must be in [1, {os.cpu_count()}]")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from benchmarks.harness.writer import write
    from benchmarks.peers.side_by_side_report import markdown

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop both servers
    result = run(args)
    if args.out:  # a JSON path: its stem names the result
        result = replace(result, name=args.out.stem)
    write(result, markdown(result), args.out.parent if args.out else RESULTS)
    print(markdown(result))
    return result.payload


if __name__ == "__main__":
    main()
