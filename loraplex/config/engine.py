"""`EngineConfig`: the compute slice (``[engine]``), handed to the engine and its workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loraplex.config.checks import check_at_least_one as _check_at_least_one
from loraplex.errors import user_error


@dataclass(frozen=True)
class EngineConfig:
    """Compute settings.

    Attributes:
        device: ``cpu`` or ``cuda``; ``auto`` picks cuda when present.
        dtype: ``auto``, ``float32``, ``bfloat16`` (``float16``). On CUDA the compute dtype
            (``auto``: bfloat16). On a CPU the compute is float32 and this is what the packed
            kernel's weights are held in: ``bfloat16`` halves their bytes (results are the
            float32 engine's on the weights rounded to bfloat16), ``auto`` does so only where
            no bit changes (the weights are bfloat16 values already, as in a bf16 checkpoint).
        max_lora_rank: largest rank a client may ask for.
        batch_invariant: pad GEMM rows and tile attention so a token's logprob does not depend
            on what else shares the batch, nor on decode vs full forward (bitwise).
        row_multiple: GEMM row counts are padded to a multiple of this in batch-invariant mode.
        kv_block_size: keys per attention block and per KV-cache page.
        kv_cache_blocks: pages in the sampler's KV cache (bounds sampler memory); None: as
            many as ``kv_cache_memory`` holds.
        kv_cache_memory: bytes of the sampler's KV cache when ``kv_cache_blocks`` is None
            (None: a tenth of the device's memory, host RAM on a CPU, and at most 131,072
            positions; `engine.sampling.kv_budget`).
        recompute: activation recomputation in training. ``layer``: keep each decoder
            layer's input only and recompute the layer's inside in the backward (the same
            bits; on SmolLM2 a 8,192-token step's activations go from ~20 GB to ~1 GB, and a
            2,048-token step takes ~1.2× as long: one more forward); ``none``: keep every
            activation; ``auto``: keep the activations of as many layers as
            ``activation_memory`` holds (by the model's bytes per row and layer) and
            recompute the others. The bits are the same in every mode.
        activation_memory: bytes of kept activations a training forward may use with
            ``recompute = auto`` (0: recompute every layer).
        max_context: longest sequence accepted (None: the model's own limit).
        num_threads: torch intra-op threads (None: torch's default).
        retain_host_memory: keep freed host memory in the process for the next step's tensors
            instead of returning it to the OS and faulting it in again (glibc malloc; see
            `engine.host_allocator`); the process's memory then stays at its peak.
        adapter_memory_budget: bytes of adapter state kept on the engine's device: LoRA
            weights + gradients + AdamW moments of every resident adapter, sampler snapshots
            included. Idle adapters beyond it page out (host memory, then disk) and back in,
            bit for bit, on next use; a call whose own adapters exceed it still runs (None:
            unlimited, nothing pages).
        host_memory_budget: bytes of paged-out adapter state kept in host memory before the
            oldest spills to disk (None: unlimited; 0: page straight to disk).
        page_dir: scratch directory for paged-out adapter state; the engine writes into a
            private subdirectory it deletes on close. Never a checkpoint: its files are
            deleted and overwritten freely (None: a temporary directory).
        sample_prefill_tokens_per_step: prompt tokens the sampler prefills per step while
            sequences are decoding: a long prompt is prefilled in pieces between decode steps,
            so the running sequences and a short prompt admitted beside it are not held behind
            all of it (with nothing decoding, a step prefills as much as fits).
        sample_shared_decode_kv_tokens: while more than one tenant is sampling, the KV
            positions one tenant's decode rows may read per decode step (deficit round-robin,
            `engine.sampling.step_share`): a tenant decoding many long sequences decodes
            some of them each step instead of making every step long for everyone (0: off).
        sample_shared_prefill_tokens: while more than one tenant is sampling, prompt tokens
            prefilled per decode step (long prompts cut into pieces this small).
        sample_shared_linger_steps: decode steps a tenant still counts as sampling after its
            last sequence finished (its next request usually comes moments later).
        native_kernels: on CPU in float32, run loraplex's C kernels (`engine.kernels`, built
            with the system C compiler on first use): the packed sgemm for the base model's
            linears and head, wherever the loader finds it gives F.linear's bits on this
            machine (it keeps a packed copy of those weights: twice their memory), and the
            paged attention forward. False: torch only.
    """

    device: str = "auto"
    dtype: str = "auto"
    max_lora_rank: int = 128
    batch_invariant: bool = True
    row_multiple: int = 8
    kv_block_size: int = 64
    kv_cache_blocks: int | None = None
    kv_cache_memory: int | None = None
    recompute: Literal["auto", "none", "layer"] = "auto"
    activation_memory: int = 4 << 30
    max_context: int | None = None
    num_threads: int | None = None
    retain_host_memory: bool = True
    adapter_memory_budget: int | None = None
    host_memory_budget: int | None = None
    page_dir: str | None = None
    sample_prefill_tokens_per_step: int = 2048
    sample_shared_decode_kv_tokens: int = 16384
    sample_shared_prefill_tokens: int = 16
    sample_shared_linger_steps: int = 32
    native_kernels: bool = True

    def __post_init__(self) -> None:
        if self.num_threads is not None and self.num_threads < 1:
            raise user_error("num_threads", f"must be at least 1, got {self.num_threads}")
        for name in ("kv_cache_blocks", "kv_cache_memory"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise user_error(name, f"must be at least 1, got {value}")
        if self.recompute not in ("auto", "none", "layer"):
            raise user_error("recompute",
                             f"must be 'auto', 'none' or 'layer', got {self.recompute!r}")
        if self.activation_memory < 0:
            raise user_error("activation_memory", f"must be ≥ 0, got {self.activation_memory}")
        if self.sample_shared_decode_kv_tokens < 0:
            raise user_error("sample_shared_decode_kv_tokens",
                             f"must be ≥ 0 (0: off), got {self.sample_shared_decode_kv_tokens}")
        if self.sample_shared_linger_steps < 0:
            raise user_error("sample_shared_linger_steps",
                             f"must be ≥ 0, got {self.sample_shared_linger_steps}")
        _check_at_least_one(self, "sample_shared_prefill_tokens")
