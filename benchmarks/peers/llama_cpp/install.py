"""llama-cpp-python in its own venv, compiled from source once for this CPU.

Owns the recipe: the pinned version, the CMake flags (``GGML_NATIVE``: the host's instruction
set, AVX2 + FMA + F16C here; ``GGML_OPENMP``: OpenMP threads as torch uses; no BLAS, so its
own kernels do every matmul), the log of the build, and a marker recording the recipe so the
next run reuses the venv. Refuses to know anything about loraplex: the venv never sees it, and
loraplex's venv never sees llama.cpp.

    python = install(scratch_dir)   # minutes the first time (the C++ build), then instant
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import SCRATCH

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
DEFAULT_SCRATCH_DIR = SCRATCH / "peers" / "llama_cpp"
#: What a user who wants llama.cpp's best on this CPU passes (CMAKE_ARGS); Release is the
#: package's default build type.
CMAKE_FLAGS = ("-DGGML_NATIVE=ON", "-DGGML_OPENMP=ON", "-DGGML_BLAS=OFF",
               "-DGGML_LLAMAFILE=ON", "-DCMAKE_BUILD_TYPE=Release")
#: Ninja's progress lines (``[12/151] Building C object ...``) in pip's verbose output.
_PROGRESS = re.compile(r"^\s*\[(\d+)/(\d+)\]")


def _recipe_hash() -> str:
    """The version, flags, Python and this CPU (``-march=native`` code built on one CPU may be
    slow or illegal on another: a checkout moved to another machine rebuilds)."""
    text = json.dumps([LLAMA_CPP_PYTHON_VERSION, CMAKE_FLAGS, sys.version_info[:2],
                       cpu_id()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cpu_id() -> dict[str, str]:
    """This CPU's model name and instruction-set flags (Linux's /proc/cpuinfo; elsewhere the
    platform's processor name and no flags)."""
    try:
        info = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return {"model": platform.processor() or platform.machine(), "flags": ""}
    fields = {key.strip(): value.strip() for key, _, value in
              (line.partition(":") for line in info.splitlines())}
    return {"model": fields.get("model name", ""), "flags": fields.get("flags", "")}


def _say(message: str) -> None:
    print(f"[llama.cpp] {message}", file=sys.stderr, flush=True)


def venv_python(scratch_dir: str | os.PathLike[str] = DEFAULT_SCRATCH_DIR) -> Path:
    return Path(scratch_dir) / "venv" / "bin" / "python"


def install_record(scratch_dir: str | os.PathLike[str] = DEFAULT_SCRATCH_DIR) -> dict[str, Any]:
    """What `install` wrote in its marker (version, flags, build seconds), or {}."""
    marker = Path(scratch_dir) / "installed.json"
    return json.loads(marker.read_text()) if marker.exists() else {}


def is_installed(scratch_dir: str | os.PathLike[str] = DEFAULT_SCRATCH_DIR) -> bool:
    """The venv exists and was built by this recipe."""
    return (venv_python(scratch_dir).exists()
            and install_record(scratch_dir).get("recipe") == _recipe_hash())


def install(scratch_dir: str | os.PathLike[str] = DEFAULT_SCRATCH_DIR,
            python: str = sys.executable, jobs: int | None = None) -> Path:
    """Create ``<scratch_dir>/venv`` with llama-cpp-python built from its sdist; return its
    python. Idempotent (a marker records the recipe). The full pip/CMake output goes to
    ``<scratch_dir>/build.log``; ninja's ``[n/total]`` progress is echoed to stderr.

    Raises:
        subprocess.CalledProcessError: the build or the import check failed (see build.log).
    """
    scratch = Path(scratch_dir).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    py = venv_python(scratch)
    if is_installed(scratch):
        return py
    started = time.monotonic()
    if not py.exists():
        _say(f"[1/3] creating venv {scratch / 'venv'}")
        subprocess.run([python, "-m", "venv", str(scratch / "venv")], check=True)
    log = scratch / "build.log"
    _say(f"[2/3] building llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} from source "
         f"(CMAKE_ARGS {' '.join(CMAKE_FLAGS)}); several minutes; full log: {log}")
    env = dict(os.environ, CMAKE_ARGS=" ".join(CMAKE_FLAGS),
               CMAKE_BUILD_PARALLEL_LEVEL=str(jobs or os.cpu_count() or 1))
    _run_logged([str(py), "-m", "pip", "install", "-v", "--no-cache-dir",
                 "--no-binary", "llama-cpp-python",
                 f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], log, env)
    _say("[3/3] import check")
    check = ("import llama_cpp, json; print(json.dumps({'version': llama_cpp.__version__, "
             "'system_info': llama_cpp.llama_print_system_info().decode()}))")
    info = json.loads(subprocess.run([str(py), "-c", check], check=True, capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1])
    record = {"recipe": _recipe_hash(), "llama_cpp_python": info["version"],
              "cpu": cpu_id()["model"],
              "cmake_flags": list(CMAKE_FLAGS), "system_info": info["system_info"],
              "build_s": round(time.monotonic() - started, 1)}
    (scratch / "installed.json").write_text(json.dumps(record, indent=1) + "\n")
    _say(f"installed in {record['build_s']} s: {info['system_info']}")
    return py


def _run_logged(cmd: Sequence[str], log: Path, env: dict[str, str]) -> None:
    """Run ``cmd`` with its output in ``log``, echoing build progress about every 5 %."""
    shown = -1
    with open(log, "w") as out, subprocess.Popen(
            list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            match = _PROGRESS.match(line)
            if match:
                done, total = int(match.group(1)), int(match.group(2))
                if done * 20 // total > shown:
                    shown = done * 20 // total
                    _say(f"  compiled {done}/{total}")
    if proc.returncode != 0:
        _say(f"build failed (rc {proc.returncode}); last lines of {log}:")
        print("".join(log.read_text().splitlines(keepends=True)[-30:]), file=sys.stderr)
        raise subprocess.CalledProcessError(proc.returncode, list(cmd))
