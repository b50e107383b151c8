"""vLLM's tokenizer endpoints (``/tokenize``, ``/detokenize``, ``/tokenizer_info``) as lm-eval's
remote tokenizer calls them (no ``model``, a Bearer key), checked against transformers'
tokenizer and ``apply_chat_template`` of the served model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import tinker

from tests.api.conftest import MODEL, Server, engine_only
from tests.api.test_openai import MESSAGES, hf_tokenizer

pytestmark = engine_only


def call(server: Server, key: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", trust_env=False, timeout=30,
                         headers={"Authorization": f"Bearer {key}"}, **kwargs)


def test_tokenize_and_detokenize_equal_transformers(server: Server,
                                                    new_key: Callable[[], str]) -> None:
    key, tok = new_key(), hf_tokenizer(server)
    text = "Hello world, déjà vu!"
    plain = call(server, key, "POST", "/tokenize",
                 json={"prompt": text, "add_special_tokens": False}).json()
    assert plain["tokens"] == tok(text, add_special_tokens=False).input_ids
    assert plain["count"] == len(plain["tokens"])
    assert plain["max_model_len"] == server.ctx.catalog.get(MODEL).info.max_context
    special = call(server, key, "POST", "/tokenize",
                   json={"model": MODEL, "prompt": text, "return_token_strs": True}).json()
    assert special["tokens"] == tok(text).input_ids
    assert len(special["token_strs"]) == special["count"]
    chat = call(server, key, "POST", "/tokenize", json={"messages": MESSAGES}).json()
    assert chat["tokens"] == tok.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                     tokenize=True, return_dict=False)
    back = call(server, key, "POST", "/detokenize", json={"tokens": plain["tokens"]}).json()
    assert back["prompt"] == tok.decode(plain["tokens"]) == text


def test_tokenizer_info_has_the_special_tokens_and_chat_template(
        server: Server, new_key: Callable[[], str]) -> None:
    tok = hf_tokenizer(server)
    info = call(server, new_key(), "GET", "/tokenizer_info").json()
    assert info["eos_token"] == tok.eos_token
    assert info["chat_template"] == tok.chat_template
    assert info["model_max_length"] == server.ctx.catalog.get(MODEL).info.max_context


def test_bad_requests_and_auth(server: Server, new_key: Callable[[], str],
                               service_client: Callable[..., tinker.ServiceClient]) -> None:
    key = new_key()
    vocab = server.ctx.catalog.get(MODEL).info.vocab_size
    bad = call(server, key, "POST", "/detokenize", json={"tokens": [1, vocab]})
    assert bad.status_code == 400 and "tokens" in bad.text
    both = call(server, key, "POST", "/tokenize", json={"prompt": "a", "messages": MESSAGES})
    assert both.status_code == 400
    anonymous = httpx.get(f"{server.url}/tokenizer_info", trust_env=False, timeout=30)
    assert anonymous.status_code == 401
    unknown = call(server, key, "POST", "/tokenize", json={"model": "nope", "prompt": "a"})
    assert unknown.status_code == 404
    tc = service_client(key).create_lora_training_client(base_model=MODEL, rank=4).result()
    path = tc.save_weights_for_sampler("tok").result().path
    mine = call(server, key, "POST", "/tokenize", json={"model": path, "prompt": "a b"})
    assert mine.status_code == 200
    theirs = call(server, new_key(), "POST", "/tokenize", json={"model": path, "prompt": "a"})
    assert theirs.status_code == 404
