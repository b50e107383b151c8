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
        *agreement_lines(r.get("greedy_agreement", {})),
        *runs_table(r),
        *ratio_table(r),
        *latency_table(r),
        *time_split(r),
        *floor_lines(r.get("gemm_floor", {})),
        *profile_lines(r.get("ours_profile", {})),
        *findings(record),
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


def agreement_lines(agreement: dict[str, Any]) -> list[str]:
    """The greedy runs' continuations (first round) against ours, sequence by sequence."""
    if not agreement:
        return []
    cells = [f"{name} {a['identical']}/{a['sequences']} identical (mean common prefix "
             f"{a['mean_common_prefix']:.1f} of {a['tokens_per_sequence']})"
             for name, a in agreement.items()]
    return ["Greedy runs on the benchmark's own prompts (first round), each side's "
            "continuations against ours: " + "; ".join(cells) + ".", ""]


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
             "high-level | ratio_vs_llama_cpp (ours ÷ faster llama.cpp) | goal | per CPU-s | "
             "fast mode ÷ faster llama.cpp (per CPU-s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for mode, shapes in r["ratios"].items():
        for shape, v in shapes.items():
            goal = f"≥ {GOALS[shape]:g}" if shape in GOALS and mode == r["headline_mode"] else ""
            cells = [f"{v[f'{m}_tok_s']:.1f}" if f"{m}_tok_s" in v else "—"
                     for m in ("ours", "ours_fast", *LLAMA_MODES)]
            fast = (f"{v['ratio_fast']:.2f} ({v['ratio_fast_cpu']:.2f})" if "ratio_fast" in v
                    else "—")
            lines.append(f"| {shape} | {mode} | {' | '.join(cells)} | **{v['ratio']:.2f}** (vs "
                         f"{v['llama_cpp_best'].split('_')[1]}) | {goal} | "
                         f"{v['ratio_cpu']:.2f} | {fast} |")
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
    """Our prefill and decode step, each split by cProfile's shares into the packed sgemm,
    the attention kernel and the rest."""
    if not profiles:
        return []
    lines = ["Our time, measured apart from the rounds: CPU ms of the prefill step (every "
             "prompt, first tokens drawn) and of one decode step, split in the shares cProfile "
             "gives the packed sgemm (base linears and head), the C attention kernel and the "
             "rest (norms, RoPE, KV writes, sampling over the vocabulary, Python):", "",
             "| shape / side | prefill ms | sgemm | attention | rest | decode step ms | sgemm | "
             "attention | rest |", "|---|---|---|---|---|---|---|---|---|"]
    for name, p in profiles.items():
        cells = [f"{p[part][key]:.0f}" if part == "prefill" else f"{p[part][key]:.1f}"
                 for part in ("prefill", "decode")
                 for key in ("cpu_ms", "packed_sgemm_ms", "attention_kernel_ms", "other_ms")]
        lines.append(f"| {name} ({p['sequences']} seq.) | {' | '.join(cells)} |")
    return [*lines, ""]


def findings(record: Result) -> list[str]:
    """Where llama.cpp wins and why, from this run's own numbers (headline mode)."""
    r = record.payload
    mode, runs, floors = r["headline_mode"], r["runs"], r.get("gemm_floor", {})
    lines = ["## Where llama.cpp wins, and why", ""]
    for shape, v in r["ratios"][mode].items():
        best = v["llama_cpp_best"]
        verdict = ("even (within 5 %)" if abs(v["ratio"] - 1) <= 0.05
                   else "llama.cpp wins" if v["ratio"] < 1 else "ours wins")
        lines.append(f"- **{shape}**: {verdict}: ours {v['ours_tok_s']:.1f} tok/s, llama.cpp "
                     f"{best.split('_')[1]} {v[f'{best}_tok_s']:.1f} tok/s (ratio "
                     f"{v['ratio']:.2f}; per CPU-second {v['ratio_cpu']:.2f}).")

    def step(shape: str, side: str) -> str:
        s = runs.get(f"{shape}/{mode}/{side}")
        return "—" if s is None else f"{s['decode_step_ms_median']:.0f}"

    shapes = [s for s in ("single", "batch", "fanout") if s in r["workloads"]]
    sizes = {s: r["workloads"][s]["num_prompts"] * r["workloads"][s]["num_samples"]
             for s in shapes}
    lines += ["", "Decode step ms by sequences per step (" + ", ".join(
        f"{sizes[s]} ({s})" for s in shapes) + "): ours " + " / ".join(
        step(s, "ours") for s in shapes) + ", ours fast " + " / ".join(
        step(s, "ours_fast") for s in shapes) + ", llama.cpp batched " + " / ".join(
        step(s, "llama_batched") for s in shapes) + ". llama.cpp's step grows with the "
        "sequences in it (one row is a matrix-vector product over the F32 weights); our default "
        f"mode pads every GEMM to a multiple of {r['ours_config']['row_multiple']} rows (the "
        "batch-invariance guarantee: a token's bits do not depend on its batch), so one "
        "sequence costs about what 8 do."]
    if "single/ours" in floors and "single/ours_fast" in floors:
        lines += ["", "One sequence: our base GEMMs alone take "
                  f"{1e3 * floors['single/ours']['decode_step_s']:.0f} ms per step padded, "
                  f"{1e3 * floors['single/ours_fast']['decode_step_s']:.0f} ms at one row (fast "
                  "mode); the rest of our step is 30 layers of norms, RoPE, KV writes, attention "
                  "and torch dispatch from Python, and the sampler over the 49,152-token "
                  "vocabulary, where llama.cpp runs one C graph."]
    probe = record.start.probe or {}
    if probe.get("packed_gemm_gflops"):
        lines += ["", "GEMM kernels on this machine (probe at the start, fp32 4096×512→512, "
                  f"1 thread): MKL {probe['gemm_gflops']:.1f} GFLOP/s, our packed kernel "
                  f"{probe['packed_gemm_gflops']:.1f} GFLOP/s. Our base GEMMs run on the packed "
                  "kernel; `python -m benchmarks packed_gemm` compares the two at the model's "
                  "own shapes."]
    if "batch" in r["workloads"]:
        w = r["workloads"]["batch"]
        tokens = w["num_prompts"] * w["prompt_len"]
        rates = {side: tokens / (runs[f"batch/{mode}/{side}"]["first_token_ms_median"] / 1e3)
                 for side in ("ours", "llama_batched") if f"batch/{mode}/{side}" in runs}
        if len(rates) == 2:
            lines += ["", f"Prefill ({tokens} prompt tokens in one step): ours "
                      f"{rates['ours']:.0f} tok/s, llama.cpp {rates['llama_batched']:.0f} tok/s."]
    return [*lines, "", *MECHANISMS, ""]


MECHANISMS = (
    "What each side does: llama.cpp's batched API shares prompts as we do (each prompt "
    "prefilled once, its KV copied to the G sequences with `llama_memory_seq_cp`, every "
    "sequence decoded in one batch per step), so against it the fan-out difference is per-step "
    "compute (GEMM kernels, attention, the work around them), not prefix sharing or batching; "
    "its high-level `Llama.generate` decodes one sequence at a time (reusing the previous "
    "sequence's common prefix), which is where our batching shows. llama.cpp keeps its KV cache "
    "in F16 and (flash attention on) computes attention in F16 on a CPU; ours keeps fp32.",
)
