"""Sampling with SDK 0.38's session poller (``retrieve_futures``, one long-poll per
SamplingClient) vs without it (one ``retrieve_future`` long-poll per in-flight sample).

    python benchmarks/sample_polling.py [--rounds 5] [--requests 64] [--out benchmarks/results]

Two servers run side by side as their own processes (`tests/integration/serve_fake.py`), the
same except for ``sample_use_retrieve_futures`` in their client config; one SDK client in this
process fires ``--requests`` concurrent ``sample`` calls at one of them per round, rounds
interleaved (poller, baseline, poller, …). Per round: requests/s (wall clock from the first
submit to the last result) and the server's CPU seconds per request (its process's user +
system time from /proc). Done for two executors: the torch engine on ``builtin:tiny`` (real
sampling) and the no-op executor with a 5 ms engine call (the HTTP path alone). Records the
load average and the GEMM probe in the same run (perf-anchors §4).

Writes ``sample_polling.json`` and ``sample_polling.md`` (`benchmarks.harness.writer`).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("TINKER_TELEMETRY", "0")

from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run
from benchmarks.harness.server_process import ServerProcess, serve_fake
from benchmarks.harness.writer import write

MODEL = "Qwen/Qwen3-8B"
KEY = "tml-benchmark-polling"
MODES = ("poller", "per_request")


@dataclass
class Server:
    mode: str
    process: ServerProcess

    @property
    def url(self) -> str:
        return self.process.base_url

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server process (all its threads)."""
        pid = self.process.process.pid
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(mode: str, executor: str, data_dir: Path) -> Server:
    config = json.dumps({"sample_use_retrieve_futures": mode == "poller"})
    args = ["--executor", executor, "--client-config", config, "--threads", "1"]
    if executor == "noop":
        args += ["--engine-ms", "5"]
    return Server(mode, serve_fake(MODEL, data_dir, *args, timeout_s=120))


def one_round(sampler: Any, server: Server, requests: int, max_tokens: int) -> dict[str, float]:
    from tinker import types

    prompt = types.ModelInput.from_ints([2, 3, 4, 5, 6, 7])
    cpu_before, client_before = server.cpu_s(), time.process_time()
    start_s = time.perf_counter()
    futures = [sampler.sample(prompt, 1, types.SamplingParams(max_tokens=max_tokens, seed=i,
                                                              stop=[]))
               for i in range(requests)]
    for future in futures:
        future.result(timeout=600)
    wall_s = time.perf_counter() - start_s
    return {"requests_per_s": requests / wall_s, "wall_s": wall_s,
            "server_cpu_ms_per_request": 1000 * (server.cpu_s() - cpu_before) / requests,
            "client_cpu_ms_per_request": 1000 * (time.process_time() - client_before) / requests}


def run_executor(executor: str, rounds: int, requests: int, max_tokens: int,
                 scratch: Path) -> dict[str, Any]:
    import tinker
    from tqdm import tqdm

    servers = {mode: start(mode, executor, scratch / f"{executor}-{mode}") for mode in MODES}
    try:
        samplers = {}
        for mode, server in servers.items():
            client = tinker.ServiceClient(base_url=server.url, api_key=KEY)
            samplers[mode] = client.create_sampling_client(base_model=MODEL).result()
            one_round(samplers[mode], server, requests, max_tokens)  # warm-up
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        loads = []
        for _ in tqdm(range(rounds), desc=f"{executor} rounds", unit="round"):
            for mode in MODES:
                loads.append(os.getloadavg()[0])
                runs[mode].append(one_round(samplers[mode], servers[mode], requests, max_tokens))
        return {"rounds": runs, "summary": summarize(runs), "load_avg_1m": loads}
    finally:
        for server in servers.values():
            server.process.stop()


def summarize(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    def median(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    out: dict[str, Any] = {}
    for key in ("requests_per_s", "server_cpu_ms_per_request", "client_cpu_ms_per_request"):
        out[key] = {mode: round(median(mode, key), 3) for mode in MODES}
        out[key]["ratio_poller_over_per_request"] = round(
            median("poller", key) / median("per_request", key), 3)
    return out


def markdown(record: Result) -> str:
    result = record.payload
    lines = ["# Sampling: session poller (retrieve_futures) vs one long-poll per request", "",
             f"{result['requests']} concurrent `sample` calls (max_tokens "
             f"{result['max_tokens']}) from one SDK 0.38 SamplingClient per round, "
             f"{result['rounds_per_mode']} interleaved rounds per mode; medians.", "",
             "| executor | metric | poller | per request | poller / per request |",
             "|---|---|---|---|---|"]
    for executor, run in result["executors"].items():
        for key, values in run["summary"].items():
            lines.append(f"| {executor} | {key} | {values['poller']} | "
                         f"{values['per_request']} | {values['ratio_poller_over_per_request']} |")
    lines += ["", "Load average (1 min) during the rounds: "
              + ", ".join(f"{e}: {min(r['load_avg_1m']):.2f}–{max(r['load_avg_1m']):.2f}"
                          for e, r in result["executors"].items()) + ".", "",
              record.provenance(), ""]
    return "\n".join(lines)


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--executors", default="engine,noop")
    args = parser.parse_args()

    run = Run("sample_polling")
    with tempfile.TemporaryDirectory(prefix="sample-polling-") as scratch:
        executors = {e: run_executor(e, args.rounds, args.requests, args.max_tokens,
                                     Path(scratch)) for e in args.executors.split(",")}
    result = run.finish({"requests": args.requests, "max_tokens": args.max_tokens,
                         "rounds_per_mode": args.rounds, "executors": executors}, model=MODEL)
    write(result, markdown(result), args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
