"""Checkpoint downloads: SDK 0.38 external weights (plain and age-encrypted) fetched from signed
URLs without auth, the ``tinker checkpoint download`` CLI, and the 0.27 archive endpoint."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import urllib.request
from collections.abc import Callable
from pathlib import Path

import httpx
import pyrage
import pytest
import tinker

from tests.api.conftest import MODEL, Server
from tests.api.test_training import ADAM, DATA

Make = Callable[..., tinker.ServiceClient]
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str) -> bytes:
    with NO_PROXY.open(url, timeout=30) as response:  # a plain GET, no X-API-Key
        return bytes(response.read())


@pytest.fixture
def trained(service_client: Make, new_key: Callable[[], str]
            ) -> tuple[str, tinker.TrainingClient]:
    key = new_key()
    tc = service_client(key).create_lora_training_client(base_model=MODEL, rank=4).result()
    tc.forward_backward(DATA, "cross_entropy")
    tc.optim_step(ADAM).result()
    return key, tc


def test_external_weights_plain_and_age_encrypted(server: Server, trained) -> None:  # type: ignore[no-untyped-def]
    key, tc = trained
    rest = tinker.RestClient(base_url=server.url, api_key=key)
    plain_path = tc.save_weights_external("export").result().path
    assert plain_path == f"tinker://{tc.model_id}/external_weights/export"
    urls = rest.get_external_weights_urls(plain_path).result().urls
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(urls)
    plain = {name: fetch(url) for name, url in urls.items()}
    assert json.loads(plain["adapter_config.json"])["r"] == 4

    identity = pyrage.x25519.Identity.generate()
    enc_path = tc.save_weights_external(
        "sealed", age_encryption_recipients=[str(identity.to_public())]).result().path
    sealed = rest.get_external_weights_urls(enc_path).result().urls
    assert set(sealed) == {f"{name}.age" for name in plain}
    for name, url in sealed.items():
        assert pyrage.decrypt(fetch(url), [identity]) == plain[name.removesuffix(".age")]

    tampered = urls["adapter_config.json"].replace("sig=", "sig=0")
    assert httpx.get(tampered, trust_env=False).status_code == 404
    with pytest.raises(tinker.RequestFailedError, match=r"age_encryption_recipients\[0\]"):
        tc.save_weights_external("bad", age_encryption_recipients=["not-a-key"]).result()


def test_tinker_cli_downloads_a_training_checkpoint(server: Server, trained,  # type: ignore[no-untyped-def]
                                                    tmp_path: Path) -> None:
    key, tc = trained
    state = tc.save_state("final").result().path
    env = {**os.environ, "TINKER_BASE_URL": server.url, "TINKER_API_KEY": key,
           "NO_PROXY": "127.0.0.1,localhost", "TINKER_TELEMETRY": "0"}
    tinker_cli = os.path.join(os.path.dirname(sys.executable), "tinker")
    done = subprocess.run([tinker_cli, "checkpoint", "download", state, "--output",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    [folder] = list(tmp_path.iterdir())
    files = {p.name for p in folder.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    rest = tinker.RestClient(base_url=server.url, api_key=key)
    exports = [c for r in rest.list_training_runs().result().training_runs
               for c in rest.list_checkpoints(r.training_run_id).result().checkpoints
               if c.checkpoint_type == "external"]
    assert exports == [], "the CLI deletes its temporary export"


def test_archive_endpoint_redirects_to_a_tar(server: Server, trained) -> None:  # type: ignore[no-untyped-def]
    key, tc = trained
    path = tc.save_weights_for_sampler("s1").result().path
    run_id, checkpoint_id = path.removeprefix("tinker://").split("/", 1)
    answer = httpx.get(f"{server.url}/api/v1/training_runs/{run_id}/checkpoints/"
                       f"{checkpoint_id}/archive", headers={"X-API-Key": key},
                       follow_redirects=False, trust_env=False)
    assert answer.status_code == 302 and answer.headers["Expires"]
    with tarfile.open(fileobj=io.BytesIO(fetch(answer.headers["Location"]))) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"adapter_config.json", "adapter_model.safetensors",
                            "checkpoint_complete"}
    assert members["checkpoint_complete"].size == 0
