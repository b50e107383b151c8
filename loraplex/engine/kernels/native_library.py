"""`NativeLibrary`: a C source of this package compiled on the machine that runs it, cached.

The kernels are plain C (no torch headers, no build step at install): the first engine on a
machine compiles each of them (``packed_gemm.c``, ``paged_attention.c``; both include
``simd.h``) with the system C compiler (``$CC``, else ``cc``) and
``-O3 -march=native -fopenmp``, in well under a second, into a user cache directory
(``$LORAPLEX_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/loraplex/kernels``, else
``~/.cache/loraplex/kernels``); later processes load the cached file. The file name is a hash
of the source, the compiler's version, the flags and the CPU (its model name and feature flags,
so a cache shared by different hosts never serves one host's code to another). A new file is
written under a temporary name and renamed into place, so concurrent builders never see half
a library. Beside each library a ``.sha256`` file holds its digest, checked before the library
is loaded: a truncated or corrupted cached file (a full disk, a killed copy) is rebuilt, never
mapped (a truncated mapping dies of SIGBUS at its first call).

``-fopenmp`` links ``libgomp.so.1``; loaded into a process where torch already loaded its own
``libgomp.so.1``, the dynamic loader reuses that one (same soname), so the kernels' parallel
regions run on torch's OpenMP thread pools and no second runtime is started.

No compiler, a failed build or a CPU without AVX2/AVX-512: `load` returns None with the reason,
and the engine keeps torch's GEMMs.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

log = logging.getLogger(__name__)

FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-std=gnu11", "-shared",
         "-fPIC")


@dataclass(frozen=True)
class NativeLibrary:
    """A loaded kernel library, or why there is none.

    Attributes:
        handle: the ctypes library (None when unavailable).
        reason: why it is unavailable ("" when loaded).
        path: the shared object loaded.
    """

    handle: ctypes.CDLL | None
    reason: str = ""
    path: Path | None = None


def cache_dir() -> Path:
    """Where compiled kernels are kept (see the module docstring)."""
    explicit = os.environ.get("LORAPLEX_KERNEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "loraplex" / "kernels"


@cache
def packaged(name: str, defines: tuple[str, ...] = ()) -> NativeLibrary:
    """The package's ``name.c``, built and loaded once per process (it never changes) and per
    set of ``defines`` (extra flags such as ``-DLP_WEIGHT_BF16``: another library)."""
    return load(Path(__file__).with_name(f"{name}.c"), defines)


def vectorized(name: str, lanes_symbol: str, what: str, defines: tuple[str, ...] = ()
               ) -> tuple[ctypes.CDLL, int] | None:
    """The package's ``name.c`` (`packaged`, with ``defines``) and its vector width (its
    ``lanes_symbol()``), or None with the reason logged: it could not be built, or the CPU has
    neither AVX2+FMA nor AVX-512 (width 0). ``what`` ends the log line: what runs instead."""
    native = packaged(name, defines)
    if native.handle is None:
        log.warning("%s kernel unavailable (%s); %s", name, native.reason, what)
        return None
    lanes = int(getattr(native.handle, lanes_symbol)())
    if lanes == 0:
        log.warning("%s kernel needs AVX2+FMA or AVX-512; %s", name, what)
        return None
    return native.handle, lanes


def load(source: Path, extra_flags: tuple[str, ...] = ()) -> NativeLibrary:
    """``source`` compiled for this machine (built on first use) and loaded; ``extra_flags``
    after the usual ones (tests build the AVX2 variant with ``-mno-avx512f``), then those of
    ``$LORAPLEX_KERNEL_FLAGS`` (the warning and sanitizer builds of the tests). The flags are
    part of the cache key."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return NativeLibrary(None, "no C compiler found ($CC, cc or gcc)")
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                                 timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return NativeLibrary(None, f"{compiler} --version failed: {exc}")
    try:
        text = _with_local_headers(source)
    except OSError as exc:  # a source or header missing from the install
        return NativeLibrary(None, f"reading {source.name}: {exc}")
    flags = (*FLAGS, *extra_flags, *os.environ.get("LORAPLEX_KERNEL_FLAGS", "").split())
    key = hashlib.sha256(b"\0".join([text, version.encode(), " ".join(flags).encode(),
                                     _cpu_identity().encode()])).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    if not _intact(target):
        if target.exists():
            log.warning("cached kernel %s does not match its digest; rebuilding it", target)
        error = _build(compiler, flags, source, target)
        if error:
            return NativeLibrary(None, error)
    try:
        return NativeLibrary(ctypes.CDLL(str(target)), "", target)
    except OSError as exc:
        return NativeLibrary(None, f"loading {target} failed: {exc}")


def _digest_path(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _intact(target: Path) -> bool:
    """Whether ``target`` exists and its bytes hash to the digest written beside it."""
    try:
        expected = _digest_path(target).read_text().strip()
        return hashlib.sha256(target.read_bytes()).hexdigest() == expected
    except OSError:
        return False


def _with_local_headers(source: Path) -> bytes:
    """The source's text and that of each header it includes from its own folder
    (``#include "name.h"``): what the cache key must cover."""
    text = source.read_bytes()
    names = re.findall(rb'^#include "([^"]+)"', text, flags=re.MULTILINE)
    return b"\0".join([text, *((source.parent / n.decode()).read_bytes() for n in names)])


def _build(compiler: str, flags: tuple[str, ...], source: Path, target: Path) -> str:
    """Compile ``source`` into ``target`` atomically; an error message, or "" on success."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        return f"kernel cache {target.parent} is not writable: {exc}"
    try:
        done = subprocess.run([compiler, *flags, "-o", tmp, str(source)], capture_output=True,
                              text=True, timeout=300)
        if done.returncode != 0:
            return f"compiling {source.name} failed: {done.stderr.strip()[-2000:]}"
        digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
        fd, tmp_digest = tempfile.mkstemp(suffix=".sha256", dir=target.parent)
        with os.fdopen(fd, "w") as out:
            out.write(digest)
        os.replace(tmp_digest, _digest_path(target))  # the digest first, then the library
        os.replace(tmp, target)
        log.info("compiled %s into %s", source.name, target)
        return ""
    except (OSError, subprocess.SubprocessError) as exc:
        return f"compiling {source.name} failed: {exc}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (what -march=native compiled for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line.strip() for line in lines if line.startswith(wanted)}))
