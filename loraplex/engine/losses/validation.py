"""Validate one request's loss (name, ``loss_fn_config``, every datum's ``loss_fn_inputs``) and
turn it into a `ValidatedLoss` the trainer can run. Nothing is computed before every check has
passed, so a bad datum fails only its own request and changes no state.

Each `UserError`'s field names the culprit, e.g.
``data[3].loss_fn_inputs.advantages: length 7 != model_input length 9``. Inputs a loss does not
use (``mask``, ``weights`` for RL losses, ...) are ignored, as Tinker does.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from loraplex.domain.data import Datum, TensorData
from loraplex.domain.tokens import check_token_range
from loraplex.engine.losses.loss_inputs import LossInputs
from loraplex.engine.losses.loss_spec import LossOutput, LossSpec
from loraplex.engine.losses.registry import get_loss
from loraplex.errors import user_error

NUMPY_DTYPE = {"float32": np.float32, "int64": np.int64}
#: Inputs that may be ``[N, K]`` when the loss allows top-K targets.
TOP_K_INPUTS = ("target_tokens", "weights")
#: Lower bounds of config values (clip_high must also be ≥ clip_low).
CONFIG_MINIMUM = {
    "clip_low_threshold": 0.0,
    "clip_high_threshold": 0.0,
    "beta": 0.0,
    "kl_coeff": 0.0,
}


@dataclass(frozen=True)
class ValidatedLoss:
    """A loss bound to one request's checked, concatenated inputs.

    The trainer gathers the model's logprobs of ``inputs.target_tokens`` (shape ``[T]`` or
    ``[T, K]``, datums concatenated in request order) and calls `compute`.
    """

    spec: LossSpec
    inputs: LossInputs

    @property
    def target_tokens(self) -> torch.Tensor:
        return self.inputs.target_tokens

    def to(self, device: torch.device | str) -> ValidatedLoss:
        return ValidatedLoss(self.spec, self.inputs.to(device))

    def compute(self, logprobs: torch.Tensor) -> LossOutput:
        """Run the loss on the model's target logprobs (autograd flows back into them)."""
        if logprobs.shape != self.inputs.target_tokens.shape:
            raise ValueError(
                f"logprobs shape {tuple(logprobs.shape)} != target_tokens shape "
                f"{tuple(self.inputs.target_tokens.shape)}"
            )
        return self.spec.fn(logprobs, self.inputs)


def validate(
    loss_fn: str,
    loss_fn_config: Mapping[str, float | str] | None,
    data: Sequence[Datum],
    vocab_size: int,
) -> ValidatedLoss:
    """Check a request's loss and data; return it ready to compute (on CPU; see ``to``).

    Raises:
        UserError: unknown loss or config key, non-numeric or out-of-range config value, and per
            datum: missing input, wrong dtype, shape or length not matching ``model_input``,
            non-finite float values (NaN is allowed only where the loss says so), token ids
            outside ``[0, vocab_size)``, or top-K width differing between datums.
    """
    spec = get_loss(loss_fn)
    config = resolve_config(spec, loss_fn_config)
    arrays = [datum_arrays(i, datum, spec, vocab_size) for i, datum in enumerate(data)]
    check_same_target_width(arrays)
    return ValidatedLoss(spec, concatenate(spec, config, arrays, [d.length for d in data]))


def resolve_config(spec: LossSpec, raw: Mapping[str, float | str] | None) -> dict[str, float]:
    """The spec's defaults overridden by ``raw``; every key known, every value a finite float."""
    config = dict(spec.config_defaults)
    for key, value in (raw or {}).items():
        field = f"loss_fn_config.{key}"
        if key not in spec.config_defaults:
            accepted = ", ".join(spec.config_defaults) or "none"
            raise user_error(field, f"unknown key for loss {spec.name!r}; accepted: {accepted}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise user_error(field, f"must be a number, got {value!r}")
        if not math.isfinite(value) or value < CONFIG_MINIMUM.get(key, -math.inf):
            raise user_error(field, f"invalid value {value!r}")
        config[key] = float(value)
    low, high = config.get("clip_low_threshold"), config.get("clip_high_threshold")
    if high is not None and (high <= 0 or (low is not None and high < low)):
        raise user_error(
            "loss_fn_config.clip_high_threshold", f"{high} must be > 0 and ≥ the low bound"
        )
    return config


def datum_arrays(
    index: int, datum: Datum, spec: LossSpec, vocab_size: int
) -> dict[str, np.ndarray]:
    """One datum's loss inputs as numpy views, after every per-datum check."""
    check_token_range(as_array(datum.tokens, "int64"), vocab_size, f"data[{index}].model_input")
    inputs = datum.loss_fn_inputs
    arrays: dict[str, np.ndarray] = {}
    for key in ("target_tokens", *spec.required_inputs):
        if key not in inputs:
            raise user_error(
                f"data[{index}].loss_fn_inputs.{key}", f"missing (required by {spec.name})"
            )
    for key in ("target_tokens", *spec.required_inputs, *spec.optional_inputs):
        if key in inputs:
            arrays[key] = checked_input(index, key, inputs[key], datum.length, spec, arrays)
    check_token_range(arrays["target_tokens"].reshape(-1), vocab_size,
                      f"data[{index}].loss_fn_inputs.target_tokens")
    if spec.check_datum is not None:
        floats = {k: torch.from_numpy(v) for k, v in arrays.items() if k != "target_tokens"}
        spec.check_datum(index, floats)
    return arrays


def checked_input(
    index: int,
    key: str,
    tensor: TensorData,
    length: int,
    spec: LossSpec,
    earlier: Mapping[str, np.ndarray],
) -> np.ndarray:
    """Dtype, shape/length, finiteness of one input; returns it shaped as a numpy view."""
    field = f"data[{index}].loss_fn_inputs.{key}"
    expected_dtype = "int64" if key == "target_tokens" else "float32"
    if tensor.dtype != expected_dtype:
        raise user_error(field, f"dtype {tensor.dtype}, expected {expected_dtype}")
    if tensor.numel != len(tensor.data):
        raise user_error(field, f"shape {list(tensor.shape)} holds {len(tensor.data)} values")
    shape = tuple(tensor.shape)
    top_k = spec.allows_2d_targets and key in TOP_K_INPUTS
    if len(shape) == 0 or len(shape) > (2 if top_k else 1) or (len(shape) == 2 and shape[1] < 1):
        expected = "[N] or [N, K]" if top_k else "[N]"
        raise user_error(field, f"shape {list(shape)}, expected {expected} with N = {length}")
    if shape[0] != length:
        raise user_error(field, f"length {shape[0]} != model_input length {length}")
    targets = earlier.get("target_tokens")
    if key == "weights" and top_k and targets is not None and targets.shape != shape:
        raise user_error(field, f"shape {list(shape)} != target_tokens shape {list(targets.shape)}")
    values = as_array(tensor.data, tensor.dtype).reshape(shape)
    if expected_dtype == "float32":
        bad = ~np.isfinite(values)
        if key in spec.nan_allowed_inputs:
            bad &= ~np.isnan(values)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise user_error(
                field, f"non-finite value {values.flat[bad.argmax()]} at position {row}"
            )
    return values


def as_array(data: array, dtype: str) -> np.ndarray:
    """A numpy view of an ``array`` (a converted copy if its typecode is not ``dtype``'s)."""
    return np.asarray(memoryview(data)).astype(NUMPY_DTYPE[dtype], copy=False)


def check_same_target_width(arrays: Sequence[Mapping[str, np.ndarray]]) -> None:
    """Top-K requests are concatenated, so every datum must use the same K (or none)."""
    if not arrays:
        return
    first = arrays[0]["target_tokens"].shape[1:]
    for i, datum in enumerate(arrays[1:], start=1):
        width = datum["target_tokens"].shape[1:]
        if width != first:
            raise user_error(
                f"data[{i}].loss_fn_inputs.target_tokens",
                f"per-position width {list(width)} differs from data[0]'s {list(first)}; "
                "all datums of one request must use the same K",
            )


def concatenate(
    spec: LossSpec,
    config: Mapping[str, float],
    arrays: Sequence[Mapping[str, np.ndarray]],
    lengths: Sequence[int],
) -> LossInputs:
    """Concatenate every datum's inputs; an optional input absent from some datums is filled
    with NaN where NaN means "absent", else 0 (validation made sure it is unused there)."""
    keys = ("target_tokens", *spec.required_inputs, *spec.optional_inputs)
    present = [k for k in keys if any(k in a for a in arrays)]
    columns: dict[str, torch.Tensor] = {}
    for key in present:
        fill = np.nan if key in spec.nan_allowed_inputs else 0.0
        parts = [
            a[key] if key in a else np.full(n, fill, dtype=np.float32)
            for a, n in zip(arrays, lengths, strict=True)
        ]
        dtype = np.int64 if key == "target_tokens" else np.float32
        joined = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
        columns[key] = torch.from_numpy(joined.astype(dtype, copy=False))
    offsets = tuple(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).tolist())
    datum_index_T = torch.repeat_interleave(
        torch.arange(len(lengths)), torch.tensor(list(lengths), dtype=torch.int64)
    )
    return LossInputs(
        target_tokens=columns.pop("target_tokens"),
        tensors=columns,
        config=dict(config),
        offsets=offsets,
        datum_index_T=datum_index_T,
    )
