"""`loraplex keys create NAME --data-dir DIR`: mint an API key for tenant NAME.

Prints the new ``tml-`` key once; only its SHA-256 hash is stored (in the data dir's SQLite
database), so a lost key cannot be recovered, only replaced. Several keys may name one tenant.
"""

from __future__ import annotations

import argparse

from loraplex.config import ServerConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("keys", help="manage API keys", description=__doc__)
    verbs = parser.add_subparsers(dest="keys_command", required=True)
    create = verbs.add_parser("create", help="print a new API key for tenant NAME",
                              description=__doc__)
    create.add_argument("name", metavar="NAME", help="tenant name (owner of what the key makes)")
    create.add_argument("--data-dir", default=ServerConfig.data_dir, metavar="DIR",
                        help=f"server data directory (default {ServerConfig.data_dir})")
    create.set_defaults(func=run_create)


def run_create(args: argparse.Namespace) -> int:
    from loraplex.store.stores import open_stores

    stores = open_stores(args.data_dir)
    try:
        print(stores.keys.create(args.name))
    finally:
        stores.close()
    return 0
