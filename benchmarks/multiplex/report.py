"""Markdown and PNG for `benchmarks/multiplex/`'s result: per-mode tables by K, the profile of
where time went, the loraplex vs SkyRL tx ratios, and a two-panel plot (aggregate throughput of
packed / timeslice / single, and efficiency and speedup vs K), judged by the run's own goals.

Reads only the result; measures nothing.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from benchmarks.harness.result import Result
from benchmarks.harness.writer import pyplot

VARIANT_LABELS = {"packed": "packed (loraplex default)", "timeslice": "timeslice (one model "
                  "per cycle)", "single": "one adapter, K× batch"}


def _f(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _median(values: list[float]) -> float:
    return statistics.median(values)


def mode_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| K | aggregate tok/s | efficiency (wall / CPU) | speedup vs timeslice (wall / "
             "CPU) | fairness (max/min) | step p50 / p95 s | utilization | client CPU share | "
             "other load share | tenants per cycle | engine efficiency | roofline fraction |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tenants = _median([run["train_cycles"]["mean_tenants"] for run in r["runs"]["packed"]])
        lat = r["step_latency_s"]
        lines.append(
            f"| {r['k']} | **{r['aggregate_tok_s']:.0f}** | **{r['efficiency']:.2f}** / "
            f"{r['efficiency_cpu']:.2f} | **{r['speedup_vs_timeslice']:.2f}** / "
            f"{r['speedup_vs_timeslice_cpu']:.2f} | {r['fairness']:.2f} | "
            f"{lat['p50']:.1f} / {lat['p95']:.1f} | {r['utilization']:.2f} | "
            f"{r['client_cpu_share']:.3f} | {r['other_cpu_share']:.2f} | "
            f"{tenants:.1f} | {r['engine_efficiency']:.2f} | {r['roofline_fraction']:.2f} |")
    return lines


def runs_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| K | run | tok/s | tok per server CPU s | sampled tok/s | window s | utilization "
             "| engine s (cycle / sample / control) | idle s | train cycles (mean tenants, "
             "tokens) | sample plans (mean requests decoding) | client / server / other CPU "
             "share | load avg start → end |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for variant in ("packed", "timeslice", "single"):
            for run in r["runs"][variant]:
                e, cyc = run["engine_s"], run["train_cycles"]
                lines.append(
                    f"| {r['k']} | {variant} | {run['aggregate_tok_s']:.0f} | "
                    f"{run['tok_per_server_cpu_s']:.0f} | {run['sampled_tok_s']:.1f} | "
                    f"{run['window_s']:.1f} | {run['utilization']:.2f} | "
                    f"{_f(e.get('cycle'), 1)} / {_f(e.get('sample'), 1)} / "
                    f"{_f(e.get('control'), 1)} | {run['idle_s']:.1f} | {cyc['count']} "
                    f"({cyc['mean_tenants']:.1f}, {cyc['mean_tokens']:.0f}) | "
                    f"{run['sample_plans']['count']} ({run['sample_plans']['mean_running']:.1f})"
                    " | "
                    f"{run['client_cpu_share']:.3f} / {run['server_cpu_share']:.2f} / "
                    f"{run['other_cpu_share']:.2f} | {run['load_avg']['start'][0]} → "
                    f"{run['load_avg']['end'][0]} |")
    return lines


def noise_floor(rows: list[dict[str, Any]]) -> list[str]:
    """At K=1 the three variants run the same workload: their spread is the noise floor."""
    one = next((r for r in rows if r["k"] == 1), None)
    if one is None:
        return []
    return [f"Noise floor: at K=1 the three runs are the same workload (one tenant, same "
            f"batch), so their ratios should be 1: efficiency {one['efficiency']:.2f}, speedup "
            f"vs timeslice {one['speedup_vs_timeslice']:.2f}. Differences of that size "
            "elsewhere in the table are noise from the other jobs on the machine."]


def time_split(mode: str, rows: list[dict[str, Any]]) -> list[str]:
    """Where the time went at the largest K: per variant, trained tokens per engine second
    and per server CPU second, the engine's busy fraction and how work was batched."""
    top = rows[-1]
    lines = [f"Where the time went at K={top['k']} (medians over repeats):", "",
             "| run | tok/s | engine ms per token | tok per server CPU s | utilization | "
             "train cycles per round | tenants per cycle | sample plans (requests decoding) | "
             "client / other CPU share |", "|---|---|---|---|---|---|---|---|---|"]
    for variant in ("packed", "timeslice", "single"):
        runs = top["runs"][variant]

        def med(get: Any, of: list[dict[str, Any]] = runs) -> float:
            return _median([get(r) for r in of])

        lines.append(
            f"| {variant} | {med(lambda r: r['aggregate_tok_s']):.0f} | "
            f"{med(lambda r: r['engine_s_per_ktok']):.2f} | "
            f"{med(lambda r: r['tok_per_server_cpu_s']):.0f} | "
            f"{med(lambda r: r['utilization']):.2f} | "
            f"{med(_cycles_per_round):.1f} | "
            f"{med(lambda r: r['train_cycles']['mean_tenants']):.1f} | "
            f"{med(lambda r: r['sample_plans']['count']):.0f} "
            f"({med(lambda r: r['sample_plans']['mean_running']):.1f}) | "
            f"{med(lambda r: r['client_cpu_share']):.3f} / "
            f"{med(lambda r: r['other_cpu_share']):.2f} |")
    return lines


def _cycles_per_round(run: dict[str, Any]) -> float:
    """Training engine calls per round (a round: every tenant of the run does one step)."""
    return float(run["train_cycles"]["count"] * run["num_tenants"]
                 / max(1, run["steps_in_window"]))


def peer_section(peer: dict[str, Any]) -> list[str]:
    lines = ["## Side by side with SkyRL tx", ""]
    if peer.get("status") != "ok":
        lines.append(f"Not measured: **{peer.get('reason')}**.")
        if peer.get("loraplex"):
            lines.append(f"loraplex alone: `{json.dumps(peer['loraplex']['summary'])}`.")
        return lines
    ours, theirs = peer["loraplex"], peer["skyrl"]
    ratio = peer["ratio_vs_skyrl"]
    lines += [
        f"The same script (`benchmarks/peers/client_bench.py {' '.join(peer['client_args'])}`) "
        f"against loraplex (SDK {ours['sdk_version']}, `--threads "
        f"{peer.get('loraplex_threads') or 'default'}`) and then SkyRL tx "
        f"{theirs['peer']['version']} (JAX CPU backend, SDK {theirs['sdk_version']}, backend "
        f"config `{json.dumps(theirs['peer']['backend_config'])}`) on the same weights. Load "
        f"average: loraplex {ours['load_avg']['start']} → {ours['load_avg']['end']}, SkyRL "
        f"{theirs['load_avg']['start']} → {theirs['load_avg']['end']}.", "",
        "| tokens/s | loraplex | SkyRL tx | ratio_vs_skyrl (loraplex ÷ SkyRL) |",
        "|---|---|---|---|"]
    for key, label in (("fwd_bwd_tok_s", "fwd_bwd + optim_step (median step)"),
                       ("fwd_bwd_pipelined_tok_s", "fwd_bwd + optim_step, pipelined"),
                       ("sample_fanout_tok_s", "sampling, fan-out (generated)"),
                       ("sample_batch_tok_s", "sampling, batch (generated)")):
        lines.append(f"| {label} | {_f(ours['summary'].get(key), 1)} | "
                     f"{_f(theirs['summary'].get(key), 1)} | **{_f(ratio.get(key))}** |")
    compiles = theirs.get("jit_compiles", [])
    lines += ["", f"SkyRL JIT compiles (absorbed by the untimed warm-up): {len(compiles)}, "
              f"{sum(c['s'] for c in compiles):.0f} s in all."]
    return lines


def markdown(record: Result, png_name: str) -> str:
    result = record.payload
    s = result["settings"]
    p0 = record.start.probe or {}
    lines = [
        "# Multiplexing: K tenants on one server (packed clock cycles vs time-slicing vs one "
        "adapter)", "",
        f"`python -m benchmarks.multiplex{' --quick' if result['quick'] else ''}`"
        f"{' (loraplex/ had uncommitted changes)' if result['git']['loraplex_dirty'] else ''}"
        f". {record.provenance()} Roofline for trained tokens: the probe's fwd+bwd rate "
        f"({p0.get('gemm_fwd_bwd_gflops', 0):.1f} GFLOP/s at start) ÷ "
        f"{result['flops_per_trained_token'] / 1e6:.0f} MFLOP/token = "
        f"{result['roofline_tok_s']:.0f} tok/s.", "",
        f"Workload per tenant step: SFT {s['sft_batch']} × {s['seq_len']} tokens "
        f"(cross_entropy); GRPO {s['grpo_prompts']} prompt × {s['group_size']} samples × "
        f"({s['prompt_len']} prompt + {s['max_tokens']} new) tokens, graded (fraction of even "
        f"token ids, centred per group) and trained with importance_sampling; rank "
        f"{s['rank']}; forward_backward and optim_step submitted back to back. Each tenant is "
        f"its own process (official SDK); {s['warmup_steps']} warm-up step, then "
        f"at least {s['timed_steps']} (SFT) / {s.get('grpo_timed_steps', s['timed_steps'])} "
        f"(GRPO) timed steps per tenant, more where needed for "
        f"{s['min_window_tokens']} trained tokens per window; each K's three runs repeated "
        f"{s['repeats']}× (order flipped every time; ratios are medians of per-repeat ratios). "
        f"Servers: {s['threads'] or 'default'} torch thread(s) (one thread degrades gracefully "
        "when other jobs share the cores; two collapse). Steps are chosen so the whole run "
        "fits in well under 40 min on this shared 2-core machine, at the cost of few samples "
        "per latency percentile.", "",
        f"`per_op_overhead_ms` (scheduler alone, no-op engine, 16 tenants): "
        f"**{result['per_op_overhead_ms']:.3f} ms** (goal < "
        f"{result['goals']['per_op_overhead_ms']:g}).", ""]
    for mode, rows in result["modes"].items():
        lines += [f"## {mode.upper()}", "", *mode_table(rows), "", *noise_floor(rows), "",
                  *time_split(mode, rows), "", "Every run:", "", *runs_table(rows), ""]
    lines += [*peer_section(result["peer"]), "", "## Definitions", "", *DEFINITIONS, "",
              f"![throughput and efficiency vs K]({png_name})", ""]
    return "\n".join(lines)


DEFINITIONS = (
    "- aggregate tok/s: trained tokens of every step (all tenants) that finished between the "
    "barrier and the moment the last tenant finished its timed steps, ÷ that window. Tenants "
    "that finish early keep stepping (untimed) so the load stays steady.",
    "- efficiency = packed aggregate ÷ the `single` run's (one tenant sending K× the batch per "
    "step, same server, same total tokens). speedup vs timeslice = packed ÷ the same tenants "
    "against a server started with `--timeslice` (one model per clock cycle).",
    "- fairness = max ÷ min over tenants of (its timed tokens ÷ time to finish them). step "
    "p50 / p95 pool all tenants' timed steps (per-tenant values are in the JSON).",
    "- utilization: engine seconds (all plan kinds, from `/api/v1/loraplex/stats`) ÷ wall "
    "seconds of the window. client / server / other CPU share: CPU seconds of the tenant "
    "processes / the server process / everything else on the machine (from /proc), ÷ (window "
    "× cores). `other` is the other jobs sharing this machine.",
    "- engine efficiency: engine seconds per trained token of the one-adapter run ÷ the "
    "packed run's (engine time clipped to the window): the part of the efficiency lost inside "
    "engine calls; the rest is time the engine waited (HTTP, scheduling, tenants' round trips).",
    "- roofline fraction: aggregate tok/s ÷ (probe GEMM rate ÷ FLOPs per trained token); "
    "attention FLOPs ignored, so an upper bound on the real fraction.",
)


def figure(result: dict[str, Any], when: str = "") -> Any:
    """The two-panel matplotlib figure (throughput; efficiency and speedup), both against K,
    from a result's payload; ``when`` (date and load) goes into the title."""
    plt = pyplot()
    from matplotlib import ticker

    modes = result["modes"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"sft": "-", "grpo": "--"}
    for mode, rows in modes.items():
        ks = [r["k"] for r in rows]
        for variant, color in (("packed", "C0"), ("timeslice", "C3"), ("single", "C2")):
            axes[0].plot(ks, [_median([run["aggregate_tok_s"] for run in r["runs"][variant]])
                              for r in rows],
                         styles.get(mode, ":"), color=color, marker="o",
                         label=f"{mode}: {VARIANT_LABELS[variant]}")
        axes[1].plot(ks, [r["efficiency"] for r in rows], styles.get(mode, ":"), color="C0",
                     marker="o", label=f"{mode}: efficiency (packed ÷ one adapter)")
        axes[1].plot(ks, [r["speedup_vs_timeslice"] for r in rows], styles.get(mode, ":"),
                     color="C3", marker="s", label=f"{mode}: speedup vs timeslice")
    axes[0].set(xscale="log", xlabel="tenants K", ylabel="trained tokens/s",
                title="aggregate throughput")
    if "goals" in result:  # results from before the goals were recorded have none
        axes[1].axhline(result["goals"]["efficiency"], color="grey", lw=0.8, ls=":")
    axes[1].set(xscale="log", xlabel="tenants K", ylabel="ratio",
                title="efficiency and speedup vs K")
    ks = sorted({r["k"] for rows in modes.values() for r in rows})
    for ax in axes:
        # Ticks at the measured K only, as plain numbers: a log axis otherwise labels its minor
        # ticks "3×10^0" whenever K spans less than a decade.
        ax.xaxis.set_major_locator(ticker.FixedLocator(ks))
        ax.xaxis.set_major_formatter(ticker.ScalarFormatter())
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        ax.ticklabel_format(axis="y", style="plain", useOffset=False)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"loraplex multiplexing, small model, {when} on {result['cores']} cores",
                 fontsize=10)
    fig.tight_layout()
    return fig
