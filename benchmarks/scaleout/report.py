"""Markdown and PNG for `benchmarks/scaleout/`'s result: each headline key against the goal
the run recorded, the throughput runs and where their CPU time went, the dispatch, paging and
recovery details, and a two-panel plot (throughput per round, workers 1 vs 2; the recovery
timeline).

Reads only the result; measures nothing.
"""

from __future__ import annotations

from typing import Any

from benchmarks.harness.result import Result
from benchmarks.harness.writer import pyplot

LABELS = {
    "throughput_ratio_2v1": "aggregate trained tok/s, `--workers 2` ÷ `--workers 1`",
    "dispatch_overhead_ms": "dispatch per training cycle (fwd_bwd + optim call), Ray − "
                            "in-process, ms",
    "page_swap_ms": "one page swap (page-out + page-in, disk tier), ms",
    "page_bytes_vs_theory": "page-file bytes ÷ adapter state of theory",
    "recovery_s": "worker SIGKILL → affected tenants' next successful step, s",
    "acknowledged_lost": "acknowledged save_states not listed or not loadable",
    "tenants_per_worker_max": "adapters one worker trained under the memory budget",
}


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, (bool, int)):
        return str(value)
    return f"{value:.{digits}f}"


def _goal(goal: list[Any] | None) -> str:
    return "–" if goal is None else f"{goal[0]} {goal[1]}"


def _verdict(ok: bool | None) -> str:
    return {True: "**pass**", False: "**FAIL**", None: "reported"}[ok]


def goals_table(result: dict[str, Any]) -> list[str]:
    lines = ["| key | what | value | goal | verdict |", "|---|---|---|---|---|"]
    for key, g in result["goals"].items():
        lines.append(f"| `{key}` | {LABELS.get(key, '')} | **{_f(g['value'])}** | "
                     f"{_goal(g['goal'])} | {_verdict(g['pass'])} |")
    if "throughput_ratio_2v1_cpu" in result:
        lines.append(f"| `throughput_ratio_2v1_cpu` | trained tokens per CPU second (server "
                     f"tree + tenants), 2 ÷ 1 | {_f(result['throughput_ratio_2v1_cpu'])} | – "
                     "| reported |")
    return lines


def throughput_section(t: dict[str, Any], cores: int) -> list[str]:
    lines = ["## Throughput: `--workers 1` vs `--workers 2`", "",
             "| round | workers | tok/s | 2 ÷ 1 | steps | step p50 s | tok per CPU s | cores "
             "used | CPU share server / Ray / workers / tenants / other | worker utilization | "
             "worker CPU per busy s | load avg start → end | GEMM GFLOP/s before → after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, one in enumerate(t["runs"]["1"]):
        for run in (one, t["runs"]["2"][r]):
            s = run["cpu_share"]
            util = " / ".join(f"{lane['utilization']:.2f}" for lane in run["lanes"])
            ratio = t["ratio_per_round"][r] if run["workers"] == 2 else None
            lines.append(
                f"| {r + 1} | {run['workers']} | **{run['aggregate_tok_s']:.0f}** | "
                f"{_f(ratio)} | {run['num_steps']} | "
                f"{_f(run['step_latency_s'].get('p50'), 1)} | {run['tok_per_cpu_s']:.0f} | "
                f"{run['cpu_cores_used']:.2f} | {s['server']:.2f} / {s['ray']:.2f} / "
                f"{s['engine_workers']:.2f} / {s['tenants']:.2f} / {s['other']:.2f} | {util} | "
                f"{run['worker_cpu_per_busy_s']:.2f} | {run['load_avg']['start'][0]} → "
                f"{run['load_avg']['end'][0]} | "
                f"{run['probe_before']['gemm_fwd_bwd_gflops']:.0f} → "
                f"{run['probe_after']['gemm_fwd_bwd_gflops']:.0f} |")
    lines += ["", *where_time_went(t, cores)]
    return lines


def where_time_went(t: dict[str, Any], cores: int) -> list[str]:
    """The wall ratio split exactly into (worker CPU 2 ÷ 1) × (tokens per worker CPU s, 2 ÷ 1),
    and the CPU left for the workers on this machine."""
    one, two = t["where"]["1"], t["where"]["2"]
    cpu_ratio = t["worker_cpu_ratio_2v1"]
    eff_ratio = two["tok_per_worker_cpu_s"] / max(1e-9, one["tok_per_worker_cpu_s"])
    nonworker = {w: sum(v for k, v in t["where"][w]["cpu_share"].items()
                        if k in ("server", "ray", "tenants", "other")) * cores
                 for w in ("1", "2")}
    return [
        "### Where the time went", "",
        f"Throughput ratio {t['throughput_ratio_2v1']:.2f} = the engine workers' CPU seconds, "
        f"2 ÷ 1 (**{cpu_ratio:.2f}**) × trained tokens per worker CPU second, 2 ÷ 1 "
        f"(**{eff_ratio:.2f}**; medians, so the product is approximate). A ratio of 2 needs "
        "both factors near their ideal: two workers getting twice the CPU of one, and each "
        "turning a CPU second into as many tokens as the single worker does.", "",
        f"On this {cores}-core machine, with `--workers 1` the worker used "
        f"{one['cpu_share']['engine_workers'] * cores:.2f} cores (engine busy "
        f"{', '.join(f'{u:.2f}' for u in one['worker_utilization'])} of the window, "
        f"{one['worker_cpu_per_busy_s']:.2f} CPU s per busy s) while everything else (server "
        f"{one['cpu_share']['server'] * cores:.2f}, Ray's processes "
        f"{one['cpu_share']['ray'] * cores:.2f}, tenants "
        f"{one['cpu_share']['tenants'] * cores:.2f}, other jobs "
        f"{one['cpu_share']['other'] * cores:.2f}) took {nonworker['1']:.2f}. With "
        f"`--workers 2` the workers used {two['cpu_share']['engine_workers'] * cores:.2f} "
        f"cores (busy {', '.join(f'{u:.2f}' for u in two['worker_utilization'])}; "
        f"{two['worker_cpu_per_busy_s']:.2f} CPU s per busy s: below 1, a busy worker waited "
        f"for a core) and the rest took {nonworker['2']:.2f} (server "
        f"{two['cpu_share']['server'] * cores:.2f}, Ray {two['cpu_share']['ray'] * cores:.2f},"
        f" tenants {two['cpu_share']['tenants'] * cores:.2f}, other jobs "
        f"{two['cpu_share']['other'] * cores:.2f}). The CPU-normalised ratio (tokens per CPU "
        f"second of server tree + tenants) is {t['throughput_ratio_2v1_cpu']:.2f}; the cores "
        f"the benchmark's processes used went up {t['cpu_rate_ratio_2v1']:.2f}×.",
    ]


def dispatch_section(d: dict[str, Any]) -> list[str]:
    lines = ["## Dispatch: Ray worker vs in-process executor", "",
             f"{d['num_calls']} back-to-back pairs per call shape (order alternating), "
             f"{d['num_tenants']} tenants' cycle ({d['payload_tokens']} datum tokens). "
             "`remote`: `RemoteExecutor.noop(payload)` on a real `EngineWorker` actor (the "
             "payload goes there and comes back); `local`: the same payload through "
             "benchmarks/harness/fakes.py's `NoopExecutor` in this process. "
             f"**Per cycle (forward_backward call + optim_step call): {d['per_cycle_ms']:.2f} "
             "ms.**", "",
             "| call | payload bytes | remote p50 ms | local p50 ms | difference p50 / p95 ms |",
             "|---|---|---|---|---|"]
    for name, c in d["calls"].items():
        lines.append(f"| {name} | {d['payload_bytes'].get(name, 0)} | {c['remote_p50_ms']:.3f} "
                     f"| {c['local_p50_ms']:.3f} | {c['diff_p50_ms']:.3f} / "
                     f"{c['diff_p95_ms']:.3f} |")
    return lines


def paging_section(p: dict[str, Any]) -> list[str]:
    lines = ["## Paging under an adapter memory budget", "",
             f"One engine (one thread), rank {p['rank']}, {p['num_params']:,} LoRA parameters "
             f"per adapter: state at rest {p['rest_bytes']:,} B (leaves + two AdamW moments, "
             f"fp32, + step; the pager measures {p['resident_bytes_per_adapter']:,.0f} B per "
             f"resident adapter), {p['peak_bytes']:,} B while training. Budget "
             f"**{p['budget_bytes']:,} B** = {p['num_resident_budgeted']} adapters "
             f"({p['num_resident_budgeted'] - 1} at rest + one training); "
             f"{p['num_adapters']} adapters trained round robin, {p['rounds']} rounds, one "
             f"{p['seq_len']}-token datum per step. Resident baseline (no budget, "
             f"{p['num_resident_budgeted']} adapters): {p['resident_step_ms']:.1f} ms per step.",
             "", "| tier | page-out ms | page-in ms | swap ms | page file B (÷ theory) | read B "
             "(÷ theory) | step ms | adapters trained | max resident | over-budget calls | "
             "disk bound (adapters) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for tier in ("disk", "host"):
        t = p[tier]
        lines.append(
            f"| {tier} | {_f(t['page_out_ms'], 3)} | {_f(t['page_in_ms'], 3)} | "
            f"{_f(t['swap_ms'], 3)} | {_f(t['bytes_per_page_file'], 0)} "
            f"({_f(t['written_vs_theory'], 4)}) | {_f(t['bytes_per_page_read'], 0)} "
            f"({_f(t['read_vs_theory'], 4)}) | {t['step_ms']:.1f} | {t['adapters_trained']} | "
            f"{t['max_resident']} | {t['paging']['over_budget_calls']} | "
            f"{_f(t['disk_bound_adapters'])} |")
    lines += ["", "The host tier on a CPU engine hands the tensors over (nothing is copied), "
              "so only the disk tier bounds memory here; its swap is what a step on a "
              f"paged-out adapter pays ({p['swap_overhead_per_step_ms']:.1f} ms more per step "
              "than the resident baseline, medians)."]
    return lines


def recovery_section(r: dict[str, Any]) -> list[str]:
    lines = ["## Recovery: SIGKILL of one of two workers", "",
             f"Killed pid {r['victim_pid']} (workers {r['worker_pids_before']} → "
             f"{r['worker_pids_after']}); lost lane {', '.join(r['lost_lanes']) or '–'} left "
             f"the stats endpoint after {_f(r['lane_gone_s'])} s; a replacement worker joined "
             f"after {_f(r['replacement_joined_s'])} s. Affected tenants: "
             f"{', '.join(r['affected_tenants']) or 'none'}; each was told which checkpoint its "
             f"run was restored from: {r['errors_name_restore']}. "
             f"Unaffected tenants' longest gap between successful ops: "
             f"{_f(r['unaffected_max_gap_s'])} s. {r['acknowledged']} save_states "
             f"acknowledged, {r['acknowledged_lost']} lost.", "",
             "| tenant | lane | failed ops after kill | next successful step s | longest gap s "
             "| acknowledged | not listed | not loadable |",
             "|---|---|---|---|---|---|---|---|"]
    for t in r["tenants"]:
        lines.append(f"| {t['tenant']} | {t['lane']} | {t['failed_ops_after_kill']} | "
                     f"{_f(t['recovered_s'])} | {_f(t['max_gap_s'])} | {t.get('acked', 0)} | "
                     f"{len(t.get('not_listed', []))} | {len(t.get('unloadable', []))} |")
    errors = [(t["tenant"], e) for t in r["tenants"] for e in t.get("errors", [])]
    if errors:
        lines += ["", "What the affected tenants' failed ops said (each was retried at once):",
                  "", *[f"- {tenant}, {error}" for tenant, error in errors]]
    return lines


def markdown(record: Result, png_name: str) -> str:
    result = record.payload
    s = result["settings"]
    dirty = result["git"]["loraplex_dirty"]
    lines = [
        "# Scale-out: engine workers as Ray actors (`loraplex serve --workers N`)", "",
        f"`{result['command']}`{' (loraplex/ had uncommitted changes)' if dirty else ''}. "
        f"{record.provenance()} (The probe runs on one thread, as each worker does.)", "",
        f"Settings: {s['tenants']} tenants ({', '.join(s['modes'])} loops, cycled), model "
        f"`{s['model']}` (recovery: `{s['recovery_model']}`), {s['rounds']} round(s) of "
        f"{s['window_s']:.0f} s windows per worker count.", "",
        *goals_table(result), ""]
    if "throughput" in result:
        lines += [*throughput_section(result["throughput"], result["cores"]), ""]
    if "dispatch" in result:
        lines += [*dispatch_section(result["dispatch"]), ""]
    if "paging" in result:
        lines += [*paging_section(result["paging"]), ""]
    if "recovery" in result:
        lines += [*recovery_section(result["recovery"]), ""]
    lines += ["## Definitions", "", *DEFINITIONS, "", f"![throughput and recovery]({png_name})",
              ""]
    return "\n".join(lines)


DEFINITIONS = (
    "- aggregate trained tok/s: trained tokens of every tenant step inside the window (a step "
    "straddling its end counts by the fraction inside) ÷ the window. Tenants keep stepping "
    "until it closes; both servers (`--workers 1`, `--workers 2`, `--threads 1`) stay up for "
    "the whole phase and run alternately, 1, 2, 1, 2; the ratio is the median over rounds of "
    "the ratio within a round.",
    "- CPU shares: CPU seconds ÷ (window × cores), from /proc: `server` the `loraplex serve` "
    "process, `Ray` the Ray runtime it started (gcs_server, raylet, agents), `workers` the "
    "`EngineWorker` actors, `tenants` the SDK tenant processes, `other` the rest of the "
    "machine (other jobs). Worker utilization: engine-busy seconds per worker (stats endpoint, "
    "clipped to the window) ÷ the window.",
    "- dispatch: p50 of (remote − local) over back-to-back pairs, per call; a training cycle "
    "is two calls (forward_backward, optim_step).",
    "- paging: page-out ms from steps that only paged out (the first round), page-in ms from "
    "the swaps of later rounds minus their page-outs; theory is the adapter state at rest.",
    "- recovery: from the SIGKILL to the end of each affected tenant's first successful "
    "forward_backward + optim_step after its failed op (the tenant retries at once); the max "
    "over affected tenants.",
)


def figure(result: dict[str, Any], when: str = "") -> Any:
    """The two panels (throughput per round; the recovery timeline) from a result's payload,
    titled with the run's goals; ``when`` (date and load) goes into the title."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    goals = {key: _goal(g["goal"]) for key, g in result["goals"].items()}
    if "throughput" in result:
        _throughput_panel(axes[0], result["throughput"], goals.get("throughput_ratio_2v1", "–"))
    if "recovery" in result:
        _recovery_panel(axes[1], result["recovery"], goals.get("recovery_s", "–"))
    fig.suptitle(f"loraplex scale-out, {result['settings']['model']} model, {when} on "
                 f"{result['cores']} cores", fontsize=10)
    fig.tight_layout()
    return fig


def _throughput_panel(ax: Any, t: dict[str, Any], goal: str) -> None:
    rounds = range(1, len(t["runs"]["1"]) + 1)
    width = 0.38
    for offset, w, color in ((-width / 2, "1", "C0"), (width / 2, "2", "C2")):
        ax.bar([r + offset for r in rounds], [run["aggregate_tok_s"] for run in t["runs"][w]],
               width, color=color, label=f"--workers {w}")
    for r, ratio in zip(rounds, t["ratio_per_round"], strict=True):
        top = max(t["runs"]["1"][r - 1]["aggregate_tok_s"], t["runs"]["2"][r - 1]
                  ["aggregate_tok_s"])
        ax.annotate(f"{ratio:.2f}×", (r, top), ha="center", va="bottom", fontsize=8)
    ax.set(xlabel="round", ylabel="aggregate trained tokens/s",
           title=f"throughput (ratio {t['throughput_ratio_2v1']:.2f}, goal {goal})")
    ax.set_xticks(list(rounds))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)


def _recovery_panel(ax: Any, r: dict[str, Any], goal: str) -> None:
    for y, tenant in enumerate(r["tenants"]):
        for t0, t1, kind, ok in tenant["timeline"]:
            ax.plot([t0, t1], [y, y], lw=6 if kind == "train" else 3,
                    color=("C2" if kind == "train" else "C0") if ok else "C3",
                    solid_capstyle="butt")
    marks = (("kill", 0.0, "k"), ("lane gone", r["lane_gone_s"], "C1"),
             ("replacement joined", r["replacement_joined_s"], "C4"),
             ("recovered", r["recovery_s"], "C2"))
    for label, at, color in marks:
        if at is not None:
            ax.axvline(at, color=color, ls="--", lw=1, label=f"{label} ({at:.1f} s)")
    ax.set_yticks(range(len(r["tenants"])),
                  [f"{t['tenant']} ({t['lane']})" for t in r["tenants"]], fontsize=8)
    ax.set(xlabel="seconds from SIGKILL (green: train ok, blue: save_state ok, red: failed)",
           title=f"recovery ({_f(r['recovery_s'])} s, goal {goal}; "
                 f"{r['acknowledged_lost']} acknowledged lost)")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=7, loc="lower right")
