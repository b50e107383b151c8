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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from loraplex.cli.config_sources import LoadedConfig, load_config
from loraplex.config import DEFAULT_MODEL_NAME, LoraplexConfig, SchedulerConfig, ServerConfig

if TYPE_CHECKING:
    from loraplex.api.context import ServerContext
    from loraplex.scheduler.executor import BatchExecutor
    from loraplex.scheduler.lanes import WorkerGroup

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
    "workers": "cluster.workers",
    "ray_address": "cluster.ray_address",
    "worker_resources": "cluster.worker_resources",
    "adapter_memory_budget": "engine.adapter_memory_budget",
    "model_parallel": "cluster.model_parallel",
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
    parser.add_argument("--workers", type=int, metavar="N",
                        help="engine workers per model as Ray actors on a local Ray runtime "
                             "(default 0: the engine runs in the server process)")
    parser.add_argument("--ray-address", metavar="ADDR",
                        help="join a running Ray cluster (ray start --head ...) instead")
    parser.add_argument("--worker-resources", metavar="NAME=N[,...]",
                        help="one worker's Ray bundle, e.g. CPU=1 or GPU=1 (default CPU=1)")
    parser.add_argument("--model-parallel", type=int, metavar="N",
                        help="ranks per engine worker: each worker becomes N processes that "
                             "hold one copy of the model as pipeline stages (with --workers "
                             "M: M such groups on Ray; without: one group of local processes)")
    parser.add_argument("--adapter-memory-budget", type=int, metavar="BYTES",
                        help="adapter state (LoRA + grads + Adam moments) a worker keeps on "
                             "its device; idle adapters page out to host memory, then disk")


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
        ctx = prepare(config)
    except (LoraplexError, OSError) as err:  # OSError: e.g. a model directory it cannot write
        print(f"error: {err}", file=sys.stderr)
        return 2
    serve(ctx)
    return 0


def prepare(config: LoraplexConfig) -> ServerContext:
    """The serving process set up: its host-memory policy first, then stores and engines.

    `retain_freed_memory` must run before any thread but the main one allocates: glibc hands
    a thread started later one of the arenas that exist by then, round-robin, and a thread
    of its own arena (the stores' journal thread opens one) does not keep a step's large
    blocks. SmolLM2-135M, 2048-token training steps at 2 threads: retained from the engine's
    constructor (after the journal thread started), the clock thread faulted in 390–450k
    pages (1.2–2.4 s of system time) per 6.1–7.9 s step; retained here, ~0 and 5.2–5.6 s.
    Ray workers get the same policy from their environment (`cluster.ray_workers`)."""
    if config.engine.retain_host_memory and not config.cluster.uses_ray:
        from loraplex.engine.host_allocator import retain_freed_memory

        retain_freed_memory()
    return build_context(config.server, config.scheduler, executors_of(config))


def executors_of(config: LoraplexConfig) -> Callable[[str], BatchExecutor | WorkerGroup]:
    """Model directory → its engine: in this process, ``cluster.workers`` Ray actors (or
    groups of ``cluster.model_parallel`` actors), or one group of local rank processes
    (``--model-parallel`` without Ray). Ray is imported only when asked for. Paged-out
    adapter state goes under the data dir (``paged/``, scratch space) unless
    ``engine.page_dir`` says otherwise."""
    engine = config.engine
    if engine.page_dir is None and engine.adapter_memory_budget is not None:
        engine = replace(engine, page_dir=os.path.join(config.server.data_dir, "paged"))
    if not config.cluster.uses_ray and config.cluster.model_parallel > 1:
        from loraplex.cluster.local_groups import LocalGroups

        return LocalGroups(engine, config.cluster.model_parallel).group
    if not config.cluster.uses_ray:
        from loraplex.engine.executor import Engine

        return lambda model_dir: Engine(model_dir, engine)
    from loraplex.cluster.ray_workers import RayWorkers

    cluster = config.cluster if config.cluster.workers else replace(config.cluster, workers=1)
    cluster = replace(cluster, ray_host=cluster.ray_host or config.server.host)
    return RayWorkers(cluster, engine, config.scheduler).group


def build_context(
    config: ServerConfig,
    scheduler_config: SchedulerConfig,
    make_executor: Callable[[str], BatchExecutor | WorkerGroup],
    resolve: Callable[[str, str], str] | None = None,
) -> ServerContext:
    """Open the stores, load each distinct model source once, and wire its lanes.

    Args:
        make_executor: model directory → its executor (the torch engine, or a test fake), or a
            `WorkerGroup` of several (Ray workers); each executor gets a lane (a scheduler).
        resolve: ``(SOURCE, data_dir)`` → model directory (default: `resolve_source`).
    """
    from loraplex.api.context import ServerContext
    from loraplex.api.signing import UrlSigner
    from loraplex.cli.model_sources import resolve_source
    from loraplex.scheduler.assembly import build_scheduler
    from loraplex.scheduler.catalog import Catalog, ServedModel
    from loraplex.scheduler.effects import Effects
    from loraplex.scheduler.futures import FutureStore
    from loraplex.scheduler.lanes import Lanes, WorkerGroup
    from loraplex.scheduler.scheduler import Scheduler
    from loraplex.store.stores import open_stores

    stores = open_stores(config.data_dir)
    futures = FutureStore(config.future_ttl_s, stores.futures,
                          max_unfetched_bytes=config.quotas.max_unfetched_result_bytes)
    effects = Effects(stores.runs, stores.checkpoints, stores.samplers, stores.sequences)

    def make_scheduler(executor: BatchExecutor) -> Scheduler:
        return build_scheduler(executor, scheduler_config, futures, effects)

    by_dir: dict[str, Lanes] = {}
    served = []
    for model in config.models:
        directory = os.path.realpath((resolve or resolve_source)(model.source, config.data_dir))
        if directory not in by_dir:
            log.info("loading %s from %s", model.source, directory)
            made = make_executor(directory)
            group = made if isinstance(made, WorkerGroup) else WorkerGroup([made])
            lanes = by_dir[directory] = Lanes(make_scheduler, stores.checkpoints, group.spawn,
                                                  group.health)
            for executor in group.executors:
                lanes.add_worker(executor)
        lanes = by_dir[directory]
        served.append(ServedModel(model.name, model.source, lanes, lanes.model_info(),
                                  directory))
        stores.served_models.record(model.name, model.source, directory)
    return ServerContext(config, stores, Catalog(served), futures, UrlSigner(stores.secret))


def serve(ctx: ServerContext, log_level: str = "info") -> None:
    import uvicorn

    from loraplex.api.app import create_app

    config = ctx.config
    names = ", ".join(m.name for m in ctx.catalog)
    print(f"loraplex: serving {names} on http://{config.host}:{config.port} "
          f"(data dir {os.path.abspath(config.data_dir)}, "
          f"{'open access' if config.open_access else 'keys required'}); dashboard at "
          f"http://{config.host}:{config.port}/dashboard", file=sys.stderr)
    # Keep idle keep-alive connections well past the SDK's 10 s heartbeat period, so a request
    # never races the server closing its connection.
    try:
        uvicorn.run(create_app(ctx), host=config.host, port=config.port, log_level=log_level,
                    access_log=False, timeout_keep_alive=75)
    finally:
        ctx.stores.close()
