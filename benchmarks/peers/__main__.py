"""`python -m benchmarks.peers`: measure SkyRL tx on the small model; write JSON + markdown.

Installs SkyRL into its scratch venv if needed, starts it on the small-model weights, runs
client_bench.py twice against the same server (the default mixed-length workload with sampling,
then a uniform 8×256 batch comparable to peers.md §6), stops it, and writes
`benchmarks/results/skyrl_peer.json` and `.md`. Extra args after `--` go to client_bench.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import RESULTS
from benchmarks.harness.result import Result, Run
from benchmarks.harness.writer import write
from benchmarks.peers import skyrl
from benchmarks.peers.client import run_client
from benchmarks.peers.small_model import SMALL_MODEL_DIR, ensure_small_model

UNIFORM_ARGS = ["--train-lengths", ",".join(["256"] * 8), "--skip-sample"]


def run(args: argparse.Namespace) -> Result:
    model_dir = ensure_small_model(args.model_dir)
    py = skyrl.install(args.scratch_dir)
    record = Run("skyrl_peer", probe=False)  # the client records the load around each run
    with skyrl.start(model_dir, args.port, args.scratch_dir) as server:
        env = skyrl.server_env(args.scratch_dir)
        mixed = run_client(py, server.base_url, server.base_model, args.client_args,
                           server.run_dir / "mixed.json", env=env)
        uniform = None if args.skip_uniform else run_client(
            py, server.base_url, server.base_model, [*UNIFORM_ARGS, *args.client_args],
            server.run_dir / "uniform.json", env=env)
    return record.finish({
        "peer": {"name": "skyrl", "version": skyrl.SKYRL_VERSION, "backend": "jax",
                 "backend_config": skyrl.DEFAULT_BACKEND_CONFIG,
                 "install": skyrl.install_record(args.scratch_dir)},
        "model_dir": str(model_dir),
        "model": _model_summary(model_dir),
        "served_model_dir": server.base_model,
        "server_log": str(server.log_path),
        "jit_compiles": skyrl.jit_compiles(server.log_path),
        "mixed": mixed,
        "uniform_8x256": uniform,
    }, model=str(model_dir))


def _model_summary(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    keys = ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
            "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
            "tie_word_embeddings")
    return {k: config.get(k) for k in keys}


def _train_row(label: str, train: dict[str, Any]) -> str:
    return (f"| fwd_bwd + optim_step, {label} | {train['tokens_per_step']} | "
            f"{train['median_step_s']} s | **{train['tok_per_s']}** (pipelined "
            f"{train['pipelined']['tok_per_s']}) | {train.get('best_tok_per_s')} |")


def markdown(record: Result) -> str:
    result = record.payload
    mixed, uniform = result["mixed"], result["uniform_8x256"]
    train = mixed.get("train", {})
    fan, batch = mixed.get("sample_fanout", {}), mixed.get("sample_batch", {})
    lines = [
        f"# SkyRL tx {result['peer']['version']} (JAX, CPU) on the small model",
        "",
        f"{record.provenance()} `python -m benchmarks.peers`; official "
        f"`tinker` SDK {mixed['sdk_version']} (the version SkyRL accepts). Model: "
        f"`{json.dumps(result['model'])}`. Backend config: "
        f"`{json.dumps(result['peer']['backend_config'])}`. Load average (1/5/15 min) at start "
        f"{mixed['load_avg']['start']}, at end {mixed['load_avg']['end']}: the 2 cores are shared, "
        "so compare only with numbers measured in the same run.",
        "",
        "| workload | tokens | median wall | tokens/s (median) | best round |",
        "|---|---|---|---|---|",
    ]
    if train:
        lines.append(_train_row(f"{train['num_sequences']} seqs of lengths {train['lengths']} "
                                f"(rank {mixed['rank']})", train))
    if uniform and uniform.get("train"):
        lines.append(_train_row("8×256 (peers.md §6 shape)", uniform["train"]))
    for name, s in (("fan-out", fan), ("batch", batch)):
        if s:
            lines.append(f"| sample {name}: {s['num_prompts']} prompts × {s['prompt_len']} "
                         f"tokens × {s['num_samples']} samples × {s['max_tokens']} new | "
                         f"{s['gen_tokens']} | {s['median_round_s']} s | **{s['tok_per_s']}** | "
                         f"{s.get('best_tok_per_s')} |")
    lines += ["", f"JIT warm-up (untimed): train steps {train.get('warmup_step_s')} s, sampling "
              f"rounds {fan.get('warmup_round_s')} / {batch.get('warmup_round_s')} s; first "
              f"create_lora_training_client {mixed['create_training_client_s']} s. Engine JIT "
              f"compiles (all in warm-up): `{json.dumps(result['jit_compiles'])}`.",
              f"Install record: `{json.dumps(result['peer']['install'])}`.", "", *NOTES, ""]
    return "\n".join(lines)


NOTES = (
    "Notes:",
    "- tokens/s counts real tokens: SkyRL pads every sequence of a batch to the longest one's "
    "bucket (the mixed batch computes 8×384), and sampling counts generated tokens only.",
    "- Workarounds needed (benchmarks/peers/skyrl.py): Python 3.11 with "
    "`--ignore-requires-python` (skyrl 0.4.0 declares >=3.12; the only local CPU torch is "
    "cp311), jax/jaxlib 0.10.2 + flax 0.12.8, a sitecustomize that aliases "
    "`typing.TypedDict`, `aiohttp` added, a launcher replacing the `uv run` engine command, "
    "`--backend jax`, and a model-dir view whose config.json names the dtype.",
    "- `sample_max_num_sequences` 64 instead of 8 was slower here (fan-out 149 tok/s, batch "
    "21 tok/s in one run): SkyRL pads every sampling batch to that size.",
    "- SDK 0.38 against SkyRL: training works, sampling fails in the client "
    "(`asample promises always carry sample_sequence_ids`); SkyRL pins tinker>=0.25,<0.26.",
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scratch-dir", default=str(skyrl.DEFAULT_SCRATCH_DIR))
    p.add_argument("--model-dir", default=str(SMALL_MODEL_DIR))
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--out", default=str(RESULTS / "skyrl_peer.json"))
    p.add_argument("--skip-uniform", action="store_true")
    p.add_argument("client_args", nargs="*", help="passed to client_bench.py (after --)")
    args = p.parse_args()
    out = Path(args.out)  # a JSON path: its stem names the result
    result = replace(run(args), name=out.stem)
    write(result, markdown(result), out.parent)
    print(markdown(result))


if __name__ == "__main__":
    main()
