"""The sampler's batch invariance on the built-in tiny Qwen3-MoE (``builtin:tiny-moe``).

The dense module's tests (`test_sampler_invariance`), collected here against a rig on the MoE
model: sampled logprobs bitwise the same alone and among 64 sequences of other adapters and
base rows, equal to the training forward's (sampler = trainer), across prefix-cache hit and
miss, for prompt logprobs; fast mode close. (Preemption and recompute, a scheduling matter
that runs the same forwards, stay with the dense module.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.sampling.rig import Rig, make_rig
from tests.engine.sampling.test_sampler_invariance import (
    test_fast_mode_is_close_to_the_training_forward,
    test_prefix_cache_hit_and_miss_give_identical_samples,
    test_prompt_logprobs_equal_the_training_forward,
    test_sampled_logprobs_equal_the_training_forward,
    test_sampled_logprobs_identical_alone_and_among_64_sequences,
)

__all__ = [  # collected here against the MoE rig below
    "test_fast_mode_is_close_to_the_training_forward",
    "test_prefix_cache_hit_and_miss_give_identical_samples",
    "test_prompt_logprobs_equal_the_training_forward",
    "test_sampled_logprobs_equal_the_training_forward",
    "test_sampled_logprobs_identical_alone_and_among_64_sequences"]


@pytest.fixture
def rig(tiny_moe_model_dir: Path) -> Rig:
    moe = make_rig(tiny_moe_model_dir)
    assert moe.model.spec.experts is not None
    assert {"w1", "w2", "w3"} <= set(moe.bank.get("a").weights)
    return moe
