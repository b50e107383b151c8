"""The effective `LoraplexConfig`: dataclass defaults < TOML file < ``LORAPLEX_*`` env < flags.

Sections are found by walking the config dataclasses: every field typed as a ``*Config``
dataclass is a section named after the field, flattened, so ``ServerConfig.metering`` is the
``[metering]`` table and ``LORAPLEX_METERING_*`` while it stays nested in code. Every other
field of a section is a key: ``[engine] kv_cache_blocks`` in the file,
``LORAPLEX_ENGINE_KV_CACHE_BLOCKS`` in the environment, read by its type annotation
(`config_values`). A field added to a slice is reachable with no code here. Unknown sections
and keys raise, naming the valid ones. Each value remembers its source (``default``, ``file
PATH``, ``env NAME``, ``flag --NAME``), which error messages and ``loraplex config show``
report.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loraplex.cli.config_values import BadValue, field_types, from_data, from_text
from loraplex.config import ENV_PREFIX, LoraplexConfig, loraplex_environment
from loraplex.errors import UserError, user_error

DEFAULT_SOURCE = "default"
ENV_EXEMPT_PREFIXES = ("LORAPLEX_TEST_", "LORAPLEX_KERNEL_CACHE", "LORAPLEX_KERNEL_FLAGS")
"""Not configuration: the test harness's own knobs (``LORAPLEX_TEST_EXECUTOR``,
``LORAPLEX_TEST_THREADS``, read by ``tests/*/conftest.py``), set while tests start servers, and
the native kernels' build cache and extra compiler flags (``LORAPLEX_KERNEL_CACHE``,
``LORAPLEX_KERNEL_FLAGS``, read by `engine.kernels.native_library` in every process that builds
them)."""


@dataclass(frozen=True)
class Section:
    """One config table: a dataclass slice and where it sits in `LoraplexConfig`.

    Attributes:
        name: the table name (``engine``), also the env infix (``LORAPLEX_ENGINE_``).
        cls: the slice's dataclass.
        path: attribute path from the aggregate (``("server", "metering")``).
        keys: field name → annotation, for the fields that are values (not sections).
        declared: field name → the annotation as written, for messages.
    """

    name: str
    cls: type
    path: tuple[str, ...]
    keys: Mapping[str, Any]
    declared: Mapping[str, str]

    def env_name(self, key: str) -> str:
        return f"{ENV_PREFIX}{self.name}_{key}".upper()


@dataclass(frozen=True)
class LoadedConfig:
    """The effective config and where each value came from.

    Attributes:
        config: the aggregate, every slice built and checked.
        sources: ``section.key`` → ``default``, ``file PATH``, ``env NAME`` or ``flag --NAME``.
    """

    config: LoraplexConfig
    sources: Mapping[str, str]


@functools.cache
def sections(root: type = LoraplexConfig) -> dict[str, Section]:
    """Every section under ``root``, parents before their nested sections."""
    found: dict[str, Section] = {}

    def walk(cls: type, path: tuple[str, ...]) -> None:
        hints = field_types(cls)
        nested = [f for f in dataclasses.fields(cls) if _is_section(hints[f.name])]
        values = [f for f in dataclasses.fields(cls) if f not in nested]
        if path:
            name = path[-1]
            assert name not in found, f"two config sections named {name!r}"
            found[name] = Section(name, cls, path, {f.name: hints[f.name] for f in values},
                                  {f.name: _declared(f) for f in values})
        for f in nested:
            walk(hints[f.name], (*path, f.name))

    walk(root, ())
    env_names = [s.env_name(k) for s in found.values() for k in s.keys]
    assert len(set(env_names)) == len(env_names), "two config keys share an env var name"
    return found


def load_config(path: str | None = None, flags: Mapping[str, tuple[str, Any]] | None = None,
                environ: Mapping[str, str] | None = None) -> LoadedConfig:
    """Layer the sources and build every slice.

    Args:
        path: a TOML file (``--config``), or None.
        flags: ``section.key`` → (flag label such as ``--port``, argparse value), only for the
            flags actually given.
        environ: the ``LORAPLEX_*`` variables (default: the process environment).

    Raises:
        UserError: naming the source and the key (unknown key, wrong type, failed check).
    """
    layers: dict[str, tuple[Any, str]] = {}
    if path is not None:
        layers.update(file_values(path))
    layers.update(env_values(loraplex_environment() if environ is None else environ))
    for key, (flag, value) in (flags or {}).items():
        layers[key] = (_read(from_data, value, key, f"flag {flag}"), f"flag {flag}")
    config = _build(LoraplexConfig, (), layers)
    sources = {f"{s.name}.{k}": layers.get(f"{s.name}.{k}", (None, DEFAULT_SOURCE))[1]
               for s in sections().values() for k in s.keys}
    return LoadedConfig(config, sources)


def file_values(path: str) -> dict[str, tuple[Any, str]]:
    """``section.key`` → (value, ``file PATH``) for every key of a TOML file."""
    where = f"file {path}"
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as err:
        raise user_error("--config", f"cannot read {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise user_error(where, f"not valid TOML: {err}") from None
    known = sections()
    out: dict[str, tuple[Any, str]] = {}
    for name, table in data.items():
        if name not in known:
            raise user_error(where, f"unknown section {name!r}; known: "
                                    f"{', '.join(f'[{n}]' for n in known)}")
        if not isinstance(table, dict):
            raise user_error(where, f"{name!r} must be a [{name}] table")
        for key, raw in table.items():
            if key in known and known[key].path[:-1] == known[name].path:
                raise user_error(where, f"{name}.{key}: set it in its own [{key}] table")
            if key not in known[name].keys:
                raise user_error(where, f"unknown key {name}.{key}; known keys of [{name}]: "
                                        f"{', '.join(sorted(known[name].keys))}")
            out[f"{name}.{key}"] = (_read(from_data, raw, f"{name}.{key}", where), where)
    return out


def env_values(environ: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    """``section.key`` → (value, ``env NAME``) for every ``LORAPLEX_*`` variable."""
    by_env = {s.env_name(k): (s, k) for s in sections().values() for k in s.keys}
    out: dict[str, tuple[Any, str]] = {}
    for name, text in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name.startswith(ENV_EXEMPT_PREFIXES):
            continue
        if name not in by_env:
            raise user_error(f"env {name}", _unknown_env(name))
        section, key = by_env[name]
        dotted = f"{section.name}.{key}"
        out[dotted] = (_read(from_text, text, dotted, f"env {name}"), f"env {name}")
    return out


def _unknown_env(name: str) -> str:
    matches = [s for s in sections().values() if name.startswith(s.env_name(""))]
    if matches:
        section = max(matches, key=lambda s: len(s.name))
        return (f"no field of [{section.name}] is named so; known: "
                f"{', '.join(section.env_name(k) for k in sorted(section.keys))}")
    names = ", ".join(n.upper() for n in sections())
    return (f"unknown section; variables are {ENV_PREFIX}<SECTION>_<FIELD> with SECTION one "
            f"of {names} ({', '.join(p + '*' for p in ENV_EXEMPT_PREFIXES)} are exempt)")


def _read(reader: Any, raw: Any, dotted: str, where: str) -> Any:
    section, key = dotted.split(".", 1)
    found = sections()[section]
    try:
        return reader(raw, found.keys[key])
    except BadValue as err:
        raise user_error(where, f"{dotted}: {err} (type {found.declared[key]})") from None


def _build(cls: type, path: tuple[str, ...], layers: Mapping[str, tuple[Any, str]]) -> Any:
    """``cls`` from the layered values under ``path``; unset fields keep their defaults."""
    by_path = {s.path: s for s in sections().values()}
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        sub = (*path, f.name)
        if sub in by_path:
            kwargs[f.name] = _build(by_path[sub].cls, sub, layers)
        elif path and f"{path[-1]}.{f.name}" in layers:
            kwargs[f.name] = layers[f"{path[-1]}.{f.name}"][0]
    try:
        return cls(**kwargs)
    except UserError as err:  # the slice's own check names one of its fields
        if not path or err.field not in by_path[path].keys:
            raise
        dotted = f"{path[-1]}.{err.field}"
        problem = err.message.removeprefix(f"{err.field}: ")
        raise user_error(layers.get(dotted, (None, DEFAULT_SOURCE))[1],
                         f"{dotted}: {problem}") from None


def _is_section(tp: Any) -> bool:
    """A field typed as a ``*Config`` dataclass is a section; other dataclasses (`ModelSource`)
    are values."""
    return _is_dataclass_type(tp) and tp.__name__.endswith("Config")


def _is_dataclass_type(tp: Any) -> bool:
    return dataclasses.is_dataclass(tp) and isinstance(tp, type)


def _declared(f: dataclasses.Field[Any]) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))
