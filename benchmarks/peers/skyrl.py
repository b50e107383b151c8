"""SkyRL tx (PyPI `skyrl`, JAX backend) as a side-by-side peer: install, start, drive, stop.

Owns the recipe that makes skyrl 0.4.0 run on a CPU-only Python 3.11 machine (its own venv, pip
from PyPI only, pinned jax/flax, the sitecustomize shim and the no-`uv` launcher in
`skyrl_compat/`); refuses to know anything about loraplex. One call does everything:

    from benchmarks.peers import skyrl
    result = skyrl.measure(model_dir, client_args=["--steps", "5"])   # dict from client_bench.py

or step by step:

    python = skyrl.install(scratch_dir)                     # idempotent; minutes the first time
    with skyrl.start(model_dir, port, scratch_dir) as server:   # waits for /api/v1/healthz
        result = run_client(python, server.base_url, server.base_model, ["--steps", "5"], out)
    # leaving the block stops the API server and its engine subprocess (one process group)

`run_client` (benchmarks/peers/client.py) runs the same script against loraplex with loraplex's
venv python. The venv lives under `<scratch_dir>/venv` (default `<repo>/.scratch/peers/skyrl`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import SCRATCH
from benchmarks.harness.server_process import ServerProcess, free_port
from benchmarks.peers.client import run_client

SKYRL_VERSION = "0.4.0"
DEFAULT_SCRATCH_DIR = SCRATCH / "peers" / "skyrl"
COMPAT_DIR = Path(__file__).resolve().parent / "skyrl_compat"

# Pins that make 0.4.0 work on cp311 (see /work/shared/reference/peers-howto.md): flax>=0.12.10
# needs jax>=0.11, and jaxlib>=0.11 has no cp311 wheels; tinker/transformers are what 0.4.0's
# ranges resolved to when it was first measured. torch is only here because peft imports it: it
# must be the CPU build (pip's configured find-links/index supplies it on this machine; on a
# clean machine point PIP_FIND_LINKS or PIP_EXTRA_INDEX_URL at a CPU wheel, or PyPI's CUDA build
# is fetched).
CONSTRAINTS = (
    "numpy<2.5",
    "torch==2.13.0",
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "tinker==0.25.0",
    "transformers==5.16.1",
)
# skyrl's own Requires-Dist (core + `tinker` + `jax` extras), installed by hand because pip would
# refuse the wheel on Python 3.11; aiohttp is imported by skyrl.tinker.extra but not declared.
REQUIREMENTS = (
    "torch", "datasets>=4.0.0", "pillow>=11.3.0", "rich>=14.1.0", "safetensors>=0.6.2",
    "tokenizers>=0.23.1", "transformers>=5.6.1,<=5.16.1", "typer>=0.17.4", "peft==0.18.1",
    "hf_transfer", "cloudpathlib>=0.23.0", "zstandard>=0.23.0", "xxhash>=3.0.0",
    "tinker>=0.25.0,<0.26.0", "fastapi[standard]", "sqlmodel", "sqlalchemy[asyncio]", "aiosqlite",
    "asyncpg", "psycopg2-binary", "jax", "jaxlib", "flax", "optax>=0.2.5", "aiohttp",
)
# Fixed shapes: without a micro-batch and a sampling batch size every new batch shape recompiles
# (12–33 s each on 2 CPU cores).
DEFAULT_BACKEND_CONFIG: dict[str, Any] = {
    "max_lora_adapters": 4,
    "max_lora_rank": 16,
    "train_micro_batch_size": 8,
    "sample_max_num_sequences": 8,
}


def _recipe_hash() -> str:
    text = json.dumps([SKYRL_VERSION, CONSTRAINTS, REQUIREMENTS, sys.version_info[:2]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _say(message: str) -> None:
    print(f"[skyrl] {message}", file=sys.stderr, flush=True)


def _run(cmd: Sequence[str], env: dict[str, str] | None = None) -> None:
    _say("$ " + " ".join(str(c) for c in cmd))
    subprocess.run(list(cmd), check=True, env=env)


def venv_python(scratch_dir: str | os.PathLike[str] = DEFAULT_SCRATCH_DIR) -> Path:
    return Path(scratch_dir) / "venv" / "bin" / "python"


def install(
    scratch_dir: str | os.PathLike[str] = DEFAULT_SCRATCH_DIR, python: str = sys.executable
) -> Path:
    """Create `<scratch_dir>/venv` with skyrl 0.4.0 + its JAX/tinker deps; return its python.

    Idempotent: a marker file records the recipe; a second call only refreshes the shim and the
    launcher (copied from `skyrl_compat/`). pip's own output shows the progress (minutes and
    ~2.3 GB the first time). `python` is the interpreter the venv is made from (3.11 or 3.12).

    Raises:
        subprocess.CalledProcessError: a pip step or the import smoke test failed.
    """
    scratch = Path(scratch_dir).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    _copy_compat_files(scratch)
    marker = scratch / "installed.json"
    py = venv_python(scratch)
    if py.exists() and install_record(scratch).get("recipe") == _recipe_hash():
        return py
    t0 = time.monotonic()
    if not py.exists():
        _say(f"[1/5] creating venv {scratch / 'venv'}")
        _run([python, "-m", "venv", str(scratch / "venv")])
    constraints = scratch / "constraints.txt"
    constraints.write_text("\n".join(CONSTRAINTS) + "\n")
    pip = [str(py), "-m", "pip", "install", "--prefer-binary"]
    _say("[2/5] installing skyrl's dependencies (jax, flax, optax, torch CPU, tinker 0.25, ...)")
    _run([*pip, "-c", str(constraints), *REQUIREMENTS])
    _say(f"[3/5] downloading the skyrl=={SKYRL_VERSION} wheel (declares Python >=3.12)")
    wheel_dir = scratch / "wheels"
    _run([str(py), "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
          "--python-version", "3.12", "-d", str(wheel_dir), f"skyrl=={SKYRL_VERSION}"])
    wheel = wheel_dir / f"skyrl-{SKYRL_VERSION}-py3-none-any.whl"
    _say("[4/5] installing it without its Python-version check")
    _run([*pip, "--no-deps", "--ignore-requires-python", str(wheel)])
    _say("[5/5] import smoke test")
    smoke = "import jax, skyrl.tinker.api, skyrl.backends.jax; print('jax', jax.__version__)"
    _run([str(py), "-c", smoke], env=server_env(scratch))
    seconds = round(time.monotonic() - t0, 1)
    record = {"recipe": _recipe_hash(), "skyrl": SKYRL_VERSION, "install_s": seconds,
              "venv_bytes": _tree_bytes(scratch / "venv")}
    marker.write_text(json.dumps(record))
    _say(f"installed in {seconds} s")
    return py


def _copy_compat_files(scratch: Path) -> None:
    (scratch / "compat").mkdir(exist_ok=True)
    shutil.copy2(COMPAT_DIR / "sitecustomize.py", scratch / "compat" / "sitecustomize.py")
    shutil.copy2(COMPAT_DIR / "run_api.py", scratch / "run_api.py")


def _tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def install_record(scratch_dir: str | os.PathLike[str] = DEFAULT_SCRATCH_DIR) -> dict[str, Any]:
    """What `install` wrote in its marker (install seconds, venv bytes), or {}."""
    marker = Path(scratch_dir) / "installed.json"
    return json.loads(marker.read_text()) if marker.exists() else {}


def server_env(scratch_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Environment for every skyrl process: the shim on PYTHONPATH, no telemetry, no hub."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(scratch_dir).resolve() / "compat")
    # COLUMNS: rich wraps skyrl's log lines at 80 columns otherwise, which breaks grepping them.
    env.update(TINKER_TELEMETRY="0", HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu", COLUMNS="240",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    return env


_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def weights_dtype(model_dir: Path) -> str:
    """The dtype of the first tensor in the model's first safetensors file (from its header)."""
    path = sorted(model_dir.glob("*.safetensors"))[0]
    with open(path, "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    first = next(v for k, v in header.items() if k != "__metadata__")
    return _SAFETENSORS_DTYPES[first["dtype"]]


def peer_model_dir(model_dir: str | os.PathLike[str], scratch_dir: str | os.PathLike[str]) -> Path:
    """`model_dir` itself, or a view of it SkyRL can load: the same files (symlinks) with a
    config.json that names the weights' dtype.

    SkyRL maps `config.dtype` to a JAX dtype and rejects `None`; transformers writes it when it
    saves a model, but configs saved on their own (loraplex's built-ins) leave it out.
    """
    source = Path(model_dir).resolve()
    config = json.loads((source / "config.json").read_text())
    if config.get("dtype") or config.get("torch_dtype"):
        return source
    digest = hashlib.sha256(str(source).encode()).hexdigest()[:12]
    view = Path(scratch_dir).resolve() / "models" / f"{source.name}-{digest}"
    view.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        link = view / item.name
        if item.name != "config.json" and not link.is_symlink():
            link.symlink_to(item)
    config["dtype"] = weights_dtype(source)
    (view / "config.json").write_text(json.dumps(config, indent=2))
    return view


def start(
    model_dir: str | os.PathLike[str],
    port: int | None = None,
    scratch_dir: str | os.PathLike[str] = DEFAULT_SCRATCH_DIR,
    backend_config: dict[str, Any] | None = None,
    ready_timeout_s: float = 300.0,
    launch_prefix: Sequence[str] = (),
) -> ServerProcess:
    """Start the SkyRL API server (+ its engine subprocess) on `model_dir`; wait for healthz.

    The base model name clients must send is `server.base_model`: the absolute `model_dir`, or
    its `peer_model_dir` view (SkyRL serves exactly one `--base-model`). Each start gets a fresh
    run dir (SQLite DB, checkpoints, server.log) under `<scratch_dir>/runs/`. Use the result as
    a context manager or call `.stop()`. `launch_prefix` goes before the command (e.g.
    `taskset -c 0-1`, inherited by the engine subprocess).

    Raises:
        RuntimeError: the server exited or did not answer healthz within `ready_timeout_s`
            (the message carries the tail of server.log).
    """
    scratch = Path(scratch_dir).resolve()
    py = venv_python(scratch)
    if not py.exists():
        raise RuntimeError(f"skyrl is not installed under {scratch}; call install() first")
    port = port or free_port()
    model = str(peer_model_dir(model_dir, scratch))
    run_dir = scratch / "runs" / time.strftime(f"%Y%m%d-%H%M%S-{port}")
    (run_dir / "ckpt").mkdir(parents=True)
    config = DEFAULT_BACKEND_CONFIG if backend_config is None else backend_config
    cmd = [*launch_prefix, str(py), str(scratch / "run_api.py"), "--base-model", model,
           "--backend", "jax", "--host", "127.0.0.1", "--port", str(port),
           "--database-url", f"sqlite:///{run_dir / 'tinker.db'}",
           "--checkpoints-base", str(run_dir / "ckpt"), "--backend-config", json.dumps(config)]
    server = ServerProcess.launch(cmd, server_env(scratch), run_dir / "server.log",
                                  base_url=f"http://127.0.0.1:{port}", base_model=model)
    _say(f"started pid {server.process.pid} on port {port}; log {run_dir / 'server.log'}")
    server.wait_ready("/api/v1/healthz", ready_timeout_s)
    return server


ENGINE_READY_LINE = "Starting background engine"


def wait_engine_loaded(server: ServerProcess, timeout_s: float = 600.0) -> float:
    """Block until the engine subprocess has loaded the model (its log says it started its
    loop); return the seconds waited. healthz answers before that, while the engine is still
    reading the weights on every core, which would slow whatever is measured meanwhile.

    Raises:
        RuntimeError: the server exited, or `timeout_s` passed.
    """
    t0 = time.monotonic()
    while ENGINE_READY_LINE not in server.log_path.read_text(errors="replace"):
        if server.process.poll() is not None or time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"SkyRL engine not loaded; {server.log_path}")
        time.sleep(1.0)
    return time.monotonic() - t0


_JIT_LINE = re.compile(
    r"JIT\s+compilation\s+for\s+(train|sample)\s+seq_len=(\d+)\s+took\s+([\d.]+)s")


def jit_compiles(log_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every JIT compile the engine logged (mode, padded seq_len, seconds), in order: the
    evidence that warm-up absorbed them and no timed round recompiled."""
    text = Path(log_path).read_text(errors="replace")
    return [{"mode": m, "seq_len": int(n), "s": float(t)} for m, n, t in _JIT_LINE.findall(text)]


def measure(
    model_dir: str | os.PathLike[str],
    client_args: Sequence[str] = (),
    scratch_dir: str | os.PathLike[str] = DEFAULT_SCRATCH_DIR,
    backend_config: dict[str, Any] | None = None,
    port: int | None = None,
) -> dict[str, Any]:
    """install → start on `model_dir` → run client_bench.py with `client_args` → stop.

    Returns client_bench.py's JSON result, plus `peer` (version, backend config, install record)
    and `server_log` (path).
    """
    py = install(scratch_dir)
    config = DEFAULT_BACKEND_CONFIG if backend_config is None else backend_config
    with start(model_dir, port, scratch_dir, config) as server:
        out = server.run_dir / "client_bench.json"
        result = run_client(py, server.base_url, server.base_model, client_args, out,
                            env=server_env(scratch_dir))
    result["peer"] = {"name": "skyrl", "version": SKYRL_VERSION, "backend": "jax",
                      "backend_config": config, "install": install_record(scratch_dir)}
    result["server_log"] = str(server.log_path)
    result["jit_compiles"] = jit_compiles(server.log_path)
    return result
