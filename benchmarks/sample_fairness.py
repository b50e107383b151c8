"""Sampling fairness: another tenant's short sample beside a heavy sampler, with the sampling
admission bounds on (this server's defaults) and off (how admission worked before them).

    python benchmarks/sample_fairness.py [--rounds 3] [--heavy-prompt 6000] [--heavy-clients 32]

Up to five `loraplex serve` processes (``--modes``) on ``builtin:tiny`` run side by side, the
same except for the sampling bounds: ``on`` (the defaults), ``no_share`` (the defaults but
``engine.sample_shared_decode_kv_tokens`` 0: every running sequence decodes every step, however
many tenants sample), ``no_hold`` (the defaults but
``scheduler.sample_anticipation_s`` 0: training does not wait for a finished sample's client),
``engine_only`` (the scheduler's admission bounds
``scheduler.sample_prefill_tokens_per_step`` and ``sample_max_tenant_share`` off: unbounded and
1.0) and ``off`` (also ``engine.sample_prefill_tokens_per_step`` unbounded and no step
sharing: how sampling worked before these bounds). Per round, for each server in turn (interleaved):
- ``solo``: the light tenant's sequential short samples (8-token prompt, 8 tokens) alone;
- ``beside``: the same while the heavy tenant keeps ``--heavy-clients`` samples of
  ``--heavy-prompt``-token prompts in flight (each client resubmits as soon as one returns),
  for two heavy workloads: ``distinct`` prompts (every request its own: nothing is cached) and
  one ``shared`` prompt (what a GRPO group sends: the engine's prefix cache holds it); and
  a ``training`` flood: 4 SDK clients of the heavy tenant each looping forward_backward
  (8 × 1024 tokens) + optim_step (no sampling bound applies to it: it measures how long a
  sample waits beside training).
Reports the light tenant's p50 / p95 latency and the beside / solo ratio of its p50, and the
heavy tenant's completed samples per second (what the bounds cost it, relative to ``off``).
Records the load average and the GEMM probe in the same run. Writes ``sample_fairness.json``
and ``sample_fairness.md`` (``sample_fairness_training.*`` with ``--workloads training``).
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("TINKER_TELEMETRY", "0")

from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run
from benchmarks.harness.server_process import ServerProcess, serve_loraplex
from benchmarks.harness.writer import write
from loraplex.config import EngineConfig, SchedulerConfig

MODEL = "tiny"
UNBOUNDED = "1000000000"
SCHEDULER_OFF = {"LORAPLEX_SCHEDULER_SAMPLE_PREFILL_TOKENS_PER_STEP": UNBOUNDED,
                 "LORAPLEX_SCHEDULER_SAMPLE_MAX_TENANT_SHARE": "1.0"}
SHARE_OFF = {"LORAPLEX_ENGINE_SAMPLE_SHARED_DECODE_KV_TOKENS": "0"}
MODES = {"on": {}, "no_share": SHARE_OFF,
         "no_hold": {"LORAPLEX_SCHEDULER_SAMPLE_ANTICIPATION_S": "0"},
         "engine_only": SCHEDULER_OFF,
         "off": {**SCHEDULER_OFF, **SHARE_OFF,
                 "LORAPLEX_ENGINE_SAMPLE_PREFILL_TOKENS_PER_STEP": UNBOUNDED}}
LIGHT_SAMPLES = 20
WORKLOADS = ("distinct", "shared", "training")
TRAIN_CLIENTS = 4
HEAVY_WINDOW_S = 10.0  # the light tenant samples at least this long beside the heavy one
TRAIN_BATCH = (8, 1024)  # datums × tokens per forward_backward


def start(mode: str, data_dir: Path) -> ServerProcess:
    return serve_loraplex(MODEL, "builtin:tiny", data_dir, "--threads", "1", env=MODES[mode])


def service(url: str, key: str) -> Any:
    import tinker

    return tinker.ServiceClient(base_url=url, api_key=key)


def sampler(url: str, key: str) -> Any:
    return service(url, key).create_sampling_client(base_model=MODEL).result()


def light_latencies(client: Any, min_s: float = 0.0) -> list[float]:
    """``LIGHT_SAMPLES`` sequential samples, and more until ``min_s`` seconds passed."""
    from tinker import types

    prompt = types.ModelInput.from_ints(list(range(10, 18)))
    out: list[float] = []
    began = time.perf_counter()
    for i in itertools.count():
        if i >= LIGHT_SAMPLES and time.perf_counter() - began >= min_s:
            break
        start = time.perf_counter()
        client.sample(prompt, 1, types.SamplingParams(max_tokens=8, seed=i, stop=[])).result()
        out.append(time.perf_counter() - start)
    return out


class Heavy:
    """``clients`` threads, each keeping one long-prompt sample in flight until stopped."""

    def __init__(self, client: Any, clients: int, prompt_tokens: int, distinct: bool) -> None:
        from tinker import types

        self._client = client
        self._types = types
        self._tokens = [(i * 7) % 1000 + 3 for i in range(prompt_tokens)]
        self._distinct = distinct
        self._counter = itertools.count()
        self._params = types.SamplingParams(max_tokens=32, seed=1, stop=[])
        self._stop = threading.Event()
        self.done = 0
        self._threads = [threading.Thread(target=self._loop, daemon=True)
                         for _ in range(clients)]

    def _prompt(self) -> Any:
        tokens = self._tokens
        if self._distinct:  # a different first page: no cached prefix
            n = next(self._counter)
            tokens = [(n * 131 + i) % 1000 + 3 for i in range(64)] + tokens[64:]
        return self._types.ModelInput.from_ints(tokens)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._client.sample(self._prompt(), 1, self._params).result()
            self.done += 1

    def __enter__(self) -> Heavy:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(600)


class Trainers(Heavy):
    """``clients`` training clients of the heavy tenant, each stepping until stopped."""

    def __init__(self, service: Any, clients: int) -> None:
        from tinker import types

        self._types = types
        self._clients = [service.create_lora_training_client(base_model=MODEL, rank=8)
                         .result() for _ in range(clients)]
        n, t = TRAIN_BATCH
        self._data = [types.Datum(model_input=types.ModelInput.from_ints(
            [(i * 13 + j) % 1000 + 3 for j in range(t)]), loss_fn_inputs={
            "target_tokens": [(i * 13 + j + 1) % 1000 + 3 for j in range(t)],
            "weights": [1.0] * t}) for i in range(n)]
        self._stop = threading.Event()
        self.done = 0
        self._threads = [threading.Thread(target=self._train, args=(tc,), daemon=True)
                         for tc in self._clients]

    def _train(self, tc: Any) -> None:
        adam = self._types.AdamParams(learning_rate=1e-4)
        while not self._stop.is_set():
            tc.forward_backward(self._data, "cross_entropy").result()
            tc.optim_step(adam).result()
            self.done += 1


def one_round(light: Any, heavy: Any, clients: int, prompt_tokens: int, workload: str
              ) -> dict[str, Any]:
    solo = light_latencies(light)
    flood = (Trainers(heavy, TRAIN_CLIENTS) if workload == "training"
             else Heavy(heavy, clients, prompt_tokens, workload == "distinct"))
    with flood:
        time.sleep(3.0)  # the heavy tenant is at its steady state
        started, done_before = time.perf_counter(), flood.done
        beside = light_latencies(light, HEAVY_WINDOW_S)  # the heavy rate is measured beside it
        heavy_rate = (flood.done - done_before) / (time.perf_counter() - started)
    return {"solo_p50_s": statistics.median(solo), "beside_p50_s": statistics.median(beside),
            "beside_p95_s": sorted(beside)[int(0.95 * (len(beside) - 1))],
            "heavy_samples_per_s": heavy_rate, "load_avg_1m": os.getloadavg()[0]}


def summarize(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per ``mode/workload``: medians and the beside / solo ratio; per workload the heavy
    tenant's rate with the bounds on over off."""
    out: dict[str, Any] = {}
    for key, runs in rounds.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "load_avg_1m"}
        out[key] = {k: round(v, 4) for k, v in med.items()} | {
            "beside_over_solo_p50": round(med["beside_p50_s"] / med["solo_p50_s"], 2)}
    for key in rounds:
        workload = key.split("/")[1]
        out[f"heavy_rate_over_off/{key}"] = round(
            out[key]["heavy_samples_per_s"] / out[f"off/{workload}"]["heavy_samples_per_s"], 3)
    return out


BOUNDS = {"scheduler": ("sample_prefill_tokens_per_step", "sample_max_tenant_share"),
          "engine": ("sample_prefill_tokens_per_step", "sample_shared_decode_kv_tokens",
                     "sample_shared_prefill_tokens")}
"""The sampling bounds a run records, as config fields by slice."""
def bound_defaults() -> dict[str, dict[str, Any]]:
    """The bounds' values in this checkout's config defaults (what ``on`` runs with)."""
    slices = {"scheduler": SchedulerConfig(), "engine": EngineConfig()}
    return {name: {f: getattr(slices[name], f) for f in fields}
            for name, fields in BOUNDS.items()}


def _defaults_text(defaults: dict[str, dict[str, Any]]) -> str:
    return "; ".join(f"{name}: " + ", ".join(f"`{f}` {v}" for f, v in fields.items())
                     for name, fields in defaults.items())


def markdown(record: Result) -> str:
    result = record.payload
    s = result["summary"]
    loads = [r["load_avg_1m"] for runs in result["rounds"].values() for r in runs]
    rounds = len(next(iter(result["rounds"].values())))
    lines = ["# Sampling fairness: a short sample beside a heavy sampler", "",
             f"`builtin:tiny`; light tenant: sequential samples (8-token prompt, 8 tokens), "
             f"{LIGHT_SAMPLES} solo, and beside the heavy tenant at least {LIGHT_SAMPLES} and "
             f"for at least {HEAVY_WINDOW_S:g} s (the heavy rate is measured over that "
             f"time); heavy tenant: {result['heavy_clients']} samples of "
             f"{result['heavy_prompt']}-token prompts (32 tokens) kept in flight. "
             f"{rounds} interleaved rounds per mode and workload, medians. `on`: the "
             f"defaults ({_defaults_text(result['defaults'])}); "
             "`no_share`: the defaults but "
             "`engine.sample_shared_decode_kv_tokens` 0 (every running sequence decodes "
             "every step); `no_hold`: the defaults but `scheduler.sample_anticipation_s` 0 "
             "(training does not wait for a finished sample's client); `engine_only`: the "
             "scheduler's two admission bounds off; `off`: all of these off.", "",
             "| heavy prompts | admission bounds | light p50 solo (s) | light p50 beside (s) | "
             "light p95 beside (s) | beside / solo | heavy samples/s | heavy ÷ off |",
             "|---|---|---|---|---|---|---|---|"]
    for workload in result["workloads"]:
        for mode in result["modes"]:
            r = s[f"{mode}/{workload}"]
            ratio = s[f"heavy_rate_over_off/{mode}/{workload}"]
            lines.append(f"| {workload} | {mode} | {r['solo_p50_s']} | {r['beside_p50_s']} | "
                         f"{r['beside_p95_s']} | {r['beside_over_solo_p50']}× | "
                         f"{r['heavy_samples_per_s']} | {ratio} |")
    lines += ["", f"Load average (1 min) during the rounds: {min(loads):.2f}–{max(loads):.2f}.",
              "", record.provenance(), ""]
    return "\n".join(lines)


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--heavy-prompt", type=int, default=6000)
    parser.add_argument("--heavy-clients", type=int, default=32)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--modes", default=",".join(MODES),
                        help="servers to run side by side (off is always one)")
    args = parser.parse_args()
    workloads = tuple(args.workloads.split(","))
    modes = [m for m in MODES if m in args.modes.split(",") or m == "off"]

    from tqdm import tqdm

    run = Run("sample_fairness")
    with tempfile.TemporaryDirectory(prefix="sample-fairness-") as scratch:
        servers = {mode: start(mode, Path(scratch) / mode) for mode in modes}
        try:
            clients = {mode: (sampler(s.base_url, "tml-light"), sampler(s.base_url, "tml-heavy"))
                       for mode, s in servers.items()}
            services = {mode: service(s.base_url, "tml-heavy") for mode, s in servers.items()}
            rounds: dict[str, list[dict[str, Any]]] = {
                f"{m}/{w}": [] for w in workloads for m in modes}
            for _ in tqdm(range(args.rounds), desc="rounds", unit="round"):
                for workload in workloads:
                    for mode, (light, heavy) in clients.items():
                        rounds[f"{mode}/{workload}"].append(one_round(
                            light,
                            heavy if workload != "training" else services[mode],
                            args.heavy_clients, args.heavy_prompt, workload))
        finally:
            for server in servers.values():
                server.stop()
    result = run.finish({"workloads": workloads, "modes": modes,
                         "heavy_prompt": args.heavy_prompt, "heavy_clients": args.heavy_clients,
                         "defaults": bound_defaults(), "rounds": rounds,
                         "summary": summarize(rounds)}, model="builtin:tiny",
                        name="sample_fairness_training" if workloads == ("training",) else None)
    write(result, markdown(result), args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
