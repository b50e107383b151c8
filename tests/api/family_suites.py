"""The SDK 0.38 suites run again on another family's tiny built-in, served under a catalogue name.

`install` puts into a test module: a `suite_server` serving only that model (so no test can
fall back to the dense default), a `trained` run, the family checks (the server reports the
arch, the export's ``target_modules``, usage billed at the catalogue rate of the name), and the
dense suites' own test functions (not copies) with their module global ``MODEL`` rebound:
SFT with pipelined chunked steps, forward_backward_custom, the RL losses, save/resume with the
optimizer bitwise, GRPO with every loss and ``kl_sample_train`` exactly 0, named and ephemeral
sampler checkpoints, sampler = trainer logprobs, and the PEFT export download.
"""

from __future__ import annotations

import json
import shutil
import types as pytypes
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import tinker
import torch

from loraplex.cli.model_sources import builtin_dir
from loraplex.config import ModelSource
from tests.api import test_downloads, test_grpo, test_sampling, test_training
from tests.api.conftest import Server
from tests.api.live_server import live_server
from tests.integration.serve_fake import fake_context

SUITES = (test_training.test_sft_loop_with_pipelined_chunked_steps_lowers_the_loss,
          test_training.test_forward_backward_custom_equals_the_matching_linear_loss,
          test_training.test_save_state_then_load_with_and_without_optimizer,
          test_training.test_rl_losses_run_and_report_per_token_outputs,
          test_grpo.test_grpo_steps_train_on_policy_with_zero_sampler_trainer_kl,
          test_sampling.test_named_and_ephemeral_sampler_checkpoints,
          test_sampling.test_sampling_logprobs_match_training_logprobs,
          test_downloads.test_external_weights_plain_and_age_encrypted)


def on_model(test: Callable[..., None], model: str) -> Callable[..., None]:
    """``test`` with the module global ``MODEL`` it reads rebound to ``model`` (its marks,
    e.g. parametrize, travel along)."""
    fn = pytypes.FunctionType(test.__code__, {**test.__globals__, "MODEL": model},
                              test.__name__, test.__defaults__, test.__closure__)
    fn.__dict__.update(test.__dict__)
    fn.__doc__ = test.__doc__
    return fn


def install(namespace: dict[str, Any], *, model: str, builtin: str, arch: str,
            train_usd_per_m: float, export_targets: set[str]) -> None:
    """Define the suite's fixtures and tests in a test module's ``namespace``."""

    @pytest.fixture(scope="module")
    def suite_server(tmp_path_factory: pytest.TempPathFactory,
                     builtin_model_dir: Callable[[str], Any]) -> Iterator[Server]:
        data_dir = tmp_path_factory.mktemp(f"loraplex-{builtin}")
        shutil.copytree(builtin_model_dir(builtin), builtin_dir(str(data_dir), builtin))
        # One torch thread: with two, a Qwen3.5 adapter's LoRA weight gradients differ run to
        # run in the last bit on the packed-kernel path (MKL's GEMMs after the kernel's OpenMP
        # regions; docs/security.md "Not yet"), and these suites compare training runs bit for bit.
        threads = torch.get_num_threads()
        ctx = fake_context(str(data_dir), models=(ModelSource(model, f"builtin:{builtin}"),),
                           client_config={"fwdbwd_max_chunk_len": 2}, executor="engine",
                           num_threads=1)
        try:
            with live_server(ctx) as url:
                yield Server(url, ctx)
        finally:
            ctx.stores.close()
            torch.set_num_threads(threads)

    @pytest.fixture
    def trained(service_client: Callable[..., tinker.ServiceClient],
                new_key: Callable[[], str]) -> tuple[str, tinker.TrainingClient]:
        key = new_key()
        tc = service_client(key).create_lora_training_client(base_model=model, rank=4).result()
        tc.forward_backward(test_training.DATA, "cross_entropy")
        tc.optim_step(test_training.ADAM).result()
        return key, tc

    def test_the_server_runs_the_family(server: Server, new_key: Callable[[], str]) -> None:
        caps = tinker.RestClient(base_url=server.url, api_key=new_key()
                                 ).get_server_capabilities().result()
        assert [m.model_name for m in caps.supported_models] == [model]
        assert server.ctx.catalog.get(model).info.arch == arch

    def test_the_export_names_the_familys_targets(server: Server, trained: Any) -> None:
        key, tc = trained
        rest = tinker.RestClient(base_url=server.url, api_key=key)
        path = tc.save_weights_external("export").result().path
        urls = rest.get_external_weights_urls(path).result().urls
        config = json.loads(test_downloads.fetch(urls["adapter_config.json"]))
        assert export_targets <= set(config["target_modules"])

    def test_usage_is_billed_at_the_catalogue_rate(server: Server, trained: Any) -> None:
        key, tc = trained
        report = httpx.get(f"{server.url}/api/v1/loraplex/usage", headers={"X-API-Key": key},
                           trust_env=False, timeout=30).json()
        run = next(r for r in report["runs"] if r["run_id"] == tc.model_id)
        assert run["base_models"] == [model]
        tokens = run["tokens"]["trained_tokens"]
        assert tokens == sum(len(d.model_input.to_ints()) for d in test_training.DATA)
        assert run["bill_usd"]["per_rollout"]["train"] == pytest.approx(
            tokens * train_usd_per_m / 1e6)

    namespace.update(suite_server=suite_server, trained=trained,
                     test_the_server_runs_the_family=test_the_server_runs_the_family,
                     test_the_export_names_the_familys_targets=(
                         test_the_export_names_the_familys_targets),
                     test_usage_is_billed_at_the_catalogue_rate=(
                         test_usage_is_billed_at_the_catalogue_rate))
    for test in SUITES:
        namespace[test.__name__] = on_model(test, model)
