"""The SDK's SFT, save/resume and GRPO tests of tests/api, unchanged, against a server whose
engine is two Ray workers (the conftest's ``server``): results as on one in-process engine,
``kl_sample_train`` exactly 0 with the sampler and the trainer on any worker."""

from __future__ import annotations

from tests.api.test_grpo import (  # noqa: F401  (collected here, run against Ray workers)
    test_grpo_steps_train_on_policy_with_zero_sampler_trainer_kl,
)
from tests.api.test_training import (  # noqa: F401
    test_save_state_then_load_with_and_without_optimizer,
    test_sft_loop_with_pipelined_chunked_steps_lowers_the_loss,
)
