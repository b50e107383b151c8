"""Long contexts through the official SDK on ``builtin:tiny-long`` (the tiny built-in with
Qwen3's 40,960-position context): one 32,768-token datum trained with cross_entropy and an
AdamW step (twice the scheduler's token budget: it runs alone in its cycle); an 8,192-token
prompt sampled with its prompt logprobs, equal bit for bit to the trainer's forward of the same
tokens; 40,961 tokens refused as before (a user error naming the field). SmolLM2-135M at its
full 8,192 tokens is trained by ``benchmarks/memory.py`` (12 minutes a step on 2 cores), and by
`test_smollm2_trains_its_full_context` when ``LORAPLEX_TEST_LONG_SMOLLM2=1``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

from loraplex.api.context import ServerContext
from loraplex.cli.serve_cmd import build_context
from loraplex.config import EngineConfig, ModelSource, SchedulerConfig, ServerConfig
from tests.api.live_server import live_server

NAME = "Qwen/Qwen3-8B"


def serving(data_dir: Path, source: str) -> ServerContext:
    from loraplex.engine.executor import Engine

    config = ServerConfig(host="127.0.0.1", port=0, data_dir=str(data_dir), open_access=True,
                          models=(ModelSource(NAME, source),))
    engine = EngineConfig(kv_cache_blocks=256)
    return build_context(config, SchedulerConfig(), lambda d: Engine(d, engine))


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tinker.ServiceClient]:
    ctx = serving(tmp_path_factory.mktemp("long"), "builtin:tiny-long")
    with live_server(ctx) as url:
        service = tinker.ServiceClient(base_url=url, api_key="tml-long-context")
        yield service
    ctx.stores.close()


def datum(tokens: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:],
                                       "weights": [1.0] * (len(tokens) - 1)})


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 1000, n).tolist()


@pytest.mark.slow
def test_a_32k_token_datum_trains(client: tinker.ServiceClient) -> None:
    tc = client.create_lora_training_client(base_model=NAME, rank=8, seed=0).result()
    data = [datum(tokens(32_768 + 1, 0))]
    first = tc.forward_backward(data, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = tc.forward(data, "cross_entropy").result()
    assert len(first.loss_fn_outputs[0]["logprobs"].data) == 32_768
    assert after.metrics["loss:sum"] < first.metrics["loss:sum"]


def test_an_8k_prompt_samples_with_the_trainers_logprobs(client: tinker.ServiceClient) -> None:
    tc = client.create_lora_training_client(base_model=NAME, rank=8, seed=1).result()
    prompt = tokens(8192, 1)
    sampler = tc.save_weights_and_get_sampling_client("long")
    out = sampler.sample(types.ModelInput.from_ints(prompt), 2,
                         types.SamplingParams(max_tokens=8, seed=3),
                         include_prompt_logprobs=True).result()
    trained = tc.forward([datum(prompt)], "cross_entropy").result()
    expected = np.asarray(trained.loss_fn_outputs[0]["logprobs"].data, dtype=np.float32)
    assert out.prompt_logprobs is not None
    got = np.asarray(out.prompt_logprobs[1:], dtype=np.float32)
    assert np.array_equal(got, expected), "sampler = trainer on an 8K prompt"
    assert all(len(s.tokens) == 8 for s in out.sequences)


def test_tokens_past_the_context_are_refused(client: tinker.ServiceClient) -> None:
    tc = client.create_lora_training_client(base_model=NAME, rank=8, seed=2).result()
    with pytest.raises(tinker.RequestFailedError,
                       match=r"data\[0\]\.model_input: 40961 tokens exceed the context of "
                             "40960") as info:
        tc.forward_backward([datum(tokens(40_962, 2))], "cross_entropy").result()
    assert info.value.category == types.RequestErrorCategory.User


@pytest.mark.skipif(os.environ.get("LORAPLEX_TEST_LONG_SMOLLM2") != "1",
                    reason="12 minutes on 2 cores: set LORAPLEX_TEST_LONG_SMOLLM2=1 "
                           "(benchmarks/memory.py trains it too)")
def test_smollm2_trains_its_full_context(smollm2_data_dir: Path) -> None:
    ctx = serving(smollm2_data_dir, "builtin:smollm2-135m")
    with live_server(ctx) as url:
        service = tinker.ServiceClient(base_url=url, api_key="tml-long-smollm2")
        tc = service.create_lora_training_client(base_model=NAME, rank=16, seed=0).result()
        out = tc.forward_backward([datum(tokens(8192 + 1, 4))], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-4)).result()
    ctx.stores.close()
    assert len(out.loss_fn_outputs[0]["logprobs"].data) == 8192
