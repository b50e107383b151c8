"""SkyRL's model-dir view: SkyRL rejects a config.json without a dtype, so the harness serves it
the same files with the weights' dtype named; a config that names one is used as is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from benchmarks.harness.server_process import ServerProcess
from benchmarks.peers import skyrl


def _model_dir(root: Path, config: dict[str, object], dtype: type = np.float32) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text("{}")
    save_file({"model.embed_tokens.weight": np.zeros((4, 2), dtype=dtype)},
              str(root / "model.safetensors"))
    return root


def test_view_names_the_weights_dtype_and_links_the_same_files(tmp_path: Path) -> None:
    source = _model_dir(tmp_path / "small", {"model_type": "qwen3", "hidden_size": 2})
    view = skyrl.peer_model_dir(source, tmp_path / "scratch")
    assert view != source
    assert json.loads((view / "config.json").read_text()) == {
        "model_type": "qwen3", "hidden_size": 2, "dtype": "float32"}
    for name in ("model.safetensors", "tokenizer.json"):
        assert (view / name).resolve() == (source / name).resolve()
    assert skyrl.peer_model_dir(source, tmp_path / "scratch") == view  # idempotent


def test_view_reads_half_precision_from_the_safetensors_header(tmp_path: Path) -> None:
    source = _model_dir(tmp_path / "half", {"model_type": "qwen3"}, dtype=np.float16)
    assert skyrl.weights_dtype(source) == "float16"


def test_config_with_a_dtype_is_served_as_is(tmp_path: Path) -> None:
    source = _model_dir(tmp_path / "hf", {"model_type": "qwen3", "dtype": "bfloat16"})
    assert skyrl.peer_model_dir(source, tmp_path / "scratch") == source.resolve()


def _launch(tmp_path: Path, script: str) -> ServerProcess:
    return ServerProcess.launch(["sh", "-c", script], {}, tmp_path / "server.log",
                                base_url="http://127.0.0.1:1", base_model="m")


def test_wait_engine_loaded_returns_once_the_engine_logs_its_loop(tmp_path: Path) -> None:
    server = _launch(tmp_path, f"sleep 0.3; echo '{skyrl.ENGINE_READY_LINE}...'; sleep 30")
    try:
        assert 0.2 < skyrl.wait_engine_loaded(server, timeout_s=20) < 20
    finally:
        server.stop()


def test_wait_engine_loaded_fails_when_the_server_exits_first(tmp_path: Path) -> None:
    server = _launch(tmp_path, "echo loading; exit 3")
    with pytest.raises(RuntimeError, match="not loaded"):
        skyrl.wait_engine_loaded(server, timeout_s=20)
