"""The `small` benchmark weights both servers load: loraplex's built-in `small` Qwen3.

A thin wrapper over `loraplex.engine.builtin.model.ensure_builtin_model` (4 layers, hidden 512,
vocab 8192, tied embeddings, random weights, locally trained tokenizer, no network), so the peer
and loraplex read the very same directory. Needs torch: run it with loraplex's venv.
"""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import SCRATCH

SMALL_ARCH, SMALL_SIZE, SMALL_SEED = "qwen3", "small", 0
SMALL_MODEL_DIR = SCRATCH / "peers" / "models" / "small"


def ensure_small_model(directory: str | os.PathLike[str], seed: int = SMALL_SEED) -> Path:
    """The small model under `directory`, created first unless a config.json is there."""
    from loraplex.engine.builtin.model import ensure_builtin_model

    return Path(ensure_builtin_model(Path(directory).resolve(), SMALL_ARCH, SMALL_SIZE, seed))
