"""SDK 0.27.0 client runs (executed by the 0.27 venv's python, not by pytest).

    python client_sdk027.py BASE_URL API_KEY MODEL main
    python client_sdk027.py BASE_URL API_KEY MODEL before-restart|after-restart STATE_FILE

``main``: SFT with pipelined steps; sampling (named and ephemeral sampler weights, prompt
logprobs, compute_logprobs); save_state and resume with and without optimizer (0.27 resumes
through weights_info → create_model → load_weights); GRPO steps with every RL loss, sampler and
trainer logprobs bitwise equal; forward_backward_custom; REST listing; a second tenant refused;
the archive download. ``before-restart`` trains and saves, writing what a never-stopped run
reaches to STATE_FILE; ``after-restart`` (on a restarted server) resumes from it with the
optimizer and must reach the same logprobs. Prints one JSON summary line; exits non-zero on
any mismatch.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
import urllib.request
from typing import Any

import tinker
import torch
from tinker import types

assert tinker.__version__ == "0.27.0", tinker.__version__
BASE_URL, API_KEY, MODEL, PHASE = sys.argv[1:5]
ADAM = types.AdamParams(learning_rate=0.01)
PROMPT = types.ModelInput.from_ints([2, 3, 4, 5])
RL_LOSSES: list[tuple[str, dict[str, Any] | None]] = [
    ("importance_sampling", None), ("ppo", {"clip_low_threshold": 0.8,
                                            "clip_high_threshold": 1.2}),
    ("cispo", None), ("dro", {"beta": 0.1}),
    # Not in 0.27's LossFnType literal, but the SDK sends it as is.
    ("stable_reinforce", None)]


def datum(tokens: list[int], weight: float = 1.0) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens),
                       loss_fn_inputs={"target_tokens": tokens[1:] + tokens[:1],
                                       "weights": [weight] * len(tokens)})


DATA = [datum([2 + i, 7, 11 + i, 5]) for i in range(3)]


def step(tc: tinker.TrainingClient) -> float:
    fb = tc.forward_backward(DATA, "cross_entropy")
    opt = tc.optim_step(ADAM)
    loss = fb.result().metrics["loss:sum"]
    opt.result()
    return float(loss)


def forward(tc: tinker.TrainingClient) -> list[list[float]]:
    out = tc.forward(DATA, "cross_entropy").result()
    return [list(o["logprobs"].data) for o in out.loss_fn_outputs]


def sft(sc: tinker.ServiceClient) -> tuple[tinker.TrainingClient, list[float]]:
    tc = sc.create_lora_training_client(base_model=MODEL, rank=4, seed=0)
    losses = [step(tc) for _ in range(3)]
    assert losses[0] > losses[1] > losses[2], losses
    assert tc.get_info().model_data.model_name == MODEL
    return tc, losses


def sampling(sc: tinker.ServiceClient, tc: tinker.TrainingClient) -> str:
    named = tc.save_weights_for_sampler("s1").result().path
    sampler = sc.create_sampling_client(model_path=named)
    out = sampler.sample(PROMPT, 2, types.SamplingParams(max_tokens=4, seed=1),
                         include_prompt_logprobs=True).result()
    assert len(out.sequences) == 2 and out.prompt_logprobs[0] is None
    ephemeral = tc.save_weights_and_get_sampling_client(name="eph")
    computed = sampler.compute_logprobs(PROMPT).result()
    assert ephemeral.compute_logprobs(PROMPT).result() == computed == out.prompt_logprobs
    base = sc.create_sampling_client(base_model=MODEL).compute_logprobs(PROMPT).result()
    assert base != computed, "the sampler checkpoint carries the trained adapter"
    return named


def resume(sc: tinker.ServiceClient, tc: tinker.TrainingClient) -> str:
    state = tc.save_state("c1").result().path
    step(tc)
    never_stopped = forward(tc)
    resumed = sc.create_training_client_from_state_with_optimizer(state)
    step(resumed)
    assert forward(resumed) == never_stopped, "resume with optimizer is exact"
    fresh = sc.create_training_client_from_state(state)
    step(fresh)
    assert forward(fresh) != never_stopped, "a fresh optimizer takes another step"
    return state


def rl_datum(prompt: list[int], seq: types.SampledSequence, advantage: float,
             sent: list[float]) -> types.Datum:
    """The cookbook's layout (model_input = S[:-1], targets = S[1:]) with provenance spans."""
    full, sid, n = prompt + list(seq.tokens), seq.sequence_id, len(seq.tokens)
    plain = types.Datum(
        model_input=types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={"target_tokens": full[1:],
                        "logprobs": [0.0] * (len(prompt) - 1) + sent,
                        "advantages": [0.0] * (len(prompt) - 1) + [advantage] * n})
    return plain.with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=sid, length=len(prompt)),
                     types.SampledProvenanceSpan(sequence_id=sid, length=n - 1)],
        loss_fn_inputs=[types.PromptProvenanceSpan(sequence_id=sid, offset=1,
                                                   length=len(prompt) - 1),
                        types.SampledProvenanceSpan(sequence_id=sid, length=n)])


def grpo(sc: tinker.ServiceClient, loss_fn: str, config: dict[str, Any] | None) -> float:
    """Two GRPO steps; the trainer's logprobs of the sampled tokens equal the sampler's."""
    tc = sc.create_lora_training_client(base_model=MODEL, rank=8, seed=0)
    record = loss_fn == "stable_reinforce"
    prompt, num_tokens = [2, 3, 4, 5], 5
    for i in range(2):
        sampler = tc.save_weights_and_get_sampling_client(record_stability_info=record)
        group = sampler.sample(types.ModelInput.from_ints(prompt), 4, types.SamplingParams(
            max_tokens=num_tokens, stop=[], seed=7 + i)).result().sequences
        rewards = [sum(s.tokens) / 1000 for s in group]
        data = [rl_datum(prompt, s, r - sum(rewards) / len(rewards),
                         [0.0] * num_tokens if record else list(s.logprobs or []))
                for s, r in zip(group, rewards, strict=True)]
        fb = tc.forward_backward(data, loss_fn, config)  # type: ignore[arg-type]
        opt = tc.optim_step(ADAM)
        out = fb.result()
        opt.result()
        for seq, o in zip(group, out.loss_fn_outputs, strict=True):
            trained = [float(x) for x in o["logprobs"].data[-num_tokens:]]
            assert trained == [float(x) for x in seq.logprobs or []], (loss_fn, i)
        if record:  # scored against the sampler's record (the sent logprobs are zeros)
            assert out.metrics["importance_ratio:mean"] == 1.0, out.metrics
    return float(out.metrics["loss:sum"])


def custom_equals_linear(sc: tinker.ServiceClient) -> None:
    custom = sc.create_lora_training_client(base_model=MODEL, rank=4, seed=0)
    linear = sc.create_lora_training_client(base_model=MODEL, rank=4, seed=0)

    def doubled_nll(data: list[types.Datum], lps: list[torch.Tensor]
                    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss = torch.stack([-2.0 * lp.sum() for lp in lps]).sum()
        return loss, {"custom:sum": float(loss.detach())}

    assert "custom:sum" in custom.forward_backward_custom(DATA, doubled_nll).result().metrics
    linear.forward_backward([datum(d.model_input.to_ints(), 2.0) for d in DATA],
                            "cross_entropy").result()
    custom.optim_step(ADAM).result()
    linear.optim_step(ADAM).result()
    assert forward(custom) == forward(linear), "custom loss = the matching linear loss"


def rest_and_tenants(sc: tinker.ServiceClient, tc: tinker.TrainingClient, state: str,
                     sampler_path: str) -> None:
    rest = sc.create_rest_client()
    assert tc.model_id in [r.training_run_id for r in rest.list_training_runs().result()
                           .training_runs]
    run = rest.get_training_run_by_tinker_path(state).result()
    assert (run.base_model, run.lora_rank) == (MODEL, 4)
    listed = {c.tinker_path for c in rest.list_checkpoints(tc.model_id).result().checkpoints}
    assert {state, sampler_path} <= listed, listed
    other = tinker.ServiceClient(base_url=BASE_URL, api_key=API_KEY + "-other")
    other_rest = other.create_rest_client()
    for refused in (lambda: other_rest.get_training_run(tc.model_id).result(),
                    lambda: other_rest.list_checkpoints(tc.model_id).result(),
                    lambda: other.create_training_client_from_state(state)):
        try:
            refused()
        except tinker.NotFoundError:
            continue
        raise AssertionError("another tenant reached this tenant's run")
    assert other_rest.list_training_runs().result().training_runs == []


def archive_members(sc: tinker.ServiceClient, state: str) -> list[str]:
    archive = sc.create_rest_client().get_checkpoint_archive_url_from_tinker_path(state).result()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(archive.url, timeout=30) as response, tarfile.open(
            fileobj=io.BytesIO(response.read())) as tar:
        members = tar.getnames()
    assert {"adapter_config.json", "adapter_model.safetensors", "checkpoint_complete"} <= set(
        members), members
    return members


def main() -> dict[str, Any]:
    sc = tinker.ServiceClient(base_url=BASE_URL, api_key=API_KEY)
    tc, losses = sft(sc)
    sampler_path = sampling(sc, tc)
    state = resume(sc, tc)
    rl = {loss_fn: grpo(sc, loss_fn, config) for loss_fn, config in RL_LOSSES}
    custom_equals_linear(sc)
    rest_and_tenants(sc, tc, state, sampler_path)
    return {"losses": losses, "state": state, "rl_loss": rl, "archive": archive_members(sc, state)}


def before_restart(state_file: str) -> dict[str, Any]:
    tc, _ = sft(tinker.ServiceClient(base_url=BASE_URL, api_key=API_KEY))
    state = tc.save_state("before-restart").result().path
    step(tc)
    saved = {"state": state, "model_id": tc.model_id, "never_stopped": forward(tc)}
    with open(state_file, "w") as f:
        json.dump(saved, f)
    return {"state": state}


def after_restart(state_file: str) -> dict[str, Any]:
    with open(state_file) as f:
        saved = json.load(f)
    sc = tinker.ServiceClient(base_url=BASE_URL, api_key=API_KEY)
    listed = sc.create_rest_client().list_checkpoints(saved["model_id"]).result().checkpoints
    assert saved["state"] in {c.tinker_path for c in listed}, listed
    resumed = sc.create_training_client_from_state_with_optimizer(saved["state"])
    step(resumed)
    assert forward(resumed) == saved["never_stopped"], "resume after restart is exact"
    return {"state": saved["state"]}


if __name__ == "__main__":
    phases = {"main": main, "before-restart": before_restart, "after-restart": after_restart}
    summary = phases[PHASE](*sys.argv[5:])
    print(json.dumps({"ok": True, "phase": PHASE, **summary}))
