"""Markdown and PNG for `benchmarks/load/`'s result: the goals with their verdicts (as the run
judged them), per-op-kind latency, RSS levels, the flood and OpenAI windows, the phases; a
two-panel plot (server RSS over time with the phases shaded; every op's latency over time).

Reads only the result; measures nothing.
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness.result import Result
from benchmarks.harness.writer import pyplot

PHASE_COLORS = {"soak": "C0", "stopping": "C7", "expiry": "C2", "baseline_a": "C8",
                "flood": "C3", "drain": "C1", "baseline_b": "C8", "openai": "C4",
                "openai_stop": "C7", "baseline_c": "C8"}


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _x(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}×"


def goals_table(result: dict[str, Any]) -> list[str]:
    g, rss, normal = result["goals"], result["rss"], result["flood"]["normal"]
    oai, oai_rss = result["openai"]["normal"], result["openai"]["rss"]
    verdict = {True: "**PASS**", False: "**FAIL**"}
    return [
        "| goal | value | target | verdict |", "|---|---|---|---|",
        f"| errors (soak ops, normal tenants' ops, flooder's failed or non-429 requests, "
        f"OpenAI clients' requests) | "
        f"{g['errors']['value']} | 0 | {verdict[g['errors']['pass']]} |",
        f"| server RSS back after the clients finished and their sessions expired | "
        f"{_x(g['rss_back']['value'], 3)} (final {_ms(rss['final_mib'])} MiB ÷ post-warm-up "
        f"{_ms(rss['post_warmup_mib'])} MiB) | {g['rss_back']['goal']} | "
        f"{verdict[g['rss_back']['pass']]} |",
        f"| normal tenants' step p50 under flood ÷ baseline | {_x(g['flood_ratio']['value'])} "
        f"({_ms(normal['flood']['p50_ms'])} ÷ {_ms(normal['baseline']['p50_ms'])} ms) | "
        f"{g['flood_ratio']['goal']} | {verdict[g['flood_ratio']['pass']]} |",
        f"| normal tenants' step p50 beside the OpenAI clients ÷ baseline | "
        f"{_x(g['openai_ratio']['value'])} ({_ms(oai['openai']['p50_ms'])} ÷ "
        f"{_ms(oai['baseline']['p50_ms'])} ms) | {g['openai_ratio']['goal']} | "
        f"{verdict[g['openai_ratio']['pass']]} |",
        f"| server RSS after the OpenAI clients left ÷ just before they came | "
        f"{_x(g['openai_rss_back']['value'], 3)} ({_ms(oai_rss['after_mib'])} ÷ "
        f"{_ms(oai_rss['before_mib'])} MiB; peak {_ms(oai_rss['peak_mib'])}) | "
        f"{g['openai_rss_back']['goal']} | {verdict[g['openai_rss_back']['pass']]} |"]


def ops_table(ops: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| op kind | ok | errors | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|---|"]
    for kind, o in ops.items():
        lines.append(f"| `{kind}` | {o['n']} | {o['errors']} | {_ms(o['p50_ms'])} | "
                     f"{_ms(o['p99_ms'])} | {_ms(o['max_ms'])} |")
    return lines


def window_table(normal: dict[str, Any], labels: dict[str, str]) -> list[str]:
    """The normal tenants' step latency in each window (``labels``: window → its row)."""
    lines = ["| window | steps | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|"]
    for name, label in labels.items():
        w = normal[name]
        lines.append(f"| {label} | {w['n']} | {_ms(w['p50_ms'])} | {_ms(w['p99_ms'])} | "
                     f"{_ms(w['max_ms'])} |")
    return lines


def errors_lines(title: str, errors: dict[str, Any]) -> list[str]:
    if not errors["count"]:
        return [f"{title}: none."]
    lines = [f"{title}: {errors['count']} ({errors['by_kind']}); most common:", ""]
    lines += [f"- {m['count']} × `{m['kind']}`: {m['message']}" for m in errors["messages"]]
    return lines


def flood_lines(result: dict[str, Any]) -> list[str]:
    flood, s = result["flood"], result["settings"]
    normal, f = flood["normal"], flood["flooder"]
    lines = window_table(normal, {
        "baseline_a": "baseline A (before the flood)", "flood": "flood",
        "baseline_b": "baseline B (after the drain)", "baseline": "baseline (A + B)"})
    share = flood["engine_share_flood_and_drain"]
    normal_share = [v for k, v in share.items() if k != "flooder"]
    lines += [
        "", f"Ratio flood ÷ baseline p50 **{_x(normal['ratio'])}** (÷ A alone "
        f"{_x(normal['ratio_a'])}, ÷ B alone {_x(normal['ratio_b'])}).", "",
        f"Flooder ({s['flood_concurrency']} submitters, 429s resubmitted after "
        f"{s['flood_retry_s']:g} s, nice +{s['flood_nice']}): {f['requests']} requests "
        f"({f['requests_per_s']:.0f}/s over the flood and its drain), {f['accepted']} "
        f"accepted, **{f['rejected_429']} answered 429** (server count {f['server_rejected']}), "
        f"{f['completed']} completed, {f['failed']} failed, other HTTP answers "
        f"{f['other_http'] or 'none'}; its queue drained in {f['drain_s']:.1f} s; its own CPU "
        f"{f['cpu_s']:.1f} s. Engine time over the flood and drain: flooder "
        f"{100 * share.get('flooder', 0):.0f}%, each normal tenant "
        + (f"{100 * min(normal_share):.0f}-{100 * max(normal_share):.0f}%." if normal_share
           else "–."),
        ""]
    return lines + errors_lines("Normal tenants' errors", flood["normal_errors"])


def openai_lines(result: dict[str, Any]) -> list[str]:
    o, s = result["openai"], result["settings"]
    lines = window_table(o["normal"], {
        "baseline_b": "baseline B (before the clients)", "openai": "OpenAI clients",
        "baseline_c": "baseline C (after they left)", "baseline": "baseline (B + C)"})
    ttft = o["ttft"]
    lines += [
        "", f"Ratio p50 beside the clients ÷ baseline **{_x(o['normal']['ratio'])}** (÷ B "
        f"alone {_x(o['normal']['ratio_b'])}, ÷ C alone {_x(o['normal']['ratio_c'])}).", "",
        f"{s['openai_clients']} clients (official `openai` package, one key and thread each, "
        f"closed loops, nice +{s['flood_nice']}, up to {s['openai_max_tokens']} new tokens "
        f"and n ≤ 2 per request): {o['requests_per_s']:.1f} requests/s, {o['tokens']} tokens. "
        f"Time to the first content chunk, p50: completions "
        f"{_ms(ttft['completion_stream']['p50_ms'])} ms, chat "
        f"{_ms(ttft['chat_stream']['p50_ms'])} ms. Latency is to the whole answer (a "
        "stream's last chunk):", "", *ops_table(o["clients"]), ""]
    return (lines + errors_lines("OpenAI clients' errors", o["client_errors"]) + [""]
            + errors_lines("Normal tenants' errors", o["normal_errors"]))


def markdown(record: Result, png_name: str) -> str:
    result = record.payload
    s, soak, rss = result["settings"], result["soak"], result["rss"]
    phases = {p["name"]: p for p in result["phases"]}
    cmd = "python -m benchmarks.load" + (" --smoke" if result["smoke"] else "")
    lines = [
        f"# Load: {s['clients']} SDK clients × {s['soak_s']:g} s, then one flooding tenant "
        f"beside {s['steady_tenants']} normal ones, then {s['openai_clients']} OpenAI-API "
        "clients beside them", "",
        f"`{cmd}`"
        f"{' (loraplex/ had uncommitted changes)' if result['git']['loraplex_dirty'] else ''}. "
        f"{record.provenance()} Server: `loraplex serve --open --model "
        f"Qwen/Qwen3-8B=builtin:tiny --threads {s['threads']}` with "
        + ", ".join(f"`{k}={v}`" for k, v in result["server_env"].items()) + ".", "",
        *goals_table(result), "",
        f"## Soak: {soak['clients']} clients in {soak['processes']} "
        f"process{'es' if soak['processes'] > 1 else ''}", "",
        f"Sessions closed at the end: {len(soak['closed_sessions'])}; abandoned (left to "
        f"expire): {len(soak['abandoned_sessions'])}.", "",
        f"{soak['num_ops']} ops in {soak['duration_s']:.0f} s ({soak['ops_per_s']:.1f}/s); "
        f"client processes' CPU share {soak['client_cpu_share']:.2f}, server's "
        f"{phases['soak']['server_cpu_share']:.2f}, machine busy "
        f"{phases['soak']['machine_busy_share']:.2f} (of {result['cores']} cores). Latency is "
        "from the SDK call to its result, in the client; forward_backward and optim_step of "
        "a step are submitted together, so optim_step's latency includes its "
        "forward_backward's.", "",
        *ops_table(soak["ops"]), "",
        *errors_lines("Soak errors", soak["errors"]), "",
        "## Server RSS", "",
        "| post-warm-up | peak in soak | peak in run | sessions expired | final | final ÷ "
        "post-warm-up |", "|---|---|---|---|---|---|",
        f"| {_ms(rss['post_warmup_mib'])} MiB | {_ms(rss['peak_soak_mib'])} MiB | "
        f"{_ms(rss['peak_mib'])} MiB | {_ms(rss['at_expiry_mib'])} MiB | "
        f"{_ms(rss['final_mib'])} MiB | {_x(rss['final_over_post_warmup'], 3)} |", "",
        f"Post-warm-up: at {rss['warm_at_s']:.1f} s, when every soak client had finished its "
        f"first iteration (each op kind once{'' if rss['warmup_complete'] else '; NOT all did'})"
        f". Sessions expired: the latest moment the server could release the abandoned sessions"
        f" ({rss['expired_at_s']:.1f} s). Final: {rss['final_at_s']:.1f} s"
        + (f", after fetched futures are dropped too ({rss['waited_for_fetched_grace_s']:g} s "
           "after their fetch)" if rss["waited_for_fetched_grace_s"] else "")
        + f". Each level is the median over {s['settle_s']:g} s of samples. The server had "
        f"run {rss['release_plans_at_stop']} adapter release plan(s) when the clients had "
        f"stopped (closed sessions) and {rss['release_plans_after_wait']} after the wait "
        "(abandoned sessions expired).", "",
        f"## Flood: {s['steady_tenants']} normal tenants and one flooder", "",
        *flood_lines(result), "",
        f"## OpenAI API: {s['openai_clients']} clients beside the {s['steady_tenants']} "
        "normal tenants", "",
        *openai_lines(result), "",
        "## Phases", "", "| phase | start s | end s | server CPU share | machine busy share |",
        "|---|---|---|---|---|",
        *(f"| {p['name']} | {p['start_s']:.1f} | {p['end_s']:.1f} | "
          f"{p['server_cpu_share']:.2f} | {p['machine_busy_share']:.2f} |"
          for p in result["phases"]), "",
        f"![load]({png_name})", "",
        "Method: `benchmarks/load/`'s docstring; raw op records, RSS samples and the "
        "flooder's progress are in `load.json` (`raw`). Absolute latencies on this shared "
        "2-core machine move with its load; the flood ratio compares windows minutes apart "
        "on either side of the flood.", ""]
    return "\n".join(lines)


def figure(result: dict[str, Any]) -> Any:
    """RSS over time (phases shaded, post-warm-up ±tolerance marked) above every op's latency
    over time (log scale, one colour per kind)."""
    plt = pyplot()

    raw, rss = result["raw"], result["rss"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [1, 1.3]})
    for ax in (top, bottom):
        for phase in result["phases"]:
            ax.axvspan(phase["start_s"], phase["end_s"], alpha=0.08, lw=0,
                       color=PHASE_COLORS.get(phase["name"], "C7"))
    for phase in result["phases"]:
        top.text((phase["start_s"] + phase["end_s"]) / 2, 1.0, phase["name"], fontsize=7,
                 ha="center", va="bottom", transform=top.get_xaxis_transform())
    if raw["rss"]:
        t, mib = zip(*raw["rss"], strict=True)
        top.plot(t, mib, color="k", lw=1, label="server RSS")
    if rss["post_warmup_mib"]:
        limit = rss["post_warmup_mib"] * (1 + result["settings"]["rss_tolerance"])
        top.axhline(rss["post_warmup_mib"], color="C0", ls="--", lw=0.8, label="post-warm-up")
        top.axhline(limit, color="C3", ls=":", lw=0.8, label="goal: final ≤ this")
    if rss["final_mib"]:
        top.plot([rss["final_at_s"]], [rss["final_mib"]], "o", color="C3", label="final")
    top.set(ylabel="RSS MiB", title="server resident memory")
    top.legend(fontsize=7, loc="lower right")
    kinds = sorted({row[2] for row in raw["ops"]})
    for i, kind in enumerate(kinds):
        rows = [r for r in raw["ops"] if r[2] == kind and r[4]]
        if rows:
            bottom.scatter([r[0] for r in rows], [r[1] for r in rows], s=3, alpha=0.5,
                           color=f"C{i % 10}", label=kind)
    failed = [r for r in raw["ops"] if not r[4]]
    if failed:
        bottom.scatter([r[0] for r in failed], [r[1] for r in failed], s=14, marker="x",
                       color="r", label="failed")
    bottom.set(yscale="log", xlabel="seconds since the server was up", ylabel="latency ms",
               title="op latency (train_step: the normal tenants of the flood and OpenAI "
                     "phases)")
    bottom.legend(fontsize=7, markerscale=3, ncol=2, loc="upper left")
    fig.tight_layout()
    return fig
