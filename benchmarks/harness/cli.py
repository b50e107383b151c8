"""The command line benchmarks share: a parser whose ``--help`` is the benchmark's module
docstring, with ``--out`` (where results go); settings overridden by the flags given.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from benchmarks import RESULTS

T = TypeVar("T")


def parser(doc: str | None, *, out: bool = True) -> argparse.ArgumentParser:
    """An argument parser that prints ``doc`` as written, with ``--out DIR`` (default
    benchmarks/results) unless ``out`` is false (the benchmark adds its own)."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if out:
        p.add_argument("--out", type=Path, default=RESULTS,
                       help="results directory (default benchmarks/results)")
    return p


def overridden(settings: T, **given: Any) -> T:
    """``settings`` (a dataclass) with each field ``given`` that is not None."""
    return replace(settings, **{k: v for k, v in given.items() if v is not None})
