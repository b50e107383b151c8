"""The OpenAI-compatible routes driven by the official ``openai`` client (sync, async,
streaming) against the live server, checked against the Tinker SDK's own ``sample`` (same
seed and parameters → the same tokens and logprobs) and transformers' tokenizer and
``apply_chat_template`` (the prompt tokens)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
import tinker
from tinker import types
from transformers import AutoTokenizer

from tests.api.conftest import MODEL, Server, engine_only
from tests.api.test_training import ADAM, DATA
from tests.api.test_usage import usage

pytestmark = engine_only  # needs the served model's tokenizer

Make = Callable[..., tinker.ServiceClient]
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello to the world."}]


def client(server: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0,
                         http_client=httpx.Client(trust_env=False, timeout=60))


def hf_tokenizer(server: Server) -> Any:
    return AutoTokenizer.from_pretrained(server.ctx.catalog.get(MODEL).model_dir)


def tinker_sample(sampler: tinker.SamplingClient, tokens: list[int], n: int,
                  **params: Any) -> types.SampleResponse:
    return sampler.sample(types.ModelInput.from_ints(tokens), n,
                          types.SamplingParams(**params)).result()


def test_completions_sample_what_tinker_samples(server: Server, service_client: Make,
                                                new_key: Callable[[], str]) -> None:
    key = new_key()
    prompt = "def add(a, b):"
    out = client(server, key).completions.create(
        model=MODEL, prompt=prompt, n=3, max_tokens=7, temperature=0.9, top_p=0.95, seed=5,
        logprobs=2, extra_body={"return_token_ids": True})
    tokens = hf_tokenizer(server)(prompt).input_ids
    reference = tinker_sample(service_client(key).create_sampling_client(base_model=MODEL).result(),
                              tokens, 3, max_tokens=7, temperature=0.9, top_p=0.95, seed=5)
    assert len(out.choices) == 3 and out.object == "text_completion"
    for choice, seq in zip(out.choices, reference.sequences, strict=True):
        shown = choice.model_extra["token_ids"]
        assert shown == seq.tokens[: len(shown)] and len(shown) >= len(seq.tokens) - 1
        assert choice.logprobs.token_logprobs == seq.logprobs[: len(shown)], "bitwise"
        assert all(len(alts) == 2 for alts in choice.logprobs.top_logprobs)
        assert choice.finish_reason == ("length" if seq.stop_reason == "length" else "stop")
    assert out.usage.prompt_tokens == 3 * len(tokens)
    assert out.usage.completion_tokens == sum(len(s.tokens) for s in reference.sequences)


def test_chat_on_a_trained_checkpoint_matches_tinker_and_the_chat_template(
    server: Server, service_client: Make, new_key: Callable[[], str]
) -> None:
    key = new_key()
    tc = service_client(key).create_lora_training_client(base_model=MODEL, rank=4).result()
    tc.forward_backward(DATA, "cross_entropy")
    tc.optim_step(ADAM).result()
    path = tc.save_weights_for_sampler("chat").result().path
    oai = client(server, key)
    assert path in [m.id for m in oai.models.list().data]
    out = oai.chat.completions.create(model=path, messages=MESSAGES, max_tokens=6, seed=9,
                                      temperature=0.7, logprobs=True, top_logprobs=3,
                                      extra_body={"return_token_ids": True})
    tokens = hf_tokenizer(server).apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                      tokenize=True, return_dict=False)
    sampler = service_client(key).create_sampling_client(model_path=path).result()
    seq = tinker_sample(sampler, tokens, 1, max_tokens=6, seed=9, temperature=0.7).sequences[0]
    choice = out.choices[0]
    shown = choice.model_extra["token_ids"]
    assert shown == seq.tokens[: len(shown)] and out.usage.prompt_tokens == len(tokens)
    assert choice.message.role == "assistant"
    assert [e.logprob for e in choice.logprobs.content] == seq.logprobs[: len(shown)]
    assert all(len(e.top_logprobs) == 3 for e in choice.logprobs.content)
    base = oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, seed=9,
                                       temperature=0.7, logprobs=True)
    assert [e.logprob for e in base.choices[0].logprobs.content] != \
        [e.logprob for e in choice.logprobs.content], "the adapter is applied"


def test_streaming_gives_the_same_text_and_usage(server: Server,
                                                 new_key: Callable[[], str]) -> None:
    oai = client(server, new_key())
    kwargs: dict[str, Any] = dict(model=MODEL, messages=MESSAGES, max_tokens=10, seed=2, n=2)
    whole = oai.chat.completions.create(**kwargs)
    pieces: dict[int, str] = {0: "", 1: ""}
    finish: dict[int, str | None] = {}
    usage_seen = None
    for chunk in oai.chat.completions.create(**kwargs, stream=True,
                                             stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage_seen = chunk.usage
        for c in chunk.choices:
            pieces[c.index] += c.delta.content or ""
            finish[c.index] = c.finish_reason or finish.get(c.index)
    assert [pieces[i] for i in (0, 1)] == [c.message.content for c in whole.choices]
    assert [finish[i] for i in (0, 1)] == [c.finish_reason for c in whole.choices]
    assert usage_seen is not None and usage_seen.total_tokens == whole.usage.total_tokens
    text = "".join(c.choices[0].text for c in oai.completions.create(
        model=MODEL, prompt="hello", max_tokens=8, seed=1, stream=True) if c.choices)
    assert text == oai.completions.create(model=MODEL, prompt="hello", max_tokens=8,
                                          seed=1).choices[0].text
    raw = httpx.post(f"{server.url}/v1/completions", trust_env=False, timeout=60,
                     headers={"Authorization": f"Bearer {new_key()}"},
                     json={"model": MODEL, "prompt": [2, 3, 4], "max_tokens": 3, "seed": 1,
                           "stream": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.endswith("data: [DONE]\n\n") and raw.text.count("data: ") == 3 + 1 + 1


def test_async_client_and_a_stop_string(server: Server, new_key: Callable[[], str]) -> None:
    async def run() -> tuple[Any, Any]:
        oai = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=new_key(),
                                 max_retries=0,
                                 http_client=httpx.AsyncClient(trust_env=False, timeout=60))
        kwargs: dict[str, Any] = dict(model=MODEL, prompt="The cat", max_tokens=12, seed=4,
                                      extra_body={"return_token_ids": True})
        free = await oai.completions.create(**kwargs)
        text = free.choices[0].text
        stop = next(text[i:i + 2] for i in range(2, len(text) - 1) if text[i:i + 2].strip())
        cut = await oai.completions.create(**kwargs, stop=[stop])
        await oai.close()
        return free, (cut, stop)

    free, (cut, stop) = asyncio.run(run())
    text = free.choices[0].text
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)], "cut before the stop string"
    assert stop not in cut.choices[0].text


def test_tenancy_errors_and_metering(server: Server, service_client: Make,
                                     new_key: Callable[[], str]) -> None:
    owner, other = new_key(), new_key()
    tc = service_client(owner).create_lora_training_client(base_model=MODEL, rank=4).result()
    path = tc.save_weights_for_sampler("mine").result().path
    theirs = client(server, other)
    assert path not in [m.id for m in theirs.models.list().data]
    assert MODEL in [m.id for m in theirs.models.list().data]
    with pytest.raises(openai.NotFoundError) as missing:
        theirs.completions.create(model=path, prompt="hi", max_tokens=2)
    assert missing.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as unknown:
        theirs.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        theirs.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature=3.0)
    assert bad.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as unsupported:
        theirs.completions.create(model=MODEL, prompt="hi", max_tokens=2, best_of=3)
    assert unsupported.value.param == "best_of"
    with pytest.raises(openai.AuthenticationError):
        client(server, "not-a-tml-key").models.list()
    out = client(server, owner).completions.create(model=path, prompt="hi", max_tokens=3,
                                                    n=2, seed=1)
    run = next(r for r in usage(server, owner)["runs"] if r["run_id"] == tc.model_id)
    assert run["tokens"]["num_sequences"] == 2
    assert run["tokens"]["sampled_tokens"] == out.usage.completion_tokens


def test_echo_shows_the_prompt_with_compute_logprobs_bits(server: Server, service_client: Make,
                                                           new_key: Callable[[], str]) -> None:
    """lm-eval's loglikelihood request (token-id prompts, a batch of them, ``echo`` +
    ``logprobs: 1`` + ``max_tokens: 1``) and ``max_tokens: 0``: the prompt's logprobs are the
    bits `compute_logprobs` returns, null at position 0, offsets run across prompt and
    completion."""
    key = new_key()
    tok = hf_tokenizer(server)
    prompts = [tok("The cat sat on the mat").input_ids, tok("def add(a, b): return").input_ids]
    oai = client(server, key)
    out = oai.completions.create(model=MODEL, prompt=prompts, max_tokens=1, temperature=0.0,
                                 logprobs=1, echo=True, seed=3)
    sampler = service_client(key).create_sampling_client(base_model=MODEL).result()
    for choice, tokens in zip(out.choices, prompts, strict=True):
        expected = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
        logprobs = choice.logprobs
        assert logprobs.token_logprobs[: len(tokens)] == expected, "bitwise"
        assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
        assert len(logprobs.tokens) == len(tokens) + 1  # the prompt, then one sampled token
        assert all(len(alts) == 1 for alts in logprobs.top_logprobs[1:])
        top = logprobs.top_logprobs[len(tokens)]
        assert max(top.values()) == logprobs.token_logprobs[len(tokens)], "greedy: its own top"
        assert choice.text.startswith(tok.decode(tokens))
        pieces = [choice.text[a:b] for a, b in zip(logprobs.text_offset,
                                                    [*logprobs.text_offset[1:], len(choice.text)],
                                                    strict=True)]
        assert "".join(pieces) == choice.text and logprobs.text_offset[0] == 0
    only = oai.completions.create(model=MODEL, prompt="Hello there", max_tokens=0, echo=True,
                                  logprobs=0)
    assert only.choices[0].text == "Hello there"
    assert only.usage.completion_tokens == 0
    assert len(only.choices[0].logprobs.token_logprobs) == len(tok("Hello there").input_ids)


def test_more_than_four_stop_strings_are_taken(server: Server, new_key: Callable[[], str]
                                               ) -> None:
    """lm-eval sends every ``until`` string plus EOS; vLLM takes any number (bytes bound)."""
    oai = client(server, new_key())
    stops = ["\n\n", "Question:", "</s>", "<|im_end|>", "Q:", "\nclass"]
    out = oai.completions.create(model=MODEL, prompt="def f(x):", max_tokens=8, stop=stops,
                                 temperature=0.0)
    assert out.choices[0].finish_reason in ("stop", "length")
    assert not any(s in out.choices[0].text for s in stops)
    with pytest.raises(openai.BadRequestError) as too_big:
        oai.completions.create(model=MODEL, prompt="hi", max_tokens=2, stop=["x" * 5000])
    assert too_big.value.param == "stop"


def test_a_wrong_method_is_a_client_error_and_models_have_a_created_time(
        server: Server, new_key: Callable[[], str]) -> None:
    key = new_key()
    wrong = httpx.get(f"{server.url}/v1/completions", headers={"X-API-Key": key},
                      trust_env=False, timeout=30)
    assert wrong.status_code == 405
    assert wrong.json()["error"]["type"] == "invalid_request_error"
    models = client(server, key).models.list().data
    assert all(m.created > 1_700_000_000 for m in models if m.id == MODEL)


def test_text_that_cannot_fit_is_refused_before_it_is_encoded(
        server: Server, new_key: Callable[[], str]) -> None:
    """A prompt of more characters than 32 per token of context is a 400 from a length check,
    never tokenized (a 48 MiB prompt used to hold the event loop for a minute); the same for
    chat messages and ``/tokenize``."""
    oai = client(server, new_key())
    context = server.ctx.catalog.get(MODEL).info.max_context
    huge = "a" * (context * 32 + 1)
    with pytest.raises(openai.BadRequestError, match="cannot fit the context") as text:
        oai.completions.create(model=MODEL, prompt=huge, max_tokens=1)
    assert text.value.param == "prompt"
    with pytest.raises(openai.BadRequestError, match="cannot fit the context") as two:
        oai.completions.create(model=MODEL, prompt=["hi", huge], max_tokens=1)
    assert two.value.param == "prompt[1]"
    with pytest.raises(openai.BadRequestError, match="cannot fit the context") as chat:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": huge}],
                                    max_tokens=1)
    assert chat.value.param == "messages"
    tokenize = httpx.post(f"{server.url}/tokenize", json={"prompt": huge}, trust_env=False,
                          headers={"X-API-Key": new_key()}, timeout=60)
    assert tokenize.status_code == 400 and "cannot fit" in tokenize.text


def test_a_bad_prompt_of_several_queues_none_of_them(server: Server,
                                                    new_key: Callable[[], str]) -> None:
    """Prompt 1 of 2 is out of the vocabulary: a 400 naming it, and prompt 0 (a long sample)
    was never queued, so nothing is left running with nobody to collect it."""
    vocab = server.ctx.catalog.get(MODEL).info.vocab_size
    before = server.ctx.futures.num_pending()
    with pytest.raises(openai.BadRequestError) as bad:
        client(server, new_key()).completions.create(
            model=MODEL, prompt=[[1, 2, 3], [1, vocab]], max_tokens=400, temperature=1.0)
    assert bad.value.param == "prompt[1][1]"
    assert server.ctx.futures.num_pending() == before


def _engine(server: Server) -> Any:
    return server.ctx.catalog.get(MODEL).lanes.schedulers()[0][1].executor


def test_streamed_tokens_and_logprobs_are_the_unstreamed_ones(
        server: Server, new_key: Callable[[], str]) -> None:
    """Two prompts × n=2 with top-2 logprobs and a stop string: per choice, the streamed text,
    tokens, logprobs and alternatives joined are the whole response's, bitwise (chat too)."""
    oai = client(server, new_key())
    kwargs: dict[str, Any] = dict(model=MODEL, prompt=["Once upon", "The cat"], n=2,
                                  max_tokens=40, temperature=0.9, seed=11, logprobs=2,
                                  stop=["zq", " the"])
    whole = oai.completions.create(**kwargs)
    got: dict[int, dict[str, list[Any]]] = {}
    for chunk in oai.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            mine = got.setdefault(c.index, {"text": [], "tokens": [], "lps": [], "top": [],
                                            "finish": []})
            mine["text"].append(c.text)
            mine["finish"].append(c.finish_reason)
            if c.logprobs is not None:
                mine["tokens"] += c.logprobs.tokens
                mine["lps"] += c.logprobs.token_logprobs
                mine["top"] += c.logprobs.top_logprobs
    assert sorted(got) == [0, 1, 2, 3]
    for c in whole.choices:
        mine = got[c.index]
        assert "".join(mine["text"]) == c.text
        assert mine["tokens"] == c.logprobs.tokens and mine["lps"] == c.logprobs.token_logprobs
        assert mine["top"] == c.logprobs.top_logprobs
        assert [f for f in mine["finish"] if f] == [c.finish_reason]
    chat: dict[str, Any] = dict(model=MODEL, messages=MESSAGES, max_tokens=30, seed=3,
                                logprobs=True, top_logprobs=2)
    one = oai.chat.completions.create(**chat).choices[0]
    pieces, entries = [], []
    for chunk in oai.chat.completions.create(**chat, stream=True):
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            entries += c.logprobs.content if c.logprobs is not None else []
    assert "".join(pieces) == one.message.content
    assert [(e.token, e.logprob, [(a.token, a.logprob) for a in e.top_logprobs])
            for e in entries] == [(e.token, e.logprob, [(a.token, a.logprob)
                                                        for a in e.top_logprobs])
                                  for e in one.logprobs.content]


def test_first_tokens_arrive_while_sampling_and_a_closed_stream_frees_its_pages(
        server: Server, new_key: Callable[[], str]) -> None:
    """The first streamed chunk comes while the request still samples; closing the stream
    cancels it: the engine drops it and its KV pages are free again."""
    engine = _engine(server)
    oai = client(server, new_key())
    free = engine.sampler.pool.num_free
    stream = oai.completions.create(model=MODEL, prompt="A long story:", max_tokens=400,
                                    temperature=1.0, seed=5, stream=True)
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    assert engine.num_running_samples() == 1, "tokens leave before the completion is done"
    assert engine.sampler.pool.num_free < free
    decoded = engine.sampler.stats.decode_tokens
    stream.close()
    deadline = time.monotonic() + 30
    while engine.num_running_samples() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.num_running_samples() == 0 and engine.sampler.pool.num_free == free
    assert engine.sampler.stats.decode_tokens - decoded < 200, "dropped, not run to the end"


def test_ignore_eos_keeps_the_stop_strings_and_drops_eos(server: Server) -> None:
    from loraplex.api.samplers import base_sampler, prepare_sample, sample_request

    params = types.SamplingParams(max_tokens=5, stop=["x", "yz"])
    body = sample_request([2, 3, 4], 1, params, 0)
    sampler = base_sampler(server.ctx, "tenant-eos", MODEL, "model")
    plain = prepare_sample(server.ctx, "tenant-eos", body, sampler).item.op.work.params.stop
    ignored = prepare_sample(server.ctx, "tenant-eos", body, sampler,
                             ignore_eos=True).item.op.work.params.stop  # type: ignore[union-attr]
    assert plain.use_eos and not ignored.use_eos  # type: ignore[union-attr]
    assert ignored.strings == plain.strings == ("x", "yz")  # type: ignore[union-attr]


def test_bodies_and_chunks_are_the_documented_models(server: Server,
                                                     new_key: Callable[[], str]) -> None:
    """What the routes send validates as the response models `/openapi.json` names, and a
    field a response does not carry is left out (``token_ids`` unless asked; ``usage`` only
    in the last chunk; ``role`` only in a chat choice's first delta)."""
    from loraplex.api import openai_responses as r

    headers = {"Authorization": f"Bearer {new_key()}"}

    def post(path: str, **body: Any) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/{path}", json={"model": MODEL, "max_tokens": 6,
                          "seed": 3, **body}, headers=headers, trust_env=False, timeout=60)

    plain = post("completions", prompt="Once upon", logprobs=2, echo=True).json()
    r.CompletionResponse.model_validate(plain, strict=True)
    assert "token_ids" not in plain["choices"][0]
    ids = post("completions", prompt="Once upon", return_token_ids=True).json()
    assert r.CompletionResponse.model_validate(ids).choices[0].token_ids
    chat = post("chat/completions", messages=[{"role": "user", "content": "Hi"}],
                logprobs=True, top_logprobs=2).json()
    r.ChatCompletionResponse.model_validate(chat, strict=True)
    for path, body, model in [("completions", {"prompt": "Once"}, r.CompletionChunk),
                              ("chat/completions", {"messages": [{"role": "user",
                                                                  "content": "Hi"}]},
                               r.ChatCompletionChunk)]:
        events = post(path, stream=True, stream_options={"include_usage": True},
                      **body).text.split("\n\n")
        chunks = [json.loads(e.removeprefix("data: ")) for e in events
                  if e.startswith("data: {")]
        for chunk in chunks:
            model.model_validate(chunk, strict=True)
        assert [("usage" in c) for c in chunks] == [False] * (len(chunks) - 1) + [True]
        if model is r.ChatCompletionChunk:
            roles = ["role" in c["choices"][0]["delta"] for c in chunks[:-1]]
            assert roles == [True] + [False] * (len(roles) - 1)
    doc = httpx.get(f"{server.url}/openapi.json", trust_env=False, timeout=30).json()
    answer = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert answer["application/json"]["schema"]["$ref"].endswith("/ChatCompletionResponse")
    assert answer["text/event-stream"]["schema"]["$ref"].endswith("/ChatCompletionChunk")
    assert "ChatLogprob" in doc["components"]["schemas"]
