"""Per-op server overhead: a trivial op through the full HTTP path (official SDK call → result)
minus engine time, with a no-op executor; compared with a 100 ms polling design.

    python benchmarks/server_overhead.py [--ops 300] [--out benchmarks/results]

The server runs as its own process (`tests/integration/serve_fake.py --executor noop`), the SDK
0.38 client in this one, so they do not share a GIL. Measured sequentially:

1. headline: ``optim_step`` (JSON both ways) and ``forward`` on one 8-token datum (protobuf
   both ways) through the SDK, minus the engine time the server reports
   (``/api/v1/loraplex/stats``);
2. the same optim_step from a plain HTTP client (httpx: submit, then retrieve at once): the
   server and HTTP share of (1), without the SDK's own client-side cost;
3. with a 20 ms engine call: the SDK against this server (event-driven long-poll) vs a client
   polling every 100 ms against the same server with long-polling off (the polling design).

Writes ``server_overhead.json`` and ``server_overhead.md``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("TINKER_TELEMETRY", "0")

import httpx
import tinker
from tinker import types

from benchmarks import SCRATCH
from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run
from benchmarks.harness.server_process import ServerProcess, serve_fake
from benchmarks.harness.writer import write

MODEL = "Qwen/Qwen3-8B"
KEY = "tml-benchmark"
POLL_INTERVAL_S = 0.1
ENGINE_MS = 20.0


def start_server(data_dir: Path, long_poll_s: float, engine_ms: float = 0.0) -> ServerProcess:
    return serve_fake(MODEL, data_dir, "--executor", "noop", "--long-poll-s", str(long_poll_s),
                      "--engine-ms", str(engine_ms), timeout_s=120)


def engine_seconds(url: str) -> float:
    stats = httpx.get(f"{url}/api/v1/loraplex/stats", headers={"X-API-Key": KEY},
                      trust_env=False).json()
    return float(sum(stats["engine_s"].values()))


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in samples_s)
    return {"p50_ms": round(statistics.median(ms), 3),
            "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3),
            "mean_ms": round(statistics.fmean(ms), 3), "n": len(ms)}


def time_sdk_ops(url: str, n: int, names: tuple[str, ...] = ("optim_step", "forward")
                 ) -> dict[str, dict[str, float]]:
    client = tinker.ServiceClient(base_url=url, api_key=KEY)
    tc = client.create_lora_training_client(base_model=MODEL, rank=4).result()
    datum = types.Datum(model_input=types.ModelInput.from_ints(list(range(2, 10))),
                        loss_fn_inputs={"target_tokens": list(range(3, 11)),
                                        "weights": [1.0] * 8})
    ops = {"optim_step": lambda: tc.optim_step(types.AdamParams()).result(),
           "forward": lambda: tc.forward([datum], "cross_entropy").result()}
    out = {name: measure(url, ops[name], n) for name in names}
    client.close("success").result()
    return out


def measure(url: str, op: Callable[[], object], n: int) -> dict[str, float]:
    """Latency of ``op`` minus the engine time per op, after 20 warm-up calls."""
    for _ in range(20):
        op()
    engine_before = engine_seconds(url)
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        op()
        samples.append(time.perf_counter() - start)
    engine_per_op = (engine_seconds(url) - engine_before) / n
    out = percentiles([s - engine_per_op for s in samples])
    out["engine_ms_per_op"] = round(engine_per_op * 1000, 4)
    return out


def time_http_client(url: str, n: int, poll_interval_s: float) -> dict[str, float]:
    """optim_step from a plain HTTP client: submit, retrieve at once, then every interval."""
    with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, trust_env=False) as http:
        session = http.post("/api/v1/create_session", json={
            "tags": [], "user_metadata": {}, "sdk_version": "poll"}).json()["session_id"]
        created = http.post("/api/v1/create_model", json={
            "session_id": session, "model_seq_id": 0, "base_model": MODEL,
            "lora_config": {"rank": 4}}).json()
        poll(http, created["request_id"], poll_interval_s)
        seq = iter(range(1, 10**9))

        def op() -> None:
            submitted = http.post("/api/v1/optim_step", json={
                "model_id": created["model_id"], "seq_id": next(seq), "adam_params": {}}).json()
            poll(http, submitted["request_id"], poll_interval_s)

        return measure(url, op, n)


def poll(http: httpx.Client, request_id: str, interval_s: float) -> None:
    while True:
        answer = http.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()
        if answer.get("type") != "try_again":
            return
        time.sleep(interval_s)


def markdown(record: Result) -> str:
    result = record.payload
    ops = result["per_op"]
    rows = "\n".join(
        f"| SDK `{name}` | {o['p50_ms']:.2f} | {o['p95_ms']:.2f} | {o['mean_ms']:.2f} | "
        f"{o['engine_ms_per_op']:.4f} |" for name, o in ops.items())
    raw = result["http_client"]
    rows += (f"\n| plain HTTP client, `optim_step` | {raw['p50_ms']:.2f} | {raw['p95_ms']:.2f} | "
             f"{raw['mean_ms']:.2f} | {raw['engine_ms_per_op']:.4f} |")
    lp, pl = result["with_engine_long_poll"], result["with_engine_polling_100ms"]
    designs = "\n".join(
        f"| {label} | {d['p50_ms']:.1f} | {d['p95_ms']:.1f} | {d['mean_ms']:.1f} |"
        for label, d in (("long-poll, woken by the clock thread (this server), SDK", lp),
                         ("poll every 100 ms (same server, long-poll off), HTTP client", pl)))
    return f"""# Server overhead per op (no-op engine)

Official SDK 0.38 client → HTTP → scheduler → no-op executor → future → long-poll wake-up →
SDK result, measured sequentially ({result['n']} ops each after 20 warm-up ops), minus the
engine time the server reports. Server and client are separate processes. {record.provenance()}
(The machine is shared with other jobs, so absolute numbers are noisy.)

| path | p50 ms | p95 ms | mean ms | engine ms/op |
|---|---|---|---|---|
{rows}

Headline (SDK `optim_step`): **p50 {result['p50_ms']:.2f} ms, p95 {result['p95_ms']:.2f} ms**
(goal p50 < 5 ms). The plain-HTTP row is the same op without the SDK: two HTTP round trips
(submit, retrieve) plus the server's work; the difference to the SDK row is the SDK's own
client-side cost (its background event loop, pyqwest transport, future bookkeeping), which a
server cannot remove.

## Compared with a 100 ms polling design

With a {ENGINE_MS:.0f} ms engine call per op (so the result is not ready at the first poll):

| design | p50 ms | p95 ms | mean ms (latency − engine time) |
|---|---|---|---|
{designs}

Reasoning: with polling, a result that is ready t ms after submit is seen at the first poll
after t; an op that finishes between polls waits for the next one, so the added latency is up
to the interval (here the first poll comes right after submit, the second 100 ms later:
every op that takes longer than one round trip pays ≈ 100 ms − t). For an RL or SFT loop of
thousands of dependent ops (forward_backward → optim_step → save → sample) that is ≈ 0.1 s of
dead time per op, which dwarfs both the server overhead and, on small models, the engine
time. Long-polling wakes the waiting request through `loop.call_soon_threadsafe` the moment
the op completes, so the overhead stays at the round trips plus the SDK's client-side cost,
independent of engine time; polling faster instead would trade latency for CPU and request
load (and the SDK re-polls at once on `try_again`, so a server answering it immediately would
turn every pending op into a hot loop).
"""


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--data-dir", type=Path, default=SCRATCH / "bench-overhead")
    args = parser.parse_args()
    run = Run("server_overhead", probe=False)
    results: dict[str, Any] = {}
    runs = [("no_engine", 25.0, 0.0), ("engine_long_poll", 25.0, ENGINE_MS),
            ("engine_polling", 0.0, ENGINE_MS)]
    for mode, long_poll, engine_ms in runs:
        server = start_server(args.data_dir / mode, long_poll, engine_ms)
        url = server.base_url
        try:
            if mode == "no_engine":
                results["per_op"] = time_sdk_ops(url, args.ops)
                results["http_client"] = time_http_client(url, args.ops, 0.0)
            elif mode == "engine_long_poll":
                results["with_engine_long_poll"] = time_sdk_ops(url, 100, ("optim_step",))[
                    "optim_step"]
            else:
                results["with_engine_polling_100ms"] = time_http_client(url, 100,
                                                                        POLL_INTERVAL_S)
        finally:
            server.stop()
    headline = results["per_op"]["optim_step"]
    result = run.finish({"p50_ms": headline["p50_ms"], "p95_ms": headline["p95_ms"],
                         "n": args.ops, "engine_ms_for_polling_comparison": ENGINE_MS, **results,
                         "sdk": tinker.__version__}, model=MODEL)
    write(result, markdown(result), args.out)
    print(json.dumps(result.payload, indent=2))


if __name__ == "__main__":
    main()
