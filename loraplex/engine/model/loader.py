"""Turning an `EngineConfig` and a model directory into a ready `Transformer`.

Resolves ``device``/``dtype`` ``auto`` (CUDA + bf16 when a GPU is present, CPU + fp32
otherwise), parses the spec, loads the safetensors and builds the compute options. On CPU the
compute dtype is float32 and ``dtype`` decides what the packed kernel's weights are held in
(`weight_storage`): ``bfloat16`` holds them in bfloat16 (rounded once where they are not
bfloat16 values), ``auto`` does so only where that changes no bit (a bf16 checkpoint), and
either falls back to float32, logged, where the kernel is not available.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from loraplex.config import EngineConfig
from loraplex.engine.kernels.attention_kernel import attention_kernel
from loraplex.engine.kernels.gemm_order import gemm_kernel
from loraplex.engine.model.checkpoint import load_vision_weights, load_weights
from loraplex.engine.model.compute_options import RANK_MULTIPLE, ComputeOptions
from loraplex.engine.model.gguf_weights import gguf_file_of, load_gguf_weights
from loraplex.engine.model.row_quantum import row_quantum
from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.model.stage import Stage, plan_stages
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.model.vision import VisionTower
from loraplex.engine.model.weight_storage import exact_in, store_in
from loraplex.engine.model.weights import BaseWeights
from loraplex.errors import user_error

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise user_error("engine.device", f"{name} requested but CUDA is not available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype: ``auto`` is bfloat16 on CUDA and float32 on CPU; on CPU, bfloat16
    means float32 compute on bfloat16 weights (`weight_storage`)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise user_error("engine.dtype", f"unknown {name!r}; known: auto, {sorted(DTYPES)}")
    if device.type == "cpu" and DTYPES[name] == torch.bfloat16:
        return torch.float32
    return DTYPES[name]


def wanted_weight_dtype(name: str, device: torch.device, dtype: torch.dtype,
                        weights: BaseWeights | None) -> torch.dtype:
    """What the packed kernel's weights should be held in (module docstring): bfloat16 on a
    CPU asked for it, or asked ``auto`` with every such weight a bfloat16 value (``weights``
    None: not known yet, float32)."""
    if device.type != "cpu" or dtype != torch.float32:
        return dtype
    if name != "auto":
        return DTYPES[name]
    exact = weights is not None and exact_in(weights, torch.bfloat16)
    return torch.bfloat16 if exact else torch.float32


def compute_options(config: EngineConfig, spec: ModelSpec, device: torch.device,
                    dtype: torch.dtype, weight_dtype: torch.dtype | None = None
                    ) -> ComputeOptions:
    """The compute options; in batch-invariant mode the row multiple is the smallest of
    ``config.row_multiple``, 2×, 4×, … whose padded GEMMs keep a row's bits on this machine at
    the model's inner dimensions (`row_quantum`); the packed GEMM kernel (reading
    ``weight_dtype`` weights, float32 by default) where it gives F.linear's bits here
    (`gemm_order`), and the C attention kernel where it takes the shape."""
    if config.row_multiple < 1 or config.kv_block_size % 16:
        raise user_error("engine", "row_multiple must be ≥ 1 and kv_block_size a multiple of 16")
    multiple = config.row_multiple
    if config.batch_invariant:
        multiple = row_quantum(multiple, inner_dims(spec), device, dtype)
    gemm = attention = None
    if config.native_kernels:
        gemm = gemm_kernel(base_inner_dims(spec), device, dtype, weight_dtype or dtype)
        attention = attention_kernel(device, dtype)
        if attention is not None and not attention.supports(
                spec.num_heads, spec.num_kv_heads, spec.head_dim, config.kv_block_size):
            attention = None
    return ComputeOptions(batch_invariant=config.batch_invariant, row_multiple=multiple,
                          kv_block_size=config.kv_block_size, gemm=gemm, attention=attention,
                          recompute=config.recompute,
                          activation_memory=config.activation_memory)


def base_inner_dims(spec: ModelSpec) -> tuple[int, ...]:
    """The inner dimensions of the base linears and the head (hidden, MLP, attention output,
    a linear-attention layer's output projection, a shared expert's down projection; routed
    expert MLPs excepted: they run as grouped GEMMs)."""
    dims = [spec.hidden_size, spec.intermediate_size, spec.num_heads * spec.head_dim]
    if spec.linear is not None:
        dims.append(spec.linear.value_dim)
    if spec.experts is not None and spec.experts.shared_intermediate_size:
        dims.append(spec.experts.shared_intermediate_size)
    return tuple(d for d in dict.fromkeys(dims) if d > 0)


def inner_dims(spec: ModelSpec) -> tuple[int, ...]:
    """The inner (reduction) dimensions of the model's GEMMs: hidden, MLP, attention output,
    expert MLP, and LoRA ranks as padded (the smallest two multiples of `RANK_MULTIPLE`)."""
    dims = [*base_inner_dims(spec), RANK_MULTIPLE, 2 * RANK_MULTIPLE]
    if spec.experts is not None:
        dims.append(spec.experts.expert_intermediate_size)
    if spec.linear is not None:  # the delta rule's products (chunk rows, key width)
        dims += [spec.linear.k_head_dim, spec.linear.v_head_dim]
    return tuple(dict.fromkeys(dims))


def load_model(model_dir: str | Path, config: EngineConfig | None = None,
               stage: Stage | None = None, device: torch.device | None = None) -> Transformer:
    """Load a HF checkpoint directory (or a GGUF-backed one) as a frozen `Transformer`; with
    ``stage``, only that pipeline stage's layers (and the vocabulary on the last stage) are
    read.

    Raises:
        UserError: unsupported architecture, mismatching weights, unavailable device.
    """
    config = config or EngineConfig()
    device = device or resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    spec = ModelSpec.from_dir(model_dir)
    if stage is not None:
        spec = spec.sliced(stage)
    gguf_file = gguf_file_of(model_dir)
    if gguf_file is not None:  # a GGUF-backed directory: dequantise the file itself
        weights = load_gguf_weights(gguf_file, spec, device, dtype)
    else:
        weights = load_weights(model_dir, spec, device, dtype)
    vision = None
    if spec.vision is not None and gguf_file is None and spec.holds_embed:
        vision = VisionTower(spec.vision, load_vision_weights(model_dir, spec.vision, device,
                                                              dtype))
    options = stored_options(config, spec, device, dtype, weights)
    return Transformer(spec, weights, options, vision)


def stored_options(config: EngineConfig, spec: ModelSpec, device: torch.device,
                   dtype: torch.dtype, weights: BaseWeights) -> ComputeOptions:
    """`compute_options` with the kernel's weights held as ``engine.dtype`` asks (`store_in`,
    in place); float32 where the kernel cannot read bfloat16 here (logged if asked for)."""
    wanted = wanted_weight_dtype(config.dtype, device, dtype, weights)
    options = compute_options(config, spec, device, dtype, wanted)
    if wanted == dtype:
        return options
    if options.gemm is None:
        if config.dtype != "auto":
            log.warning("engine.dtype=%s: the packed GEMM kernel is not available here "
                        "(native_kernels=%s); the weights stay %s", config.dtype,
                        config.native_kernels, dtype)
        return compute_options(config, spec, device, dtype)
    store_in(weights, wanted)
    return options


def model_stages(model_dir: str | Path, config: EngineConfig, count: int) -> list[Stage]:
    """``count`` pipeline stages of the model, balanced by the bytes each holds: its weights
    in the compute dtype (the kernel's in bfloat16 where ``engine.dtype`` asks for it), plus
    the packed copies of the linears where the CPU's packed sgemm will run them
    (`plan_stages`: the first stage also holds an untied embedding, the last the head)."""
    spec = ModelSpec.from_dir(model_dir)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    packed = config.native_kernels and device.type == "cpu" and dtype == torch.float32
    itemsize = torch.empty((), dtype=dtype).element_size()
    stored = wanted_weight_dtype(config.dtype, device, dtype, None)  # the kernel's weights
    linear_bytes = torch.empty((), dtype=stored).element_size() * (2 if packed else 1)

    def layer_bytes(i: int) -> int:
        d, ff = spec.hidden_size, spec.intermediate_size
        attn = 2 * d * spec.q_size + 2 * d * spec.kv_size
        if spec.is_sparse(i):
            assert spec.experts is not None
            mlp = spec.experts.layer_params(d)  # grouped GEMMs: never packed
            return linear_bytes * attn + itemsize * mlp
        return linear_bytes * (attn + 3 * d * ff)

    table = spec.vocab_size * spec.hidden_size * linear_bytes // (2 if packed else 1)
    head = table * (2 if packed else 1)  # a tied embedding is the head's matrix (last stage)
    embed = 0 if spec.tie_word_embeddings else table
    return plan_stages([layer_bytes(i) for i in range(spec.num_layers)], embed, head, count)
