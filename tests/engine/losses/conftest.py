"""Builders for domain `Datum`s with hand-written loss inputs."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from loraplex.domain.data import TYPECODE, Datum, TensorData

VOCAB = 50


def tensor(values: Sequence[Any], dtype: str) -> TensorData:
    """A TensorData from a flat or nested (2-D) list."""
    rows = [list(v) for v in values] if values and isinstance(values[0], Sequence) else None
    flat = [x for row in rows for x in row] if rows is not None else list(values)
    shape = (len(rows), len(rows[0])) if rows else (len(flat),)
    return TensorData(dtype, shape, array(TYPECODE[dtype], flat))  # type: ignore[arg-type]


def datum(tokens: Sequence[int], **inputs: object) -> Datum:
    """``target_tokens`` default to ``tokens`` shifted by one; ints → int64, floats → float32."""
    fields: dict[str, TensorData] = {}
    for key, value in inputs.items():
        if isinstance(value, TensorData):
            fields[key] = value
        else:
            fields[key] = tensor(value, "int64" if key == "target_tokens" else "float32")  # type: ignore[arg-type]
    if "target_tokens" not in fields:
        fields["target_tokens"] = tensor([(t + 1) % VOCAB for t in tokens], "int64")
    return Datum(tokens=array("q", tokens), loss_fn_inputs=fields)


@pytest.fixture
def make_datum() -> Callable[..., Datum]:
    return datum


@pytest.fixture
def make_tensor() -> Callable[..., TensorData]:
    return tensor
