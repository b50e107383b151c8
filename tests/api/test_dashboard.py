"""The dashboard's endpoints after real SDK traffic: a run's per-step curves (checked against
the metrics the SDK itself returned), the tenant view (own runs only, checkpoints with a working
download link, sampling sessions), the operator view (403 for a tenant), the columnar cycle
feed with its cursors, the Perfetto trace export (valid trace-event JSON), and the page and its
assets served from the package."""

from __future__ import annotations

import fnmatch
import itertools
import json
import re
import tomllib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import tinker

from loraplex.api.routes.dashboard import asset_names
from tests.api.conftest import MODEL, Server
from tests.api.test_stats import tenant_of
from tests.api.test_training import ADAM, datum

Make = Callable[..., tinker.ServiceClient]
PHASES = {"X", "B", "E", "i", "I", "C", "M", "b", "e", "n", "s", "t", "f"}


def call(server: Server, path: str, key: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", params=params, headers={"X-API-Key": key},
                     trust_env=False, timeout=30)


def ok(server: Server, path: str, key: str, **params: Any) -> Any:
    response = call(server, path, key, **params)
    assert response.status_code == 200, response.text
    return response.json()


def train(make: Make, key: str, steps: int) -> tuple[tinker.TrainingClient, list[dict]]:
    """``steps`` forward_backward (3 datums: 2 chunks) + optim_step pairs; the SDK's metrics."""
    tc = make(key).create_lora_training_client(base_model=MODEL, rank=4).result()
    seen = []
    for i in range(steps):
        fb = tc.forward_backward([datum([2, 3, 4, 5 + i])] * 3, "cross_entropy")
        step = tc.optim_step(ADAM)
        seen.append({**fb.result().metrics, **step.result().metrics})
    return tc, seen


def test_run_curves_hold_one_point_per_step_with_the_sdks_metrics(
        server: Server, service_client: Make, new_key: Callable[[], str]) -> None:
    key, other = new_key(), new_key()
    tc, seen = train(service_client, key, 3)
    model_id = tc.model_id
    tc.forward([datum([2, 3, 4])], "cross_entropy").result()  # an evaluation after step 3
    body = ok(server, f"/api/v1/loraplex/training_runs/{model_id}/metrics", key)
    curve = body["train"]
    assert curve["step"] == [1, 2, 3] and curve["bucket"] == 1 and body["num_steps"] == 3
    assert curve["tokens"] == [12, 12, 12]
    assert set(curve["metrics"]) == set(seen[0])
    for key_name in seen[0]:
        assert curve["metrics"][key_name] == pytest.approx([s[key_name] for s in seen],
                                                           rel=1e-6), key_name
    assert body["forward"]["step"] == [3] and "loss:sum" in body["forward"]["metrics"]
    # Downsampled: 2 points of mean, with the bucket's min and max beside them.
    coarse = ok(server, f"/api/v1/loraplex/training_runs/{model_id}/metrics", key,
                max_points=2)["train"]
    losses = [s["loss:sum"] for s in seen]
    assert coarse["bucket"] == 2 and coarse["step"] == [2, 3]
    assert coarse["metrics"]["loss:sum"] == pytest.approx([sum(losses[:2]) / 2, losses[2]])
    assert coarse["min"]["loss:sum"][0] == pytest.approx(min(losses[:2]))
    # Another tenant's run is a 404; a bad parameter a 400 naming it.
    assert call(server, f"/api/v1/loraplex/training_runs/{model_id}/metrics",
                other).status_code == 404
    for field, value in (("max_points", 0), ("after_step", 2**70), ("after_step", -1)):
        bad = call(server, f"/api/v1/loraplex/training_runs/{model_id}/metrics", key,
                   **{field: value})
        assert bad.status_code == 400 and field in bad.text, (field, value)


def test_tenant_view_lists_only_the_callers_runs_checkpoints_and_samplers(
        server: Server, service_client: Make, new_key: Callable[[], str]) -> None:
    key, other = new_key(), new_key()
    mine, _ = train(service_client, key, 1)
    theirs, _ = train(service_client, other, 1)
    path = mine.save_state("ckpt-a").result().path
    mine.save_weights_and_get_sampling_client("w1")
    view = ok(server, "/api/v1/loraplex/dashboard/tenant", key)
    assert view["tenant"] == tenant_of(key) and view["is_operator"] is False
    assert [r["model_id"] for r in view["runs"]] == [mine.model_id]
    assert theirs.model_id not in json.dumps(view)
    run = view["runs"][0]
    assert run["num_steps"] == 1 and run["lora"]["rank"] == 4 and run["is_live"] is True
    [state] = [c for c in view["checkpoints"] if c["tinker_path"] == path]
    assert state["size_bytes"] > 0 and state["public"] is False
    tar = httpx.get(state["download_url"], trust_env=False, timeout=30)
    assert tar.status_code == 200 and len(tar.content) > 0
    assert view["num_sampling_sessions"] >= 1
    assert all(s["model_id"] in (None, mine.model_id) for s in view["sampling_sessions"])


def test_operator_view_needs_an_operator_key(server: Server, service_client: Make,
                                             new_key: Callable[[], str]) -> None:
    key = new_key()
    train(service_client, key, 1)
    refused = call(server, "/api/v1/loraplex/dashboard/operator", key)
    assert refused.status_code == 403 and "operator" in refused.text
    operator = server.ctx.stores.keys.create("dash-operator", operator=True)
    body = ok(server, "/api/v1/loraplex/dashboard/operator", operator)
    waits = body["queue_waits_s"][tenant_of(key)]["train"]
    assert waits["n"] >= 2 and 0 <= waits["p50"] <= waits["p95"]
    [usage] = [t for t in body["usage"]["tenants"] if t["tenant"] == tenant_of(key)]
    bill = usage["totals"]["bill_usd"]
    assert bill["per_rollout"]["total"] > 0 and bill["cache_aware"]["total"] > 0
    assert body["admissions"]["events"] == [] or all(
        {"time", "tenant", "kind", "reason"} <= set(e) for e in body["admissions"]["events"])


def test_cycle_feed_is_columnar_follows_cursors_and_hides_other_tenants(
        server: Server, service_client: Make, new_key: Callable[[], str]) -> None:
    key, other = new_key(), new_key()
    train(service_client, key, 1)
    train(service_client, other, 1)
    first = ok(server, "/api/v1/loraplex/cycles", key)
    [lane] = first["lanes"]
    c = lane["cycles"]
    n = len(c["index"])
    assert n > 0 and all(len(v) == n for k, v in c.items() if k != "t0")
    assert c["index"] == sorted(c["index"]) and lane["last_index"] == c["index"][-1]
    # The same records as the stats endpoint's, times in integer µs (starts after t0).
    recent = ok(server, "/api/v1/loraplex/stats", key, recent=4096)["schedulers"][0]
    by_index = {r["index"]: r for r in recent["recent_cycles"]}
    for i, index in enumerate(c["index"]):
        r = by_index[index]
        assert c["t0"] + c["start_us"][i] / 1e6 == pytest.approx(r["wall_time"], abs=1e-6)
        assert c["engine_us"][i] == round(r["engine_s"] * 1e6) and c["kind"][i] == r["kind"]
        assert c["num_tokens"][i] == r["num_tokens"]
    assert first["tenants"] == [tenant_of(key)] and tenant_of(other) not in json.dumps(first)
    mine = [i for i, t in enumerate(c["tenants"]) if t == [0]]
    assert {c["kind"][i] for i in mine} >= {"cycle", "control"}
    # Nothing new after the cursor; one more step brings only its own records.
    cursor = f"{lane['lane']}:{lane['last_index']}"
    train(service_client, key, 1)
    later = ok(server, "/api/v1/loraplex/cycles", key, after=cursor)["lanes"][0]["cycles"]
    assert later["index"] and min(later["index"]) > lane["last_index"]
    for bad in ("nocolon", f"{lane['lane']}:²", f"{lane['lane']}:1e3"):
        assert call(server, "/api/v1/loraplex/cycles", key, after=bad).status_code == 400, bad


def test_trace_export_is_valid_trace_event_json(server: Server, service_client: Make,
                                                new_key: Callable[[], str]) -> None:
    key, other = new_key(), new_key()
    train(service_client, key, 2)
    train(service_client, other, 1)
    operator = server.ctx.stores.keys.create("trace-operator", operator=True)
    response = call(server, "/api/v1/loraplex/trace", operator)
    assert response.status_code == 200 and "attachment" in response.headers[
        "content-disposition"]
    trace = response.json()
    events = trace["traceEvents"]
    assert isinstance(events, list) and trace["displayTimeUnit"] in ("ms", "ns")
    names: dict[tuple[int, int], str] = {}
    slices: defaultdict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        assert e["ph"] in PHASES and isinstance(e["name"], str)
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index")
            if e["name"] != "process_sort_index":
                names[(e["pid"], e["tid"] if e["name"] == "thread_name" else -1)] = \
                    e["args"]["name"]
            continue
        assert isinstance(e["ts"], int | float) and e["ts"] > 1e15  # µs since the epoch
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e["args"]["tenants"], list)
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        if e["ph"] == "C":
            assert all(isinstance(v, int | float) for v in e["args"].values())
    for track, spans in slices.items():  # complete events on one track never overlap
        assert track in names, f"track {track} has no thread_name"
        spans.sort()
        assert all(a[1] <= b[0] + 1e-3 for a, b in itertools.pairwise(spans))
    assert (1, -1) in names and re.match(r"loraplex .+/w0", names[(1, -1)])
    cycles = [e for e in events if e["ph"] == "X" and e["name"] == "cycle"]
    assert cycles and {tenant_of(key), tenant_of(other)} <= {
        t for e in cycles for t in e["args"]["tenants"]}
    # A tenant's export names only itself.
    own = ok(server, "/api/v1/loraplex/trace", key)
    assert tenant_of(other) not in json.dumps(own) and tenant_of(key) in json.dumps(own)


def test_page_and_assets_come_from_the_package(server: Server) -> None:
    page = httpx.get(f"{server.url}/dashboard", trust_env=False, timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    referenced = set(re.findall(r"/dashboard/assets/([\w.]+)", page.text))
    assert referenced and referenced <= set(asset_names())
    for name in asset_names():
        if name == "index.html":
            continue
        asset = httpx.get(f"{server.url}/dashboard/assets/{name}", trust_env=False, timeout=30)
        assert asset.status_code == 200 and asset.content, name
        if name.endswith(".js"):  # every module it imports is shipped too
            imports = set(re.findall(r'from "\./([\w.]+)"', asset.text))
            assert imports <= set(asset_names()), (name, imports)
    for bad in ("nope.js", "index.html", "..%2Fapp.py", "style"):
        assert httpx.get(f"{server.url}/dashboard/assets/{bad}", trust_env=False,
                         timeout=30).status_code == 404, bad


def test_every_asset_is_package_data_in_the_wheel() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["loraplex.api"]
    assert all(any(fnmatch.fnmatch(f"static/dashboard/{name}", g) for g in globs)
               for name in asset_names())
