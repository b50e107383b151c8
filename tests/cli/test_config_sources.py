"""Layering of the config sources (defaults < file < env < flags), the forms each source
accepts, and errors that name the source and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.cli.config_sources import load_config, sections
from loraplex.config import LoraplexConfig, ModelSource
from loraplex.errors import UserError

EXAMPLE = """
[engine]
kv_cache_blocks = 4096
max_context = "none"

[scheduler]
sample_share = 0.3
token_budget = 8192

[server]
port = 9000
models = ["Qwen/Qwen3-8B=builtin:tiny", "meta-llama/Llama-3.1-8B=/models/llama"]

[server.client_config]
fwdbwd_max_chunk_len = 2048

[metering]
price_sheet = "tinker-2026-01-05"
model_map = { "my-llama" = "meta-llama/Llama-3.1-70B" }
"""


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "loraplex.toml"
    path.write_text(text)
    return str(path)


def test_sections_are_the_slices_with_nested_ones_flattened() -> None:
    assert list(sections())[:4] == ["engine", "scheduler", "server", "metering"]
    assert sections()["metering"].path == ("server", "metering")
    assert "metering" not in sections()["server"].keys
    assert all(s.cls.__name__.endswith("Config") for s in sections().values())


def test_file_sets_fields_of_every_section(tmp_path: Path) -> None:
    loaded = load_config(_file(tmp_path, EXAMPLE), environ={})
    config = loaded.config
    assert (config.engine.kv_cache_blocks, config.engine.max_context) == (4096, None)
    assert (config.scheduler.sample_share, config.scheduler.token_budget) == (0.3, 8192)
    assert config.server.port == 9000
    assert config.server.models == (ModelSource("Qwen/Qwen3-8B", "builtin:tiny"),
                                    ModelSource("meta-llama/Llama-3.1-8B", "/models/llama"))
    assert config.server.client_config == {"fwdbwd_max_chunk_len": 2048}
    assert config.server.metering.model_map == {"my-llama": "meta-llama/Llama-3.1-70B"}
    assert loaded.sources["metering.model_map"] == f"file {tmp_path / 'loraplex.toml'}"
    assert loaded.sources["server.host"] == "default"


def test_environment_sets_fields_and_parses_by_annotation() -> None:
    config = load_config(environ={
        "LORAPLEX_ENGINE_KV_CACHE_BLOCKS": "4096",
        "LORAPLEX_ENGINE_BATCH_INVARIANT": "no",
        "LORAPLEX_ENGINE_NUM_THREADS": "",
        "LORAPLEX_SCHEDULER_SAMPLE_SHARE": "0.3",
        "LORAPLEX_SCHEDULER_SEQ_GAP_TIMEOUT_S": "None",
        "LORAPLEX_SERVER_PORT": "9000",
        "LORAPLEX_SERVER_MODELS": "A/b=builtin:tiny, C/d=/models/d",
        "LORAPLEX_SERVER_CLIENT_CONFIG": '{"parallel_fwdbwd_chunks": true}',
        "LORAPLEX_METERING_PRICE_TABLE": '{"prices": {"m": {"prefill": 1}}}',
        "LORAPLEX_TEST_EXECUTOR": "toy",  # the test harness's knob, exempt
    }).config
    assert (config.engine.kv_cache_blocks, config.engine.batch_invariant) == (4096, False)
    assert config.engine.num_threads is None
    assert (config.scheduler.sample_share, config.scheduler.seq_gap_timeout_s) == (0.3, None)
    assert config.server.port == 9000
    assert [m.name for m in config.server.models] == ["A/b", "C/d"]
    assert config.server.client_config == {"parallel_fwdbwd_chunks": True}
    assert config.server.metering.price_table == {"prices": {"m": {"prefill": 1}}}


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path) -> None:
    path = _file(tmp_path, "[scheduler]\ntoken_budget = 100\nquantum_tokens = 7\n"
                           "[server]\nport = 1\nhost = 'file-host'\n")
    env = {"LORAPLEX_SCHEDULER_TOKEN_BUDGET": "200", "LORAPLEX_SERVER_PORT": "2"}
    flags = {"scheduler.token_budget": ("--token-budget", 300)}
    loaded = load_config(path, flags, env)
    assert loaded.config.scheduler.token_budget == 300
    assert loaded.config.server.port == 2
    assert loaded.config.server.host == "file-host"
    assert loaded.config.scheduler.cycle_history == LoraplexConfig().scheduler.cycle_history
    assert loaded.sources["scheduler.token_budget"] == "flag --token-budget"
    assert loaded.sources["server.port"] == "env LORAPLEX_SERVER_PORT"
    assert loaded.sources["server.host"] == f"file {path}"
    assert loaded.sources["scheduler.cycle_history"] == "default"
    assert load_config(path, {}, env).config.scheduler.token_budget == 200
    assert load_config(path, {}, {}).config.scheduler.token_budget == 100


def test_models_accept_an_array_of_tables_or_a_name_to_source_table(tmp_path: Path) -> None:
    tables = _file(tmp_path, '[[server.models]]\nname = "A/b"\nsource = "builtin:tiny"\n')
    assert load_config(tables, environ={}).config.server.models == (
        ModelSource("A/b", "builtin:tiny"),)
    table = _file(tmp_path, '[server.models]\n"A/b" = "builtin:tiny"\n"C/d" = "x"\n')
    assert load_config(table, environ={}).config.server.models == (
        ModelSource("A/b", "builtin:tiny"), ModelSource("C/d", "x"))


@pytest.mark.parametrize(("text", "names"), [
    ("[engin]\nx = 1\n", ["'engin'", "[engine]", "[metering]"]),
    ("port = 1\n", ["'port'", "[server]"]),
    ("[engine]\nkv_blocks = 1\n", ["engine.kv_blocks", "kv_cache_blocks"]),
    ("[server.metering]\nprice_sheet = 'x'\n", ["server.metering", "[metering]"]),
])
def test_unknown_file_keys_name_the_key_and_the_valid_ones(tmp_path: Path, text: str,
                                                           names: list[str]) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_config(path, environ={})
    assert str(err.value).startswith(f"file {path}: ")
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize(("variable", "names"), [
    ("LORAPLEX_ENGINE_KV_BLOCKS", ["LORAPLEX_ENGINE_KV_CACHE_BLOCKS", "[engine]"]),
    ("LORAPLEX_SERVER_METERING_PRICE_SHEET", ["LORAPLEX_SERVER_PORT"]),
    ("LORAPLEX_ENGNE_DEVICE", ["ENGINE, SCHEDULER, SERVER, METERING", "LORAPLEX_TEST_*"]),
    ("LORAPLEX_METERING", ["ENGINE, SCHEDULER"]),
])
def test_unknown_env_variables_name_the_variable_and_the_valid_ones(variable: str,
                                                                    names: list[str]) -> None:
    with pytest.raises(UserError) as err:
        load_config(environ={variable: "1"})
    assert str(err.value).startswith(f"env {variable}: ")
    for name in names:
        assert name in str(err.value)


def test_bad_types_name_the_source_the_key_and_the_type(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"^env LORAPLEX_ENGINE_KV_CACHE_BLOCKS: "
                                        r"engine\.kv_cache_blocks: .*'lots' \(type int \| None\)"):
        load_config(environ={"LORAPLEX_ENGINE_KV_CACHE_BLOCKS": "lots"})
    with pytest.raises(UserError, match=r"scheduler\.timeslice: expected one of true/false"):
        load_config(environ={"LORAPLEX_SCHEDULER_TIMESLICE": "maybe"})
    with pytest.raises(UserError, match=r"server\.client_config: .*JSON"):
        load_config(environ={"LORAPLEX_SERVER_CLIENT_CONFIG": "{not json"})
    with pytest.raises(UserError, match=r"server\.models: item 1: expected NAME=SOURCE"):
        load_config(environ={"LORAPLEX_SERVER_MODELS": "a=b,oops"})
    path = _file(tmp_path, '[engine]\nkv_cache_blocks = "8"\n')  # TOML is typed: no strings
    with pytest.raises(UserError,
                       match=rf"^file {path}: engine\.kv_cache_blocks: .*\(type int \| None\)"):
        load_config(path, environ={})
    path = _file(tmp_path, "[engine]\nbatch_invariant = 1\n")
    with pytest.raises(UserError, match=r"engine\.batch_invariant: expected bool"):
        load_config(path, environ={})
    with pytest.raises(UserError, match="not valid TOML"):
        load_config(_file(tmp_path, "[[\n"), environ={})
    with pytest.raises(UserError, match=r"^--config: cannot read"):
        load_config(str(tmp_path / "missing.toml"), environ={})


def test_slice_checks_name_whichever_source_set_the_value(tmp_path: Path) -> None:
    path = _file(tmp_path, "[scheduler]\ntoken_budget = 0\n")
    with pytest.raises(UserError, match=rf"^file {path}: scheduler\.token_budget: must be at "
                                        r"least 1, got 0"):
        load_config(path, environ={})
    with pytest.raises(UserError, match=r"^env LORAPLEX_ENGINE_NUM_THREADS: engine\.num_threads"):
        load_config(environ={"LORAPLEX_ENGINE_NUM_THREADS": "0"})
    with pytest.raises(UserError, match=r"^env LORAPLEX_SERVER_MODELS: .*twice"):
        load_config(environ={"LORAPLEX_SERVER_MODELS": "a=x,a=y"})


def test_the_documented_example_loads(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    start = page.index("```toml") + len("```toml")
    example = page[start:page.index("```\n", start)]
    config = load_config(_file(tmp_path, example), environ={}).config
    assert config.scheduler.sample_share == 0.3
    assert config.server.metering.price_sheet == "tinker-2026-01-05"


def test_the_documented_kernel_cache_variable_is_not_refused_as_config() -> None:
    """The docs and `native_library` document ``LORAPLEX_KERNEL_CACHE``; the loader used to
    refuse it as an unknown ``LORAPLEX_*`` variable, so ``loraplex serve`` exited with 2."""
    loaded = load_config(environ={"LORAPLEX_KERNEL_CACHE": "/tmp/kernels",
                                  "LORAPLEX_ENGINE_KV_CACHE_BLOCKS": "64"})
    assert loaded.config.engine.kv_cache_blocks == 64
