"""One entry point for every benchmark: ``python -m benchmarks NAME [args]`` runs
``python -m benchmarks.NAME [args]``; ``--list`` names them with their docstrings' first lines.

    python -m benchmarks --list
    python -m benchmarks engine_train --threads 2
    python -m benchmarks peers.side_by_side --help

A benchmark is any module under benchmarks/ with a ``__main__`` block (a package's
``__main__.py`` counts as the package), found the way `tests/benchmarks/test_entry_points.py`
finds them; the tenant and client workers the load and multiplex benchmarks spawn are left out.
"""

from __future__ import annotations

import argparse
import ast
import runpy
import sys
from pathlib import Path

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HERE = Path(__file__).resolve().parent
#: Worker processes other benchmarks spawn (the llama.cpp one in its own venv), and a launcher
#: that runs in SkyRL's own venv.
NOT_BENCHMARKS = {"load.client", "load.flood", "load.openai_clients", "multiplex.tenant",
                  "peers.client_bench", "peers.skyrl_compat.run_api",
                  "peers.llama_cpp.worker"}


def benchmarks() -> dict[str, Path]:
    """Each benchmark's name (its module under ``benchmarks.``) and its file."""
    found = {}
    for path in sorted(HERE.rglob("*.py")):
        parts = path.relative_to(HERE).with_suffix("").parts
        if parts[0] in ("results", "harness") or parts == ("__main__",):
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__main__" else parts)
        if name not in NOT_BENCHMARKS and 'if __name__ == "__main__":' in path.read_text():
            found[name] = path
    return found


def summary(path: Path, width: int = 100) -> str:
    """The first sentence of a module's docstring (clipped to `width`), read without importing
    the module (so without torch)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = doc.split("\n\n")[0].replace("\n", " ").split(". ")[0].strip()
    return first if len(first) <= width else first[:width - 1] + "…"


def main() -> None:
    found = benchmarks()
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("name", nargs="?", choices=sorted(found), metavar="NAME",
                        help="the benchmark to run (see --list)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its own arguments")
    args = parser.parse_args()
    if args.list or args.name is None:
        width = max(map(len, found))
        for name, path in found.items():
            print(f"{name:<{width}}  {summary(path)}")
        return
    sys.argv = [f"python -m benchmarks {args.name}", *args.args]
    runpy.run_module(f"benchmarks.{args.name}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
