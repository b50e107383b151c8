"""Machine probes recorded by every benchmark: load average, GEMM FLOP/s, memory bandwidth.

Absolute times on shared 2-core machines swing 3–7× with contention (perf-anchors §4), so each
benchmark records these in the same run and reports ratios; the roofline probe also gives the
denominator of `roofline_fraction`.
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
        copy_gbps=2 * src.numel() * 4 / copy_s / 1e9,
        torch_version=torch.__version__,
        cpu=platform.processor() or platform.machine(),
    )
