"""Several tenants' SDK clients (one thread each) train and sample against one server process at
once; the cycle records read back through /api/v1/loraplex/stats show that their work was
packed: cycles carrying several tenants, and a model's chunks with its optim_step.

With the default (toy) test executor the server runs the no-op engine with 20 ms per engine
call, so ops queue while a call runs, as they do on a real engine; with
``LORAPLEX_TEST_EXECUTOR=engine`` it runs the torch engine on the built-in tiny model.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker
from tinker import types

from loraplex.config import DEFAULT_MODEL_NAME as MODEL
from loraplex.store.stores import open_stores
from tests.api.test_training import ADAM, datum
from tests.integration.conftest import EXECUTOR, ServerProcess
from tests.integration.serve_fake import seed_builtin_tiny

NUM_TENANTS = 4
NUM_STEPS = 4
DATA = [datum([2 + i, 7, 11 + i, 5, 9, 3]) for i in range(6)]  # 3 chunks of 2 datums


@pytest.fixture
def packing_server(tmp_path: Path, tiny_model_dir: Path) -> Iterator[ServerProcess]:
    seed_builtin_tiny(tmp_path / "data", tiny_model_dir)
    engine = ["--executor", "engine"] if EXECUTOR == "engine" else [
        "--executor", "noop", "--engine-ms", "20"]
    server = ServerProcess(tmp_path / "data", "--open", *engine, "--client-config",
                           json.dumps({"fwdbwd_max_chunk_len": 2})).start()
    yield server
    server.stop()


def tenant_loop(url: str, key: str, errors: list[BaseException]) -> None:
    try:
        client = tinker.ServiceClient(base_url=url, api_key=key)
        tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
        for _ in range(NUM_STEPS):
            fb = tc.forward_backward(DATA, "cross_entropy")
            step = tc.optim_step(ADAM)  # pipelined: submitted before fb finished
            assert len(fb.result().loss_fn_outputs) == len(DATA)
            step.result()
        sampler = tc.save_weights_and_get_sampling_client().result()
        out = sampler.sample(types.ModelInput.from_ints([2, 3, 4]), 2,
                             types.SamplingParams(max_tokens=3, seed=1)).result()
        assert len(out.sequences) == 2
        client.close("success").result(timeout=90)
    except BaseException as exc:  # reported by the main thread
        errors.append(exc)


def test_many_tenants_work_is_packed_into_shared_cycles(packing_server: ServerProcess) -> None:
    keys = [f"tml-packing-{i}" for i in range(NUM_TENANTS)]
    errors: list[BaseException] = []
    threads = [threading.Thread(target=tenant_loop, args=(packing_server.url, k, errors))
               for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    stores = open_stores(str(packing_server.data_dir))  # the operator's view names tenants
    operator = stores.keys.create("packing-operator", operator=True)
    stores.close()
    stats: dict[str, Any] = httpx.get(
        f"{packing_server.url}/api/v1/loraplex/stats?recent=4096",
        headers={"X-API-Key": operator}, trust_env=False, timeout=30).json()
    cycles = [c for c in stats["schedulers"][0]["recent_cycles"] if c["kind"] == "cycle"]
    assert len(stats["tenants"]) == NUM_TENANTS
    assert sum(c["num_tokens"] for c in cycles) == NUM_TENANTS * NUM_STEPS * 36
    assert max(len(c["tenants"]) for c in cycles) >= 2, "no cycle carried two tenants"
    assert len(cycles) < NUM_TENANTS * NUM_STEPS * 4, "no fewer engine calls than one per op"
    assert any(c["num_ops"] > c["num_models"] for c in cycles), (
        "no cycle carried several ops of one model (chunks, or a step with its optim_step)")
    summary = stats["schedulers"][0]["cycles"]
    assert summary["mean_tenants"] > 1.0 or summary["multi_tenant_fraction"] > 0
