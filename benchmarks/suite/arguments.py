"""Checks that each manifest entry's arguments parse with its benchmark's own parser, without
running the benchmark: the module runs as ``__main__`` (as ``python -m`` would run it) with
the entry's arguments, and the first `ArgumentParser.parse_args` it calls parses them for real
and then stops it before anything is measured.

Costs one import of each benchmark module (torch, transformers and the SDK once, for all), so
it runs in a process of its own (``python -m benchmarks suite --check``): it patches argparse.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import runpy
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.suite.manifest import Entry, available


class _Parsed(Exception):
    """Raised by the patched `parse_args` once the arguments have parsed."""


def parse_error(entry: Entry, out: Path) -> str | None:
    """None if `entry`'s arguments parse with its benchmark's parser, else what went wrong.

    Raises:
        ValueError: `entry` is not a benchmark entry, or its module is not in this checkout.
    """
    if not entry.is_benchmark or not available(entry):
        raise ValueError(f"{entry.stem}: not a benchmark of this checkout ({entry.module})")
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        original(self, *args, **kwargs)
        raise _Parsed

    argv = entry.argv(out)[len(entry.launcher) + 1:]
    saved_argv, stderr = sys.argv, io.StringIO()
    sys.argv = [f"python -m benchmarks {entry.module}", *argv]
    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_module(f"benchmarks.{entry.module}", run_name="__main__", alter_sys=True)
    except _Parsed:
        return None
    except SystemExit as exc:  # argparse's error(): exit 2 and the usage on stderr
        return f"exit {exc.code}: {stderr.getvalue().strip()[-500:]}"
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        sys.argv = saved_argv
    return "ran to the end without parsing its arguments"


def check_all(entries: Sequence[Entry], out: Path) -> list[tuple[str, bool, str]]:
    """(stem, passed, verdict) per entry: a benchmark's arguments parse ("ok") or not (the
    error); an entry that is no benchmark is not parsed, and one whose module is missing passes
    only while it is marked as on another branch."""
    verdicts = []
    for entry in entries:
        if not entry.is_benchmark:
            verdicts.append((entry.stem, True, f"not parsed: run by {' '.join(entry.launcher)}"))
        elif not available(entry):
            where = f" (on branch {entry.elsewhere})" if entry.elsewhere else ""
            verdicts.append((entry.stem, bool(entry.elsewhere),
                             f"missing: {entry.module} is not in this checkout{where}"))
        else:
            error = parse_error(entry, out)
            verdicts.append((entry.stem, error is None, error or "ok"))
    return verdicts
