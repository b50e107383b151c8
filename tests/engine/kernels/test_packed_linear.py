"""The packed sgemm kernel against F.linear (MKL), bit for bit, and its build and fallbacks.

Runs wherever the kernel can be built (a C compiler and a CPU with AVX2+FMA or AVX-512, as on
the CI machines, where a missing kernel is a failure, not a skip: `test_kernel_builds_here`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from loraplex.engine.kernels import native_library
from loraplex.engine.kernels.gemm_order import SOURCE, candidate_blocks, gemm_kernel, matching_block
from loraplex.engine.kernels.packed_linear import FrozenLinear, GemmKernel
from tests.engine.threads import one_thread  # noqa: F401  (autouse)

CPU = torch.device("cpu")


def _cpu_has_vector_fma() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512f" in flags or ("avx2" in flags and " fma" in flags)


BUILDABLE = shutil.which("cc") is not None and _cpu_has_vector_fma()


@pytest.fixture(scope="module")
def kernel() -> GemmKernel:
    found = gemm_kernel((64, 96, 300, 576, 1536), CPU, torch.float32)
    if found is None:
        pytest.skip("the packed GEMM kernel is not available on this machine")
    return found


@pytest.mark.skipif(not BUILDABLE, reason="needs cc and a CPU with AVX2+FMA or AVX-512")
def test_kernel_builds_here_and_matches_mkl_at_the_real_models_dims() -> None:
    """Where it can be built, it is, and it takes the base GEMMs of SmolLM2 (576, 1536), the
    built-in models (512, 1536; 64, 96) and Qwen3 sizes (1024, 2048, 3072, 4096)."""
    dims = (64, 96, 512, 576, 1024, 1536, 2048, 3072, 4096)
    found = gemm_kernel(dims, CPU, torch.float32)
    assert found is not None
    assert sorted(found.blocks) == sorted(dims)


def test_bits_equal_f_linear_at_any_rows_columns_and_threads(kernel: GemmKernel) -> None:
    """Row counts that MKL runs on its main kernel (multiples of 4), partial panels, a lone
    last panel, one and two threads: every output is F.linear's, bit for bit. (MKL's edge
    kernels, for 1–3 rows or a row count's remainder past a multiple of 4, and for fewer than
    16 outputs, sum otherwise: batch-invariant mode pads rows to 8, and `FrozenLinear` leaves
    weights of < 16 outputs to F.linear.)"""
    gen = torch.Generator().manual_seed(0)
    for inner in (64, 300, 576, 1536):
        block = kernel.blocks[inner]
        for out_features in (16, 17, 40, 1000):
            w = torch.randn(out_features, inner, generator=gen)
            panels = kernel.pack(w)
            for rows in (4, 8, 12, 36, 300):
                x = torch.randn(rows, inner, generator=gen)
                want = F.linear(x, w)
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    got = kernel.matmul(x, panels, out_features, block)
                    assert torch.equal(got, want), (inner, out_features, rows, threads)
    torch.set_num_threads(1)


def test_a_row_has_the_same_bits_in_any_batch(kernel: GemmKernel) -> None:
    """The kernel computes each row alike wherever it sits (MKL needs rows padded to 8)."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(200, 576, generator=gen)
    x = torch.randn(37, 576, generator=gen)
    panels = kernel.pack(w)
    alone = kernel.matmul(x[5:6], panels, 200, kernel.blocks[576])
    for start, stop in ((0, 37), (5, 12), (3, 6)):
        batch = kernel.matmul(x[start:stop], panels, 200, kernel.blocks[576])
        assert torch.equal(batch[5 - start], alone[0])


def test_the_order_check_rejects_a_wrong_block(kernel: GemmKernel) -> None:
    """Summing in one block, or in the wrong blocks, changes bits: the loader's check can
    fail, and the block it picks is the one that matches."""
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(64, 576, generator=gen)
    x = torch.randn(16, 576, generator=gen)
    want = F.linear(x, w)
    panels = kernel.pack(w)
    right = kernel.blocks[576]
    assert matching_block(kernel, 576) == right
    assert torch.equal(kernel.matmul(x, panels, 64, right), want)
    for wrong in (576, 288, 64):
        assert wrong != right
        assert not torch.equal(kernel.matmul(x, panels, 64, wrong), want)
    assert candidate_blocks(576)[0] == 192 and candidate_blocks(300)[0] == 150


def test_frozen_linear_forward_equals_f_linear_and_its_backward_is_right(
        kernel: GemmKernel) -> None:
    """Forward bitwise; the input gradient (the kernel reading the weight unpacked) within
    fp32 rounding of torch's: 576 inputs (whole panels: the kernel) and 300 (torch.mm)."""
    gen = torch.Generator().manual_seed(3)
    for inner in (576, 300):
        w = torch.randn(96, inner, generator=gen)
        linear = FrozenLinear(w, kernel)
        assert linear.is_packed and linear.nbytes_packed() == 96 * inner * 4
        x = torch.randn(24, inner, generator=gen, requires_grad=True)
        grad = torch.randn(24, 96, generator=gen)
        (ours,) = torch.autograd.grad(linear(x), x, grad)
        (theirs,) = torch.autograd.grad(F.linear(x, w), x, grad)
        assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max()
        with torch.no_grad():
            assert torch.equal(linear(x), F.linear(x, w))


def test_unpacked_matmul_reads_a_row_major_matrix_as_panels(kernel: GemmKernel) -> None:
    """``x · w`` for ``w [K, O]`` as it is: every output width a multiple of the panel, odd
    panel counts, rows past a micro-kernel block, two threads."""
    gen = torch.Generator().manual_seed(4)
    for out_features in (kernel.lanes, 3 * kernel.lanes, 40 * kernel.lanes):
        w = torch.randn(700, out_features, generator=gen)
        for rows in (1, 13, 300):
            x = torch.randn(rows, 700, generator=gen)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                got = kernel.matmul_unpacked(x, w)
                want = x.double().mm(w.double())
                assert (got.double() - want).abs().max() <= 1e-4 * want.abs().max()
    torch.set_num_threads(1)


def test_frozen_linear_falls_back_where_the_kernel_does_not_apply(kernel: GemmKernel) -> None:
    """An inner dim the check did not accept, another dtype, or no kernel: F.linear."""
    unchecked = FrozenLinear(torch.randn(8, 100), kernel)
    assert 100 not in kernel.blocks and not unchecked.is_packed
    assert not FrozenLinear(torch.randn(32, 576, dtype=torch.float64), kernel).is_packed
    assert not FrozenLinear(torch.randn(32, 576), None).is_packed
    assert not FrozenLinear(torch.randn(15, 576), kernel).is_packed  # MKL's narrow path
    x = torch.randn(3, 100)
    assert torch.equal(unchecked(x), F.linear(x, unchecked.weight))


def test_no_compiler_means_no_kernel_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("PATH", str(tmp_path))
    built = native_library.load(SOURCE)
    assert built.handle is None and "no C compiler" in built.reason


def test_a_failing_compiler_means_no_kernel_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc 0.0'\n[ \"$1\" = --version ] && exit 0\n"
                      "echo 'boom: no such target' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    monkeypatch.setenv("LORAPLEX_KERNEL_CACHE", str(tmp_path / "cache"))
    built = native_library.load(SOURCE)
    assert built.handle is None and "boom: no such target" in built.reason
    assert not list((tmp_path / "cache").glob("*"))  # no half-written library left behind


@pytest.mark.skipif(not BUILDABLE, reason="needs cc and a CPU with AVX2+FMA or AVX-512")
def test_build_is_cached_per_source_compiler_and_cpu(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("LORAPLEX_KERNEL_CACHE", str(tmp_path))
    first = native_library.load(SOURCE)
    assert first.handle is not None and first.path is not None
    assert first.path.parent == tmp_path and first.path.name.startswith("packed_gemm-")
    stamp = first.path.stat().st_mtime_ns
    again = native_library.load(SOURCE)
    assert again.path == first.path and first.path.stat().st_mtime_ns == stamp  # not rebuilt


@pytest.mark.skipif(not BUILDABLE or not sys.platform.startswith("linux"),
                    reason="reads /proc/self/maps; needs the kernel")
def test_the_kernel_runs_on_torchs_openmp_runtime() -> None:
    """Loaded after torch, the library binds to torch's libgomp (same soname): one OpenMP
    runtime in the process, so no second set of thread pools."""
    script = ("import json, torch\n"
              "from loraplex.engine.kernels.gemm_order import gemm_kernel\n"
              "torch.set_num_threads(2)\n"
              "assert gemm_kernel((576,), torch.device('cpu'), torch.float32) is not None\n"
              "maps = open('/proc/self/maps').read().splitlines()\n"
              "print(json.dumps(sorted({l.split()[-1] for l in maps if 'gomp' in l})))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    libraries = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(libraries) == 1 and "torch" in libraries[0], libraries
