"""GRPO through the SDK 0.38, the cookbook's way: each step samples groups from a fresh sampler
snapshot, centres a reward within each group, and trains with one RL loss on datums carrying
provenance spans. On the engine the sampler and the trainer agree bitwise (KL(sampler ‖
trainer) = 0 at every step, the cookbook's ``optim/kl_sample_train_v1``), and the first step
moves every loss towards the advantaged samples."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tinker
from tinker import types

from tests.api.conftest import MODEL, engine_only
from tests.api.test_provenance import rl_datum

Make = Callable[..., tinker.ServiceClient]
PROMPTS = [[2, 3, 4, 5], [9, 8, 7]]
GROUP_SIZE = 4
NUM_TOKENS = 5
ADAM = types.AdamParams(learning_rate=1e-3)
LOSSES = [
    pytest.param("importance_sampling", None, id="importance_sampling"),
    pytest.param("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, id="ppo"),
    pytest.param("cispo", None, id="cispo"),
    pytest.param("dro", {"beta": 0.1}, id="dro"),
    pytest.param("stable_reinforce", None, marks=engine_only, id="stable_reinforce"),
]


def reward(tokens: list[int]) -> float:
    """Larger token ids are better: distinct samples get distinct rewards, so every sample
    has a non-zero advantage (the engine's per-datum metrics average over datums)."""
    return float(np.mean(tokens)) / 1000


def rollouts(sampler: tinker.SamplingClient, step: int
             ) -> list[tuple[list[int], types.SampledSequence, float]]:
    """(prompt, sequence, group-centred advantage) for every sample of every group."""
    params = types.SamplingParams(max_tokens=NUM_TOKENS, stop=[], seed=100 + step)
    futures = [sampler.sample(types.ModelInput.from_ints(p), GROUP_SIZE, params) for p in PROMPTS]
    out = []
    for prompt, future in zip(PROMPTS, futures, strict=True):
        group = future.result().sequences
        rewards = np.array([reward(list(s.tokens)) for s in group])
        out += [(prompt, s, float(a)) for s, a in zip(group, rewards - rewards.mean(),
                                                      strict=True)]
    return out


def action_logprobs(output: types.ForwardBackwardOutput) -> list[np.ndarray]:
    """Each datum's trainer logprobs of its sampled tokens (the last NUM_TOKENS targets)."""
    return [np.asarray(o["logprobs"].data, dtype=np.float32)[-NUM_TOKENS:]
            for o in output.loss_fn_outputs]


@pytest.mark.parametrize(("loss_fn", "config"), LOSSES)
def test_grpo_steps_train_on_policy_with_zero_sampler_trainer_kl(
    service_client: Make, loss_fn: str, config: dict[str, Any] | None
) -> None:
    tc = service_client().create_lora_training_client(base_model=MODEL, rank=8, seed=0).result()
    record = loss_fn == "stable_reinforce"
    for step in range(3):
        sampler = tc.save_weights_and_get_sampling_client(record_stability_info=record).result()
        batch = rollouts(sampler, step)
        # stable_reinforce scores against the sampler's own record found through the spans:
        # the logprobs the client sends are deliberately wrong to show they are not used.
        data = [rl_datum(seq, prompt=prompt, advantage=adv,
                         logprobs=[0.0] * NUM_TOKENS if record else None)
                for prompt, seq, adv in batch]
        fb = tc.forward_backward(data, loss_fn, config)
        optim = tc.optim_step(ADAM)  # pipelined, as the cookbook does
        out = fb.result()
        optim.result()
        for (_, seq, _), trained in zip(batch, action_logprobs(out), strict=True):
            np.testing.assert_array_equal(trained, np.asarray(seq.logprobs, dtype=np.float32),
                                          err_msg=f"step {step}: sampler ≠ trainer")
        assert np.isfinite(out.metrics["loss:sum"])
        if record:
            assert out.metrics["recorded_fraction:mean"] == 1.0
            assert out.metrics["importance_ratio:mean"] == 1.0, "on-policy against the record"
        if step == 0:
            first_batch, first_lps = batch, action_logprobs(out)
    # The first step's samples, scored now: the advantaged ones gained probability.
    rescored = action_logprobs(tc.forward([rl_datum(s, prompt=p, advantage=a)
                                           for p, s, a in first_batch], "importance_sampling"
                                          ).result())
    gain = sum(a * float((after - before).sum())
               for (_, _, a), after, before in zip(first_batch, rescored, first_lps, strict=True))
    assert gain > 0, f"{loss_fn}: the policy moved away from the advantaged samples ({gain})"
