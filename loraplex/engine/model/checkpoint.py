"""Reading and writing base-model weights as Hugging Face safetensors (single file or sharded).

Loads ``model.safetensors``, or every shard named by ``model.safetensors.index.json``, or any
``*.safetensors`` in the directory; converts to the compute dtype on the target device one
tensor at a time (a bf16 checkpoint never exists twice in fp32). Writes what
``save_pretrained`` writes, so ``transformers`` loads our built-in models.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.model.vision_spec import VisionSpec
from loraplex.engine.model.vision_weights import (
    VisionWeights,
    expected_vision_names,
    vision_from_hf,
)
from loraplex.engine.model.weights import (
    BaseWeights,
    expected_names,
    from_hf_state,
    fused_expert_layers,
)
from loraplex.errors import user_error

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
#: Tensors some checkpoints carry that the model recomputes (old Llama exports).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def shard_files(model_dir: Path) -> list[Path]:
    """The safetensors files holding the weights, in a stable order."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise user_error("model", f"{model_dir}: no *.safetensors weights")
    return files


def load_weights(
    model_dir: str | Path, spec: ModelSpec, device: torch.device, dtype: torch.dtype
) -> BaseWeights:
    """Read every tensor the spec needs; missing or unexpected tensors are errors.

    Raises:
        UserError: missing/unexpected tensor names or wrong shapes (the message names them).
    """
    model_dir = Path(model_dir)
    shards = shard_files(model_dir)
    names: set[str] = set()
    for path in shards:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            names.update(canonical for name in f.keys()  # noqa: SIM118
                         if (canonical := canonical_name(spec, name)) is not None)
    whole = spec.whole_spec
    known = expected_names(whole, fused_expert_layers(whole, names))
    wanted = expected_names(spec, fused_expert_layers(spec, names))  # a stage's: its share
    tensors: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for path in shards:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for stored in f.keys():  # noqa: SIM118 - safe_open handles are not iterable
                name = canonical_name(spec, stored)
                if name is None:
                    continue
                if name not in wanted:
                    tied_head = name == "lm_head.weight" and spec.tie_word_embeddings
                    if name not in known and not tied_head and not name.endswith(
                            IGNORED_SUFFIXES):
                        unexpected.append(name)
                    continue
                tensor = f.get_tensor(stored)  # MXFP4 blocks/scales stay integers
                tensors[name] = (tensor.to(device=device, dtype=dtype)
                                 if tensor.is_floating_point() else tensor.to(device))
    missing = sorted(known - names)
    if missing or unexpected:
        raise user_error("model", f"{model_dir}: checkpoint does not match config.json "
                                  f"(missing {missing[:5]}, unexpected {unexpected[:5]})")
    try:
        weights = from_hf_state(spec, tensors)
    except ValueError as err:  # experts whose shapes do not fit together
        raise user_error("model", f"{model_dir}: {err}") from None
    _check_shapes(spec, weights)
    return weights


def load_vision_weights(model_dir: str | Path, vision: VisionSpec, device: torch.device,
                        dtype: torch.dtype) -> VisionWeights:
    """The checkpoint's vision tower (``model.visual.*``) in ``dtype`` on ``device``."""
    wanted = expected_vision_names(vision)
    tensors: dict[str, torch.Tensor] = {}
    for path in shard_files(Path(model_dir)):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118
                if name in wanted:
                    tensors[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    return vision_from_hf(vision, tensors)


def canonical_name(spec: ModelSpec, stored: str) -> str | None:
    """A checkpoint's tensor name as `weights` spells it (``model.…``), or None for one the
    engine does not use (`Family.ignored_weights`)."""
    if stored.startswith(spec.family.ignored_weights):
        return None
    prefix = spec.weight_prefix
    if prefix != "model." and stored.startswith(prefix):
        return "model." + stored[len(prefix):]
    return stored


def stored_name(spec: ModelSpec, name: str) -> str:
    """`canonical_name`'s inverse: a `weights` name as this checkpoint spells it."""
    prefix = spec.weight_prefix
    return prefix + name[len("model."):] if name.startswith("model.") else name


def save_weights(model_dir: str | Path, spec: ModelSpec, weights: BaseWeights,
                 extra: dict[str, torch.Tensor] | None = None) -> Path:
    """Write ``model.safetensors`` with HF names (metadata ``format=pt`` as HF expects);
    ``extra``: tensors the engine does not read, written as named (a vision tower)."""
    path = Path(model_dir) / SINGLE_FILE
    state = {stored_name(spec, name): t.detach().contiguous().cpu()
             for name, t in weights.named_tensors(spec)}
    state |= {name: t.detach().contiguous().cpu() for name, t in (extra or {}).items()}
    save_file(state, str(path), metadata={"format": "pt"})
    return path


def _check_shapes(spec: ModelSpec, weights: BaseWeights) -> None:
    d, v = spec.hidden_size, spec.vocab_size
    expected: dict[str, tuple[torch.Tensor | None, tuple[int, ...]]] = {}
    for i in spec.attention_layers[:1]:
        expected[f"layers.{i}.q_proj"] = (weights.layers[i].q_proj, (spec.q_proj_size, d))
        expected[f"layers.{i}.k_proj"] = (weights.layers[i].k_proj, (spec.kv_size, d))
    for i in spec.linear_layers[:1]:
        linear = weights.layers[i].linear
        assert spec.linear is not None and linear is not None
        expected[f"layers.{i}.linear_attn.in_proj_qkv"] = (linear.in_proj_qkv,
                                                           (spec.linear.conv_dim, d))
        expected[f"layers.{i}.linear_attn.conv1d"] = (
            linear.conv_C_1_K, (spec.linear.conv_dim, 1, spec.linear.conv_kernel))
        expected[f"layers.{i}.linear_attn.out_proj"] = (linear.out_proj,
                                                        (d, spec.linear.value_dim))
    if spec.holds_embed:
        expected["embed"] = (weights.embed, (v, d))
    if spec.holds_head:
        expected["lm_head"] = (weights.lm_head, (v, d))
    dense = spec.dense_mlp_layers
    if dense:
        expected[f"layers.{dense[0]}.down_proj"] = (weights.layers[dense[0]].down_proj,
                                                    (d, spec.intermediate_size))
    if spec.experts is not None and spec.experts.sparse_layers:
        i, e = spec.experts.sparse_layers[0], spec.experts
        experts = weights.layers[i].experts
        assert experts is not None
        expected[f"layers.{i}.mlp.gate"] = (experts.router_E_D, (e.num_experts, d))
        expected[f"layers.{i}.mlp.experts.down_proj"] = (
            experts.down_E_D_F, (e.num_experts, d, e.expert_intermediate_size))
    for name, (tensor, shape) in expected.items():
        assert tensor is not None
        if tuple(tensor.shape) != shape:
            raise user_error("model", f"{name} has shape {tuple(tensor.shape)}, "
                                      f"config.json implies {shape}")
