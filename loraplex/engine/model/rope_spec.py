"""`RopeSpec`: the rotary-embedding numbers of a base model, parsed from ``config.json``.

Three kinds, as transformers 5 computes them (`modeling_rope_utils`): ``default``, ``llama3``
(Llama 3.1's frequency-dependent scaling) and ``yarn`` (gpt-oss: NTK-by-parts interpolation
plus a cos/sin ``attention_factor``); ``partial_rotary_factor`` rotates the first part of each
head only (Qwen3.5: a quarter). Both the transformers 4.x (``rope_theta`` + ``rope_scaling``)
and 5.x (``rope_parameters``) layouts are read. Knows no tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from loraplex.errors import user_error

RopeKind = Literal["default", "llama3", "yarn"]


@dataclass(frozen=True)
class RopeSpec:
    """Rotary position embedding parameters.

    Attributes:
        theta: base wavelength.
        kind: ``default``, ``llama3`` or ``yarn``.
        factor, low_freq_factor, high_freq_factor, original_max_position: llama3 and yarn
            scaling parameters (unused for ``default``).
        beta_fast, beta_slow, truncate: yarn's correction range.
        attention_factor: yarn's cos/sin multiplier (1 otherwise).
        partial_rotary_factor: the fraction of each head's dimensions that rotates (the first
            ones; the rest pass through).
        mrope_section: multimodal rotary (Qwen3-VL, Qwen3.5): frequencies per (time, row,
            column) axis, interleaved (transformers' ``mrope_interleaved``); None: one axis.
    """

    theta: float
    kind: RopeKind = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0
    partial_rotary_factor: float = 1.0
    mrope_section: tuple[int, int, int] | None = None

    def rotary_dim(self, head_dim: int) -> int:
        """Dimensions of a head that rotate (transformers: ``int(head_dim * factor)``)."""
        return int(head_dim * self.partial_rotary_factor)


def rope_of(config: Mapping[str, Any], max_pos: int) -> RopeSpec:
    """The config's rope parameters (either layout); unknown kinds name the key."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    partial = float(params.get("partial_rotary_factor",
                               config.get("partial_rotary_factor", 1.0)) or 1.0)
    if not 0 < partial <= 1:
        raise user_error("config.partial_rotary_factor", f"must be in (0, 1], got {partial}")
    if kind == "default":
        return RopeSpec(theta=theta, partial_rotary_factor=partial,
                        mrope_section=_mrope_section(params))
    original = int(params.get("original_max_position_embeddings", max_pos))
    if kind == "llama3":
        return RopeSpec(theta=theta, kind="llama3", factor=float(params["factor"]),
                        low_freq_factor=float(params["low_freq_factor"]),
                        high_freq_factor=float(params["high_freq_factor"]),
                        original_max_position=original, partial_rotary_factor=partial)
    if kind == "yarn":
        return _yarn(params, theta, original, max_pos, partial)
    raise user_error("config.rope_parameters.rope_type",
                     f"unsupported {kind!r}; supported: default, llama3, yarn")


def _mrope_section(params: Mapping[str, Any]) -> tuple[int, int, int] | None:
    section = params.get("mrope_section")
    if section is None:
        return None
    if len(section) != 3 or not all(isinstance(n, int) and n >= 0 for n in section):
        raise user_error("config.rope_parameters.mrope_section",
                         f"expected 3 frequency counts (time, row, column), got {section}")
    t, h, w = section
    return (t, h, w)


def _yarn(params: Mapping[str, Any], theta: float, original: int, max_pos: int,
          partial: float) -> RopeSpec:
    """transformers' ``_compute_yarn_parameters`` numbers (the tensors are `rope`'s)."""
    factor = params.get("factor")
    factor = float(factor) if factor is not None else max_pos / original
    attention = params.get("attention_factor")
    if attention is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all:
            attention = _mscale(factor, float(mscale)) / _mscale(factor, float(mscale_all))
        else:
            attention = _mscale(factor)
    return RopeSpec(theta=theta, kind="yarn", factor=factor, original_max_position=original,
                    beta_fast=float(params.get("beta_fast") or 32),
                    beta_slow=float(params.get("beta_slow") or 1),
                    truncate=bool(params.get("truncate", True)),
                    attention_factor=float(attention), partial_rotary_factor=partial)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
