"""`loraplex keys create NAME [--operator] | revoke NAME` (``--data-dir DIR``): API keys.

``create`` prints a new ``tml-`` key for tenant NAME once; only its SHA-256 hash is stored (in
the data dir's SQLite database), so a lost key cannot be recovered, only replaced. Several keys
may name one tenant. ``--operator`` keys also see the machine-wide views (every tenant's stats,
the labelled Prometheus metrics). ``revoke`` deletes every key of NAME; a running server stops
accepting them within ``server.key_cache_ttl_s`` (5 s by default).
"""

from __future__ import annotations

import argparse
import sys

from loraplex.config import ServerConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("keys", help="manage API keys", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="keys_command", required=True)
    create = verbs.add_parser("create", help="print a new API key for tenant NAME",
                              description=__doc__)
    create.add_argument("name", metavar="NAME", help="tenant name (owner of what the key makes)")
    create.add_argument("--operator", action="store_true",
                        help="the key also sees every tenant's stats and metrics")
    create.set_defaults(func=run_create)
    revoke = verbs.add_parser("revoke", help="delete every key of tenant NAME")
    revoke.add_argument("name", metavar="NAME")
    revoke.set_defaults(func=run_revoke)
    for verb in (create, revoke):
        verb.add_argument("--data-dir", default=ServerConfig.data_dir, metavar="DIR",
                          help=f"server data directory (default {ServerConfig.data_dir})")


def run_create(args: argparse.Namespace) -> int:
    from loraplex.store.stores import open_stores

    stores = open_stores(args.data_dir)  # a refused data dir: `main` prints one line
    try:
        print(stores.keys.create(args.name, operator=args.operator))
    finally:
        stores.close()
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    from loraplex.store.stores import open_stores

    stores = open_stores(args.data_dir)
    try:
        n = stores.keys.revoke(args.name)
    finally:
        stores.close()
    if not n:
        print(f"error: no keys for tenant {args.name!r}", file=sys.stderr)
        return 2
    print(f"revoked {n} key{'s' if n != 1 else ''} of tenant {args.name!r}")
    return 0
