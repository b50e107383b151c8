"""The one writer of a benchmark's results: ``<name>.json`` (the `Result` record),
``<name>.md`` (the report the benchmark rendered from it) and, when the benchmark drew one,
``<name>.png``, side by side under the results folder.

Renders nothing itself: the markdown and the figure come from the benchmark.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import RESULTS
from benchmarks.harness.result import Result

DPI = 110


def write(result: Result, markdown: str, out: Path = RESULTS, figure: Any = None) -> Path:
    """Write `result` as ``out/<name>.json``, `markdown` as ``.md`` and a matplotlib `figure`
    (if given) as ``.png``; returns the JSON path."""
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{result.name}.json"
    json_path.write_text(compact_json(result.to_json()) + "\n")
    json_path.with_suffix(".md").write_text(markdown if markdown.endswith("\n")
                                            else markdown + "\n")
    if figure is not None:
        import matplotlib.pyplot as plt

        figure.savefig(json_path.with_suffix(".png"), dpi=DPI)
        plt.close(figure)
    return json_path


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display), imported on first use
    so that a benchmark's ``--help`` needs no matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def compact_json(value: Any, indent: int = 0) -> str:
    """Indented JSON in which a list of scalars stays on one line (so raw records, one list per
    op or sample, take one line each)."""
    pad = " " * (indent + 1)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(str(k))}: {compact_json(v, indent + 1)}"
                 for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list | tuple) and any(isinstance(v, dict | list | tuple)
                                                for v in value):
        return ("[\n" + ",\n".join(pad + compact_json(v, indent + 1) for v in value) + "\n"
                + " " * indent + "]")
    return json.dumps(value, ensure_ascii=False)
