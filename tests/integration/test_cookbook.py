"""Two unmodified tinker-cookbook 0.6.1 recipes against `loraplex serve` (cookbook.md §10): the
SFT recipe ``prompt_distillation.train`` (S1) and the RL recipe ``math_rl.train`` on the
synthetic arithmetic env (S2), with ``loss_fn=importance_sampling`` and with its default
``stable_reinforce`` (record_stability_info samplers, provenance spans).

The recipes run in their own venv (`venvs.COOKBOOK_STEPS`), offline: the tokenizer of the
built-in tiny model, served as the catalogue name ``Qwen/Qwen3-8B``, comes from a private HF
cache made by ``loraplex model cache-tokenizer``. The pass criterion for RL is the cookbook's own
sampler/trainer agreement, ``optim/kl_sample_train_v1``: |v1| ≤ 1e-3 on every step, and exactly
0 here (the engine's sampler and trainer are bitwise identical in batch-invariant mode).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tinker
from tinker import types
from tokenizers import Tokenizer

from loraplex.cli.model_sources import resolve_source
from loraplex.config import DEFAULT_MODEL_NAME as MODEL
from tests.integration.conftest import LORAPLEX_SERVE, ServerProcess
from tests.integration.venvs import COOKBOOK_STEPS, ensure_venv

KEY = "tml-cookbook"
RL_STEPS = 2
IMPORTS = ("import tinker, tinker_cookbook.recipes.math_rl.train, "
           "tinker_cookbook.recipes.prompt_distillation.train; "
           "assert tinker.__version__ == '0.38.0'")


@pytest.fixture(scope="module")
def cookbook_python() -> str:
    return ensure_venv("cookbook", COOKBOOK_STEPS, IMPORTS)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict]]:
    """`loraplex serve` (built-in tiny model as Qwen/Qwen3-8B, one torch thread: the recipe
    process needs the other core) and the recipes' offline environment."""
    root = tmp_path_factory.mktemp("cookbook")
    server = ServerProcess(root / "data", "--open", "--threads", "1",
                           command=LORAPLEX_SERVE).start()
    hf_home = root / "hf"
    subprocess.run([sys.executable, "-m", "loraplex", "model", "cache-tokenizer", MODEL,
                    "--data-dir", str(server.data_dir), "--hf-home", str(hf_home)],
                   check=True, capture_output=True, timeout=120)
    env = recipe_env(server.url, KEY, hf_home, TINKER_COOKBOOK_RUNS_DIR=str(root / "runs"))
    yield server, env
    server.stop()


def recipe_env(url: str, key: str, hf_home: Path, **extra: str) -> dict[str, str]:
    """A recipe process's environment: the server, offline HF (tokenizers from ``hf_home``),
    and no internet (the pricing fetch fails at once instead of trying it)."""
    no_proxy = "127.0.0.1,localhost"
    return {**os.environ, "TINKER_BASE_URL": url, "TINKER_API_KEY": key,
            "TINKER_TELEMETRY": "0", "NO_PROXY": no_proxy, "no_proxy": no_proxy,
            "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "HTTPS_PROXY": "http://127.0.0.1:9",
            "https_proxy": "http://127.0.0.1:9", **extra}


def run_recipe(python: str, env: dict, module: str, *args: str) -> None:
    done = subprocess.run([python, "-m", f"tinker_cookbook.recipes.{module}", *args], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


def rows(log_path: Path, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_path / name).read_text().splitlines()]


@pytest.mark.slow
def test_prompt_distillation_sft_recipe(cookbook_python: str, served: tuple[ServerProcess, dict],
                                        tmp_path: Path) -> None:
    server, env = served
    data = Path(cookbook_python).parents[1] / "lib" / "python3.11" / "site-packages" / \
        "tinker_cookbook" / "example_data" / "conversations.jsonl"
    log_path = tmp_path / "s1"
    run_recipe(cookbook_python, env, "prompt_distillation.train",
               f"file_path={data}", f"model_name={MODEL}", "renderer_name=qwen3",
               "batch_size=16", "max_length=512", "num_epochs=1", "max_steps=3", "lora_rank=8",
               "save_every=2", "eval_every=0", f"log_path={log_path}",
               "behavior_if_log_dir_exists=delete")
    metrics = rows(log_path, "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert all(m["num_sequences"] == 16 and math.isfinite(m["train_mean_nll"]) for m in metrics)
    checkpoints = rows(log_path, "checkpoints.jsonl")
    assert [c["name"] for c in checkpoints] == ["000002", "final"]
    rest = tinker.RestClient(base_url=server.url, api_key=KEY)
    listed = {c.tinker_path for c in rest.list_user_checkpoints(limit=1000).result().checkpoints}
    for c in checkpoints:
        assert c["state_path"].endswith(f"/weights/{c['name']}") and c["state_path"] in listed
        assert c["sampler_path"].endswith(f"/sampler_weights/{c['name']}")
        assert c["sampler_path"] in listed


@pytest.fixture(scope="module")
def warm_start(served: tuple[ServerProcess, dict]) -> str:
    """A LoRA state (rank 8) whose policy ends its answer with ``<|im_end|>`` about half the
    time. The random tiny model almost never does, so every rollout would fail the arithmetic
    env's format check, all advantages would be zero, the weights would never move, and the
    KL check after step 0 would compare a sampler and a trainer that trivially agree. From this
    state the groups' rewards differ, so each step really changes the weights the next
    sampler must pick up."""
    server, _ = served
    model_dir = resolve_source("builtin:tiny", str(server.data_dir), create=False)
    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    im_end, vocab = tokenizer.token_to_id("<|im_end|>"), tokenizer.get_vocab_size()
    rng = np.random.default_rng(0)
    client = tinker.ServiceClient(base_url=server.url, api_key=KEY)
    tc = client.create_lora_training_client(
        base_model=MODEL, rank=8, seed=0,
        user_metadata={"renderer_name": "qwen3_disable_thinking"}).result()
    for _ in range(30):  # targets: <|im_end|> with probability 0.1, else a random token
        data = [types.Datum(
            model_input=types.ModelInput.from_ints(rng.integers(0, vocab, 32).tolist()),
            loss_fn_inputs={"target_tokens": np.where(rng.random(32) < 0.1, im_end,
                                                      rng.integers(0, vocab, 32)).tolist(),
                            "weights": [1.0] * 32}) for _ in range(16)]
        tc.forward_backward(data, "cross_entropy")
        tc.optim_step(types.AdamParams(learning_rate=0.01)).result()
    return str(tc.save_state("warm-start").result().path)


@pytest.mark.slow
@pytest.mark.parametrize("loss_args", [["loss_fn=importance_sampling"], []],
                         ids=["importance_sampling", "default_stable_reinforce"])
def test_math_rl_recipe_sampler_and_trainer_agree(
    cookbook_python: str, served: tuple[ServerProcess, dict], warm_start: str,
    tmp_path: Path, loss_args: list[str]
) -> None:
    _, env = served
    log_path = tmp_path / "s2"
    run_recipe(cookbook_python, env, "math_rl.train",
               f"model_name={MODEL}", "renderer_name=qwen3_disable_thinking",
               "groups_per_batch=8", "group_size=4", "max_tokens=8", f"max_steps={RL_STEPS}",
               "lora_rank=8", "eval_every=0", "save_every=1", *loss_args,
               f"load_checkpoint_path={warm_start}", "learning_rate=1e-3",
               f"log_path={log_path}", "behavior_if_log_dir_exists=delete")
    config = json.loads((log_path / "config.json").read_text())
    assert config["loss_fn"] == (loss_args[0].split("=")[1] if loss_args else "stable_reinforce")
    steps = [m for m in rows(log_path, "metrics.jsonl") if "optim/kl_sample_train_v1" in m]
    assert [m["step"] for m in steps] == list(range(RL_STEPS))
    assert steps[0]["env/all/by_group/frac_mixed"] > 0, "step 0 trained on non-zero advantages"
    for m in steps:
        kl = m["optim/kl_sample_train_v1"]
        assert abs(kl) <= 1e-3, f"step {m['step']}: kl_sample_train_v1 = {kl}"
        assert kl == 0.0 and m["optim/kl_sample_train_v2"] == 0.0, "bitwise sampler = trainer"
        assert "env/all/reward/total" in m


def test_cookbook_renderers_work_on_the_builtin_tokenizers(cookbook_python: str) -> None:
    """`tests/engine/builtin/test_builtin_renderers.py` and `test_family_renderers.py` (the
    Qwen3.5 and gpt-oss renderers against the built-ins' chat templates, token for token) need
    `tinker_cookbook`, which lives only in the cookbook venv (the project venv skips them): run
    them there."""
    tests = Path(__file__).resolve().parents[1] / "engine/builtin"
    done = subprocess.run([cookbook_python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tests / "test_builtin_renderers.py"),
                           str(tests / "test_family_renderers.py")],
                          cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert "16 passed" in done.stdout, done.stdout[-2000:]
