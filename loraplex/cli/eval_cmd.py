"""`loraplex eval --server URL --model tinker://… --tasks NAME[,…] [--limit N]`: run
lm-evaluation-harness on a checkpoint through the server's ``/v1`` and store the scores with the
checkpoint (``GET /api/v1/loraplex/evals?path=…`` lists them; the dashboard's checkpoint table
shows them). `loraplex eval --server URL --compare PATH [PATH …]` prints stored scores side by
side. Local task files (YAML + JSONL) work offline with ``--include-path DIR``.

The API key comes from ``--api-key`` or ``TINKER_API_KEY``. A base model name as ``--model``
is evaluated but has no checkpoint to store scores with (they are printed only)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from loraplex.cli.lm_eval_run import EvalRun, run_lm_eval
from loraplex.domain.eval_score import EvalScore


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("eval", help="lm-eval a checkpoint through /v1, keep scores",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, metavar="URL", help="the loraplex server")
    parser.add_argument("--model", metavar="PATH", help="tinker://…/sampler_weights/… or a "
                        "served base model")
    parser.add_argument("--tasks", metavar="NAMES", help="lm-eval task names, comma-separated")
    parser.add_argument("--limit", type=int, metavar="N", help="documents per task")
    parser.add_argument("--include-path", metavar="DIR", help="local task YAMLs")
    parser.add_argument("--num-concurrent", type=int, default=8, metavar="N")
    parser.add_argument("--api-key", default=None, help="default: $TINKER_API_KEY")
    parser.add_argument("--lm-eval-python", default=sys.executable, metavar="PY",
                        help="interpreter that has lm-eval (default: this one)")
    parser.add_argument("--out", metavar="DIR", help="keep lm-eval's output here")
    parser.add_argument("--compare", nargs="+", metavar="PATH",
                        help="print the stored scores of these checkpoints side by side")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    key = args.api_key or os.environ.get("TINKER_API_KEY")
    if not key:
        print("loraplex eval: give --api-key or set TINKER_API_KEY", file=sys.stderr)
        return 2
    if args.compare:
        print(compare_table(args.compare, _get_evals(args.server, key, args.compare)))
        return 0
    if not args.model or not args.tasks:
        print("loraplex eval: --model and --tasks are required (or --compare)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        scores = run_lm_eval(EvalRun(args.server, args.model, tuple(args.tasks.split(",")), key,
                                     out, args.limit, args.include_path, args.num_concurrent,
                                     args.lm_eval_python))
    if args.model.startswith("tinker://"):
        _post(args.server, key, "/api/v1/loraplex/evals",
              {"path": args.model, "scores": [_score_body(s) for s in scores]})
        print(f"stored {len(scores)} scores with {args.model}")
    rows = {args.model: [_score_body(s) for s in scores]}
    print(compare_table([args.model], rows))
    return 0


def compare_table(paths: list[str], evals: dict[str, list[dict[str, Any]]]) -> str:
    """One row per (task, metric), one column per checkpoint ("–": not evaluated)."""
    keys = sorted({(e["task"], e["metric"]) for p in paths for e in evals.get(p, [])})
    values = {(p, e["task"], e["metric"]): e["value"] for p in paths for e in evals.get(p, [])}
    header = ["task", "metric", *paths]
    lines = [header] + [[t, m, *(f"{values[p, t, m]:.4f}" if (p, t, m) in values else "–"
                                 for p in paths)] for t, m in keys]
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     for row in lines)


def _score_body(s: EvalScore) -> dict[str, Any]:
    return {"task": s.task, "metric": s.metric, "value": s.value, "stderr": s.stderr,
            "num_samples": s.num_samples}


def _get_evals(server: str, key: str, paths: list[str]) -> dict[str, list[dict[str, Any]]]:
    import httpx

    response = httpx.get(f"{server.rstrip('/')}/api/v1/loraplex/evals",
                         params=[("path", p) for p in paths], headers={"X-API-Key": key},
                         trust_env=False, timeout=60)
    _check(response)
    return dict(response.json()["evals"])


def _post(server: str, key: str, path: str, body: dict[str, Any]) -> None:
    import httpx

    response = httpx.post(f"{server.rstrip('/')}{path}", content=json.dumps(body),
                          headers={"X-API-Key": key, "Content-Type": "application/json"},
                          trust_env=False, timeout=60)
    _check(response)


def _check(response: Any) -> None:
    from loraplex.errors import user_error

    if response.status_code >= 400:
        raise user_error("server", f"{response.status_code}: {response.text[:500]}")
