"""tinker-cookbook's renderers reproduce the new families' built-in chat templates token for
token. Skipped in the project venv (no cookbook there); `tests/integration/test_cookbook.py`
runs this file in the cookbook venv.

Generation prompts (what sampling starts from) are compared token for token for every
renderer. Supervised examples are compared token for token too, except for the ``qwen3_5``
(thinking) renderer: it tokenizes its ``<think>\\n`` prefill and the completion after it apart,
and the tokenizer merges the ``\\n\\n`` a whole-string template holds there into one token (the
renderer's own ``has_extension_property`` docstring says so); its text equals the template's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loraplex.engine.builtin.model import create_builtin_model

renderers = pytest.importorskip("tinker_cookbook.renderers")

CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "  What is 2+2?  "}],
    [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
     {"role": "user", "content": "three\n\nfour"}],
]
ANSWER = {"role": "assistant", "content": "4"}
#: (arch, renderer, chat-template kwargs, supervised compared token for token).
CASES: list[tuple[str, str, dict[str, Any], bool]] = [
    ("qwen3_5", "qwen3_5", {}, False),
    ("qwen3_5", "qwen3_5_disable_thinking", {"enable_thinking": False}, True),
    ("qwen3_5_moe", "qwen3_5", {}, False),
    ("gpt_oss", "gpt_oss_no_sysprompt", {}, True),
    ("gpt_oss", "gpt_oss_medium_reasoning", {"reasoning_effort": "medium"}, True),
]


def template_ids(tok: Any, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
    ids = tok.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(ids if isinstance(ids, list) else ids["input_ids"])


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from transformers import AutoTokenizer

    out = {}
    for arch in {c[0] for c in CASES}:
        path: Path = create_builtin_model(tmp_path_factory.mktemp("r") / arch, arch, "tiny", 0)
        out[arch] = AutoTokenizer.from_pretrained(path)
    return out


@pytest.mark.parametrize(("arch", "name", "kwargs", "exact"), CASES)
def test_the_renderer_reproduces_the_chat_template(tokenizers: dict[str, Any], arch: str,
                                                   name: str, kwargs: dict[str, Any],
                                                   exact: bool) -> None:
    tok = tokenizers[arch]
    renderer = renderers.get_renderer(name, tok)
    for messages in CONVERSATIONS:
        if name == "gpt_oss_medium_reasoning" and messages[0]["role"] == "system":
            continue  # that renderer prepends its own system message to the user's
        prompt = renderer.build_generation_prompt(messages).to_ints()
        assert prompt == template_ids(tok, messages, add_generation_prompt=True, **kwargs)
        example, _ = renderer.build_supervised_example([*messages, ANSWER])
        ours = template_ids(tok, [*messages, ANSWER], **kwargs)
        theirs = example.to_ints()
        if exact:
            assert ours[:len(theirs)] == theirs
        else:
            assert tok.decode(ours).startswith(tok.decode(theirs))
        # the rest is the template's separator after the turn, if any
        assert tok.decode(ours[len(theirs):]) in ("", "\n")


@pytest.mark.parametrize(("arch", "name"), [(c[0], c[1]) for c in CASES])
def test_a_sampled_response_parses_at_its_stop_token(tokenizers: dict[str, Any], arch: str,
                                                     name: str) -> None:
    tok = tokenizers[arch]
    renderer = renderers.get_renderer(name, tok)
    stop = renderer.get_stop_sequences()[0]
    ids = tok.encode("4", add_special_tokens=False)
    ids = ids + (tok.encode(stop, add_special_tokens=False) if isinstance(stop, str) else [stop])
    message, termination = renderer.parse_response(ids)
    assert termination == "stop_sequence"
    content = message["content"]
    text = content if isinstance(content, str) else "".join(
        p["text"] for p in content if p["type"] == "text")
    assert text.strip() == "4"
