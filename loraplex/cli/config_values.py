"""Typed config values: a field's type annotation decides how its raw value is read.

Two raw forms: *text* (an environment variable) and *data* (a TOML value, or a flag value
argparse already typed). Supported annotations: ``int``, ``float``, ``bool``, ``str``,
``Literal[...]``, ``Any``, unions (``X | None``), ``tuple[X, ...]`` and fixed tuples,
``Mapping[K, V]`` / ``dict[K, V]`` and dataclasses used as values (a table of their fields, or
the ``NAME=SOURCE``-style text their ``parse`` accepts). The walk over an annotation (unions
and the none words, comma-separated tuples, tables of pairs, dataclasses and their unknown keys)
is the config syntax's own; every leaf (a scalar or a ``Literal``) is validated by pydantic's
``TypeAdapter``, strict for TOML data, lax for text. Knows nothing of sections or sources;
an annotation it cannot read is a programming error (`TypeError`), which
``tests/test_config.py`` (``test_every_field_is_reachable_from_*``) catches for every new
field.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

import pydantic

from loraplex.errors import UserError

BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
NONE_WORDS = ("", "none")
"""Text (any case) that means None for an ``X | None`` field, in the environment and in TOML
(which has no null)."""


class BadValue(Exception):
    """A raw value that does not fit its annotation; the message says what was expected."""


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Field name → resolved annotation of a dataclass (they use postponed annotations)."""
    return typing.get_type_hints(cls)


def from_text(text: str, tp: Any) -> Any:
    """An environment variable's text as a value of annotation ``tp``.

    Scalars parse as Python would (bools also from yes/no/1/0); ``X | None`` is None for
    ``""`` or ``none``; tuples are comma-separated items (or a JSON array); mappings, ``Any``
    and dataclasses without ``parse`` are JSON.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        return _union(text, args, from_text, is_none=text.strip().lower() in NONE_WORDS)
    if tp is bool:
        word = text.strip().lower()
        if word not in BOOL_WORDS:
            raise BadValue(f"expected one of true/false/yes/no/1/0, got {text!r}")
        return BOOL_WORDS[word]
    if tp in (int, float, str):
        return _leaf(text.strip() if tp is not str else text, tp, strict=False)
    if origin is tuple and not text.lstrip().startswith("["):
        items = [item.strip() for item in text.split(",") if item.strip()]
        return _tuple(items, args, from_text)
    if dataclasses.is_dataclass(tp) and hasattr(tp, "parse") and text.lstrip()[:1] != "{":
        return _parse(tp, text)
    if origin is Literal:
        for option in args:
            if str(option) == text.strip():
                return option
        raise BadValue(f"expected one of {list(args)}, got {text!r}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        if tp is Any:
            return text
        raise BadValue(f"expected JSON ({err.msg}), got {text!r}") from None
    return from_data(data, tp)


def from_data(value: Any, tp: Any) -> Any:
    """A TOML (or already-typed flag) value as a value of annotation ``tp``.

    Strict about scalars (an int field refuses ``"8"`` and ``true``; a float field takes
    ints); ``X | None`` is None for None, ``""`` or ``"none"``; a tuple takes an array, or for
    two-field dataclass items a table ``{first = second}``.
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (types.UnionType, typing.Union):
        is_none = value is None or (isinstance(value, str) and value.lower() in NONE_WORDS)
        return _union(value, args, from_data, is_none=is_none)
    if tp is Any:
        return value
    if origin is Literal or tp in (bool, int, float, str):
        return _leaf(value, tp, strict=True)
    if origin is tuple:
        return _tuple_data(value, args)
    if origin in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise BadValue(f"expected a table (JSON object), got {value!r}")
        key_tp, value_tp = args or (Any, Any)
        return {from_data(k, key_tp): from_data(v, value_tp) for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(value, tp)
    raise TypeError(f"no reader for config annotation {tp!r}")


def to_data(value: Any) -> Any:
    """A config value as plain JSON data (dataclasses as tables, tuples as arrays)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): to_data(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [to_data(v) for v in value]
    return value


@functools.cache
def _adapter(tp: Any) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(tp)


def _leaf(value: Any, tp: Any, strict: bool) -> Any:
    """A scalar or ``Literal`` value by pydantic: strict for data (an int field refuses
    ``"8"`` and ``true``; a float field takes ints), lax for an environment variable's text."""
    try:
        return _adapter(tp).validate_python(value, strict=strict)
    except pydantic.ValidationError:
        raise BadValue(f"expected {_describe(tp)}, got {value!r}") from None


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return f"one of {list(typing.get_args(tp))}"
    return {int: "an integer", float: "a number"}.get(tp, getattr(tp, "__name__", str(tp)))


def _union(raw: Any, args: tuple[Any, ...], read: Callable[[Any, Any], Any], is_none: bool
           ) -> Any:
    if is_none and type(None) in args:
        return None
    members = [a for a in args if a is not type(None)]
    problems = []
    for member in members:
        try:
            return read(raw, member)
        except BadValue as err:
            problems.append(str(err))
    raise BadValue("; ".join(problems))


def _tuple(items: list[Any], args: tuple[Any, ...], read: Callable[[Any, Any], Any]
           ) -> tuple[Any, ...]:
    if len(args) == 2 and args[1] is Ellipsis:
        item_types = [args[0]] * len(items)
    elif len(items) != len(args):
        raise BadValue(f"expected {len(args)} items, got {len(items)}")
    else:
        item_types = list(args)
    out = []
    for i, (item, item_tp) in enumerate(zip(items, item_types, strict=True)):
        try:
            out.append(read(item, item_tp))
        except BadValue as err:
            raise BadValue(f"item {i}: {err}") from None
    return tuple(out)


def _tuple_data(value: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    item_tp = args[0] if len(args) == 2 and args[1] is Ellipsis else None
    item_fields = dataclasses.fields(item_tp) if dataclasses.is_dataclass(item_tp) else ()
    if isinstance(value, Mapping) and len(item_fields) == 2:
        first, second = (f.name for f in item_fields)
        value = [{first: k, second: v} for k, v in value.items()]
    if not isinstance(value, list | tuple):
        raise BadValue(f"expected an array, got {value!r}")
    return _tuple(list(value), args, from_data)


def _parse(cls: Any, text: str) -> Any:
    try:
        return cls.parse(text.strip())
    except ValueError as err:
        raise BadValue(str(err)) from None


def _dataclass(value: Any, cls: type) -> Any:
    if isinstance(value, str) and hasattr(cls, "parse"):
        return _parse(cls, value)
    if not isinstance(value, Mapping):
        raise BadValue(f"expected a table of {sorted(field_types(cls))}, got {value!r}")
    hints = field_types(cls)
    unknown = sorted(set(value) - set(hints))
    if unknown:
        raise BadValue(f"unknown keys {unknown}; known: {sorted(hints)}")
    try:
        return cls(**{k: from_data(v, hints[k]) for k, v in value.items()})
    except TypeError as err:  # a required field missing
        raise BadValue(str(err)) from None
    except UserError as err:  # the item's own check
        raise BadValue(err.message) from None
