"""Adapter checkpoints on disk: exact save and restore of one adapter (+ its optimizer state).

A checkpoint is a directory, created atomically: the files are written into a temporary
directory beside the destination, each fsynced, then the directory is renamed into place (and
its parent fsynced), so a reader sees either nothing or the whole checkpoint. Layout::

    <dir>/
      loraplex_adapter.json        {"format": "loraplex-adapter", "version": 1,
                                    "lora_config": {rank, alpha, train_attn, train_mlp,
                                    train_unembed, seed}, "base_model": {arch, num_layers,
                                    hidden_size, q_size, kv_size, intermediate_size,
                                    vocab_size}, "has_optimizer": bool}
      adapter_weights.safetensors  fp32, `LoraAdapter.named_parameters` names:
                                   ``<target>.lora_A`` [layers, rank, d_in],
                                   ``<target>.lora_B`` [layers, d_out, rank]
      optimizer_state.safetensors  only with the optimizer: `OptimizerState.state_dict`, i.e.
                                   ``step`` (fp32 scalar), ``exp_avg.<name>``,
                                   ``exp_avg_sq.<name>``
      adapter_config.json          only with ``peft_export``: see `peft_export`
      adapter_model.safetensors    only with ``peft_export``: see `peft_export`

Values round-trip bit for bit. A pipeline stage reads its rows of each tensor
(`lora.stage_slices`); a model-parallel group joins its stages' rows before saving, so the
files are the same as one device's. Knows nothing of training runs, tenants or the store's naming.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora import stage_slices
from loraplex.engine.lora.adapter import LoraAdapter, LoraWeights
from loraplex.engine.lora.targets import target_shape, targets_of
from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.optim.optimizer_state import OptimizerState
from loraplex.errors import ConflictError, user_error

FORMAT, VERSION = "loraplex-adapter", 1
MANIFEST = "loraplex_adapter.json"
WEIGHTS = "adapter_weights.safetensors"
OPTIMIZER = "optimizer_state.safetensors"
#: `LoraConfig` fields that must match ``expect_config`` on load (the seed only drew the init).
MATCHED_FIELDS = ("rank", "alpha", "train_attn", "train_mlp", "train_unembed")


@dataclass(frozen=True)
class LoadedAdapter:
    """What a checkpoint holds: the adapter and, when asked for, its optimizer state (the
    executor's `PreparedAdapter`: read off the engine's thread, installed on it)."""

    adapter: LoraAdapter
    optimizer: OptimizerState | None

    @property
    def config(self) -> LoraConfig:
        return self.adapter.config


def base_model_fields(spec: ModelSpec) -> dict[str, Any]:
    """The base-model shape an adapter depends on (refused on load when it differs; a
    mixture-of-experts model adds its experts' numbers and sparse layers)."""
    out: dict[str, Any] = {
        "arch": spec.arch, "num_layers": spec.num_layers, "hidden_size": spec.hidden_size,
        "q_size": spec.q_size, "kv_size": spec.kv_size,
        "intermediate_size": spec.intermediate_size, "vocab_size": spec.vocab_size}
    if spec.experts is not None:
        e = spec.experts
        out.update(num_experts=e.num_experts, expert_intermediate_size=e.expert_intermediate_size,
                   sparse_layers=list(e.sparse_layers))
    return out


def save_checkpoint(directory: str, adapter: LoraAdapter, spec: ModelSpec,
                    optimizer: OptimizerState | None,
                    extra: Callable[[str], None] | None = None) -> int:
    """Write ``adapter`` (and ``optimizer`` when given) as a new checkpoint directory.

    Args:
        directory: destination; must not exist (its parent is created if needed).
        optimizer: the optimizer state to save with it, or None for weights only.
        extra: writes more files into the temporary directory before the rename (PEFT export).

    Returns:
        Bytes written.

    Raises:
        ConflictError: ``directory`` already exists.
    """
    directory = os.path.abspath(directory)
    if os.path.lexists(directory):
        raise ConflictError(f"checkpoint directory {os.path.basename(directory)} exists",
                            field="path")
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.", suffix=".tmp", dir=parent)
    try:
        manifest = {"format": FORMAT, "version": VERSION, "lora_config": asdict(adapter.config),
                    "base_model": base_model_fields(spec), "has_optimizer": optimizer is not None}
        write_json(os.path.join(tmp, MANIFEST), manifest)
        weights = {name: p.detach().to("cpu", copy=True) for name, p in adapter.named_parameters()}
        write_safetensors(os.path.join(tmp, WEIGHTS), weights)
        if optimizer is not None:
            write_safetensors(os.path.join(tmp, OPTIMIZER), optimizer.state_dict())
        if extra is not None:
            extra(tmp)
        fsync_path(tmp)
        os.rename(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_path(parent)
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))


def load_checkpoint(directory: str, spec: ModelSpec, device: torch.device | str, *,
                    with_optimizer: bool, trainable: bool = True,
                    expect_config: LoraConfig | None = None) -> LoadedAdapter:
    """Read a checkpoint written by `save_checkpoint`.

    Args:
        with_optimizer: also restore the optimizer state (the checkpoint must have one).
        trainable: leaves that require grad (a training adapter) or frozen ones (a sampler).
        expect_config: the LoRA config the checkpoint must have (a training run's own).

    Raises:
        UserError: no checkpoint there, a different base model, a config differing from
            ``expect_config`` (field ``lora_config.<name>``), missing optimizer state, or
            tensors that do not fit.
    """
    manifest = read_manifest(directory)
    check_base_model(manifest, spec.whole_spec)
    config = LoraConfig(**manifest["lora_config"])
    if expect_config is not None:
        check_config(config, expect_config)
    tensors = read_safetensors(os.path.join(directory, WEIGHTS), device)
    if spec.stage is not None:  # a pipeline stage: the whole file checked, its rows kept
        adapter_from_tensors(spec.whole_spec, config, tensors, trainable=False)
        tensors = stage_slices.cut(spec, config, tensors)
    adapter = adapter_from_tensors(spec, config, tensors, trainable)
    optimizer = None
    if with_optimizer:
        if not manifest.get("has_optimizer"):
            raise user_error("path", "the checkpoint has no optimizer state (it was saved "
                             "with weights only)")
        named = adapter.named_parameters()
        state = stage_slices.cut(spec, config, read_safetensors(
            os.path.join(directory, OPTIMIZER), device))
        optimizer = OptimizerState.from_state_dict(state, [n for n, _ in named],
                                               [p for _, p in named])
    return LoadedAdapter(adapter, optimizer)


def read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        raise user_error("path", f"no loraplex adapter checkpoint in "
                         f"{os.path.basename(os.path.normpath(directory))}") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise user_error("path", f"unsupported checkpoint format {manifest.get('format')!r} "
                         f"version {manifest.get('version')!r}")
    return dict(manifest)


def check_base_model(manifest: Mapping[str, Any], spec: ModelSpec) -> None:
    saved, ours = manifest.get("base_model", {}), base_model_fields(spec)
    for key, value in ours.items():
        if saved.get(key) != value:
            raise user_error("path", f"the checkpoint belongs to a different base model "
                             f"({key} {saved.get(key)!r}, this model has {value!r})")


def check_config(found: LoraConfig, expected: LoraConfig) -> None:
    for name in MATCHED_FIELDS:
        if getattr(found, name) != getattr(expected, name):
            raise user_error(f"lora_config.{name}", f"the checkpoint has {name} "
                             f"{getattr(found, name)!r}, the model expects "
                             f"{getattr(expected, name)!r}")


def adapter_from_tensors(spec: ModelSpec, config: LoraConfig,
                         tensors: Mapping[str, torch.Tensor], trainable: bool) -> LoraAdapter:
    """An adapter whose leaves are ``tensors`` (checked against the config's shapes)."""
    weights, expected = {}, set()
    for target in targets_of(config, spec):
        shape = target_shape(spec, target)
        pair = []
        for which, dims in (("lora_A", shape.a_shape(config.rank)),
                            ("lora_B", shape.b_shape(config.rank))):
            name = f"{target}.{which}"
            expected.add(name)
            t = tensors.get(name)
            if t is None or tuple(t.shape) != dims or t.dtype != torch.float32:
                got = "missing" if t is None else f"{t.dtype} {list(t.shape)}"
                raise user_error(f"adapter_weights.{name}", f"{got}, expected float32 "
                                 f"{list(dims)}")
            pair.append(t.requires_grad_(trainable))
        weights[target] = LoraWeights(pair[0], pair[1], shape.layers)
    unexpected = sorted(set(tensors) - expected)
    if unexpected:
        raise user_error(f"adapter_weights.{unexpected[0]}", "not a tensor of this adapter")
    return LoraAdapter(config, weights)


def write_json(path: str, value: Any) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def write_safetensors(path: str, tensors: Mapping[str, torch.Tensor],
                      metadata: dict[str, str] | None = None) -> None:
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=metadata)
    fsync_path(path)


def read_safetensors(path: str, device: torch.device | str) -> dict[str, torch.Tensor]:
    try:
        return load_file(path, device=str(device))
    except (OSError, SafetensorError) as err:
        # An OSError's text holds the absolute server path: name only the file and the cause.
        cause = err.strerror if isinstance(err, OSError) else str(err)
        raise user_error("path", f"unreadable checkpoint file {os.path.basename(path)}: "
                         f"{cause}") from None


def fsync_path(path: str) -> None:
    """fsync a file or a directory (a rename is durable once its directory is synced)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
