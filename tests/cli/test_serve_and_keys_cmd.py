"""`loraplex serve` argument handling (the exact forms other tooling relies on) and
`loraplex keys create`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loraplex.cli.main import build_parser, main
from loraplex.cli.serve_cmd import build_context, engine_config, scheduler_config, server_config
from loraplex.config import DEFAULT_MODEL_NAME, EngineConfig, ModelSource, SchedulerConfig
from loraplex.errors import UserError
from loraplex.store.stores import open_stores
from tests.fakes import ToyExecutor


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_serve_defaults_and_flags() -> None:
    default = server_config(parse())
    assert (default.host, default.port, default.open_access) == ("127.0.0.1", 8000, False)
    assert default.models == (ModelSource(DEFAULT_MODEL_NAME, "builtin:tiny"),)
    config = server_config(parse("--host", "0.0.0.0", "--port", "9001", "--data-dir", "/d",
                                 "--model", "Qwen/Qwen3-8B=builtin:tiny",
                                 "--model", "Qwen/Qwen3.5-4B=builtin:tiny", "--open"))
    assert (config.host, config.port, config.data_dir, config.open_access) == (
        "0.0.0.0", 9001, "/d", True)
    assert [m.name for m in config.models] == ["Qwen/Qwen3-8B", "Qwen/Qwen3.5-4B"]
    with pytest.raises(UserError, match="twice"):
        server_config(parse("--model", "A/b=builtin:tiny", "--model", "A/b=builtin:small"))
    with pytest.raises(UserError, match="NAME=SOURCE"):
        server_config(parse("--model", "no-equals-sign"))


def test_scheduler_and_engine_flags() -> None:
    assert scheduler_config(parse()) == SchedulerConfig()
    assert engine_config(parse()) == EngineConfig()
    packed = scheduler_config(parse("--token-budget", "4096"))
    assert (packed.token_budget, packed.timeslice) == (4096, False)
    assert scheduler_config(parse("--timeslice")).timeslice is True
    assert engine_config(parse("--threads", "1")).num_threads == 1
    with pytest.raises(UserError, match="--token-budget"):
        scheduler_config(parse("--token-budget", "0"))
    with pytest.raises(UserError, match="--threads"):
        engine_config(parse("--threads", "0"))


def test_names_sharing_a_source_share_one_executor(tmp_path: Path) -> None:
    made: list[str] = []

    def make(directory: str) -> ToyExecutor:
        made.append(directory)
        return ToyExecutor()

    config = server_config(parse("--data-dir", str(tmp_path), "--model", "Qwen/Qwen3-8B=x",
                                 "--model", "Qwen/Qwen3.5-4B=x", "--model", "meta-llama/L=y"))
    ctx = build_context(config, SchedulerConfig(), make,
                        resolve=lambda source, d: str(tmp_path / source))
    assert len(made) == 2
    assert ctx.catalog.get("Qwen/Qwen3-8B").scheduler is ctx.catalog.get(
        "Qwen/Qwen3.5-4B").scheduler
    assert ctx.catalog.get("meta-llama/L").scheduler is not ctx.catalog.get(
        "Qwen/Qwen3-8B").scheduler
    assert ctx.stores.served_models.model_dir("Qwen/Qwen3.5-4B") == str(tmp_path / "x")
    ctx.stores.close()


def test_keys_create_prints_a_key_stored_hashed(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "create", "alice", "--data-dir", str(tmp_path)]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("tml-")
    stores = open_stores(str(tmp_path))
    assert stores.keys.tenant_for(key, open_access=False) == "alice"
    stores.close()
