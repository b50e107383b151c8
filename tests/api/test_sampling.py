"""Sampling through the real tinker SDK 0.38: sessions, sampler checkpoints, asample options."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
import tinker
from tinker import types

from loraplex.cli.model_sources import resolve_source
from tests.api.conftest import MODEL, Server, engine_only, toy_only
from tests.api.test_training import ADAM, DATA
from tests.fakes import toy_detokenize

Make = Callable[..., tinker.ServiceClient]
PROMPT = types.ModelInput.from_ints([2, 3, 4, 5])


def params(**kw: object) -> types.SamplingParams:
    kw.setdefault("max_tokens", 6)
    kw.setdefault("seed", 11)
    return types.SamplingParams(**kw)  # type: ignore[arg-type]


def test_sample_returns_one_sequence_per_id_with_logprobs(service_client: Make) -> None:
    sampler = service_client().create_sampling_client(base_model=MODEL).result()
    out = sampler.sample(PROMPT, num_samples=3, sampling_params=params()).result()
    assert len(out.sequences) == 3
    assert len({s.sequence_id for s in out.sequences}) == 3
    for seq in out.sequences:
        assert seq.logprobs is not None and len(seq.logprobs) == len(seq.tokens)
        assert seq.stop_reason in ("stop", "length")
    again = sampler.sample(PROMPT, num_samples=3, sampling_params=params()).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in out.sequences], "seeded"


def test_prompt_logprobs_and_compute_logprobs(service_client: Make) -> None:
    sampler = service_client().create_sampling_client(base_model=MODEL).result()
    out = sampler.sample(PROMPT, num_samples=1, sampling_params=params(max_tokens=1),
                         include_prompt_logprobs=True).result()
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert all(x is not None and x < 0 for x in out.prompt_logprobs[1:])
    computed = sampler.compute_logprobs(PROMPT).result()
    assert computed == out.prompt_logprobs
    last = sampler.compute_logprobs(PROMPT, prompt_logprobs_last_n=1).result()
    assert last[:-1] == [None] * 3 and last[-1] == computed[-1]


def test_stop_token_ids_and_no_stop(service_client: Make) -> None:
    sampler = service_client().create_sampling_client(base_model=MODEL).result()
    free = sampler.sample(PROMPT, 1, params(max_tokens=12, stop=[])).result().sequences[0]
    assert free.stop_reason == "length" and len(free.tokens) == 12
    token = free.tokens[3]
    by_id = sampler.sample(PROMPT, 1, params(max_tokens=12, stop=[token])).result().sequences[0]
    assert by_id.stop_reason == "stop" and by_id.tokens[-1] == token
    assert by_id.tokens == free.tokens[: by_id.tokens.index(token) + 1]


@toy_only
def test_stop_strings_use_the_model_detokenizer(service_client: Make) -> None:
    sampler = service_client().create_sampling_client(base_model=MODEL).result()
    free = sampler.sample(PROMPT, 1, params(max_tokens=12, stop=[])).result().sequences[0]
    text = toy_detokenize(free.tokens[2:4])
    by_str = sampler.sample(PROMPT, 1, params(max_tokens=12, stop=[text])).result().sequences[0]
    assert by_str.stop_reason == "stop" and text in toy_detokenize(by_str.tokens)
    assert len(by_str.tokens) <= 4


@engine_only
def test_stop_strings_match_the_served_models_tokenizer(server: Server, service_client: Make
                                                        ) -> None:
    """What role_colon renderers rely on: a string stop, matched in the text the served model's
    own tokenizer decodes (the one `loraplex model cache-tokenizer` gives the client)."""
    from tokenizers import Tokenizer

    source = server.ctx.catalog.get(MODEL).source
    model_dir = resolve_source(source, server.ctx.config.data_dir, create=False)
    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    sampler = service_client().create_sampling_client(base_model=MODEL).result()
    free = sampler.sample(PROMPT, 1, params(max_tokens=12, stop=[])).result().sequences[0]
    windows = [(end, tokenizer.decode(free.tokens[end - 2:end], skip_special_tokens=False))
               for end in range(4, 12)]
    end, text = next((e, t.strip()) for e, t in windows if t.strip() and "\ufffd" not in t)
    by_str = sampler.sample(PROMPT, 1, params(max_tokens=12, stop=[text])).result().sequences[0]
    assert by_str.stop_reason == "stop"
    assert text in tokenizer.decode(by_str.tokens, skip_special_tokens=False)
    assert by_str.tokens == free.tokens[: len(by_str.tokens)] and len(by_str.tokens) <= end


def test_topk_sample_and_prompt_logprobs(service_client: Make) -> None:
    sampler = service_client().create_sampling_client(base_model=MODEL).result()
    out = sampler.sample(PROMPT, 1, params(max_tokens=3, temperature=0.0),
                         topk_sample_logprobs=4, topk_prompt_logprobs=2).result()
    seq = out.sequences[0]
    assert seq.topk_logprobs is not None and len(seq.topk_logprobs) == len(seq.tokens)
    for position, token, lp in zip(seq.topk_logprobs, seq.tokens, seq.logprobs, strict=True):
        assert len(position) == 4
        assert position[0] == (token, pytest.approx(lp)), "greedy takes the top token"
    assert out.topk_prompt_logprobs is not None and len(out.topk_prompt_logprobs) == 4


def test_named_and_ephemeral_sampler_checkpoints(service_client: Make) -> None:
    client = service_client()
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    tc.forward_backward(DATA, "cross_entropy")
    tc.optim_step(ADAM).result()
    path = tc.save_weights_for_sampler("step-1").result().path
    assert path.endswith("/sampler_weights/step-1")
    named = client.create_sampling_client(model_path=path).result()
    snapshot = tc.save_weights_and_get_sampling_client().result()
    base = client.create_sampling_client(base_model=MODEL).result()
    trained_lps = named.compute_logprobs(PROMPT).result()
    assert snapshot.compute_logprobs(PROMPT).result() == trained_lps
    assert base.compute_logprobs(PROMPT).result() != trained_lps
    for _ in range(2):  # train on: the snapshot and the named checkpoint stay frozen
        tc.forward_backward(DATA, "cross_entropy")
        tc.optim_step(ADAM).result()
    assert snapshot.compute_logprobs(PROMPT).result() == trained_lps
    assert named.compute_logprobs(PROMPT).result() == trained_lps
    assert named.get_base_model() == MODEL


def test_inflight_sampler_follows_later_inflight_saves(service_client: Make) -> None:
    client = service_client()
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    inflight = tc.save_weights_and_get_sampling_client(kind="inflight").result()
    before = inflight.compute_logprobs(PROMPT).result()
    tc.forward_backward(DATA, "cross_entropy")
    tc.optim_step(ADAM).result()
    assert inflight.compute_logprobs(PROMPT).result() == before, "until the next inflight save"
    tc.save_weights_and_get_sampling_client(kind="inflight").result()
    assert inflight.compute_logprobs(PROMPT).result() != before


def test_sampling_logprobs_match_training_logprobs(service_client: Make) -> None:
    """KL(sampler ‖ trainer) is zero when both use the same weights (the RL sanity check)."""
    client = service_client()
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    tc.forward_backward(DATA, "cross_entropy")
    tc.optim_step(ADAM).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    seq = sampler.sample(PROMPT, 1, params(max_tokens=5, stop=[])).result().sequences[0]
    full = PROMPT.to_ints() + seq.tokens
    datum = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={"target_tokens": full[1:],
                                        "weights": [0.0] * (len(full) - 1)})
    train_lps = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    np.testing.assert_allclose(train_lps.data[-len(seq.tokens):], seq.logprobs, rtol=1e-5)


def test_sampler_rest_views(server: Server, service_client: Make) -> None:
    client = service_client()
    sampler = client.create_sampling_client(base_model=MODEL).result()
    rest = client.create_rest_client()
    info = rest.get_sampler(sampler._sampling_session_id).result()
    assert info.base_model == MODEL and info.model_path is None


def test_backpressure_answers_429_and_the_sdk_retries(server: Server, service_client: Make
                                                      ) -> None:
    scheduler = server.ctx.catalog.get(MODEL).lanes.schedulers()[0][1]
    config = scheduler.config
    scheduler.config = replace(config, max_inflight_per_tenant=1)
    try:
        sampler = service_client().create_sampling_client(base_model=MODEL).result()
        futures = [sampler.sample(PROMPT, 1, params(max_tokens=2)) for _ in range(4)]
        assert all(len(f.result().sequences) == 1 for f in futures)
    finally:
        scheduler.config = config


def test_prompt_alt_tokens_are_k_seeded_draws_per_position(service_client: Make) -> None:
    """SDK 0.38's ``prompt_alt_tokens_k``: int64 tokens and float32 logprobs ``[len - 1, k]``;
    the same seed draws the same bits; a draw of the prompt's own token carries the prompt
    logprob compute_logprobs reports for it."""
    sampler = service_client().create_sampling_client(base_model=MODEL).result()
    prompt = types.ModelInput.from_ints(list(range(2, 40)))
    out = sampler.sample(prompt, 2, params(max_tokens=3), prompt_alt_tokens_k=16,
                         include_prompt_logprobs=True).result()
    again = sampler.sample(prompt, 2, params(max_tokens=3), prompt_alt_tokens_k=16).result()
    other = sampler.sample(prompt, 2, params(max_tokens=3, seed=12),
                           prompt_alt_tokens_k=16).result()
    assert out.prompt_alt_tokens is not None and again.prompt_alt_tokens is not None
    tokens, logprobs = out.prompt_alt_tokens.tokens, out.prompt_alt_tokens.logprobs
    assert (tokens.dtype, logprobs.dtype) == ("int64", "float32")
    assert tokens.shape == logprobs.shape == [prompt.length - 1, 16]
    tokens_P_K, logprobs_P_K = tokens.to_numpy(), logprobs.to_numpy()
    assert np.array_equal(tokens_P_K, again.prompt_alt_tokens.tokens.to_numpy())
    assert np.array_equal(logprobs_P_K, again.prompt_alt_tokens.logprobs.to_numpy())
    assert other.prompt_alt_tokens is not None
    assert not np.array_equal(tokens_P_K, other.prompt_alt_tokens.tokens.to_numpy())
    assert (logprobs_P_K <= 0).all()
    scored = sampler.compute_logprobs(prompt).result()
    assert out.prompt_logprobs == scored
    hits = [(p, j) for p in range(prompt.length - 1) for j in range(16)
            if tokens_P_K[p, j] == prompt.to_ints()[p + 1]]
    for p, j in hits:
        assert float(logprobs_P_K[p, j]) == scored[p + 1]
    assert [s.tokens for s in out.sequences] == [s.tokens for s in again.sequences]
    with pytest.raises(tinker.RequestFailedError, match="prompt_alt_tokens_k") as failed:
        sampler.sample(prompt, 1, params(), prompt_alt_tokens_k=1000).result()
    assert failed.value.category == "user"


def test_unsupported_sampling_options_are_refused_by_name(service_client: Make) -> None:
    sampler = service_client().create_sampling_client(base_model=MODEL).result()
    with pytest.raises(tinker.BadRequestError, match=r"sampling_params.top_p"):
        sampler.sample(PROMPT, 1, params(top_p=0.0)).result()
    bad_prompt = types.ModelInput.from_ints([2, 10_000])
    with pytest.raises(tinker.BadRequestError, match=r"prompt\[1\]"):
        sampler.sample(bad_prompt, 1, params()).result()
    assert not math.isnan(sum(sampler.compute_logprobs(PROMPT).result()[1:]))
