"""The kernel cache and builds: a truncated cached library (a full disk, a killed copy) is
rebuilt before it is mapped (it used to be loaded and kill the server with SIGBUS at its first
call); both kernels build with ``-Wall -Wextra -Werror``; the kernel tests pass with the kernels
built under AddressSanitizer and UndefinedBehaviorSanitizer."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loraplex.engine.kernels import native_library

SOURCE = Path(native_library.__file__).with_name("packed_gemm.c")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                              reason="no C compiler")


@needs_cc
def test_a_truncated_cached_library_is_rebuilt_not_loaded(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setenv("LORAPLEX_KERNEL_CACHE", str(tmp_path))
    first = native_library.load(SOURCE)
    assert first.handle is not None and first.path is not None
    built = first.path.read_bytes()
    assert (tmp_path / f"{first.path.name}.sha256").is_file()
    # A second cache with the same file cut in half, as a killed copy leaves it (a fresh
    # directory: the first library stays mapped in this process and must not change).
    other = tmp_path / "other"
    other.mkdir()
    (other / first.path.name).write_bytes(built[: len(built) // 2])
    (other / f"{first.path.name}.sha256").write_text(
        (tmp_path / f"{first.path.name}.sha256").read_text())
    monkeypatch.setenv("LORAPLEX_KERNEL_CACHE", str(other))
    again = native_library.load(SOURCE)
    assert again.handle is not None and again.path == other / first.path.name
    assert len(again.path.read_bytes()) == len(built), "rebuilt whole"
    assert int(again.handle.lp_lanes()) >= 0  # callable: not a truncated mapping


KERNEL_SOURCES = ("packed_gemm.c", "paged_attention.c")
#: What the sanitizer run repeats: every entry point, both variants, both input kinds.
SANITIZED_TESTS = ("test_kernel_inputs.py", "test_avx2_variant.py", "test_attention_backward.py",
                   "test_gemm_paths.py")


@needs_cc
@pytest.mark.parametrize("variant", [(), ("-mno-avx512f",), ("-DLP_WEIGHT_BF16",),
                                     ("-mno-avx512f", "-DLP_WEIGHT_BF16")],
                         ids=["native", "avx2", "native-bf16", "avx2-bf16"])
def test_the_kernels_build_warning_free(tmp_path: Path, variant: tuple[str, ...]) -> None:
    """``-Wall -Wextra -Werror`` on both kernels, as this machine builds them and as a CPU
    without AVX-512 does, with float32 and with bfloat16 weights."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler is not None
    for name in KERNEL_SOURCES:
        done = subprocess.run([compiler, *native_library.FLAGS, *variant, "-Wall", "-Wextra",
                               "-Werror", "-o", str(tmp_path / f"{name}.so"),
                               str(SOURCE.with_name(name))], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]


def _runtime(name: str) -> str | None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    path = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True,
                          text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@needs_cc
@pytest.mark.skipif(_runtime("libasan.so") is None or _runtime("libubsan.so") is None,
                    reason="no ASan/UBSan runtime")
def test_the_kernel_tests_pass_under_address_and_undefined_sanitizers(tmp_path: Path) -> None:
    """The kernel tests that reach every entry point (GEMM and attention, forward and backward,
    AVX2 and native, valid and out-of-range inputs) in a process whose kernels are built with
    ``-fsanitize=address,undefined`` (through ``$LORAPLEX_KERNEL_FLAGS``) and the sanitizer
    runtimes preloaded: any out-of-bounds access or undefined behaviour aborts that run."""
    env = {**os.environ, "LD_PRELOAD": f"{_runtime('libasan.so')} {_runtime('libubsan.so')}",
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
           "LORAPLEX_KERNEL_CACHE": str(tmp_path),
           "LORAPLEX_KERNEL_FLAGS": "-fsanitize=address,undefined "
                                    "-fno-sanitize-recover=undefined -fno-omit-frame-pointer"}
    here = Path(__file__)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *(str(here.with_name(n)) for n in SANITIZED_TESTS)],
                          capture_output=True, text=True, env=env, timeout=900,
                          cwd=here.parents[3])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    built = sorted(p.name for p in tmp_path.glob("*.so"))
    assert len(built) >= 2, built
    for so in tmp_path.glob("*.so"):
        symbols = subprocess.run(["nm", "-D", str(so)], capture_output=True, text=True).stdout
        assert "__asan" in symbols, f"{so.name} was not built with ASan"


def test_both_kernels_take_their_vector_operations_from_one_header(tmp_path: Path) -> None:
    """packed_gemm.c and paged_attention.c define neither a vector type nor any operation of
    simd.h themselves: both include it, and a change to it changes both libraries' cache
    keys."""
    kernels = Path(native_library.__file__).parent
    header = kernels / "simd.h"
    shared = set(re.findall(r"static inline [\w ]+?\b(v_\w+)\(", header.read_text()))
    assert {"v_fma", "v_load", "v_hsum", "v_load_n"} <= shared
    for name in ("packed_gemm.c", "paged_attention.c"):
        text = (kernels / name).read_text()
        assert '#include "simd.h"' in text and "typedef __m" not in text, name
        defined = set(re.findall(r"static inline [\w ]+?\b(v_\w+)\(", text))
        assert not defined & shared, (name, defined & shared)
    copy = tmp_path / "kernels"
    shutil.copytree(kernels, copy, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    before = [native_library._with_local_headers(copy / n)
              for n in ("packed_gemm.c", "paged_attention.c")]
    (copy / "simd.h").write_text(header.read_text() + "\n/* changed */\n")
    after = [native_library._with_local_headers(copy / n)
             for n in ("packed_gemm.c", "paged_attention.c")]
    assert all(b != a for b, a in zip(before, after, strict=True))
