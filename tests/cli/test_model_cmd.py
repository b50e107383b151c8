"""`loraplex model create-tiny` and `model info` through the real CLI entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loraplex.cli.main import main


def test_create_tiny_writes_a_loadable_model(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "tiny-llama"
    assert main(["model", "create-tiny", str(target), "--arch", "llama", "--seed", "3"]) == 0
    assert "tiny llama model" in capsys.readouterr().out
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (target / name).is_file()
    assert main(["model", "info", str(target)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["arch"] == "llama" and info["vocab_size"] == 1024
    assert info["num_params"] <= 1_000_000 and len(info["eos_token_ids"]) == 2


def test_errors_exit_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "taken").write_text("x")
    assert main(["model", "create-tiny", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["model", "info", str(tmp_path / "missing")]) == 2


def test_registering_the_command_does_not_import_torch() -> None:
    code = ("import argparse, sys; from loraplex.cli import model_cmd; "
            "model_cmd.register(argparse.ArgumentParser().add_subparsers()); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_create_tiny_moe_and_the_builtin_sources(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from loraplex.cli.model_sources import builtin_dir, resolve_source
    from loraplex.errors import UserError

    target = tmp_path / "tiny-moe"
    assert main(["model", "create-tiny", str(target), "--arch", "qwen3_moe"]) == 0
    assert "tiny qwen3_moe model" in capsys.readouterr().out
    assert main(["model", "info", str(target)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["arch"] == "qwen3_moe" and info["card"]["moe"]["num_experts"] == 8
    assert info["card"]["moe"]["top_k"] == 2
    data = str(tmp_path / "data")
    for name in ("tiny-moe", "small-moe"):
        assert resolve_source(f"builtin:{name}", data, create=False) == builtin_dir(data, name)
    with pytest.raises(UserError, match="builtin:tiny-moe"):
        resolve_source("builtin:huge-moe", data, create=False)
