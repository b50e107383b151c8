"""stable_reinforce provenance: sequences recorded by record_stability_info samplers are
resolved from a datum's spans into the engine's recorded-logprobs input."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import tinker
from tinker import types

from loraplex.domain.work import RECORDED_LOGPROBS_KEY
from tests.api.conftest import MODEL, Server, toy_only
from tests.api.test_errors import user_failure

Make = Callable[..., tinker.ServiceClient]
PROMPT = [2, 3, 4, 5]


def rollout(sampler: tinker.SamplingClient) -> types.SampledSequence:
    params = types.SamplingParams(max_tokens=4, stop=[], seed=5)
    return sampler.sample(types.ModelInput.from_ints(PROMPT), 1, params).result().sequences[0]


def rl_datum(seq: types.SampledSequence, sequence_id: str | None = None, *,
             prompt: list[int] = PROMPT, advantage: float = 1.0,
             logprobs: list[float] | None = None) -> types.Datum:
    """The cookbook's layout: model_input = S[:-1], targets = S[1:], spans with the first
    position dropped for the loss inputs. ``logprobs`` replaces the sampled ones sent."""
    sid = sequence_id or seq.sequence_id
    full = prompt + list(seq.tokens)
    n = len(full) - 1
    prompt_n, action_n = len(prompt), len(seq.tokens)
    sent = list(seq.logprobs or []) if logprobs is None else logprobs
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={"target_tokens": full[1:],
                        "logprobs": [0.0] * (prompt_n - 1) + sent,
                        "advantages": [0.0] * (prompt_n - 1) + [advantage] * action_n})
    assert n == prompt_n - 1 + action_n
    return datum.with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=sid, offset=0, length=prompt_n),
                     types.SampledProvenanceSpan(sequence_id=sid, offset=0,
                                                 length=action_n - 1)],
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=sid, offset=1,
                                                   length=prompt_n - 1),
                        types.SampledProvenanceSpan(sequence_id=sid, offset=0,
                                                    length=action_n)])


@toy_only
def test_recorded_logprobs_reach_the_engine_aligned_with_targets(
    server: Server, service_client: Make
) -> None:
    tc = service_client().create_lora_training_client(base_model=MODEL, rank=4).result()
    sampler = tc.save_weights_and_get_sampling_client(record_stability_info=True).result()
    seq = rollout(sampler)
    tc.forward_backward([rl_datum(seq)], "stable_reinforce").result()
    tc.optim_step(types.AdamParams(learning_rate=0.01)).result()
    [work] = server.toy.last_fwd_bwd
    recorded = list(work.data[0].loss_fn_inputs[RECORDED_LOGPROBS_KEY].data)
    assert all(math.isnan(x) for x in recorded[: len(PROMPT) - 1])
    assert recorded[len(PROMPT) - 1:] == pytest.approx(list(seq.logprobs or []))


def test_unrecorded_foreign_or_missing_provenance_is_refused(service_client: Make) -> None:
    client = service_client()
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    plain = rollout(tc.save_weights_and_get_sampling_client().result())
    user_failure(tc.forward_backward([rl_datum(plain)], "stable_reinforce"),
                 r"data\[0\]\.loss_fn_input_spans\[0\]\.sequence_id.*unknown sequence id")
    other_session = service_client().create_lora_training_client(base_model=MODEL, rank=4)
    foreign = rollout(other_session.result().save_weights_and_get_sampling_client(
        record_stability_info=True).result())
    user_failure(tc.forward_backward([rl_datum(foreign)], "stable_reinforce"),
                 r"unknown sequence id")
    recorded = rollout(tc.save_weights_and_get_sampling_client(
        record_stability_info=True).result())
    bare = types.Datum(model_input=types.ModelInput.from_ints([2, 3]),
                       loss_fn_inputs={"target_tokens": [3, 4], "logprobs": [0.0, 0.0],
                                       "advantages": [1.0, 1.0]})
    user_failure(tc.forward_backward([rl_datum(recorded), bare], "stable_reinforce"),
                 r"data\[1\]\.loss_fn_input_spans.*provenance")
    # Other losses ignore the spans, recorded or not.
    tc.forward_backward([rl_datum(plain)], "importance_sampling").result()
