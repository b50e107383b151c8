"""The SDK 0.38 suites again, on the built-in tiny Qwen3-MoE served as ``Qwen/Qwen3-30B-A3B``.

The same test functions as the dense suites (not copies): SFT with pipelined chunked steps,
forward_backward_custom, the RL losses, save/resume with the optimizer bitwise, GRPO with every
loss and the sampler's logprobs bitwise equal to the trainer's (``kl_sample_train`` exactly 0),
named/ephemeral sampler checkpoints, sampler = trainer logprobs, and the PEFT export download.
`on_moe` rebinds each function's ``MODEL`` to the MoE catalogue name; this module's
``suite_server`` serves only that model, so the tests cannot fall back to the dense one.
"""

from __future__ import annotations

import json
import types as pytypes
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tinker

from loraplex.cli.model_sources import builtin_dir
from loraplex.config import ModelSource
from tests.api import test_downloads, test_grpo, test_sampling, test_training
from tests.api.conftest import EXECUTOR, Server
from tests.api.live_server import live_server
from tests.integration.serve_fake import fake_context

MOE_MODEL = "Qwen/Qwen3-30B-A3B"
pytestmark = pytest.mark.skipif(EXECUTOR != "engine", reason="MoE needs the torch engine")


def on_moe(test: Callable[..., None]) -> Callable[..., None]:
    """``test`` with the module global ``MODEL`` it reads rebound to `MOE_MODEL` (its marks,
    e.g. parametrize, travel along)."""
    fn = pytypes.FunctionType(test.__code__, {**test.__globals__, "MODEL": MOE_MODEL},
                              test.__name__, test.__defaults__, test.__closure__)
    fn.__dict__.update(test.__dict__)
    fn.__doc__ = test.__doc__
    return fn


@pytest.fixture(scope="module")
def suite_server(tmp_path_factory: pytest.TempPathFactory, tiny_moe_model_dir: Path
                 ) -> Iterator[Server]:
    import shutil

    data_dir = tmp_path_factory.mktemp("loraplex-moe")
    shutil.copytree(tiny_moe_model_dir, builtin_dir(str(data_dir), "tiny-moe"))
    ctx = fake_context(str(data_dir), models=(ModelSource(MOE_MODEL, "builtin:tiny-moe"),),
                       client_config={"fwdbwd_max_chunk_len": 2}, executor="engine")
    assert ctx.catalog.get(MOE_MODEL) is not None
    with live_server(ctx) as url:
        yield Server(url, ctx)
    ctx.stores.close()


@pytest.fixture
def trained(service_client: Callable[..., tinker.ServiceClient], new_key: Callable[[], str]
            ) -> tuple[str, tinker.TrainingClient]:
    """`test_downloads.trained` on the MoE model."""
    key = new_key()
    tc = service_client(key).create_lora_training_client(base_model=MOE_MODEL, rank=4).result()
    tc.forward_backward(test_training.DATA, "cross_entropy")
    tc.optim_step(test_training.ADAM).result()
    return key, tc


def test_the_server_runs_the_moe_model(server: Server, new_key: Callable[[], str]) -> None:
    caps = tinker.RestClient(base_url=server.url, api_key=new_key()).get_server_capabilities(
    ).result()
    assert [m.model_name for m in caps.supported_models] == [MOE_MODEL]
    info = server.ctx.catalog.get(MOE_MODEL).info
    assert info.arch == "qwen3_moe" and info.card.moe is not None
    assert info.card.moe.num_experts == 8 and info.card.moe.top_k == 2


def test_export_download_holds_the_expert_tensors(server: Server, trained: Any) -> None:
    key, tc = trained
    rest = tinker.RestClient(base_url=server.url, api_key=key)
    path = tc.save_weights_external("moe").result().path
    urls = rest.get_external_weights_urls(path).result().urls
    config = json.loads(test_downloads.fetch(urls["adapter_config.json"]))
    assert {"w1", "w2", "w3"} <= set(config["target_modules"])


def test_usage_is_metered_and_priced_as_the_moe(server: Server, trained: Any) -> None:
    """Trained tokens of the MoE are billed at Qwen3-30B-A3B's rate (its 3B active
    parameters), not the dense default's."""
    import httpx

    key, tc = trained
    report = httpx.get(f"{server.url}/api/v1/loraplex/usage", headers={"X-API-Key": key},
                       trust_env=False, timeout=30).json()
    run = next(r for r in report["runs"] if r["run_id"] == tc.model_id)
    assert run["base_models"] == [MOE_MODEL]
    trained_tokens = run["tokens"]["trained_tokens"]
    assert trained_tokens == sum(len(d.model_input.to_ints()) for d in test_training.DATA)
    assert run["bill_usd"]["per_rollout"]["train"] == pytest.approx(trained_tokens * 0.36 / 1e6)


test_sft_loop_with_pipelined_chunked_steps_lowers_the_loss = on_moe(
    test_training.test_sft_loop_with_pipelined_chunked_steps_lowers_the_loss)
test_forward_backward_custom_equals_the_matching_linear_loss = on_moe(
    test_training.test_forward_backward_custom_equals_the_matching_linear_loss)
test_save_state_then_load_with_and_without_optimizer = on_moe(
    test_training.test_save_state_then_load_with_and_without_optimizer)
test_rl_losses_run_and_report_per_token_outputs = on_moe(
    test_training.test_rl_losses_run_and_report_per_token_outputs)
test_grpo_steps_train_on_policy_with_zero_sampler_trainer_kl = on_moe(
    test_grpo.test_grpo_steps_train_on_policy_with_zero_sampler_trainer_kl)
test_named_and_ephemeral_sampler_checkpoints = on_moe(
    test_sampling.test_named_and_ephemeral_sampler_checkpoints)
test_sampling_logprobs_match_training_logprobs = on_moe(
    test_sampling.test_sampling_logprobs_match_training_logprobs)
test_external_weights_plain_and_age_encrypted = on_moe(
    test_downloads.test_external_weights_plain_and_age_encrypted)
