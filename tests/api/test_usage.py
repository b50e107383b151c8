"""GET /api/v1/loraplex/usage after a scripted SDK session: counts equal the hand-computed
ones (a prompt sampled G times is G rollouts but one prefill), both billing modes, per run,
and a tenant sees only its own usage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
import tinker
from tinker import types

from tests.api.conftest import MODEL, Server
from tests.api.test_training import ADAM, datum

Make = Callable[..., tinker.ServiceClient]
PREFILL, SAMPLE, TRAIN = 0.13, 0.40, 0.40  # tinker-2026-01-05, Qwen/Qwen3-8B, USD per 1M


def usage(server: Server, key: str) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/api/v1/loraplex/usage", headers={"X-API-Key": key},
                         trust_env=False, timeout=30)
    assert response.status_code == 200, response.text
    return dict(response.json())


def sampled(response: types.SampleResponse) -> int:
    return sum(len(s.tokens) for s in response.sequences)


def test_usage_of_a_scripted_session_per_run_and_in_both_modes(
    server: Server, service_client: Make, new_key: Callable[[], str]
) -> None:
    key = new_key()
    client = service_client(key)
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    tc.forward_backward([datum([2, 3, 4, 5, 6]), datum([7, 8, 9, 10, 11, 12, 13])],
                        "cross_entropy").result()  # 12 trained tokens
    tc.forward([datum([2, 3, 4, 5])], "cross_entropy").result()  # 4 forward tokens
    tc.optim_step(ADAM).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=5, seed=3)
    group = sampler.sample(types.ModelInput.from_ints([2, 3, 4, 5, 6, 7]), 3, params).result()
    base = client.create_sampling_client(base_model=MODEL).result()
    alone = base.sample(types.ModelInput.from_ints([4, 5, 6, 7]), 2, params).result()

    report = usage(server, key)
    run, base_run = report["runs"]
    assert run["run_id"] == tc.model_id and base_run["run_id"] is None
    assert run["base_models"] == [MODEL] == base_run["base_models"]
    t = run["tokens"]
    assert (t["trained_tokens"], t["forward_tokens"]) == (12, 4)
    assert (t["prompt_tokens"], t["rollout_prompt_tokens"], t["num_sequences"]) == (6, 18, 3)
    assert t["sampled_tokens"] == sampled(group)
    assert base_run["tokens"]["prompt_tokens"] == 4
    assert base_run["tokens"]["rollout_prompt_tokens"] == 8
    assert base_run["tokens"]["sampled_tokens"] == sampled(alone)
    hits = run["tokens"]["cache_hit_tokens"] + base_run["tokens"]["cache_hit_tokens"]
    totals = report["totals"]
    # create, forward_backward (one chunk of 2 datums), forward, optim, snapshot, 2 samples
    assert totals["tokens"]["num_ops"] == 7
    assert set(totals["engine_s"]) >= {"total", "ForwardBackward", "Forward", "OptimStep",
                                       "Sample"}
    rollout = totals["bill_usd"]["per_rollout"]
    assert rollout["prefill"] == pytest.approx((18 + 8 + 4) * PREFILL / 1e6)
    assert rollout["sample"] == pytest.approx((sampled(group) + sampled(alone)) * SAMPLE / 1e6)
    assert rollout["train"] == pytest.approx(12 * TRAIN / 1e6)
    aware = totals["bill_usd"]["cache_aware"]
    shared = (18 - 6) + (8 - 4) + hits  # the G-1 copies of each prompt, plus engine hits
    assert aware["prefill"] == pytest.approx((30 - shared) * PREFILL / 1e6)
    assert aware["cached_prefill"] == pytest.approx(shared * PREFILL * 0.2 / 1e6)
    assert report["price_sheet"]["name"] == "tinker-2026-01-05"


def test_a_tenant_sees_only_its_own_usage(server: Server, service_client: Make,
                                          new_key: Callable[[], str]) -> None:
    alice, bob = new_key(), new_key()
    tc = service_client(alice).create_lora_training_client(base_model=MODEL, rank=4).result()
    tc.forward_backward([datum([2, 3, 4])], "cross_entropy").result()
    assert [r["run_id"] for r in usage(server, alice)["runs"]] == [tc.model_id]
    nobody = usage(server, bob)
    assert nobody["runs"] == [] and nobody["totals"]["tokens"]["num_ops"] == 0
    assert nobody["totals"]["bill_usd"]["per_rollout"]["total"] == 0.0
    missing = httpx.get(f"{server.url}/api/v1/loraplex/usage", trust_env=False)
    assert missing.status_code == 401
