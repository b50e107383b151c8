"""The kernel cache: a truncated cached library (a full disk, a killed copy) is rebuilt before
it is mapped; it used to be loaded and kill the server with SIGBUS at its first call."""

from __future__ import annotations

import shutil
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
