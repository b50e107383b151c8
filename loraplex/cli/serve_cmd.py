"""`loraplex serve [--host 127.0.0.1] [--port 8000] [--data-dir DIR] [--model NAME=SOURCE ...]
[--open] [--threads N] [--token-budget T] [--timeslice]`: the Tinker-compatible server.

NAME is what clients pass as ``base_model`` and what the server echoes everywhere; SOURCE is a
local Hugging Face checkpoint directory or ``builtin:tiny`` / ``builtin:small`` (created under
the data dir on first use). Several NAMEs may share one SOURCE: it is loaded once and served by
one engine and one scheduler. Without ``--model`` the built-in tiny model is served as
``Qwen/Qwen3-8B`` (a catalogue name, so the SDK's and the cookbook's tokenizer and renderer
lookups work; install its tokenizer with ``loraplex model cache-tokenizer``). Without ``--open``
only keys made by ``loraplex keys create`` are accepted; with it any ``tml-`` key is accepted
and each distinct key is its own tenant. ``--threads`` sets torch's intra-op threads,
``--token-budget`` the most datum tokens per clock cycle, and ``--timeslice`` runs the naive
baseline scheduler (one model per cycle; for benchmarks). ``GET /api/v1/healthz`` answers once
ready.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from loraplex.config import (
    DEFAULT_MODEL_NAME,
    EngineConfig,
    ModelSource,
    SchedulerConfig,
    ServerConfig,
)
from loraplex.errors import user_error

if TYPE_CHECKING:
    from loraplex.api.context import ServerContext
    from loraplex.scheduler.executor import BatchExecutor

log = logging.getLogger("loraplex.serve")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the Tinker-compatible server", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default=ServerConfig.host, help="listen address")
    parser.add_argument("--port", type=int, default=ServerConfig.port, help="listen port")
    parser.add_argument("--data-dir", default=ServerConfig.data_dir, metavar="DIR",
                        help="database, checkpoints and built-in models")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=SOURCE",
                        help=f"serve SOURCE as NAME (repeatable; default "
                             f"{DEFAULT_MODEL_NAME}=builtin:tiny)")
    parser.add_argument("--open", action="store_true",
                        help="accept any tml- key (one tenant per distinct key)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch intra-op threads (default: torch's own choice)")
    parser.add_argument("--token-budget", type=int, default=SchedulerConfig.token_budget,
                        metavar="T", help="most datum tokens packed into one clock cycle")
    parser.add_argument("--timeslice", action="store_true",
                        help="naive baseline: one model per clock cycle (no packing)")
    parser.set_defaults(func=run)


def server_config(args: argparse.Namespace) -> ServerConfig:
    models = tuple(ModelSource.parse(spec) for spec in args.model) or ServerConfig.models
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise user_error("--model", f"a NAME appears twice in {names}")
    return ServerConfig(host=args.host, port=args.port, data_dir=args.data_dir, models=models,
                        open_access=args.open)


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    if args.token_budget < 1:
        raise user_error("--token-budget", f"must be at least 1, got {args.token_budget}")
    return SchedulerConfig(token_budget=args.token_budget, timeslice=args.timeslice)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    if args.threads is not None and args.threads < 1:
        raise user_error("--threads", f"must be at least 1, got {args.threads}")
    return EngineConfig(num_threads=args.threads)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                        "%(message)s")
    from loraplex.errors import LoraplexError

    try:
        config = server_config(args)
        from loraplex.engine.executor import Engine

        engine = engine_config(args)
        ctx = build_context(config, scheduler_config(args), lambda d: Engine(d, engine))
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
