"""Turning an `EngineConfig` and a model directory into a ready `Transformer`.

Resolves ``device``/``dtype`` ``auto`` (CUDA + bf16 when a GPU is present, CPU + fp32
otherwise), parses the spec, loads the safetensors and builds the compute options.
"""

from __future__ import annotations

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
from loraplex.errors import user_error

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise user_error("engine.device", f"{name} requested but CUDA is not available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise user_error("engine.dtype", f"unknown {name!r}; known: auto, {sorted(DTYPES)}")
    return DTYPES[name]


def compute_options(config: EngineConfig, spec: ModelSpec, device: torch.device,
                    dtype: torch.dtype) -> ComputeOptions:
    """The compute options; in batch-invariant mode the row multiple is the smallest of
    ``config.row_multiple``, 2×, 4×, … whose padded GEMMs keep a row's bits on this machine at
    the model's inner dimensions (`row_quantum`); the packed GEMM kernel where it gives
    F.linear's bits here (`gemm_order`), and the C attention kernel where it takes the shape."""
    if config.row_multiple < 1 or config.kv_block_size % 16:
        raise user_error("engine", "row_multiple must be ≥ 1 and kv_block_size a multiple of 16")
    multiple = config.row_multiple
    if config.batch_invariant:
        multiple = row_quantum(multiple, inner_dims(spec), device, dtype)
    gemm = attention = None
    if config.native_kernels:
        gemm = gemm_kernel(base_inner_dims(spec), device, dtype)
        attention = attention_kernel(device, dtype)
        if attention is not None and not attention.supports(
                spec.num_heads, spec.num_kv_heads, spec.head_dim, config.kv_block_size):
            attention = None
    return ComputeOptions(batch_invariant=config.batch_invariant, row_multiple=multiple,
                          kv_block_size=config.kv_block_size, gemm=gemm, attention=attention,
                          recompute=config.recompute)


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
    return Transformer(spec, weights, compute_options(config, spec, device, dtype), vision)


def model_stages(model_dir: str | Path, config: EngineConfig, count: int) -> list[Stage]:
    """``count`` pipeline stages of the model, balanced by the bytes each holds: its weights
    in the compute dtype, plus the packed copies of the linears where the CPU's packed sgemm
    will run them (`plan_stages`: the first stage also holds an untied embedding, the last
    the head)."""
    spec = ModelSpec.from_dir(model_dir)
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    packed = config.native_kernels and device.type == "cpu" and dtype == torch.float32
    itemsize = torch.empty((), dtype=dtype).element_size()
    linear_copies = 2 if packed else 1

    def layer_bytes(i: int) -> int:
        d, ff = spec.hidden_size, spec.intermediate_size
        attn = 2 * d * spec.q_size + 2 * d * spec.kv_size
        if spec.is_sparse(i):
            assert spec.experts is not None
            mlp = spec.experts.layer_params(d)  # grouped GEMMs: never packed
            return itemsize * (linear_copies * attn + mlp)
        return itemsize * linear_copies * (attn + 3 * d * ff)

    table = itemsize * spec.vocab_size * spec.hidden_size
    head = table * linear_copies  # a tied embedding is the head's matrix, on the last stage
    embed = 0 if spec.tie_word_embeddings else table
    return plan_stages([layer_bytes(i) for i in range(spec.num_layers)], embed, head, count)
