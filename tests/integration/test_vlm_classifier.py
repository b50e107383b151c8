"""tinker-cookbook 0.6.1's ``vlm_classifier`` recipe, unmodified, against `loraplex serve`:
the built-in tiny Qwen3-VL-MoE served as ``Qwen/Qwen3-VL-30B-A3B-Instruct``, renderer
``qwen3_vl_instruct``, on a small image dataset the test makes.

What the recipe needs from outside, and how the test gives it (the recipe code untouched):
- the tokenizer and the image processor by model name (``AutoTokenizer`` /
  ``AutoImageProcessor.from_pretrained``): ``loraplex model cache-tokenizer`` installs the
  served model's tokenizer, ``config.json`` and ``preprocessor_config.json`` into a private
  HF cache (``HF_HOME``, ``HF_HUB_OFFLINE=1``), so the cookbook counts an image's tokens with
  the served model's own processor;
- its dataset (``datasets.load_dataset("dpdl-benchmark/caltech101")``): a local image folder
  of that name in the working directory (``{train,test}/<class>/*.png``, three classes of
  synthetic images), which ``load_dataset`` prefers to the hub (``HF_DATASETS_OFFLINE=1``);
- the service: ``base_url=`` and ``TINKER_API_KEY``; the model-pricing fetch (docs site) is
  sent to a dead proxy so it fails at once (the recipe ignores its failure).

The server's usage meter must count the same trained tokens as the recipe's own metrics: each
image as many tokens as the cookbook's processor gave it as ``expected_tokens``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from PIL import Image, ImageDraw

from tests.integration.conftest import LORAPLEX_SERVE, ServerProcess
from tests.integration.test_cookbook import recipe_env
from tests.integration.venvs import COOKBOOK_STEPS, ensure_venv

MODEL = "Qwen/Qwen3-VL-30B-A3B-Instruct"
KEY = "tml-vlm"
CLASSES = {"red_circle": (220, 40, 40), "green_square": (40, 200, 60), "blue_bar": (40, 60, 220)}


def make_dataset(root: Path) -> None:
    for split, count in (("train", 6), ("test", 2)):
        for k, (name, colour) in enumerate(CLASSES.items()):
            folder = root / "dpdl-benchmark" / "caltech101" / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                image = Image.new("RGB", (48 + 4 * i, 40 + 2 * k), (250, 250, 250))
                draw = ImageDraw.Draw(image)
                box = (4 + i, 4, 36 + i, 30)
                [draw.ellipse, draw.rectangle, draw.line][k](box, fill=colour)
                image.save(folder / f"{i}.png")


@pytest.mark.slow
def test_vlm_classifier_recipe_runs_unmodified(tmp_path: Path) -> None:
    python = ensure_venv("cookbook", COOKBOOK_STEPS,
                         "import tinker_cookbook.recipes.vlm_classifier.train")
    server = ServerProcess(tmp_path / "data", "--open", "--threads", "1", "--model",
                           f"{MODEL}=builtin:tiny-vl-moe", command=LORAPLEX_SERVE).start()
    try:
        hf_home = tmp_path / "hf"
        subprocess.run([sys.executable, "-m", "loraplex", "model", "cache-tokenizer", MODEL,
                        "--data-dir", str(server.data_dir), "--hf-home", str(hf_home)],
                       check=True, capture_output=True, timeout=120)
        work = tmp_path / "work"
        make_dataset(work)
        env = recipe_env(server.url, KEY, hf_home, HF_DATASETS_CACHE=str(tmp_path / "ds"))
        done = subprocess.run(
            [python, "-m", "tinker_cookbook.recipes.vlm_classifier.train",
             f"experiment_dir={tmp_path / 'runs'}", f"model_name={MODEL}",
             "renderer_name=qwen3_vl_instruct", f"base_url={server.url}", "batch_size=6",
             "num_epochs=1", "max_steps=2", "n_eval=6", "lora_rank=8", "eval_every=1",
             "save_every=0", "max_tokens=8", "behavior_if_log_dir_exists=delete"],
            env=env, cwd=work, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        logs = list((tmp_path / "runs").rglob("metrics.jsonl"))
        assert len(logs) == 1
        metrics = [json.loads(line) for line in logs[0].read_text().splitlines()]
        train = [m for m in metrics if "train_mean_nll" in m]
        assert [m["step"] for m in train] == [0, 1]
        assert all(math.isfinite(m["train_mean_nll"]) for m in train)
        # its evaluators ran on the test images: the NLL one (finite logprobs at image
        # positions) and the sampling one (greedy answers graded)
        assert all(math.isfinite(m["test/nll"]) and 0 <= m["accuracy"] <= 1 for m in train)
        assert all(m["tokens/trained"] > 6 * 20 for m in train)  # images count as tokens
        usage = httpx.get(f"{server.url}/api/v1/loraplex/usage", headers={"X-API-Key": KEY},
                          trust_env=False, timeout=30)
        assert usage.status_code == 200, usage.text
        tokens = usage.json()["totals"]["tokens"]
        assert tokens["num_failed"] == 0
        assert tokens["trained_tokens"] == train[-1]["tokens/cumulative/trained"]
        assert tokens["prompt_tokens"] > 0 and tokens["sampled_tokens"] > 0  # the evaluators
    finally:
        server.stop()
