"""Streamed completions: time to first token vs the whole completion, against the same
request unstreamed, on one `loraplex serve` (default ``builtin:smollm2-135m``).

    python benchmarks/streaming.py [--rounds 5] [--max-tokens 128] [--model builtin:smollm2-135m]

Per round, interleaved (streamed, unstreamed, streamed beside a batch, the batch alone, the
batch beside a stream), with the ``openai`` client:
- ``alone``: one streamed ``/v1/completions`` (seeded, ``max_tokens`` with no stop) — time to
  the first text chunk (TTFT) and to ``[DONE]``; the same request unstreamed — time to the
  response. The streamed text must equal the unstreamed text (checked every round).
- ``beside_batch``: the same stream while 4 other clients sample ``max_tokens`` unstreamed.
- ``batch``: those 4 requests' wall time beside one more unstreamed request and beside that
  request streamed (what streaming, which shortens the sampler's steps while a stream runs,
  costs the others).
Records the load average and the GEMM probe in the same run; reports medians and ratios.
Writes ``streaming.json``, ``streaming.md`` and ``streaming.png``.
"""

from __future__ import annotations

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

from benchmarks.harness import cli
from benchmarks.harness.result import Result, Run
from benchmarks.harness.server_process import ServerProcess, serve_loraplex
from benchmarks.harness.writer import pyplot, write

SERVED = "bench-model"
PROMPT = "Write a long story about a lighthouse keeper and the sea."
BATCH = 4


def start_server(model: str, data_dir: Path, stream_decode_steps: int | None
                 ) -> ServerProcess:
    env = ({} if stream_decode_steps is None else
           {"LORAPLEX_SCHEDULER_STREAM_DECODE_STEPS": str(stream_decode_steps)})
    return serve_loraplex(SERVED, model, data_dir, env=env, timeout_s=900)


def client(url: str) -> Any:
    import httpx
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="tml-bench-stream", max_retries=0,
                         http_client=httpx.Client(trust_env=False, timeout=600))


def streamed(oai: Any, max_tokens: int, seed: int) -> dict[str, Any]:
    start = time.perf_counter()
    first, pieces = None, []
    for chunk in oai.completions.create(model=SERVED, prompt=PROMPT, max_tokens=max_tokens,
                                        seed=seed, temperature=0.8, stream=True,
                                        extra_body={"ignore_eos": True}):
        text = chunk.choices[0].text if chunk.choices else ""
        if text and first is None:
            first = time.perf_counter() - start
        pieces.append(text)
    total = time.perf_counter() - start
    return {"ttft_s": first if first is not None else total, "total_s": total,
            "text": "".join(pieces)}


def unstreamed(oai: Any, max_tokens: int, seed: int) -> dict[str, Any]:
    start = time.perf_counter()
    out = oai.completions.create(model=SERVED, prompt=PROMPT, max_tokens=max_tokens, seed=seed,
                                 temperature=0.8, extra_body={"ignore_eos": True})
    return {"total_s": time.perf_counter() - start, "text": out.choices[0].text,
            "tokens": out.usage.completion_tokens}


def batch(url: str, max_tokens: int, seed: int, during: Any = None) -> tuple[float, Any]:
    """BATCH concurrent unstreamed requests (their wall time) and ``during()`` run beside."""
    clients = [client(url) for _ in range(BATCH)]
    threads = [threading.Thread(target=unstreamed, args=(c, max_tokens, seed + 100 + i))
               for i, c in enumerate(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    side = during() if during is not None else None
    for t in threads:
        t.join()
    return time.perf_counter() - start, side


def one_round(url: str, max_tokens: int, seed: int) -> dict[str, Any]:
    oai = client(url)
    alone = streamed(oai, max_tokens, seed)
    plain = unstreamed(oai, max_tokens, seed)
    if alone["text"] != plain["text"]:
        raise AssertionError(f"round {seed}: streamed text differs from the unstreamed text")
    batch_plain, _ = batch(url, max_tokens, seed,
                           during=lambda: (time.sleep(0.3), unstreamed(oai, max_tokens, seed))[1])
    batch_beside, beside = batch(url, max_tokens, seed,
                                 during=lambda: (time.sleep(0.3),
                                                 streamed(oai, max_tokens, seed))[1])
    return {"stream_ttft_s": alone["ttft_s"], "stream_total_s": alone["total_s"],
            "unstreamed_total_s": plain["total_s"], "tokens": plain["tokens"],
            "beside_batch_ttft_s": beside["ttft_s"], "beside_batch_total_s": beside["total_s"],
            "batch_beside_unstreamed_s": batch_plain, "batch_beside_stream_s": batch_beside,
            "load_avg_1m": os.getloadavg()[0]}


def summarize(rounds: list[dict[str, Any]]) -> dict[str, float]:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    return {key: round(med(key), 4) for key in rounds[0] if key != "load_avg_1m"} | {
        "ttft_over_total": round(med("stream_ttft_s") / med("stream_total_s"), 4),
        "ttft_over_unstreamed": round(med("stream_ttft_s") / med("unstreamed_total_s"), 4),
        "stream_total_over_unstreamed": round(med("stream_total_s") / med("unstreamed_total_s"),
                                              4),
        "beside_batch_ttft_over_total": round(med("beside_batch_ttft_s")
                                              / med("beside_batch_total_s"), 4),
        "batch_beside_stream_over_unstreamed": round(med("batch_beside_stream_s")
                                                     / med("batch_beside_unstreamed_s"), 4)}


def markdown(record: Result) -> str:
    result = record.payload
    s = result["summary"]
    loads = [r["load_avg_1m"] for r in result["rounds"]]
    return "\n".join([
        "# Streaming: time to first token vs the whole completion", "",
        f"`{result['model']}`, prompt of {result['prompt_tokens']} tokens, max_tokens "
        f"{result['max_tokens']} (ignore_eos), temperature 0.8; {len(result['rounds'])} "
        "interleaved rounds, medians. Streamed text equal to the unstreamed text every round.",
        "", "| measure | seconds | ratio |", "|---|---|---|",
        f"| streamed alone: first token | {s['stream_ttft_s']} | "
        f"{s['ttft_over_total']} of its total |",
        f"| streamed alone: whole completion | {s['stream_total_s']} | "
        f"{s['stream_total_over_unstreamed']} × unstreamed |",
        f"| unstreamed alone: whole completion | {s['unstreamed_total_s']} | "
        f"first streamed token at {s['ttft_over_unstreamed']} of it |",
        f"| streamed beside {BATCH} unstreamed: first token | {s['beside_batch_ttft_s']} | "
        f"{s['beside_batch_ttft_over_total']} of its total |",
        f"| {BATCH} unstreamed beside a 5th unstreamed | {s['batch_beside_unstreamed_s']} | |",
        f"| {BATCH} unstreamed beside that 5th streamed | {s['batch_beside_stream_s']} | "
        f"{s['batch_beside_stream_over_unstreamed']} × beside unstreamed |", "",
        f"Load average (1 min) during the rounds: {min(loads):.2f}–{max(loads):.2f}.", "",
        record.provenance(), ""])


def figure(result: dict[str, Any]) -> Any:
    plt = pyplot()

    s = result["summary"]
    labels = ["streamed\nalone", "unstreamed\nalone", "streamed beside\nbatch"]
    firsts = [s["stream_ttft_s"], s["unstreamed_total_s"], s["beside_batch_ttft_s"]]
    totals = [s["stream_total_s"], s["unstreamed_total_s"], s["beside_batch_total_s"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(labels, totals, color="#c8d6e5", label="whole completion")
    ax.bar(labels, firsts, color="#2e86de", label="first text the client sees")
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"{result['model']}, {result['max_tokens']} tokens")
    ax.legend()
    fig.tight_layout()
    return fig


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--model", default="builtin:smollm2-135m")
    parser.add_argument("--stream-decode-steps", type=int, default=None,
                        help="scheduler.stream_decode_steps of the server (default: its own)")
    args = parser.parse_args()

    from tqdm import tqdm

    run = Run("streaming")
    with tempfile.TemporaryDirectory(prefix="streaming-") as scratch:
        server = start_server(args.model, Path(scratch), args.stream_decode_steps)
        try:
            oai = client(server.base_url)
            prompt_tokens = oai.completions.create(model=SERVED, prompt=PROMPT,
                                                   max_tokens=1).usage.prompt_tokens
            one_round(server.base_url, 8, 0)  # warm-up
            rounds = [one_round(server.base_url, args.max_tokens, seed)
                      for seed in tqdm(range(1, args.rounds + 1), desc="rounds", unit="round")]
        finally:
            server.stop()
    result = run.finish({"model": args.model, "max_tokens": args.max_tokens,
                         "prompt_tokens": prompt_tokens,
                         "stream_decode_steps": args.stream_decode_steps, "rounds": rounds,
                         "summary": summarize(rounds)}, model=args.model)
    write(result, markdown(result), args.out, figure=figure(result.payload))
    print(markdown(result))


if __name__ == "__main__":
    main()
