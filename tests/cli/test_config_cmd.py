"""`loraplex config show`: every field, one line each, with the source of its value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loraplex.cli.config_sources import sections
from loraplex.cli.main import main


def _show(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["config", "show", *argv]) == 0
    return capsys.readouterr().out


def test_show_names_the_source_of_every_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "loraplex.toml"
    path.write_text("[engine]\nkv_cache_blocks = 4096\n[metering]\nprice_sheet = 'x'\n")
    monkeypatch.setenv("LORAPLEX_SCHEDULER_SAMPLE_SHARE", "0.3")
    out = _show(capsys, "--config", str(path), "--port", "9001")
    lines = {line.split(" = ")[0]: line for line in out.splitlines() if line}
    assert len(lines) == sum(len(s.keys) for s in sections().values())
    assert lines["scheduler.sample_share"].split() == [
        "scheduler.sample_share", "=", "0.3", "(env", "LORAPLEX_SCHEDULER_SAMPLE_SHARE)"]
    assert lines["engine.kv_cache_blocks"].endswith(f"(file {path})")
    assert lines["metering.price_sheet"].startswith('metering.price_sheet = "x"')
    assert lines["server.port"].endswith("(flag --port)")
    assert lines["server.host"].endswith("(default)")
    assert out.index("engine.device") < out.index("scheduler.") < out.index("metering.")


def test_show_json_is_value_and_source_per_field(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LORAPLEX_SERVER_MODELS", "A/b=builtin:tiny")
    shown = json.loads(_show(capsys, "--json", "--timeslice"))
    assert list(shown) == list(sections())
    assert shown["server"]["models"] == {"value": [{"name": "A/b", "source": "builtin:tiny"}],
                                         "source": "env LORAPLEX_SERVER_MODELS"}
    assert shown["scheduler"]["timeslice"] == {"value": True, "source": "flag --timeslice"}
    assert shown["engine"]["max_context"] == {"value": None, "source": "default"}


def test_show_reports_a_bad_config_as_an_error(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LORAPLEX_ENGINE_KV_CACHE_BLOCKS", "lots")
    assert main(["config", "show"]) == 2
    assert "LORAPLEX_ENGINE_KV_CACHE_BLOCKS" in capsys.readouterr().err


def test_show_never_prints_the_jwt_issuer_key(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    secret = "s3cret-" + "k" * 40
    monkeypatch.setenv("LORAPLEX_SERVER_JWT_ISSUER_KEY", secret)
    lines = _show(capsys) + _show(capsys, "--json")
    assert secret not in lines and "<secret: 47 characters>" in lines
