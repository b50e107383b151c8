"""`loraplex model cache-tokenizer`: the built-in model's tokenizer becomes loadable offline by
its catalogue name, through the real transformers resolution (in a clean subprocess)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loraplex.cli import hf_cache
from loraplex.cli.model_sources import resolve_source
from loraplex.config import DEFAULT_MODEL_NAME

LOAD = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
print(json.dumps(tok.encode("hello world, this is loraplex")))
"""


def encode_offline(name: str, hf_home: Path) -> list[int]:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD, name], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_repo_ids_follow_the_sdk_and_cookbook_remapping() -> None:
    assert hf_cache.cache_repo_id("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert hf_cache.cache_repo_id("Qwen/Qwen3-8B:peft:1") == "Qwen/Qwen3-8B"
    assert hf_cache.cache_repo_id("meta-llama/Llama-3.2-1B") == hf_cache.LLAMA3_TOKENIZER
    with pytest.raises(Exception, match="org/model"):
        hf_cache.cache_repo_id("/models/x")


@pytest.mark.slow
def test_default_model_tokenizer_loads_offline_by_catalogue_name(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    data_dir, hf_home = tmp_path / "data", tmp_path / "hf"
    args = argparse.Namespace(name=DEFAULT_MODEL_NAME, data_dir=str(data_dir),
                              hf_home=str(hf_home), source=None, with_weights=False)
    assert hf_cache.run(args) == 0
    assert hf_cache.run(args) == 0, "idempotent"
    model_dir = resolve_source("builtin:tiny", str(data_dir))
    expected = AutoTokenizer.from_pretrained(model_dir).encode("hello world, this is loraplex")
    assert encode_offline(DEFAULT_MODEL_NAME, hf_home) == expected
    llama = argparse.Namespace(name="meta-llama/Llama-3.2-1B", data_dir=str(data_dir),
                               hf_home=str(hf_home), source="builtin:tiny", with_weights=False)
    hf_cache.run(llama)
    assert encode_offline(hf_cache.LLAMA3_TOKENIZER, hf_home) == expected
    snapshot = next((hf_home / "hub" / "models--Qwen--Qwen3-8B" / "snapshots").iterdir())
    assert not any(p.suffix == ".safetensors" for p in snapshot.iterdir())


def test_an_image_models_processor_loads_offline_by_name(tmp_path: Path,
                                                         builtin_model_dir) -> None:  # type: ignore[no-untyped-def]
    """The cookbook's VLM renderers call ``AutoImageProcessor.from_pretrained(name)``: the
    served model's ``preprocessor_config.json`` is installed beside its tokenizer, and the
    processor counts an image's tokens as the server does."""
    model_dir = builtin_model_dir("tiny-vl")
    hf_home = tmp_path / "hf"
    hf_cache.install(str(model_dir), "Qwen/Qwen3-VL-30B-A3B-Instruct", str(hf_home))
    load = ("import sys; from transformers import AutoImageProcessor; "
            "p = AutoImageProcessor.from_pretrained(sys.argv[1]); "
            "print(p.get_number_of_image_patches(40, 48, {}) // p.merge_size ** 2)")
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", load, "Qwen/Qwen3-VL-30B-A3B-Instruct"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    from loraplex.domain.pixel_spec import PixelSpec, image_grid, num_image_tokens

    config = json.loads((model_dir / "config.json").read_text())
    spec = PixelSpec.from_config(config["vision_config"], json.loads(
        (model_dir / "preprocessor_config.json").read_text()))
    ours = num_image_tokens(image_grid(48, 40, spec), spec.merge_size)
    assert int(done.stdout.strip().splitlines()[-1]) == ours == 6
