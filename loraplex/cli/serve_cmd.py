"""`loraplex serve [--config loraplex.toml] [--host 127.0.0.1] [--port 8000] [--data-dir DIR]
[--model NAME=SOURCE ...] [--open] [--threads N] [--token-budget T] [--timeslice]`: the
Tinker-compatible server.

Every setting of every config slice can come from ``--config`` (a TOML file with ``[engine]``,
``[scheduler]``, ``[server]`` tables and one for each slice nested in the server's, such as
``[metering]``) or a ``LORAPLEX_<SECTION>_<FIELD>`` environment variable; a flag given on the
command line wins over the environment, which wins over the file, which wins over the
defaults. ``loraplex config show`` prints the result and where each value came from.

NAME is what clients pass as ``base_model`` and what the server echoes everywhere; SOURCE is a
local Hugging Face checkpoint directory or ``builtin:tiny`` / ``builtin:small`` (created under
the data dir on first use). Several NAMEs may share one SOURCE: it is loaded once and served by
one engine and one scheduler. Without ``--model`` the built-in tiny model is served as
``Qwen/Qwen3-8B`` (a catalogue name, so the SDK's and the cookbook's tokenizer and renderer
lookups work; install its tokenizer with ``loraplex model cache-tokenizer``); given ``--model``
flags replace the configured list. Without ``--open`` only keys made by ``loraplex keys
create`` are accepted; with it any ``tml-`` key is accepted and each distinct key is its own
tenant. ``--threads`` sets torch's intra-op threads, ``--token-budget`` the most datum tokens
per clock cycle, and ``--timeslice`` runs the naive baseline scheduler (one model per cycle;
for benchmarks). ``GET /api/v1/healthz`` answers once ready.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from loraplex.cli.config_sources import LoadedConfig, load_config
from loraplex.config import DEFAULT_MODEL_NAME, SchedulerConfig, ServerConfig

if TYPE_CHECKING:
    from loraplex.api.context import ServerContext
    from loraplex.scheduler.executor import BatchExecutor

log = logging.getLogger("loraplex.serve")

FLAG_KEYS: dict[str, str] = {
    "host": "server.host",
    "port": "server.port",
    "data_dir": "server.data_dir",
    "model": "server.models",
    "open": "server.open_access",
    "threads": "engine.num_threads",
    "token_budget": "scheduler.token_budget",
    "timeslice": "scheduler.timeslice",
}
"""argparse dest → the config key its flag sets. Every flag defaults to None, meaning "not
given", so a flag overrides the environment and the file only when it is on the command line."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the Tinker-compatible server", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_flags(parser)
    parser.set_defaults(func=run)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """``--config`` and the flags of `FLAG_KEYS` (shared with ``loraplex config show``)."""
    parser.add_argument("--config", metavar="FILE",
                        help="TOML file of [section] tables (loraplex config show lists every key)")
    parser.add_argument("--host", help=f"listen address (default {ServerConfig.host})")
    parser.add_argument("--port", type=int, help=f"listen port (default {ServerConfig.port})")
    parser.add_argument("--data-dir", metavar="DIR",
                        help=f"database, checkpoints and built-in models "
                             f"(default {ServerConfig.data_dir})")
    parser.add_argument("--model", action="append", metavar="NAME=SOURCE",
                        help=f"serve SOURCE as NAME (repeatable; default "
                             f"{DEFAULT_MODEL_NAME}=builtin:tiny)")
    parser.add_argument("--open", action=argparse.BooleanOptionalAction,
                        help="accept any tml- key (one tenant per distinct key)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="torch intra-op threads (default: torch's own choice)")
    parser.add_argument("--token-budget", type=int, metavar="T",
                        help=f"most datum tokens packed into one clock cycle "
                             f"(default {SchedulerConfig.token_budget})")
    parser.add_argument("--timeslice", action=argparse.BooleanOptionalAction,
                        help="naive baseline: one model per clock cycle (no packing)")


def given_flags(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """``section.key`` → (``--flag``, value) for the flags on the command line."""
    return {key: ("--" + dest.replace("_", "-"), getattr(args, dest))
            for dest, key in FLAG_KEYS.items() if getattr(args, dest) is not None}


def load_from_args(args: argparse.Namespace) -> LoadedConfig:
    """The effective config of ``serve``'s arguments: flags > environment > file > defaults.

    Raises:
        UserError: naming the source and key of a bad or unknown value.
    """
    return load_config(args.config, given_flags(args))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")
    from loraplex.errors import LoraplexError

    try:
        config = load_from_args(args).config
        from loraplex.engine.executor import Engine

        ctx = build_context(config.server, config.scheduler,
                            lambda d: Engine(d, config.engine))
    except LoraplexError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    serve(ctx)
    return 0


def build_context(
    config: ServerConfig,
    scheduler_config: SchedulerConfig,
    make_executor: Callable[[str], BatchExecutor],
    resolve: Callable[[str, str], str] | None = None,
) -> ServerContext:
    """Open the stores, load each distinct model source once, and wire the schedulers.

    Args:
        make_executor: model directory → `BatchExecutor` (the torch engine, or a test fake).
        resolve: ``(SOURCE, data_dir)`` → model directory (default: `resolve_source`).
    """
    from loraplex.api.context import ServerContext
    from loraplex.api.signing import UrlSigner
    from loraplex.cli.model_sources import resolve_source
    from loraplex.scheduler.catalog import Catalog, ServedModel
    from loraplex.scheduler.effects import Effects
    from loraplex.scheduler.futures import FutureStore
    from loraplex.scheduler.scheduler import Scheduler
    from loraplex.store.stores import open_stores

    stores = open_stores(config.data_dir)
    futures = FutureStore(config.future_ttl_s, stores.futures)
    effects = Effects(stores.runs, stores.checkpoints, stores.samplers, stores.sequences)
    schedulers: dict[str, Scheduler] = {}
    served = []
    for model in config.models:
        directory = os.path.realpath((resolve or resolve_source)(model.source, config.data_dir))
        if directory not in schedulers:
            log.info("loading %s from %s", model.source, directory)
            schedulers[directory] = Scheduler(make_executor(directory), scheduler_config,
                                              futures, effects)
        scheduler = schedulers[directory]
        served.append(ServedModel(model.name, model.source, scheduler,
                                  scheduler.executor.model_info()))
        stores.served_models.record(model.name, model.source, directory)
    return ServerContext(config, stores, Catalog(served), futures, UrlSigner(stores.secret))


def serve(ctx: ServerContext, log_level: str = "info") -> None:
    import uvicorn

    from loraplex.api.app import create_app

    config = ctx.config
    names = ", ".join(m.name for m in ctx.catalog)
    print(f"loraplex: serving {names} on http://{config.host}:{config.port} "
          f"(data dir {os.path.abspath(config.data_dir)}, "
          f"{'open access' if config.open_access else 'keys required'})", file=sys.stderr)
    # Keep idle keep-alive connections well past the SDK's 10 s heartbeat period, so a request
    # never races the server closing its connection.
    uvicorn.run(create_app(ctx), host=config.host, port=config.port, log_level=log_level,
                access_log=False, timeout_keep_alive=75)
