"""Check that every number the README and the docs quote from a benchmark still matches its
results file.

A quoted number carries its source in an HTML comment right after it (invisible on GitHub and in
the built site)::

    4.7× its solo p50<!--r sample_fairness summary.on/distinct.beside_over_solo-->

`sample_fairness` names `benchmarks/results/sample_fairness.json`; the path after it is
dot-separated keys and list indices into that file's JSON (into its ``payload`` when the file is
a harness result). The number checked is the last one
before the comment (thousands separators allowed, a unit after it allowed); it matches when it
equals the file's value rounded to the digits the text shows (4.7 matches 4.72, not 4.76). An
optional `*100` (percentages) or `*1000` (ms) after the path scales the file's value first.

    python scripts/check_numbers.py          # README.md and docs/**/*.md; exit 1 on a mismatch
    python scripts/check_numbers.py --find sample_fairness 4.72   # which paths hold ~4.72?

`tests/docs/test_numbers.py` runs the check in CI.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: the repo root, for the results layout
    sys.path.insert(0, str(REPO))

from benchmarks.harness.result import read_payload  # noqa: E402

MARKER = re.compile(r"<!--r\s+(?P<file>[\w.-]+)\s+(?P<path>[^\s*]+)(?:\s*\*(?P<scale>\d+))?\s*-->")
#: the last number before a marker: digits with optional thousands commas, a decimal part and
#: an exponent; then at most a short unit (×, %, s, ms, GiB, " s") before the marker.
NUMBER = re.compile(r"(?P<num>-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:e-?\d+)?)"
                    r"(?P<unit>[^\d<>]{0,12})$")


@dataclass(frozen=True)
class Quote:
    """One marked number: where it is, what it says, and where its value comes from."""

    doc: Path
    line: int
    text: str
    results: str
    path: str
    scale: int


@dataclass(frozen=True)
class Mismatch:
    quote: Quote
    reason: str

    def __str__(self) -> str:
        q = self.quote
        return f"{q.doc}:{q.line}: {q.text!r} <- {q.results} {q.path}: {self.reason}"


def quotes(doc: Path) -> Iterator[Quote]:
    text = doc.read_text()
    for match in MARKER.finditer(text):
        before = text[max(0, match.start() - 60):match.start()]
        number = NUMBER.search(before)
        line = text.count("\n", 0, match.start()) + 1
        yield Quote(doc, line, number["num"] if number else "", match["file"], match["path"],
                    int(match["scale"] or 1))


def lookup(data: Any, path: str) -> Any:
    """The value at a dot-separated path of keys and list indices."""
    for part in path.split("."):
        if isinstance(data, list):
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            keys = sorted(data)[:12] if isinstance(data, dict) else type(data).__name__
            raise KeyError(f"no key {part!r} (keys: {keys})")
    return data


def matches(shown: str, value: float) -> bool:
    """Whether `shown` is `value` rounded to the digits it shows (half a unit of its last digit)."""
    digits = shown.replace(",", "")
    exponent = Decimal(digits).as_tuple().exponent
    assert isinstance(exponent, int)
    half_unit = 0.5 * 10.0 ** exponent
    return math.isfinite(value) and abs(float(digits) - value) <= half_unit * (1 + 1e-9)


def check(quote: Quote, results_dir: Path) -> Mismatch | None:
    file = results_dir / f"{quote.results}.json"
    if not quote.text:
        return Mismatch(quote, "no number right before the marker")
    if not file.exists():
        return Mismatch(quote, f"no results file {file.name}")
    try:
        value = lookup(read_payload(file), quote.path)
    except (KeyError, IndexError, ValueError) as exc:
        return Mismatch(quote, f"path not found: {exc}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return Mismatch(quote, f"the value there is not a number: {value!r}")
    scaled = value * quote.scale
    if not matches(quote.text, scaled):
        return Mismatch(quote, f"the results file says {scaled!r}")
    return None


def documents(repo: Path) -> list[Path]:
    docs = repo / "docs"
    pages = [p for p in docs.rglob("*.md") if "results" not in p.relative_to(docs).parts]
    return [repo / "README.md", *sorted(pages)]


def check_all(repo: Path = REPO) -> tuple[int, list[Mismatch]]:
    results_dir = repo / "benchmarks" / "results"
    found = [q for doc in documents(repo) if doc.exists() for q in quotes(doc)]
    bad = [m for q in found if (m := check(q, results_dir)) is not None]
    return len(found), bad


def find(results: str, number: float, repo: Path = REPO) -> list[str]:
    """Paths in a results file whose value is within 1% of `number`."""
    data = read_payload(repo / "benchmarks" / "results" / f"{results}.json")
    out: list[str] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, child in node.items():
                walk(child, f"{prefix}.{key}" if prefix else str(key))
        elif isinstance(node, list):
            for i, child in enumerate(node):
                walk(child, f"{prefix}.{i}" if prefix else str(i))
        elif (isinstance(node, int | float) and not isinstance(node, bool)
              and abs(node - number) <= 0.01 * abs(number) + 1e-12):
            out.append(f"{prefix} = {node!r}")

    walk(data, "")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--find", nargs=2, metavar=("RESULTS", "NUMBER"),
                        help="list the paths in benchmarks/results/RESULTS.json near NUMBER")
    args = parser.parse_args()
    if args.find:
        print("\n".join(find(args.find[0], float(args.find[1]))) or "nothing within 1%")
        return 0
    count, bad = check_all()
    for mismatch in bad:
        print(mismatch)
    print(f"{count} quoted numbers checked, {len(bad)} do not match their results files")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
