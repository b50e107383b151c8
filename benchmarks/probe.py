"""Machine probes recorded by every benchmark: load average, GEMM FLOP/s, memory bandwidth.

Absolute times on shared 2-core machines swing 3–7× with contention (perf-anchors §4), so each
benchmark records these in the same run and reports ratios; the roofline probe also gives the
denominator of `roofline_fraction`: the better of MKL's rate and loraplex's packed kernel's
(`best_gemm_gflops`), since the engine's base GEMMs run on the kernel where it applies.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class MachineProbe:
    """One reading of the machine's state and its measured compute and copy rates."""

    load_avg_1m: float
    load_avg_5m: float
    num_threads: int
    gemm_gflops: float
    gemm_fwd_bwd_gflops: float
    copy_gbps: float
    torch_version: str
    cpu: str
    #: the same forward through loraplex's packed kernel (0: not available, or an old result)
    packed_gemm_gflops: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_average() -> tuple[float, float]:
    one, five, _ = os.getloadavg()
    return one, five


def median_seconds(fn: Callable[[], object], repeats: int = 7, warmup: int = 2,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """Median time of `fn` after `warmup` untimed calls (wall by default; pass
    ``time.process_time`` for this process's CPU time)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def probe_machine(m: int = 4096, k: int = 512, n: int = 512, repeats: int = 7) -> MachineProbe:
    """fp32 `F.linear` M×K→N forward and fwd+bwd (frozen W) rates, a 256 MiB copy, load average."""
    import torch
    import torch.nn.functional as F

    x_M_K = torch.randn(m, k)
    w_N_K = torch.randn(n, k)
    fwd_s = median_seconds(lambda: F.linear(x_M_K, w_N_K), repeats)
    x_grad = x_M_K.clone().requires_grad_(True)

    def fwd_bwd() -> None:
        F.linear(x_grad, w_N_K).sum().backward()

    fwd_bwd_s = median_seconds(fwd_bwd, repeats)
    packed_s = _packed_seconds(x_M_K, w_N_K, repeats)
    src = torch.empty(64 * 1024 * 1024)
    dst = torch.empty_like(src)
    copy_s = median_seconds(lambda: dst.copy_(src), repeats=5, warmup=1)
    one, five = load_average()
    return MachineProbe(
        load_avg_1m=one,
        load_avg_5m=five,
        num_threads=torch.get_num_threads(),
        gemm_gflops=2 * m * k * n / fwd_s / 1e9,
        gemm_fwd_bwd_gflops=4 * m * k * n / fwd_bwd_s / 1e9,
        packed_gemm_gflops=2 * m * k * n / packed_s / 1e9 if packed_s else 0.0,
        copy_gbps=2 * src.numel() * 4 / copy_s / 1e9,
        torch_version=torch.__version__,
        cpu=platform.processor() or platform.machine(),
    )


def _packed_seconds(x_M_K: Any, w_N_K: Any, repeats: int) -> float | None:
    """The same forward through loraplex's packed sgemm kernel (`engine.kernels`), None when
    it is not available here: the engine's base GEMMs run on it, so a roofline takes the
    better of the two rates."""
    import torch

    try:  # absent at revisions from before the kernel (step_overhead's baselines)
        from loraplex.engine.kernels.gemm_order import gemm_kernel
        from loraplex.engine.kernels.packed_linear import FrozenLinear
    except ImportError:
        return None
    kernel = gemm_kernel((x_M_K.shape[1],), torch.device("cpu"), torch.float32)
    if kernel is None:
        return None
    linear = FrozenLinear(w_N_K, kernel)
    return median_seconds(lambda: linear.forward_no_grad(x_M_K), repeats)


def best_gemm_gflops(probe: MachineProbe) -> float:
    """The faster forward GEMM rate of a probe: MKL's or the packed kernel's."""
    return max(probe.gemm_gflops, probe.packed_gemm_gflops)
