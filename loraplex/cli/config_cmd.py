"""`loraplex config show [--config FILE] [--json] [serve's flags]`: the effective config.

Builds the config exactly as ``loraplex serve`` would with the same arguments (flags >
``LORAPLEX_*`` environment > file > defaults) and prints every field, one line each, grouped by
section, with where its value came from: ``default``, ``file PATH``, ``env NAME`` or
``flag --NAME``. Values are JSON. ``--json`` prints ``{section: {field: {value, source}}}``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from loraplex.cli.config_sources import LoadedConfig, sections
from loraplex.cli.config_values import to_data

VALUE_COLUMN = 56
"""Sources line up after the widest ``key = value`` of a section, up to this many columns."""


def register(subparsers: argparse._SubParsersAction) -> None:
    from loraplex.cli.serve_cmd import add_config_flags

    parser = subparsers.add_parser("config", help="inspect configuration", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="config_command", required=True)
    show = verbs.add_parser("show", help="print the effective config and each value's source",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    show.add_argument("--json", action="store_true", help="print JSON instead of lines")
    add_config_flags(show)
    show.set_defaults(func=run_show)


def run_show(args: argparse.Namespace) -> int:
    from loraplex.cli.serve_cmd import load_from_args

    loaded = load_from_args(args)
    print(json.dumps(as_json(loaded), indent=2) if args.json else as_lines(loaded))
    return 0


def as_json(loaded: LoadedConfig) -> dict[str, dict[str, dict[str, Any]]]:
    """``{section: {field: {"value": ..., "source": ...}}}``."""
    return {name: {key: {"value": to_data(value), "source": loaded.sources[f"{name}.{key}"]}
                   for key, value in _values(loaded, name).items()}
            for name in sections()}


def as_lines(loaded: LoadedConfig) -> str:
    """``section.key = value   (source)``, one line per field, a blank line between sections."""
    blocks = []
    for name in sections():
        pairs = [(f"{name}.{key} = {json.dumps(to_data(value))}", loaded.sources[f"{name}.{key}"])
                 for key, value in _values(loaded, name).items()]
        width = min(VALUE_COLUMN, max(len(text) for text, _ in pairs))
        blocks.append("\n".join(f"{text:<{width}}   ({source})" for text, source in pairs))
    return "\n\n".join(blocks)


SECRET_FIELDS = frozenset({"server.jwt_issuer_key"})
"""Shown as ``"<secret: N characters>"``, never in clear."""


def _values(loaded: LoadedConfig, name: str) -> dict[str, Any]:
    section = sections()[name]
    slice_: Any = loaded.config
    for attr in section.path:
        slice_ = getattr(slice_, attr)
    values = {key: getattr(slice_, key) for key in section.keys}
    for key, value in values.items():
        if f"{name}.{key}" in SECRET_FIELDS and value is not None:
            values[key] = f"<secret: {len(value)} characters>"
    return values
