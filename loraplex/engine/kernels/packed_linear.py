"""`GemmKernel` and `FrozenLinear`: a frozen base weight applied by the packed sgemm kernel,
with F.linear's bits.

MKL's sgemm repacks the weight on every call, which costs most at the few rows of a decode
step (27 GFLOP/s at 8 rows on an AVX-512 EPYC, where it reaches 85 on large batches).
``packed_gemm.c`` keeps each weight packed once, in panels of 16 (AVX-512) or 8 (AVX2)
outputs, and streams it through a register-blocked micro-kernel: 2–2.5× MKL's speed from 8 rows
to 2048 with AVX-512, and on AVX2 1.7× at 8 rows and MKL's speed on large batches
(`benchmarks/packed_gemm.py`). Batch invariance and the sampler/trainer logprob equality need
every GEMM of a row to give the same bits in a decode step, a prefill and a training forward;
the kernel sums each output in the order MKL does (`gemm_order`), which the loader checks on
the machine, so a weight goes through the kernel only where its bits equal F.linear's, and
mixing the two paths changes nothing.

Weights are held in the kernel's weight dtype: float32, or bfloat16 (``engine.dtype``,
`loader`): the kernel widens each bfloat16 weight to float32 as it loads it (exact) and
computes in float32 as before, so a bfloat16 weight gives the bits float32 gives on its widened
copy, with half the bytes to stream per decode step. Every other reader of such a weight widens
it too (`FrozenLinear.dense`).

The packed copy doubles the memory of the base linears (the original stays for the backward,
``dx = dy · w``, whose bits do not matter, and for F.linear wherever the kernel is not used).
``EngineConfig.native_kernels`` turns it off. CPU only.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class GemmKernel:
    """The loaded kernel library and, per inner dimension K, the block size at which it
    reproduces F.linear on this machine (K absent: that K stays on F.linear).

    Attributes:
        library: the ctypes handle of ``packed_gemm.c`` (built for ``weight_dtype``).
        lanes: outputs per panel (16 with AVX-512, 8 with AVX2).
        blocks: K → K-block size.
        weight_dtype: the dtype the library reads weights in (float32 or bfloat16); x and y
            are float32 either way.
    """

    library: ctypes.CDLL
    lanes: int
    blocks: Mapping[int, int]
    weight_dtype: torch.dtype = torch.float32

    def pack(self, weight_O_K: torch.Tensor) -> torch.Tensor:
        """``wp[p, k, l] = w[p·lanes + l, k]`` (zeros past the last output), contiguous, in
        `weight_dtype` (a float32 weight rounded to bfloat16 for a bfloat16 kernel)."""
        out_features, in_features = weight_O_K.shape
        panels = -(-out_features // self.lanes)
        padded = F.pad(weight_O_K.to(self.weight_dtype),
                       (0, 0, 0, panels * self.lanes - out_features))
        return padded.view(panels, self.lanes, in_features).transpose(1, 2).contiguous()

    def matmul(self, x_M_K: torch.Tensor, panels_P_K_L: torch.Tensor, out_features: int,
               block: int) -> torch.Tensor:
        """``x · wᵀ`` from the packed weight (no autograd): ``[M, out_features]``."""
        inner = x_M_K.shape[1]
        return self._run(x_M_K, panels_P_K_L, out_features, block, inner * self.lanes,
                         self.lanes)

    def matmul_unpacked(self, x_M_K: torch.Tensor, w_K_O: torch.Tensor) -> torch.Tensor:
        """``x · w`` for a contiguous ``[K, O]`` matrix as it is (O a multiple of `lanes`):
        its rows already hold a panel's outputs side by side. Sums in blocks of 192 (the
        backward's ``dy · w``, whose bits need not match anything)."""
        out_features = w_K_O.shape[1]
        assert out_features % self.lanes == 0 and w_K_O.is_contiguous()
        return self._run(x_M_K, w_K_O, out_features, 192, self.lanes, out_features)

    def _run(self, x_M_K: torch.Tensor, w: torch.Tensor, out_features: int, block: int,
             panel_stride: int, row_stride: int) -> torch.Tensor:
        if w.dtype != self.weight_dtype or x_M_K.dtype != torch.float32:
            raise ValueError(f"packed GEMM reads {self.weight_dtype} weights and float32 "
                             f"inputs, not {w.dtype} and {x_M_K.dtype}")
        x_M_K = x_M_K.contiguous()
        rows, inner = x_M_K.shape
        y_M_O = torch.empty(rows, out_features, dtype=x_M_K.dtype, device=x_M_K.device)
        i64 = ctypes.c_int64
        status = self.library.lp_linear(
            ctypes.c_void_p(x_M_K.data_ptr()), ctypes.c_void_p(w.data_ptr()),
            ctypes.c_void_p(y_M_O.data_ptr()), i64(rows), i64(out_features), i64(inner),
            i64(block), i64(panel_stride), i64(row_stride), i64(torch.get_num_threads()))
        if status == -2:
            raise MemoryError(f"packed GEMM: no memory for its copies (x {tuple(x_M_K.shape)})")
        if status != 0:
            raise ValueError(f"packed GEMM refused x {tuple(x_M_K.shape)}, {out_features} "
                             f"outputs, block {block}, strides {panel_stride}/{row_stride}")
        return y_M_O


#: Fewest outputs the kernel takes: MKL runs narrower GEMMs with kernels that sum otherwise.
MIN_OUT_FEATURES = 16


class FrozenLinear:
    """``x ↦ x · wᵀ`` for one frozen weight ``[out, in]``: the packed kernel when ``kernel``
    reproduces F.linear at this inner dimension (and the weight has at least
    `MIN_OUT_FEATURES` outputs and the kernel's weight dtype), else F.linear itself on the
    weight widened to the input's dtype. The kernel's rows match MKL's from 4 rows up (MKL's
    1–3-row path sums otherwise; batch-invariant mode pads rows to 8).

    Attributes:
        weight: the weight in its HF layout (what F.linear and the backward use), in the
            dtype it is held in (bfloat16 weights are widened where they are used).
    """

    def __init__(self, weight_O_I: torch.Tensor, kernel: GemmKernel | None) -> None:
        self.weight = weight_O_I
        self._kernel: GemmKernel | None = None
        self._block = 0
        self._panels: torch.Tensor | None = None
        if kernel is not None and FrozenLinear.packs(weight_O_I, kernel):
            self._kernel = kernel
            self._block = kernel.blocks[weight_O_I.shape[1]]
            self._panels = kernel.pack(weight_O_I)

    @staticmethod
    def packs(weight_O_I: torch.Tensor, kernel: GemmKernel | None) -> bool:
        """Whether a `FrozenLinear` of this weight runs on ``kernel`` (else on F.linear)."""
        return (kernel is not None and weight_O_I.device.type == "cpu"
                and weight_O_I.dtype == kernel.weight_dtype
                and weight_O_I.shape[0] >= MIN_OUT_FEATURES
                and weight_O_I.shape[1] in kernel.blocks)

    @property
    def is_packed(self) -> bool:
        return self._panels is not None

    def nbytes_packed(self) -> int:
        """Bytes of the packed copy (0 when the kernel is not used)."""
        return 0 if self._panels is None else self._panels.numel() * self._panels.element_size()

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in ``dtype`` (a bfloat16 weight widened: exact; else itself)."""
        return self.weight.to(dtype)

    def __call__(self, x_R_I: torch.Tensor) -> torch.Tensor:
        if self._kernel is None or x_R_I.dtype != torch.float32 or x_R_I.dim() != 2:
            return F.linear(x_R_I, self.dense(x_R_I.dtype))
        if torch.is_grad_enabled() and x_R_I.requires_grad:
            out: torch.Tensor = _PackedLinearFunction.apply(x_R_I, self)
            return out
        return self.forward_no_grad(x_R_I)

    def forward_no_grad(self, x_R_I: torch.Tensor) -> torch.Tensor:
        assert self._kernel is not None and self._panels is not None
        return self._kernel.matmul(x_R_I, self._panels, self.weight.shape[0], self._block)

    def input_grad(self, d_out_R_O: torch.Tensor) -> torch.Tensor:
        """``dx = dy · w``: the kernel reading the weight unpacked (no second copy) when the
        input width is a whole number of panels, else torch's matmul."""
        kernel = self._kernel
        if (kernel is not None and self.weight.shape[1] % kernel.lanes == 0
                and self.weight.is_contiguous() and d_out_R_O.dtype == torch.float32):
            return kernel.matmul_unpacked(d_out_R_O, self.weight)
        return d_out_R_O.mm(self.dense(d_out_R_O.dtype))


class _PackedLinearFunction(torch.autograd.Function):
    """The kernel's forward; the backward is ``dx = dy · w`` (the weight is frozen)."""

    @staticmethod
    def forward(ctx: Any, x_R_I: torch.Tensor, linear: FrozenLinear) -> torch.Tensor:
        ctx.linear = linear
        return linear.forward_no_grad(x_R_I)

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor) -> tuple[torch.Tensor, None]:
        linear: FrozenLinear = ctx.linear
        return linear.input_grad(d_out), None
