"""Virtual environments the integration tests make for themselves: other SDK versions and the
cookbook run in their own interpreters, as their users' would.

Each venv lives under ``<repo>/.venvs/NAME`` (git-ignored) and is made on first use with pip
(PyPI). It is *layered* on the project's venv (the one running pytest): a ``.pth`` file appends
that venv's site-packages after the layer's own, so what the layer installs (tinker 0.27, the
cookbook) shadows the project's copies, while what it would only duplicate (torch 2.13.0+cpu,
transformers, ...) is found there and not installed a second time. The project venv's own
``.pth`` files (its editable loraplex) are not processed, so loraplex stays out of the layers.
A stamp file records the base and the install steps: a venv is kept between runs while they are
unchanged and rebuilt from scratch when they change.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENVS = REPO / ".venvs"
STAMP = "loraplex-test-venv.json"
LAYER_PTH = "loraplex-base-venv.pth"

#: torch: the SDK imports it for forward_backward_custom (found in the base venv).
SDK027_STEPS: tuple[tuple[str, ...], ...] = (("tinker==0.27.0", "torch==2.13.0"),)

#: cookbook.md §1: tinker-cookbook 0.6.1 declares tml-renderers>=0.4.1, which PyPI lacks (it is
#: imported lazily, only for Inkling/Kimi-K3.1 models), so the wheel goes in with --no-deps and
#: its other requirements explicitly; math-verify and pylatexenc are needed to import math_rl.
COOKBOOK_STEPS: tuple[tuple[str, ...], ...] = (
    ("--no-deps", "tinker-cookbook==0.6.1"),
    ("torch==2.13.0", "tinker==0.38.0", "transformers==5.24.0", "tokenizers==0.23.3",
     "datasets==5.2.0", "huggingface-hub==2.4.0", "chz==0.4.0", "math-verify==0.9.0",
     "pylatexenc==2.11", "aiohttp", "anyio", "blobfile", "cloudpickle", "numpy", "pillow",
     "pydantic", "pyrage", "rich", "safetensors", "termcolor", "tiktoken", "tqdm"),
)


def ensure_venv(name: str, steps: Sequence[Sequence[str]], check: str) -> str:
    """The python of venv ``name`` layered on the running venv, made with one
    ``pip install`` per step when missing, stale, or failing ``check`` (Python source).

    Raises:
        RuntimeError: pip failed (with the tail of its log).
    """
    root = VENVS / name
    python = root / "bin" / "python"
    base = sysconfig.get_paths()["purelib"]
    stamp = json.dumps({"base": base, "steps": [list(s) for s in steps]})
    stamp_file = root / STAMP
    if python.exists() and stamp_file.exists() and stamp_file.read_text() == stamp and \
            subprocess.run([str(python), "-c", check], capture_output=True).returncode == 0:
        return str(python)
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                          "['purelib'])"], check=True, capture_output=True, text=True).stdout
    (Path(own.strip()) / LAYER_PTH).write_text(base + "\n")
    log = root / "pip-install.log"
    for step in steps:
        with log.open("a") as out:
            done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *step],
                                  stdout=out, stderr=subprocess.STDOUT, timeout=900)
        if done.returncode != 0:
            tail = log.read_text()[-3000:]
            raise RuntimeError(f"pip install {' '.join(step)} failed in {root}:\n{tail}")
    subprocess.run([str(python), "-c", check], check=True)
    stamp_file.write_text(stamp)
    return str(python)
