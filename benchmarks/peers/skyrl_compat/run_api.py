"""Launch the SkyRL Tinker API server (`skyrl.tinker.api`) without `uv`.

Upstream, the API process starts its engine subprocess as `uv run <parent's uv flags> -m
skyrl.tinker.engine ...`, rebuilding the flags from its parent's command line, and exits when it was
not itself started by `uv run`. This launcher replaces only that command builder so the engine runs
with this interpreter, then starts uvicorn the way `python -m skyrl.tinker.api` does.
Usage: python run_api.py --base-model DIR --backend jax --host H --port P [EngineConfig flags...]
"""

import argparse
import sys

import skyrl.tinker.api as api
import uvicorn
from skyrl.tinker.config import EngineConfig, add_model, config_to_argv


def _engine_cmd(_parent_cmd: list[str], engine_config: EngineConfig) -> list[str]:
    return [sys.executable, "-m", "skyrl.tinker.engine", *config_to_argv(engine_config)]


def main() -> None:
    api._build_uv_run_cmd_engine = _engine_cmd
    parser = argparse.ArgumentParser(description="SkyRL tinker API server (no uv)")
    add_model(parser, EngineConfig)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    fields = {k: v for k, v in vars(args).items() if k in EngineConfig.model_fields}
    api.app.state.engine_config = EngineConfig.model_validate(fields)
    uvicorn.run(
        api.app,
        host=args.host,
        port=args.port,
        log_config=api.get_uvicorn_log_config(),
        backlog=api.SKYRL_HTTP_CONNECTION_LIMIT,
        timeout_keep_alive=api.HTTP_KEEP_ALIVE_TIMEOUT_SECONDS,
    )


if __name__ == "__main__":
    main()
