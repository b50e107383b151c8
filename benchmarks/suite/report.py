"""The suite's summary: its payload (what was selected, each entry's outcome) and the markdown
rendered from the `Result` record that carries it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness.result import Result
from benchmarks.suite.manifest import Entry
from benchmarks.suite.runner import Outcome, duration, relative


def payload(entries: Sequence[Entry], outcomes: Sequence[Outcome], out: Path, log_dir: Path,
            argv: Sequence[str]) -> dict[str, Any]:
    """Selected entries in run order, each one's outcome (``not_run`` after a Ctrl-C), and the
    stems that did not write their result."""
    done = {o.stem: o.as_dict() for o in outcomes}
    rows = [done.get(e.stem, {"stem": e.stem, "status": "not_run", "estimate_min": e.minutes,
                              "seconds": None, "returncode": None, "command": "", "log": ""})
            for e in entries]
    return {"command": " ".join(["python -m benchmarks suite", *argv]),
            "out": str(relative(out)), "log_dir": str(relative(log_dir)),
            "estimated_min": sum(e.minutes for e in entries),
            "entries": rows,
            "not_ok": [row["stem"] for row in rows if row["status"] != "ok"]}


def markdown(record: Result) -> str:
    p = record.payload
    lines = ["# Benchmark suite", "",
             f"`{p['command']}`: {len(p['entries'])} entries, one after another; results into "
             f"`{p['out']}`, logs in `{p['log_dir']}`. {record.provenance()}", "",
             "| # | result | status | est. min | min | exit | command |",
             "|---|---|---|---|---|---|---|"]
    for i, row in enumerate(p["entries"], 1):
        took = "" if row["seconds"] is None else f"{row['seconds'] / 60:.2f}"
        code = "" if row["returncode"] is None else str(row["returncode"])
        lines.append(f"| {i} | `{row['stem']}` | {row['status']} | {row['estimate_min']:g} | "
                     f"{took} | {code} | `{row['command']}` |")
    lines += ["", f"Estimated {duration(p['estimated_min'] * 60)}, took "
              f"{duration(record.wall_s)}. "
              + (f"Did not write their result: {', '.join(p['not_ok'])}." if p["not_ok"]
                 else "Every entry wrote its result."), ""]
    return "\n".join(lines)
