"""EleutherAI's lm-evaluation-harness 0.4.13 itself (its own venv, as its users install it)
against the live server's ``/v1`` (``local-completions``, ``tokenizer_backend=remote``, so no
tokenizer download), on three local tasks (YAML + JSONL in ``lm_eval_tasks/``, offline): a
``multiple_choice`` (``echo`` + ``logprobs``), a ``loglikelihood_rolling`` and a
``generate_until`` with 6 ``until`` strings (7 stops with EOS, over OpenAI's cap of 4). Every
per-sample score equals lm-eval's own ``hf`` backend on the same weights: loglikelihoods within
1e-4, the same ``is_greedy`` flags, the same generations."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import MODEL, Server, engine_only
from tests.integration.venvs import ensure_venv

pytestmark = engine_only

TASKS = Path(__file__).parent / "lm_eval_tasks"
NAMES = ("tiny_mc", "tiny_roll", "tiny_gen")
LM_EVAL_STEPS = (("lm-eval[api]==0.4.13", "torch==2.13.0", "transformers==5.24.0"),)
TOL = 1e-4


def run_lm_eval(python: str, tasks: Path, out: Path, model: str, model_args: str,
                env: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    cmd = [python, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args,
           "--tasks", ",".join(NAMES), "--include_path", str(tasks), "--output_path", str(out),
           "--log_samples", "--device", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return {name: [json.loads(line) for line in
                   Path(glob.glob(str(out / "*" / f"samples_{name}_*.jsonl"))[0]).open()]
            for name in NAMES}


@pytest.fixture(scope="module")
def local_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The task YAMLs with their JSONL paths made absolute."""
    out = tmp_path_factory.mktemp("lm-eval-tasks")
    for path in TASKS.iterdir():
        text = path.read_text().replace("DATA_DIR", str(out))
        (out / path.name).write_text(text)
    return out


def test_lm_eval_scores_equal_its_hf_backend(server: Server, new_key: Callable[[], str],
                                             local_tasks: Path, tmp_path: Path) -> None:
    python = ensure_venv("lm-eval", LM_EVAL_STEPS, "import lm_eval, tenacity")
    key = new_key()
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OPENAI_API_KEY": key}
    ours = run_lm_eval(python, local_tasks, tmp_path / "server", "local-completions",
                       f"model={MODEL},base_url={server.url}/v1/completions,"
                       f"tokenizer_backend=remote,auth_token={key},num_concurrent=1,"
                       "max_retries=1,tokenized_requests=True", env)
    model_dir = server.ctx.catalog.get(MODEL).model_dir
    theirs = run_lm_eval(python, local_tasks, tmp_path / "hf", "hf",
                         f"pretrained={model_dir},dtype=float32", env)
    for name in NAMES:
        assert len(ours[name]) == len(theirs[name]) == 5, name
        for mine, ref in zip(ours[name], theirs[name], strict=True):
            assert mine["doc_id"] == ref["doc_id"]
            for got, want in zip(mine["resps"], ref["resps"], strict=True):
                if name == "tiny_gen":
                    assert got == want, (got, want)
                    continue
                got_ll, want_ll = got[0][0] if name == "tiny_mc" else got[0], \
                    want[0][0] if name == "tiny_mc" else want[0]
                assert abs(float(got_ll) - float(want_ll)) <= TOL, (name, got, want)
                if name == "tiny_mc":
                    assert got[0][1] == want[0][1], "is_greedy"


def test_loraplex_eval_stores_scores_with_the_checkpoint(
        server: Server, new_key: Callable[[], str], local_tasks: Path, tmp_path: Path,
        service_client: Callable[..., Any]) -> None:
    """``loraplex eval`` on two checkpoints of a run (before and after training), the stored
    scores equal lm-eval's results file, ``--compare`` shows both, the dashboard lists them,
    another tenant sees none of it, and deleting a checkpoint drops its scores."""
    import httpx
    import tinker

    from tests.api.test_training import ADAM, DATA

    python = ensure_venv("lm-eval", LM_EVAL_STEPS, "import lm_eval, tenacity")
    key = new_key()
    client = service_client(key)
    tc = client.create_lora_training_client(base_model=MODEL, rank=4, seed=1).result()
    before = tc.save_weights_for_sampler("before").result().path
    for _ in range(3):
        tc.forward_backward(DATA, "cross_entropy").result()
        tc.optim_step(ADAM).result()
    after = tc.save_weights_for_sampler("after").result().path
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_OFFLINE": "1", "TINKER_API_KEY": key}
    base = [sys.executable, "-m", "loraplex", "eval", "--server", server.url]
    for path, out in ((before, "b"), (after, "a")):
        done = subprocess.run([*base, "--model", path, "--tasks", "tiny_mc,tiny_roll",
                               "--limit", "3", "--include-path", str(local_tasks),
                               "--lm-eval-python", python,
                               "--num-concurrent", "2", "--out", str(tmp_path / out)],
                              capture_output=True, text=True, env=env, timeout=900)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "stored" in done.stdout
    headers = {"X-API-Key": key}
    got = httpx.get(f"{server.url}/api/v1/loraplex/evals", params=[("path", before),
                                                                   ("path", after)],
                    headers=headers, trust_env=False, timeout=30).json()["evals"]
    results = json.loads(Path(glob.glob(str(tmp_path / "a" / "**" / "results_*.json"),
                                        recursive=True)[0]).read_text())["results"]
    stored = {(e["task"], e["metric"]): e for e in got[after]}
    assert stored["tiny_mc", "acc"]["value"] == results["tiny_mc"]["acc,none"]
    assert stored["tiny_mc", "acc"]["num_samples"] == 3
    assert stored["tiny_roll", "word_perplexity"]["value"] == \
        results["tiny_roll"]["word_perplexity,none"]
    assert {k for k in stored} == {(e["task"], e["metric"]) for e in got[before]}
    assert got[before] != got[after], "training moved the scores"
    table = subprocess.run([*base, "--compare", before, after], capture_output=True, text=True,
                           env=env, timeout=120).stdout
    assert before in table and after in table and "word_perplexity" in table
    view = httpx.get(f"{server.url}/api/v1/loraplex/dashboard/tenant", headers=headers,
                     trust_env=False, timeout=30).json()
    row = next(c for c in view["checkpoints"] if c["tinker_path"] == after)
    assert {(e["task"], e["metric"]) for e in row["evals"]} == set(stored)
    stranger = {"X-API-Key": new_key()}
    assert httpx.get(f"{server.url}/api/v1/loraplex/evals", params={"path": after},
                     headers=stranger, trust_env=False, timeout=30).status_code == 404
    assert httpx.post(f"{server.url}/api/v1/loraplex/evals", headers=stranger,
                      json={"path": after, "scores": [{"task": "x", "metric": "y",
                                                       "value": 1.0}]},
                      trust_env=False, timeout=30).status_code == 404
    rest = tinker.RestClient(base_url=server.url, api_key=key)
    rest.delete_checkpoint_from_tinker_path(before).result()
    assert server.ctx.stores.eval_scores.list_for([before]) == {before: []}
    assert server.ctx.stores.eval_scores.list_for([after])[after]
