"""The markdown report of a llama.cpp side-by-side result: setup, weight parity, every run,
the ratios against their goals, single-stream latency, and where the time goes on each side
(prefill, decode step, llama.cpp's sampling), all read from the result's payload."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.harness.result import Result
from benchmarks.peers.llama_cpp.summary import GOALS, LLAMA_MODES

SIDE_LABELS = {"ours": "**ours** (loraplex sampler, default: batch-invariant)",
               "ours_fast": "ours, fast mode (`batch_invariant=False`)",
               "llama_batched": "llama.cpp batched (low-level API, seq_cp)",
               "llama_high": "llama.cpp high-level `Llama.generate`, one sequence at a time"}


def markdown(record: Result) -> str:
    r = record.payload
    return "\n".join([
        f"# llama.cpp side by side: {r['model_label'].split(' (')[0]}, ours {r['dtype']} vs "
        f"{r['gguf_type'].upper()} GGUF",
        "",
        *setup(record),
        *parity_lines(r["parity"]),
        *runs_table(r),
        *ratio_table(r),
        *latency_table(r),
        *time_split(r),
        *floor_lines(r.get("gemm_floor", {})),
        *profile_lines(r.get("ours_decode_profile", {})),
        *NOTES,
        "",
    ])


def setup(record: Result) -> list[str]:
    r = record.payload
    llama = r["llama_cpp"]
    install = llama.get("install", {})
    return [
        f"`python -m benchmarks peers.llama_cpp`, {r['rounds']} interleaved rounds, "
        f"{r['threads']} thread(s) on both sides, both pinned to CPU(s) {r['cores']}. "
        f"{record.provenance()}",
        "",
        f"Ours: the engine's sampler, `EngineConfig(dtype={r['dtype']!r})`, batch-invariant "
        f"{r['ours_config']['batch_invariant']}, C kernels {r['ours_config']['native_kernels']}"
        f", KV cache {r['ours_config']['kv_dtype']}. llama.cpp: llama-cpp-python "
        f"{llama['llama_cpp_python']} built from source here "
        f"(`{' '.join(install.get('cmake_flags', []))}`), {llama['n_vocab']}-token vocabulary, "
        f"flash attention {'on' if llama['flash_attn'] else 'off'}, KV cache "
        f"{llama['kv_cache_type']}; `{llama['system_info'].strip()}`. Weights: "
        f"`{r['gguf'].rsplit('/', 1)[-1]}`, written from `{r['gguf_source'].rsplit('/', 1)[-1]}` "
        "by dequantising every tensor with the call our loader makes (the F32 file holds our "
        "fp32 weights bit for bit). Prompts: random token ids, the same ids to both sides, "
        "fresh each round; EOS ignored on both sides.",
        "",
    ]


def parity_lines(p: dict[str, Any]) -> list[str]:
    def row(key: str, label: str) -> str:
        s = p[key]
        return (f"| {label} | {s['max_abs_dlogprob_prompt']:.2e} | "
                f"{s['mean_abs_dlogprob_prompt']:.2e} | {s['greedy_agree']}/{s['greedy_tokens']}"
                f" | {s['max_abs_dlogprob_greedy']:.2e} |")

    return [
        f"Same weights, checked on a chat prompt ({p['prompt_tokens']} tokens, \"{p['prompt']}\")"
        ": teacher-forced logprob of each prompt token on both sides, then "
        f"{p['exact']['greedy_tokens']} greedy tokens.",
        "",
        "| llama.cpp | max \\|Δ logprob\\| prompt | mean | greedy tokens agreeing | "
        "max \\|Δ logprob\\| greedy |",
        "|---|---|---|---|---|",
        row("exact", "exact: F32 KV cache, flash attention off"),
        row("as_timed", "as timed: F16 KV cache (its default), flash attention as set"),
        "",
        "The exact row differs by fp32 rounding only (the same weights); the timed "
        "configuration rounds K and V to F16 (and, with flash attention on a CPU, Q too).",
        "",
    ]


def runs_table(r: dict[str, Any]) -> list[str]:
    lines = ["| shape | mode | side | tok/s (median) | best | tok per CPU-s | first token ms | "
             "decode step ms | wall s per round |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in r["runs"].items():
        shape, mode, side = name.split("/")
        w = r["workloads"][shape]
        lines.append(
            f"| {shape} ({w['num_prompts']}×{w['prompt_len']} × G={w['num_samples']} × "
            f"{w['new_tokens']}) | {mode} | {SIDE_LABELS[side]} | {s['tok_s_median']:.1f} | "
            f"{s['tok_s_best']:.1f} | {s['tok_per_cpu_s_median']:.1f} | "
            f"{s['first_token_ms_median']:.0f} | {s['decode_step_ms_median']:.1f} | "
            f"{', '.join(f'{x:.2f}' for x in s['seconds'])} |")
    return [*lines, "",
            "Decode step ms: one step of every running sequence (ours, batched), or one token of "
            "one sequence (high-level: its mean over all tokens, the G − 1 later samples' "
            "one-token prompt refresh included).", ""]


def ratio_table(r: dict[str, Any]) -> list[str]:
    lines = ["| shape | mode | ours tok/s | ours fast | llama.cpp batched | llama.cpp "
             "high-level | ratio_vs_llama_cpp (ours ÷ faster llama.cpp) | goal | fast mode ÷ "
             "faster llama.cpp |", "|---|---|---|---|---|---|---|---|---|"]
    for mode, shapes in r["ratios"].items():
        for shape, v in shapes.items():
            goal = f"≥ {GOALS[shape]:g}" if shape in GOALS and mode == r["headline_mode"] else ""
            cells = [f"{v[f'{m}_tok_s']:.1f}" if f"{m}_tok_s" in v else "—"
                     for m in ("ours", "ours_fast", *LLAMA_MODES)]
            fast = f"{v['ratio_fast']:.2f}" if "ratio_fast" in v else "—"
            lines.append(f"| {shape} | {mode} | {' | '.join(cells)} | **{v['ratio']:.2f}** (vs "
                         f"{v['llama_cpp_best'].split('_')[1]}) | {goal} | {fast} |")
    return [*lines, ""]


def latency_table(r: dict[str, Any]) -> list[str]:
    if not r["single_stream"]:
        return []
    lines = ["Single stream (1 prompt × 128 tokens, 128 new): latency.", "",
             "| mode | side | time to first token ms | ms per later token | tok/s |",
             "|---|---|---|---|---|"]
    for mode, sides in r["single_stream"].items():
        for side, s in sides.items():
            lines.append(f"| {mode} | {SIDE_LABELS[side]} | {s['first_token_ms']:.0f} | "
                         f"{s['per_token_ms']:.1f} | {s['tok_s']:.1f} |")
    return [*lines, ""]


def time_split(r: dict[str, Any]) -> list[str]:
    """Prefill rate and decode step per shape and side, and llama.cpp's sampling share."""
    lines = ["Where the time goes (headline mode, medians): prefill = prompt tokens ÷ time to "
             "first token (the batched side and ours prefill every prompt in one step), decode "
             "= the rest of the run ÷ its steps; llama.cpp's sampling (its sampler chain per "
             "sequence per step, in C) measured inside the batched runs.", "",
             "| shape | side | prefill tok/s | decode step ms | decode tok/s | sampling share |",
             "|---|---|---|---|---|---|"]
    mode = r["headline_mode"]
    for shape, w in r["workloads"].items():
        for side in ("ours", "ours_fast", "llama_batched"):
            s = r["runs"].get(f"{shape}/{mode}/{side}")
            if s is None:
                continue
            prefill = w["num_prompts"] * w["prompt_len"] / (s["first_token_ms_median"] / 1e3)
            decode = w["num_prompts"] * w["num_samples"] / (s["decode_step_ms_median"] / 1e3)
            share = ("" if s["sampling_s_median"] is None else
                     f"{s['sampling_s_median'] / statistics.median(s['seconds']):.0%}")
            lines.append(f"| {shape} | {SIDE_LABELS[side]} | {prefill:.0f} | "
                         f"{s['decode_step_ms_median']:.1f} | {decode:.0f} | {share} |")
    return [*lines, ""]


def floor_lines(floors: dict[str, Any]) -> list[str]:
    """Our base-model GEMMs alone at each workload's shapes: the floor under our sampler."""
    if not floors:
        return []
    lines = ["Our base-model GEMMs alone (`benchmarks.base_gemms`: every layer's seven linears "
             "and the head on the model's weights, rows padded as the mode pads them), CPU "
             "seconds: the floor under our sampler; `max_ratio` = the faster llama.cpp mode's "
             "CPU seconds ÷ that floor, the most a sampler on these GEMMs could reach.", "",
             "| shape / side | prefill GEMMs s | decode-step GEMMs ms | floor s | ours CPU s | "
             "llama.cpp CPU s | max_ratio |", "|---|---|---|---|---|---|---|"]
    for name, f in floors.items():
        ours = f["floor_s"] + f["ours_above_floor_s"]
        lines.append(f"| {name} | {f['prefill_s']:.2f} | {1e3 * f['decode_step_s']:.1f} | "
                     f"{f['floor_s']:.2f} | {ours:.2f} | {f['max_ratio'] * f['floor_s']:.2f} | "
                     f"{f['max_ratio']:.2f} |")
    return [*lines, ""]


def profile_lines(profiles: dict[str, Any]) -> list[str]:
    """Our decode step under torch.profiler, per shape and mode (the profiler inflates it)."""
    if not profiles:
        return []
    lines = ["Our decode step, profiled apart from the timed runs (torch.profiler; CPU ms per "
             "step; torch's ops are what runs through its dispatcher, the rest is our C "
             "kernels, the packed sgemm of the base linears and head and the paged attention, "
             "and Python):", "", "| shape / side | sequences | CPU ms per step | torch ops ms | "
             "top ops (self ms per step) |", "|---|---|---|---|---|"]
    for name, p in profiles.items():
        top = ", ".join(f"`{k}` {v}" for k, v in list(p["top_ops_ms_per_step"].items())[:5])
        lines.append(f"| {name} | {p['sequences']} | {p['cpu_ms_per_step']:.1f} | "
                     f"{p['torch_ops_ms_per_step']:.1f} | {top} |")
    return [*lines, ""]


NOTES: tuple[str, ...] = ()
