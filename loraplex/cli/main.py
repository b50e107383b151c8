"""Entry point: one argparse parser, one sub-command module per verb.

Each ``*_cmd`` module exposes ``register(subparsers)``, which adds its parser and sets
``func`` to a callable taking the parsed namespace and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMAND_MODULES: tuple[str, ...] = (
    "loraplex.cli.model_cmd",
    "loraplex.cli.cost_cmd",
    "loraplex.cli.serve_cmd",
    "loraplex.cli.config_cmd",
    "loraplex.cli.keys_cmd",
    "loraplex.cli.demo_cmd",
    "loraplex.cli.usage_cmd",
    "loraplex.cli.eval_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loraplex", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; a LoraplexError (bad input, a refused data dir) prints one line and
    exits 2, without a traceback."""
    from loraplex.errors import LoraplexError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LoraplexError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
