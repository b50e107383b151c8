"""The observability endpoints after real SDK traffic: JSON stats (cycle records, tenants,
utilization) and the Prometheus text at /metrics (a valid exposition: read line by line and by
prometheus-client's own parser)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

import httpx
import tinker
from prometheus_client.parser import text_string_to_metric_families

from tests.api.conftest import MODEL, Server
from tests.api.test_training import ADAM, datum

Make = Callable[..., tinker.ServiceClient]
SAMPLE_LINE = re.compile(r'^([a-z_]+)(\{([a-z_]+="(?:[^"\\]|\\.)*",?)*\})? '
                         r"(-?[0-9.e+-]+|[+-]?Inf|NaN)$")
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def sample(families: dict[str, Any], name: str, **labels: str) -> float:
    """The value of the sample ``name{labels}`` (label order does not matter)."""
    values = [s.value for f in families.values() for s in f.samples
              if s.name == name and s.labels == labels]
    assert len(values) == 1, f"{name}{labels}: {values}"
    return float(values[0])


def _family(sample: str, typed: dict[str, str]) -> str:
    """The family a sample belongs to (counters and histograms add suffixes to its name)."""
    for suffix in SUFFIXES:
        if sample.endswith(suffix) and sample.removesuffix(suffix) in typed:
            return sample.removesuffix(suffix)
    return sample


def get(server: Server, path: str, key: str) -> httpx.Response:
    response = httpx.get(f"{server.url}{path}", headers={"X-API-Key": key}, trust_env=False,
                         timeout=30)
    assert response.status_code == 200, response.text
    return response


def tenant_of(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]  # open-access naming


def test_stats_show_the_cycles_that_ran_a_tenants_step(
    server: Server, service_client: Make, new_key: Callable[[], str]
) -> None:
    key = new_key()
    tc = service_client(key).create_lora_training_client(base_model=MODEL, rank=4).result()
    fb = tc.forward_backward([datum([2, 3, 4, 5])] * 3, "cross_entropy")  # 2 chunks
    step = tc.optim_step(ADAM)
    fb.result()
    step.result()
    stats: dict[str, Any] = get(server, "/api/v1/loraplex/stats?recent=4096", key).json()
    assert stats["engine_calls"]["cycle"] >= 1 and stats["engine_s"]["cycle"] > 0
    [section] = stats["schedulers"]
    assert section["models"] == [MODEL]
    mine = [c for c in section["recent_cycles"] if tenant_of(key) in c["tenants"]]
    assert {c["kind"] for c in mine} >= {"control", "cycle"}
    assert sum(c["num_tokens"] for c in mine if c["kind"] == "cycle") == 12
    counters = stats["tenants"][tenant_of(key)]
    assert counters["ops"]["ForwardBackward"] == 2 and counters["ops"]["OptimStep"] == 1
    assert counters["trained_tokens"] == 12
    assert set(section["utilization"]) == {"10s", "60s", "300s"}
    assert all(0.0 <= u <= 1.0 for u in section["utilization"].values())
    assert len(section["utilization_series"]["busy"]) == 60
    assert section["cycles"]["count"] >= 1 and section["cycles"]["mean_ops"] >= 1
    assert section["queue_waits_s"]["train"]["n"] >= 1


def test_metrics_is_a_valid_prometheus_exposition(server: Server, service_client: Make,
                                                  new_key: Callable[[], str]) -> None:
    key = new_key()
    tc = service_client(key).create_lora_training_client(base_model=MODEL, rank=4).result()
    tc.forward_backward([datum([2, 3, 4])], "cross_entropy").result()
    public = httpx.get(f"{server.url}/metrics", trust_env=False, timeout=30)
    assert public.status_code == 200 and "loraplex_engine_calls_total" in public.text
    assert tenant_of(key) not in public.text and "tenant=" not in public.text
    operator = server.ctx.stores.keys.create("metrics-operator", operator=True)
    response = httpx.get(f"{server.url}/metrics", trust_env=False, timeout=30,
                         headers={"Authorization": f"Bearer {operator}"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    typed: dict[str, str] = {}
    samples: dict[str, float] = {}
    for line in response.text.splitlines():  # the exposition format, line by line
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in typed, f"{name} declared twice"
            typed[name] = kind
        elif not line.startswith("# HELP "):
            match = SAMPLE_LINE.match(line)
            assert match, f"bad sample line {line!r}"
            assert _family(match.group(1), typed) in typed, f"{match.group(1)} has no TYPE"
            samples[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert typed["loraplex_engine_calls_total"] == "counter"
    assert families["loraplex_engine_calls"].type == "counter"  # the parser drops "_total"
    assert typed["loraplex_engine_utilization"] == "gauge"
    assert families["loraplex_op_latency_seconds"].type == "histogram"
    assert "process_resident_memory_bytes" in families
    assert sample(families, "loraplex_engine_calls_total", model=MODEL, worker="w0",
                  kind="cycle") >= 1
    tenant = tenant_of(key)
    assert sample(families, "loraplex_tenant_tokens_total", model=MODEL, worker="w0",
                  tenant=tenant, type="trained") == 3
    latency = {"model": MODEL, "worker": "w0", "kind": "ForwardBackward"}
    assert sample(families, "loraplex_op_latency_seconds_count", **latency) == sample(
        families, "loraplex_op_latency_seconds_bucket", **latency, le="+Inf") >= 1
    assert len(samples) >= 20
