"""`loraplex serve` argument handling (the exact forms other tooling relies on), its wiring of
``--config`` and the environment into every slice, and `loraplex keys create`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from loraplex.cli import serve_cmd
from loraplex.cli.config_sources import sections
from loraplex.cli.main import build_parser, main
from loraplex.cli.serve_cmd import build_context, load_from_args
from loraplex.config import (
    DEFAULT_MODEL_NAME,
    EngineConfig,
    ModelSource,
    SchedulerConfig,
    ServerConfig,
)
from loraplex.errors import AuthError, UserError
from loraplex.store.stores import open_stores
from tests.fakes import ToyExecutor


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def server_config(args: argparse.Namespace) -> ServerConfig:
    return load_from_args(args).config.server


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    return load_from_args(args).config.scheduler


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return load_from_args(args).config.engine


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


def test_config_file_and_environment_reach_serve_under_its_flags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "loraplex.toml"
    path.write_text("[engine]\nkv_cache_blocks = 512\n[scheduler]\ntoken_budget = 100\n"
                    "[server]\nport = 1\nopen_access = true\n[metering]\nprice_sheet = 'x'\n")
    monkeypatch.setenv("LORAPLEX_SCHEDULER_TOKEN_BUDGET", "200")
    monkeypatch.setenv("LORAPLEX_SCHEDULER_SAMPLE_SHARE", "0.25")
    loaded = load_from_args(parse("--config", str(path), "--port", "9001", "--no-open"))
    config = loaded.config
    assert config.engine.kv_cache_blocks == 512
    assert (config.scheduler.token_budget, config.scheduler.sample_share) == (200, 0.25)
    assert (config.server.port, config.server.open_access) == (9001, False)
    assert config.server.metering.price_sheet == "x"
    assert loaded.sources["server.port"] == "flag --port"
    assert loaded.sources["scheduler.token_budget"] == "env LORAPLEX_SCHEDULER_TOKEN_BUDGET"
    assert load_from_args(parse("--config", str(path))).config.server.open_access is True


def test_every_serve_flag_sets_a_config_key() -> None:
    known = {f"{s.name}.{k}" for s in sections().values() for k in s.keys}
    assert set(serve_cmd.FLAG_KEYS.values()) <= known
    assert all(value is None for value in vars(parse()).values()
               if value is not serve_cmd.run and value != "serve")


def test_serve_hands_each_slice_to_its_component(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "loraplex.toml"
    path.write_text("[engine]\nmax_lora_rank = 8\n[scheduler]\nquantum_tokens = 9\n"
                    "[server]\nlong_poll_s = 1.5\n")
    seen: dict[str, object] = {}

    def fake_build_context(server: ServerConfig, scheduler: SchedulerConfig,
                           make_executor: object) -> str:
        seen.update(server=server, scheduler=scheduler, make_executor=make_executor)
        return "ctx"

    def fake_engine(directory: str, config: EngineConfig) -> tuple[str, EngineConfig]:
        return directory, config

    monkeypatch.setattr(serve_cmd, "build_context", fake_build_context)
    monkeypatch.setattr(serve_cmd, "serve", lambda ctx: seen.update(served=ctx))
    monkeypatch.setattr("loraplex.engine.executor.Engine", fake_engine)
    assert main(["serve", "--config", str(path), "--threads", "2"]) == 0
    assert seen["served"] == "ctx"
    assert seen["server"] == ServerConfig(long_poll_s=1.5)
    assert seen["scheduler"] == SchedulerConfig(quantum_tokens=9)
    make_executor = seen["make_executor"]
    assert callable(make_executor)
    assert make_executor("/m") == ("/m", EngineConfig(max_lora_rank=8, num_threads=2))


def test_serve_refuses_a_bad_config_before_loading_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LORAPLEX_SCHEDULER_SAMPLE_SHAR", "0.3")
    assert main(["serve", "--data-dir", str(tmp_path)]) == 2
    assert "LORAPLEX_SCHEDULER_SAMPLE_SHAR" in capsys.readouterr().err


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
    assert ctx.catalog.get("Qwen/Qwen3-8B").lanes is ctx.catalog.get(
        "Qwen/Qwen3.5-4B").lanes
    assert ctx.catalog.get("meta-llama/L").lanes is not ctx.catalog.get(
        "Qwen/Qwen3-8B").lanes
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


def test_operator_keys_revocation_and_refused_names(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    data = ["--data-dir", str(tmp_path)]
    assert main(["keys", "create", "ops", "--operator", *data]) == 0
    operator = capsys.readouterr().out.strip()
    assert main(["keys", "create", "bob", *data]) == 0
    bob = capsys.readouterr().out.strip()
    stores = open_stores(str(tmp_path))
    assert stores.keys.principal_for(operator, open_access=False).is_operator
    assert not stores.keys.principal_for(bob, open_access=False).is_operator
    stores.close()
    for name in ("key-0123456789abcdef", "no spaces", ""):
        assert main(["keys", "create", name, *data]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: NAME:") and "Traceback" not in err
    assert main(["keys", "revoke", "bob", *data]) == 0
    assert "revoked 1 key" in capsys.readouterr().out
    assert main(["keys", "revoke", "bob", *data]) == 2
    stores = open_stores(str(tmp_path))
    for open_access in (False, True):  # a revoked key does not become an open-mode tenant
        with pytest.raises(AuthError, match="revoked"):
            stores.keys.principal_for(bob, open_access=open_access)
    stores.close()
