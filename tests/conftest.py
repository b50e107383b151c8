"""Project-wide fixtures (keep generic and small; layer-specific ones live beside their tests)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in ``tiny`` Qwen3 model + tokenizer (seed 0), created once per session."""
    from loraplex.engine.builtin.model import create_builtin_model

    return create_builtin_model(tmp_path_factory.mktemp("builtin") / "tiny-qwen3", "qwen3",
                                "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_moe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in ``tiny`` Qwen3-MoE model (``builtin:tiny-moe``, seed 0), once per session."""
    from loraplex.engine.builtin.model import create_builtin_model

    return create_builtin_model(tmp_path_factory.mktemp("builtin") / "tiny-qwen3-moe",
                                "qwen3_moe", "tiny", seed=0)
