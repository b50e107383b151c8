"""Every field of every config slice is documented and reachable from a TOML file and from a
``LORAPLEX_<SECTION>_<FIELD>`` variable, found by walking the dataclasses (so a field added
later is covered with no change here); and each slice checks its own values."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pytest

from loraplex.cli.config_sources import load_config
from loraplex.config import EngineConfig, LoraplexConfig, ModelSource, SchedulerConfig, ServerConfig
from loraplex.errors import UserError


def _slices(cls: type = LoraplexConfig, path: tuple[str, ...] = ()
            ) -> list[tuple[tuple[str, ...], type]]:
    """(attribute path, dataclass) of every ``*Config`` slice, nested ones included."""
    found = [(path, cls)] if path else []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp) and tp.__name__.endswith("Config"):
            found += _slices(tp, (*path, f.name))
    return found


def _settable_fields() -> list[tuple[tuple[str, ...], str, Any]]:
    out = []
    for path, cls in _slices():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if not dataclasses.is_dataclass(hints[f.name]):
                out.append((path, f.name, hints[f.name]))
    return out


FIELDS = _settable_fields()
IDS = [f"{path[-1]}.{name}" for path, name, _ in FIELDS]


def _default(path: tuple[str, ...], name: str) -> Any:
    value: Any = LoraplexConfig()
    for attr in (*path, name):
        value = getattr(value, attr)
    return value


def _sample(tp: Any, default: Any, salt: int = 0) -> Any:
    """A value of annotation ``tp`` that differs from ``default``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        if default is not None and type(None) in args:
            return None
        return _sample(next(a for a in args if a is not type(None)), None, salt)
    if tp is bool:
        return not default
    if tp is int:
        return (default or salt) + 1
    if tp is float:
        return default / 2 if default else 0.5
    if tp is str:  # long enough for fields with a minimum length (jwt_issuer_key)
        return f"{default or 'a-value-of-at-least-thirty-two-characters'}-{salt}"
    if tp is Any:
        return salt + 1
    if origin is Literal:
        return next(a for a in args if a != default)
    if origin is tuple:
        return (_sample(args[0], None, 0), _sample(args[0], None, 1))
    if origin in (Mapping, dict):
        return {"key": _sample(args[1] if args else Any, None, salt)}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _sample(hints[f.name], None, salt)  # type: ignore[operator]
                     for f in dataclasses.fields(tp)})
    raise AssertionError(f"test has no sample for {tp!r}; teach _sample")


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return [_plain(v) for v in value] if isinstance(value, tuple | list) else value


def _env_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    return json.dumps(_plain(value))


def _toml(value: Any) -> str:
    value = _plain(value)
    if value is None:
        return '"none"'  # TOML has no null
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


@pytest.mark.parametrize(("path", "name", "tp"), FIELDS, ids=IDS)
def test_every_field_is_reachable_from_the_environment(path: tuple[str, ...], name: str,
                                                       tp: Any) -> None:
    wanted = _sample(tp, _default(path, name))
    variable = f"LORAPLEX_{path[-1]}_{name}".upper()
    loaded = load_config(environ={variable: _env_text(wanted)})
    assert _value(loaded.config, path, name) == wanted
    assert loaded.sources[f"{path[-1]}.{name}"] == f"env {variable}"


@pytest.mark.parametrize(("path", "name", "tp"), FIELDS, ids=IDS)
def test_every_field_is_reachable_from_the_file(path: tuple[str, ...], name: str, tp: Any,
                                                tmp_path: Path) -> None:
    wanted = _sample(tp, _default(path, name))
    file = tmp_path / "loraplex.toml"
    file.write_text(f"[{path[-1]}]\n{name} = {_toml(wanted)}\n")
    loaded = load_config(str(file), environ={})
    assert _value(loaded.config, path, name) == wanted
    assert loaded.sources[f"{path[-1]}.{name}"] == f"file {file}"


def _value(config: LoraplexConfig, path: tuple[str, ...], name: str) -> Any:
    value: Any = config
    for attr in (*path, name):
        value = getattr(value, attr)
    return value


@pytest.mark.parametrize("cls", [cls for _, cls in _slices()], ids=lambda c: c.__name__)
def test_every_field_is_documented_in_its_slice_docstring(cls: type) -> None:
    doc = cls.__doc__ or ""
    assert "Attributes:" in doc
    missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
               if f.name not in doc]
    assert not missing, f"{cls.__name__}: document {missing} under Attributes:"


def test_slices_check_their_own_values_whatever_builds_them() -> None:
    with pytest.raises(UserError, match="token_budget: must be at least 1, got 0"):
        SchedulerConfig(token_budget=0)
    with pytest.raises(UserError, match="num_threads: must be at least 1"):
        EngineConfig(num_threads=0)
    assert EngineConfig(num_threads=None).num_threads is None
    with pytest.raises(UserError, match="twice"):
        ServerConfig(models=(ModelSource("a", "x"), ModelSource("a", "y")))
    with pytest.raises(UserError, match="at least one model"):
        ServerConfig(models=())
    with pytest.raises(ValueError, match="NAME=SOURCE"):
        ModelSource.parse("no-equals-sign")
