"""Wire schemas → domain values, with the semantic checks the SDK leaves to the server.

Every check names the offending field the way the client wrote it (``data[3].loss_fn_inputs
.weights``, ``sampling_params.top_p``, ``lora_config.rank``), so a user error is actionable.
Checks against the base model (vocabulary, context length) use its `ModelInfo`.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np
from tinker import types as sdk
from tinker.types.optimizer import OptimizerConfigBase, OptimParamsBase

from loraplex.api.model_input import placed, prompt_chunks
from loraplex.config import LimitsConfig
from loraplex.domain.data import Datum
from loraplex.domain.image import ImageInput
from loraplex.domain.lora import LoraConfig
from loraplex.domain.losses import LOSS_FN_NAMES, LossFnName, is_loss_fn_name
from loraplex.domain.model import ModelInfo
from loraplex.domain.optim import AdamParams, DimuonParams, OptimParams
from loraplex.domain.sampling import SamplingParams, StopCondition
from loraplex.domain.tokens import check_token_range
from loraplex.errors import user_error

MIN_TTL_S = 1
MAX_TTL_S = 10 * 365 * 24 * 3600
MAX_NUM_SAMPLES = 1024


MAX_MODEL_SEQ_ID = 1 << 31
MAX_PAGE_LIMIT = 1000
MAX_PAGE_OFFSET = 1 << 40


def page(limit: int, offset: int) -> tuple[int, int]:
    """A list route's ``limit``/``offset``, bounded (SQLite integers are 64-bit)."""
    if not 0 <= limit <= MAX_PAGE_LIMIT:
        raise user_error("limit", f"must be in [0, {MAX_PAGE_LIMIT}], got {limit}")
    if not 0 <= offset <= MAX_PAGE_OFFSET:
        raise user_error("offset", f"must be in [0, 2^40], got {offset}")
    return limit, offset


def unix_time(value: float | None, field: str) -> float | None:
    """A finite, non-negative Unix time (or None)."""
    if value is not None and not (math.isfinite(value) and 0 <= value < 1e11):
        raise user_error(field, f"expected Unix seconds, got {value}")
    return value

MAX_SEED = (1 << 63) - 1


def model_seq_id(value: int, field: str = "model_seq_id") -> int:
    """A session's n-th model: part of the model id, so bounded like the SDK's counter."""
    if not 0 <= value < MAX_MODEL_SEQ_ID:
        raise user_error(field, f"must be in [0, 2^31), got {value}")
    return value


def lora_config(config: sdk.LoraConfig | None, field: str = "lora_config") -> LoraConfig:
    if config is None:
        raise user_error(field, "required (rank, train_attn, train_mlp, train_unembed)")
    if config.rank < 1:
        raise user_error(f"{field}.rank", f"must be ≥ 1, got {config.rank}")
    if config.seed is not None and not 0 <= config.seed <= MAX_SEED:
        raise user_error(f"{field}.seed", f"must be in [0, 2^63), got {config.seed}")
    return LoraConfig(rank=config.rank, train_attn=config.train_attn, train_mlp=config.train_mlp,
                      train_unembed=config.train_unembed, seed=config.seed)


def optimizer_config(config: sdk.AdamOptimizerConfig | OptimizerConfigBase | None,
                     field: str = "optimizer_config") -> dict[str, Any]:
    """The run's optimizer family as get_info echoes it: ``{"type": "adamw"}`` (also for None)
    or ``{"type": "dimuon", "version": 1}``; anything else is refused by name."""
    if config is None:
        return {"type": "adamw"}
    kind = getattr(config, "type", None)
    extra = dict(config.model_extra or {})
    if kind == "adamw" and not extra:
        return {"type": "adamw"}
    if kind == "dimuon":
        version = extra.pop("version", 1)
        if version != 1 or isinstance(version, bool):
            raise user_error(f"{field}.version", f"Dimuon version {version!r} is not "
                             "supported (only 1)")
        if not extra:
            return {"type": "dimuon", "version": 1}
    if kind in ("adamw", "dimuon"):
        raise user_error(f"{field}.{sorted(extra)[0]}", f"not a field of the {kind} config")
    raise user_error(f"{field}.type", f"optimizer {kind!r} is not supported ('adamw' or "
                     "'dimuon')")


def optim_params(params: sdk.AdamParams | OptimParamsBase, family: str) -> OptimParams:
    """A step's hyper-parameters, which must name the family the run was created with."""
    parsed: OptimParams
    if isinstance(params, sdk.AdamParams):
        parsed = AdamParams(params.learning_rate, params.beta1, params.beta2, params.eps,
                            params.weight_decay, params.grad_clip_norm).validate("adam_params")
    elif getattr(params, "type", None) == "dimuon":
        parsed = dimuon_params(dict(params.model_extra or {}))
    else:
        kind = getattr(params, "type", type(params).__name__)
        raise user_error("optimizer_params.type", f"optimizer {kind!r} is not supported "
                         "(AdamParams or DimuonParams)")
    if parsed.family != family:
        sent = "AdamParams" if parsed.family == "adamw" else "DimuonParams"
        wanted = "AdamParams" if family == "adamw" else "DimuonParams"
        raise user_error("adam_params" if parsed.family == "adamw" else "optimizer_params.type",
                         f"this model was created with the {family!r} optimizer: send "
                         f"{wanted}, not {sent}")
    return parsed


def dimuon_params(fields: dict[str, Any], field: str = "optimizer_params") -> DimuonParams:
    """`DimuonParams` from the wire's ``optimizer_params`` (``learning_rate`` required; the
    later API reference's ``damping`` and ``rank_lr_correction_exponent`` taken when sent)."""
    names = {f.name for f in dataclasses.fields(DimuonParams)}
    for name, value in fields.items():
        if name not in names:
            raise user_error(f"{field}.{name}", "not a field of DimuonParams")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise user_error(f"{field}.{name}", f"must be a number, got {value!r}")
    if "learning_rate" not in fields:
        raise user_error(f"{field}.learning_rate", "required")
    return DimuonParams(**{k: float(v) for k, v in fields.items()}).validate(field)


def ttl_seconds(value: int | None, field: str = "ttl_seconds") -> int | None:
    if value is not None and not MIN_TTL_S <= value <= MAX_TTL_S:
        raise user_error(field, f"must be between {MIN_TTL_S} s and 10 years, got {value}")
    return value


def prompt_tokens(prompt: sdk.ModelInput, info: ModelInfo, field: str = "prompt",
                  limits: LimitsConfig | None = None, decoded: bool = False
                  ) -> tuple[array[int], tuple[ImageInput, ...]]:
    """A prompt's token array (each image a run of the model's placeholder token) and its
    images (`model_input`; ``decoded``: its images were decoded off the event loop already)."""
    text, chunks = prompt_chunks(prompt, field, limits or LimitsConfig(), decode=not decoded)
    check_token_range(text, info.vocab_size, field)  # before packing: past int64 cannot pack
    tokens, images = placed(chunks, text, info)
    if not tokens:
        raise user_error(field, "empty prompt")
    check_tokens(tokens, info, field)  # before packing: an id past int64 cannot be packed
    return tokens, images


def check_tokens(tokens: Sequence[int], info: ModelInfo, field: str) -> None:
    """Every id in the vocabulary and the sequence within the model's context."""
    check_token_range(tokens, info.vocab_size, field)
    if len(tokens) > info.max_context:
        raise user_error(field, f"{len(tokens)} tokens exceed the context of {info.max_context}")


def sampling_params(params: sdk.SamplingParams, num_samples: int,
                    field: str = "sampling_params") -> SamplingParams:
    """SDK ``stop``: None → EOS; ``[]`` → nothing (not even EOS); strings or token ids → those
    plus EOS (vLLM's convention; pass ``[]`` to sample past EOS)."""
    if not 1 <= num_samples <= MAX_NUM_SAMPLES:
        raise user_error("num_samples", f"must be in [1, {MAX_NUM_SAMPLES}], got {num_samples}")
    stop = params.stop
    if stop is None:
        condition = StopCondition()
    elif isinstance(stop, str):
        condition = StopCondition(strings=(stop,))
    elif len(stop) == 0:
        condition = StopCondition(use_eos=False)
    elif all(isinstance(s, str) for s in stop):
        condition = StopCondition(strings=tuple(str(s) for s in stop))
    elif all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        condition = StopCondition(token_ids=tuple(int(s) for s in stop))
    else:
        raise user_error(f"{field}.stop", "a string, a list of strings or a list of token ids")
    return SamplingParams(max_tokens=params.max_tokens, temperature=float(params.temperature),
                          top_k=params.top_k, top_p=float(params.top_p), seed=params.seed,
                          stop=condition).validate(field)


def loss_fn_name(name: str) -> LossFnName:
    if not is_loss_fn_name(name):
        raise user_error("loss_fn", f"unknown loss {name!r}; known: {list(LOSS_FN_NAMES)}")
    return name


def check_datums(data: Sequence[Datum], info: ModelInfo, aligned: bool = True) -> None:
    """Structural checks every engine would make: tokens in the vocabulary and context, loss
    inputs aligned with the tokens (only ``target_tokens`` unless ``aligned``: a custom
    loss's inputs have the shapes its author declared) and finite."""
    if not data:
        raise user_error("data", "no datums")
    for i, datum in enumerate(data):
        where = f"data[{i}]"
        if datum.length == 0:
            raise user_error(f"{where}.model_input", "empty")
        check_tokens(datum.tokens, info, f"{where}.model_input")
        for name, t in datum.loss_fn_inputs.items():
            field = f"{where}.loss_fn_inputs.{name}"
            if (aligned or name == "target_tokens") and (
                    not t.shape or t.shape[0] != datum.length):
                raise user_error(field, f"shape {list(t.shape)} is not aligned with the "
                                 f"{datum.length} model_input tokens")
            if t.dtype == "float32":
                bad = np.flatnonzero(~np.isfinite(np.frombuffer(t.data, dtype=np.float32)))
                if bad.size:
                    k = int(bad[0])
                    raise user_error(f"{field}[{k}]", f"non-finite value {t.data[k]}")
            elif name == "target_tokens":
                check_token_range(t.data, info.vocab_size, field)
