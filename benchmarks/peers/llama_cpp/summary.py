"""From raw runs to the payload's numbers: per run name (``shape/mode/side``) the wall and CPU
seconds, tok/s median and best, time to first token and decode step time; per shape the
``ratio_vs_llama_cpp`` (ours ÷ the faster llama.cpp mode, median tok/s); the parity of the two
sides' logprobs and greedy tokens. Pure functions over dicts: no torch, no llama.cpp."""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

#: llama.cpp's two ways to sample (`worker.py`): the high-level API one sequence at a time,
#: the low-level API batching every sequence.
LLAMA_MODES = ("llama_batched", "llama_high")
#: Our engine in its default configuration (batch-invariant) and in its fast mode.
OUR_SIDES = ("ours", "ours_fast")
#: ≥ these: ours ÷ the faster llama.cpp mode (median tok/s), temperature-1 sampling.
GOALS = {"fanout": 1.5, "batch": 1.0}


def run_record(raw: dict[str, Any]) -> dict[str, Any]:
    """One run reduced to what the payload keeps (the tokens and step times are dropped)."""
    ends = raw["step_ends_s"]
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    return {"wall_s": raw["wall_s"], "cpu_s": raw["cpu_s"], "generated": raw["generated"],
            "first_token_s": raw["first_token_s"],
            "decode_step_ms_mean": 1e3 * (ends[-1] - ends[0]) / max(len(gaps), 1),
            "decode_step_ms_median": 1e3 * statistics.median(gaps) if gaps else math.nan,
            "sampling_s": raw.get("sampling_s")}


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and best of one run name's rounds."""
    rates = [r["generated"] / r["wall_s"] for r in records]
    sampling = [r["sampling_s"] for r in records if r.get("sampling_s") is not None]
    return {
        "seconds": [round(r["wall_s"], 3) for r in records],
        "cpu_seconds": [round(r["cpu_s"], 3) for r in records],
        "tok_s_median": statistics.median(rates), "tok_s_best": max(rates),
        "tok_per_cpu_s_median": statistics.median(r["generated"] / r["cpu_s"]
                                                  for r in records),
        "first_token_ms_median": 1e3 * statistics.median(r["first_token_s"] for r in records),
        "decode_step_ms_median": statistics.median(r["decode_step_ms_mean"] for r in records),
        "sampling_s_median": statistics.median(sampling) if sampling else None,
    }


def ratios(runs: dict[str, dict[str, Any]], mode: str) -> dict[str, Any]:
    """Per shape measured in ``mode``: ours' median tok/s (the default configuration) ÷ the
    faster llama.cpp mode's, which mode that was, each side's tok/s, the same in tokens per
    CPU-second (``ratio_cpu``: with one thread each, the compute a run needed, less sensitive
    to other load on a shared machine), and both for our fast mode where it ran."""
    out: dict[str, Any] = {}
    shapes = dict.fromkeys(name.split("/")[0] for name in runs if name.split("/")[1] == mode)
    for shape in shapes:
        tok_s = {side: runs[f"{shape}/{mode}/{side}"]["tok_s_median"]
                 for side in OUR_SIDES + LLAMA_MODES if f"{shape}/{mode}/{side}" in runs}
        per_cpu = {side: runs[f"{shape}/{mode}/{side}"]["tok_per_cpu_s_median"]
                   for side in tok_s}
        best = max((m for m in LLAMA_MODES if m in tok_s), key=lambda m: tok_s[m])
        best_cpu = max((m for m in LLAMA_MODES if m in tok_s), key=lambda m: per_cpu[m])
        out[shape] = {"ratio": tok_s["ours"] / tok_s[best], "llama_cpp_best": best,
                      "ratio_cpu": per_cpu["ours"] / per_cpu[best_cpu],
                      **{f"{side}_tok_s": v for side, v in tok_s.items()}}
        if "ours_fast" in tok_s:
            out[shape]["ratio_fast"] = tok_s["ours_fast"] / tok_s[best]
            out[shape]["ratio_fast_cpu"] = per_cpu["ours_fast"] / per_cpu[best_cpu]
    return out


def latency(runs: dict[str, dict[str, Any]], mode: str, new_tokens: int,
            shape: str = "single") -> dict[str, Any]:
    """Single-stream latency of each side: time to first token, ms per later token, tok/s."""
    out = {}
    for side in OUR_SIDES + LLAMA_MODES:
        s = runs.get(f"{shape}/{mode}/{side}")
        if s is not None:
            out[side] = {"first_token_ms": s["first_token_ms_median"],
                         "per_token_ms": s["decode_step_ms_median"],
                         "tok_s": s["tok_s_median"], "new_tokens": new_tokens}
    return out


def parity(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """How far llama.cpp's logprobs are from ours on the same prompt: max |Δ logprob| over the
    prompt's tokens (teacher-forced), the greedy continuations' common prefix, and max
    |Δ logprob| of the chosen tokens over that prefix."""
    prompt_deltas = [abs(a - b) for a, b in zip(ours["prompt_logprobs"],
                                                theirs["prompt_logprobs"], strict=True)]
    agree = common_prefix(ours["greedy_tokens"], theirs["greedy_tokens"])
    greedy_deltas = [abs(a - b) for a, b in zip(ours["greedy_logprobs"][:agree],
                                                theirs["greedy_logprobs"][:agree], strict=True)]
    return {"prompt_tokens": len(prompt_deltas) + 1,
            "max_abs_dlogprob_prompt": max(prompt_deltas),
            "mean_abs_dlogprob_prompt": statistics.fmean(prompt_deltas),
            "greedy_tokens": len(ours["greedy_tokens"]), "greedy_agree": agree,
            "max_abs_dlogprob_greedy": max(greedy_deltas, default=0.0)}


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def greedy_agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict[str, Any]:
    """Greedy continuations of the benchmark's own prompts, sequence by sequence: how many are
    identical, and the mean length of the common prefix."""
    prefixes = [common_prefix(a, b) for a, b in zip(ours, theirs, strict=True)]
    return {"sequences": len(prefixes),
            "identical": sum(p == len(a) for p, a in zip(prefixes, ours, strict=True)),
            "mean_common_prefix": statistics.fmean(prefixes),
            "tokens_per_sequence": len(ours[0])}
