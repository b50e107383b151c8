"""The tinker-cookbook renderers work on the built-in tokenizers. Skipped in the project venv (no
cookbook there); `tests/integration/test_cookbook.py` runs this file in the cookbook venv."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraplex.engine.builtin.model import create_builtin_model

renderers = pytest.importorskip("tinker_cookbook.renderers")

CASES = [("qwen3", "qwen3"), ("qwen3", "qwen3_disable_thinking"), ("qwen3", "qwen3_instruct"),
         ("qwen3", "role_colon"), ("llama", "llama3"), ("llama", "role_colon")]


@pytest.mark.parametrize(("arch", "name"), CASES)
def test_renderer_builds_prompts_and_parses_a_stopped_response(
        tmp_path_factory: pytest.TempPathFactory, arch: str, name: str) -> None:
    from transformers import AutoTokenizer

    path: Path = create_builtin_model(tmp_path_factory.mktemp("r") / arch, arch, "tiny", 0)
    tok = AutoTokenizer.from_pretrained(path)
    renderer = renderers.get_renderer(name, tok)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    assert renderer.build_generation_prompt(messages).length > 0
    renderer.build_supervised_example([*messages, {"role": "assistant", "content": "4"}])
    stop = renderer.get_stop_sequences()[0]
    ids = tok.encode("4", add_special_tokens=False)
    ids = ids + (tok.encode(stop, add_special_tokens=False) if isinstance(stop, str) else [stop])
    _, termination = renderer.parse_response(ids)
    assert termination == "stop_sequence"
