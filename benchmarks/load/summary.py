"""The load benchmark's arithmetic, on plain records: latency percentiles per op kind, errors
grouped by kind and message, the normal tenants' step latency per flood-phase window and its
ratio, the RSS levels (post-warm-up, peak, after sessions expired, final), and the verdict per
goal.

An op record is a dict with ``c`` (client), ``k`` (kind), wall-clock ``t0``/``t1``, ``ok`` and
``err`` (on failure). Pure functions: no I/O, no clock.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Iterable
from typing import Any

MIB = 1024 * 1024
#: Ids in error messages (request ids, hex digests) are blanked so that equal failures group.
_ID = re.compile(r"(req-)?[0-9a-f]{8,}")


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]) of a non-empty collection."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def latency_stats(latencies_s: list[float]) -> dict[str, Any]:
    """n, p50 / p99 / mean / max in milliseconds (None when there are none)."""
    if not latencies_s:
        return {"n": 0, "p50_ms": None, "p99_ms": None, "mean_ms": None, "max_ms": None}
    return {"n": len(latencies_s), "p50_ms": 1000 * percentile(latencies_s, 0.5),
            "p99_ms": 1000 * percentile(latencies_s, 0.99),
            "mean_ms": 1000 * statistics.fmean(latencies_s), "max_ms": 1000 * max(latencies_s)}


def per_kind(ops: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per op kind: successful ops' latency stats and the number of failures."""
    out = {}
    for kind in sorted({op["k"] for op in ops}):
        mine = [op for op in ops if op["k"] == kind]
        out[kind] = {**latency_stats([op["t1"] - op["t0"] for op in mine if op["ok"]]),
                     "errors": sum(not op["ok"] for op in mine)}
    return out


def error_summary(ops: list[dict[str, Any]], max_messages: int = 20) -> dict[str, Any]:
    """Failures: the count, per kind, and the most common messages (ids blanked)."""
    failed = [op for op in ops if not op["ok"]]
    messages = Counter((op["k"], _ID.sub("…", op.get("err", ""))) for op in failed)
    return {"count": len(failed), "by_kind": dict(Counter(op["k"] for op in failed)),
            "messages": [{"kind": k, "message": m, "count": n}
                         for (k, m), n in messages.most_common(max_messages)]}


def in_window(ops: list[dict[str, Any]], start: float, end: float, *, ended_inside: bool
              ) -> list[dict[str, Any]]:
    """Ops that started in [start, end); with ``ended_inside`` also finished by ``end``."""
    return [op for op in ops if start <= op["t0"] < end
            and (not ended_inside or op["t1"] <= end)]


def step_windows(steps: list[dict[str, Any]], windows: dict[str, tuple[float, float]],
                 loaded: str, baselines: tuple[str, str]) -> dict[str, Any]:
    """The normal tenants' step latency in each window and loaded p50 ÷ baseline p50.

    A baseline window counts steps that started and finished inside it (none saw the load);
    the ``loaded`` window counts every step that started in it, however long it took (the
    slow ones are the point). ``baseline`` pools the two ``baselines``, one before and one
    after the load, so slow drift of the machine's load cancels; ``ratio_<x>`` divides by
    ``baseline_<x>`` alone.

    Args:
        steps: successful ``train_step`` records of the normal tenants.
        windows: ``loaded`` and both ``baselines`` → (start, end) wall-clock.
    """
    chosen = {name: in_window(steps, *windows[name], ended_inside=name != loaded)
              for name in (baselines[0], loaded, baselines[1])}
    chosen["baseline"] = chosen[baselines[0]] + chosen[baselines[1]]
    out: dict[str, Any] = {name: latency_stats([s["t1"] - s["t0"] for s in picked])
                           for name, picked in chosen.items()}
    for name, picked in chosen.items():
        out[name]["per_tenant_n"] = dict(Counter(s["c"] for s in picked))
    top = out[loaded]["p50_ms"]
    for name in ("baseline", *baselines):
        base = out[name]["p50_ms"]
        out["ratio" + name.removeprefix("baseline")] = top / base if base and top else None
    return out


def level(samples: list[tuple[float, int]], start: float, span_s: float) -> float | None:
    """Median RSS (MiB) of the samples in [start, start + span_s]; the first sample after
    ``start`` if none falls inside; None if there is none after it."""
    inside = [rss for t, rss in samples if start <= t <= start + span_s]
    if not inside:
        inside = [rss for t, rss in samples if t >= start][:1]
    return statistics.median(inside) / MIB if inside else None


def rss_summary(samples: list[tuple[float, int]], *, warm_at: float, soak_end: float,
                expired_at: float, final_at: float, span_s: float) -> dict[str, Any]:
    """RSS levels: post-warm-up (every soak client has run each op kind once), peak (whole
    run and soak), after the sessions' idle timeout, and final (after every retention window
    the run waited for; the goal's value). Times are wall clock."""
    post_warmup = level(samples, warm_at, span_s)
    final = level(samples, final_at, span_s)
    soak = [rss for t, rss in samples if t <= soak_end]
    return {
        "post_warmup_mib": post_warmup,
        "peak_mib": max(rss for _, rss in samples) / MIB if samples else None,
        "peak_soak_mib": max(soak) / MIB if soak else None,
        "at_expiry_mib": level(samples, expired_at, span_s),
        "final_mib": final,
        "final_over_post_warmup": final / post_warmup if final and post_warmup else None,
        "num_samples": len(samples),
    }


def rss_around(samples: list[tuple[float, int]], *, load_start: float, after_end: float,
               span_s: float) -> dict[str, Any]:
    """RSS just before a load started (median over the ``span_s`` before ``load_start``), its
    peak during the load, and after the load's clients left (over the ``span_s`` before
    ``after_end``); after ÷ before is the goal's value."""
    before = level(samples, load_start - span_s, span_s)
    after = level(samples, after_end - span_s, span_s)
    during = [rss for t, rss in samples if load_start <= t <= after_end]
    return {"before_mib": before, "peak_mib": max(during) / MIB if during else None,
            "after_mib": after, "after_over_before": after / before if after and before else None}


def goals(num_errors: int, rss: dict[str, Any], flood_ratio: float | None,
          openai_ratio: float | None, openai_rss: float | None, *, rss_tolerance: float,
          ratio_limit: float) -> dict[str, dict[str, Any]]:
    """Each goal's value, target and verdict (a value that could not be measured fails)."""
    growth = rss["final_over_post_warmup"]
    return {
        "errors": {"value": num_errors, "goal": "0", "pass": num_errors == 0},
        "rss_back": {"value": growth, "goal": f"final ≤ {1 + rss_tolerance:.2f} × post-warm-up",
                     "pass": growth is not None and growth <= 1 + rss_tolerance},
        "flood_ratio": {"value": flood_ratio, "goal": f"≤ {ratio_limit:g}",
                        "pass": flood_ratio is not None and flood_ratio <= ratio_limit},
        "openai_ratio": {"value": openai_ratio, "goal": f"≤ {ratio_limit:g}",
                         "pass": openai_ratio is not None and openai_ratio <= ratio_limit},
        "openai_rss_back": {"value": openai_rss,
                            "goal": f"after ≤ {1 + rss_tolerance:.2f} × before",
                            "pass": openai_rss is not None and openai_rss <= 1 + rss_tolerance},
    }
