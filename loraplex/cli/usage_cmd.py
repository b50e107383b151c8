"""`loraplex usage --data-dir DIR [--json]`: metered usage of every tenant, priced.

Reads the data dir's SQLite usage table directly (works while the server runs; it flushes
every few seconds). One row per tenant and training run (``base`` = sampling the bare base
model): ops, trained / forward / prompt / rollout-prompt / cache-hit / sampled tokens, engine
seconds, and the bill in both modes: ``per_rollout`` (a prompt sampled G times billed G times)
and ``cache_aware`` (shared group prompts and cache hits at the cached rate).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from loraplex.config import MeteringConfig, ServerConfig

DB_FILE = "loraplex.sqlite3"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("usage", help="metered usage per tenant and training run",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=ServerConfig.data_dir, metavar="DIR",
                        help=f"server data directory (default {ServerConfig.data_dir})")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--tenant", help="only this tenant")
    parser.add_argument("--hours", type=float, help="only the last N hours")
    parser.add_argument("--price-sheet", default=MeteringConfig.price_sheet,
                        help=f"dated price sheet (default {MeteringConfig.price_sheet})")
    parser.add_argument("--model-map", action="append", default=[], metavar="NAME=MODEL",
                        help="price served NAME as the sheet's MODEL (repeatable)")
    parser.add_argument("--default-model", default=MeteringConfig.default_model,
                        help="sheet model for unmapped names (default %(default)s)")
    parser.add_argument("--cached-prefill-ratio", type=float,
                        default=MeteringConfig.cached_prefill_ratio,
                        help="cache-hit price / prefill price in cache_aware mode "
                             "(default %(default)s)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = os.path.join(args.data_dir, DB_FILE)
    if not os.path.exists(path):
        print(f"error: no loraplex database in {args.data_dir}", file=sys.stderr)
        return 2
    report = _report(args, path)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    return 0


def _report(args: argparse.Namespace, path: str) -> dict[str, Any]:
    from loraplex.cost.billing import Biller
    from loraplex.errors import user_error
    from loraplex.store.db import Database
    from loraplex.store.usage import SCHEMA, UsageStore

    mapping = {}
    for spec in args.model_map:
        name, sep, model = spec.partition("=")
        if not sep or not name or not model:
            raise user_error("--model-map", f"expected NAME=MODEL, got {spec!r}")
        mapping[name] = model
    biller = Biller(MeteringConfig(price_sheet=args.price_sheet, model_map=mapping,
                                   default_model=args.default_model,
                                   cached_prefill_ratio=args.cached_prefill_ratio))
    db = Database(path, (SCHEMA,))
    try:
        since = None if args.hours is None else time.time() - args.hours * 3600
        rows = UsageStore(db).rows(args.tenant, since)
    finally:
        db.close()
    return {"price_sheet": biller.sheet_json(),
            "tenants": [{"tenant": t.tenant, "totals": t.totals.to_json(),
                         "runs": [r.to_json() for r in t.runs]} for t in biller.tenants(rows)]}


COLUMNS = (("ops", "num_ops"), ("trained", "trained_tokens"), ("forward", "forward_tokens"),
           ("prompt", "prompt_tokens"), ("rollout prompt", "rollout_prompt_tokens"),
           ("cache hits", "cache_hit_tokens"), ("sampled", "sampled_tokens"))


def _print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    sheet = report["price_sheet"]
    table = Table(title=f"usage priced with {sheet['name']} (cache_aware: hits at "
                        f"{sheet['cached_prefill_ratio']:.0%} of prefill)", title_justify="left")
    for name in ("tenant", "run", *(c for c, _ in COLUMNS), "engine s", "per_rollout $",
                 "cache_aware $"):
        table.add_column(name, justify="left" if name in ("tenant", "run") else "right")
    for tenant in report["tenants"]:  # ids as Text: no markup or :emoji: codes in run ids
        for run in tenant["runs"]:
            table.add_row(Text(tenant["tenant"]), Text(run["run_id"] or "base"), *_cells(run))
        table.add_row(Text(tenant["tenant"]), "total", *_cells(tenant["totals"]),
                      style="bold", end_section=True)
    console = Console()
    console.print(table)
    if not report["tenants"]:
        console.print("no usage metered yet", style="dim")


def _cells(summary: dict[str, Any]) -> list[str]:
    tokens, bills = summary["tokens"], summary["bill_usd"]
    return [*(f"{tokens[k]:,}" for _, k in COLUMNS), f"{summary['engine_s']['total']:,.2f}",
            f"{bills['per_rollout']['total']:,.6f}", f"{bills['cache_aware']['total']:,.6f}"]
