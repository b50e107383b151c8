"""Run the real loraplex server (real app, scheduler, stores, HTTP) on a chosen executor.

Used as a subprocess by the integration tests (restart persistence, SDK 0.27) and imported by
the in-process API tests and the overhead benchmark. ``--executor toy`` (default) uses
`tests.fakes.ToyExecutor`, ``noop`` `benchmarks.harness.fakes.NoopExecutor` (no model directory
needed); ``engine`` uses the torch engine on the resolved SOURCE exactly like `loraplex serve`
(``builtin:tiny`` is created under the data dir; ``--threads`` as in `loraplex serve`). The
test suites pick it from ``LORAPLEX_TEST_EXECUTOR``.

    python tests/integration/serve_fake.py --port 8123 --data-dir DIR [--open]
        [--model NAME=SOURCE ...] [--client-config JSON] [--executor toy|noop|engine]
        [--long-poll-s SECONDS] [--engine-ms MS] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.harness.fakes import NoopExecutor
from loraplex.api.context import ServerContext
from loraplex.cli.model_sources import builtin_dir
from loraplex.cli.serve_cmd import build_context, serve
from loraplex.config import (
    DEFAULT_MODEL_NAME,
    EngineConfig,
    ModelSource,
    SchedulerConfig,
    ServerConfig,
)
from tests.fakes import ToyExecutor


def seed_builtin_tiny(data_dir: str | os.PathLike[str], tiny_model_dir: str | os.PathLike[str]
                      ) -> None:
    """Put a copy of the session's built-in tiny model (`tests/conftest.py`'s ``tiny_model_dir``,
    the same seed) where ``builtin:tiny`` resolves under ``data_dir``, so a test server skips
    the ~3 s of creating it (training its tokenizer) again."""
    target = builtin_dir(str(data_dir), "tiny")
    if not os.path.exists(target):
        shutil.copytree(tiny_model_dir, target)


def fake_context(data_dir: str, *, port: int = 0, open_access: bool = True,
                 models: tuple[ModelSource, ...] = (
                     ModelSource(DEFAULT_MODEL_NAME, "builtin:tiny"),),
                 client_config: Mapping[str, Any] | None = None, executor: str = "toy",
                 engine_delay_s: float = 0.0, num_threads: int | None = None,
                 scheduler: SchedulerConfig | None = None, **server: Any) -> ServerContext:
    config = ServerConfig(host="127.0.0.1", port=port, data_dir=data_dir, models=models,
                          open_access=open_access, client_config=dict(client_config or {}),
                          **server)
    if executor == "engine":
        from loraplex.engine.executor import Engine

        engine = EngineConfig(num_threads=num_threads)
        return build_context(config, scheduler or SchedulerConfig(), lambda d: Engine(d, engine))

    def make(_dir: str) -> ToyExecutor | NoopExecutor:
        return NoopExecutor(delay_s=engine_delay_s) if executor == "noop" else ToyExecutor()

    return build_context(config, scheduler or SchedulerConfig(), make,
                         resolve=lambda source, d: os.path.join(d, "models", "fake"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--open", action="store_true")
    parser.add_argument("--model", action="append", default=[])
    parser.add_argument("--client-config", default="{}")
    parser.add_argument("--executor", default="toy", choices=("toy", "noop", "engine"))
    parser.add_argument("--long-poll-s", type=float, default=25.0)
    parser.add_argument("--engine-ms", type=float, default=0.0, help="noop engine call time")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args()
    models = tuple(ModelSource.parse(m) for m in args.model) or (
        ModelSource(DEFAULT_MODEL_NAME, "builtin:tiny"),)
    ctx = fake_context(args.data_dir, port=args.port, open_access=args.open, models=models,
                       client_config=json.loads(args.client_config), executor=args.executor,
                       long_poll_s=args.long_poll_s, engine_delay_s=args.engine_ms / 1000,
                       num_threads=args.threads)
    serve(ctx, log_level="warning")


if __name__ == "__main__":
    main()
