"""One lm-evaluation-harness run against a loraplex server's ``/v1`` (``local-completions``,
its remote tokenizer: nothing downloaded), and its results file turned into `EvalScore` rows.

lm-eval is an optional dependency (``pip install 'loraplex[eval]'``); it runs in its own process
(``python -m lm_eval run``), with any interpreter that has it (``--lm-eval-python``)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.domain.eval_score import EvalScore
from loraplex.errors import user_error


@dataclass(frozen=True)
class EvalRun:
    """What to evaluate, where, and how."""

    server: str
    model: str
    tasks: tuple[str, ...]
    api_key: str
    out_dir: Path
    limit: int | None = None
    include_path: str | None = None
    num_concurrent: int = 8
    python: str = sys.executable


def command(run: EvalRun) -> list[str]:
    args = (f"model={run.model},base_url={run.server.rstrip('/')}/v1/completions,"
            f"tokenizer_backend=remote,auth_token={run.api_key},"
            f"num_concurrent={run.num_concurrent},max_retries=3,tokenized_requests=True")
    cmd = [run.python, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args",
           args, "--tasks", ",".join(run.tasks), "--output_path", str(run.out_dir)]
    if run.limit is not None:
        cmd += ["--limit", str(run.limit)]
    if run.include_path is not None:
        cmd += ["--include_path", run.include_path]
    return cmd


def run_lm_eval(run: EvalRun) -> list[EvalScore]:
    """Run lm-eval (its progress goes to this process's stderr) and read its scores.

    Raises:
        UserError: lm-eval is not installed for ``run.python``, or it failed.
    """
    env = {**os.environ, "OPENAI_API_KEY": run.api_key, "NO_PROXY": "127.0.0.1,localhost",
           "no_proxy": "127.0.0.1,localhost"}
    probe = subprocess.run([run.python, "-c", "import lm_eval, tenacity"], capture_output=True)
    if probe.returncode != 0:
        raise user_error("lm_eval", f"lm-eval is not installed for {run.python}: pip install "
                         "'loraplex[eval]' (or pass --lm-eval-python)")
    done = subprocess.run(command(run), env=env, stdout=sys.stderr)
    if done.returncode != 0:
        raise user_error("lm_eval", f"lm-eval exited with {done.returncode}")
    return scores_of(results_file(run.out_dir))


def results_file(out_dir: Path) -> dict[str, Any]:
    found = sorted(glob.glob(str(out_dir / "**" / "results_*.json"), recursive=True))
    if not found:
        raise user_error("lm_eval", f"no results_*.json under {out_dir}")
    return dict(json.loads(Path(found[-1]).read_text()))


def scores_of(results: dict[str, Any]) -> list[EvalScore]:
    """Every numeric metric of every task (``acc,none`` → ``acc``; other filters kept as
    ``metric,filter``), with its ``_stderr`` twin and the task's effective sample count."""
    samples = results.get("n-samples", {})
    out = []
    for task, metrics in sorted(results.get("results", {}).items()):
        count = samples.get(task, {}).get("effective")
        for key, value in sorted(metrics.items()):
            name, _, filt = key.partition(",")
            if "_stderr" in name or not isinstance(value, (int, float)) or isinstance(value,
                                                                                      bool):
                continue
            stderr = metrics.get(f"{name}_stderr,{filt}")
            out.append(EvalScore(task, name if filt in ("", "none") else key, float(value),
                                 float(stderr) if isinstance(stderr, (int, float)) else None,
                                 int(count) if isinstance(count, int) else None))
    return out
