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
