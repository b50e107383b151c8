"""Markdown for `side_by_side.py`'s result: ratios with their goals, per-round numbers, load."""

from __future__ import annotations

import json
from typing import Any

from benchmarks.harness.result import Result

LABELS = {
    "train": "fwd_bwd + optim_step (trained tokens/s, median step)",
    "sample_fanout": "sampling fan-out (generated tokens/s)",
    "sample_batch": "sampling batch (generated tokens/s)",
}
MODEL_LABELS = {
    "smollm2": "SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, 9/3 heads, head_dim 64, "
               "vocab 49152, tied, rope θ 100000; the `builtin:smollm2-135m` Q4_1 GGUF imported "
               "once as an fp32 HF directory)",
    "small": "loraplex's built-in small Qwen3 (4 layers, hidden 512, vocab 8192, tied, random)",
}


def _fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _shape(run: dict[str, Any]) -> str:
    train, fan, batch = run["train"], run["sample_fanout"], run["sample_batch"]
    return (f"training {train['num_sequences']} sequences of lengths {train['lengths']} "
            f"({train['tokens_per_step']} tokens per step); fan-out {fan['num_prompts']} prompts "
            f"× {fan['prompt_len']} tokens × G = {fan['num_samples']} × {fan['max_tokens']} new; "
            f"batch {batch['num_prompts']} prompts × G = {batch['num_samples']} × "
            f"{batch['max_tokens']} new (past EOS: every sample runs to max_tokens)")


def _round_rows(result: dict[str, Any]) -> list[str]:
    rows = ["| round | peer | train step s | fan-out round s (tokens) | batch round s (tokens) "
            "| load 1m start → end | server CPU s / wall s | peak RSS MiB |",
            "|---|---|---|---|---|---|---|---|"]
    for i, entry in enumerate(result["rounds"], 1):
        for peer in entry["order"]:
            r = entry[peer]
            fan, batch = r["sample_fanout"], r["sample_batch"]
            rows.append(
                f"| {i} | {peer} | {r['train']['step_s']} | {fan['round_s']} "
                f"({fan['gen_tokens']}) | {batch['round_s']} ({batch['gen_tokens']}) | "
                f"{r['load_avg']['start'][0]} → {r['load_avg']['end'][0]} | "
                f"{r['server_cpu_s']} / {r['wall_s']} | {r['server_peak_rss_mib']} |")
    return rows


def markdown(record: Result) -> str:
    result = record.payload
    ours, theirs = result["tok_per_s"]["loraplex"], result["tok_per_s"]["skyrl"]
    ratio = result["ratio_vs_skyrl"]
    first = result["rounds"][0]["loraplex"]
    sky = result["skyrl"]
    lines = [
        f"# loraplex vs SkyRL tx {sky['version']} on {result['model']}",
        "",
        f"`python -m benchmarks.peers.side_by_side --model {result['model']}`"
        f"{' (loraplex/ had uncommitted changes)' if result['git']['loraplex_dirty'] else ''}. "
        f"{record.provenance()} Model: "
        f"{MODEL_LABELS[result['model']]}. Both servers load the same directory "
        f"(`{result['model_dir']}`; SkyRL through its dtype view, config dtype "
        f"`{sky.get('dtype')}`); both compute in fp32. {result['threads']} threads each: "
        f"both pinned to cores `{json.dumps(result['affinity'])}` of {result['cores']}, loraplex "
        f"with `--threads {result['threads']}` (SDK {first['sdk_version']}), SkyRL's JAX CPU "
        f"backend sizing its pool from that affinity (SDK "
        f"{result['rounds'][0]['skyrl']['sdk_version']}, backend config "
        f"`{json.dumps(sky['backend_config'])}`). LoRA rank {first['rank']} on q, k, v, o, "
        "gate, up, down of every layer, not on the head (`train_unembed=False`: SkyRL cannot "
        "adapt a tied head). Workloads: " + _shape(first) + ".",
        "",
        f"{len(result['rounds'])} interleaved rounds (order alternating), each one "
        "`client_bench.py` run per server with untimed warm-up first, one server up at a time "
        "(SkyRL restarted each round, measured once its engine had loaded the weights).",
        "",
        "| workload | loraplex | SkyRL tx | ratio_vs_skyrl | goal |",
        "|---|---|---|---|---|",
    ]
    goals = result["goals"]  # the goals of the run this result is, not today's
    for key, label in LABELS.items():
        met = "met" if ratio[key] is not None and ratio[key] >= goals[key] else "not met"
        lines.append(f"| {label} | {_fmt(ours[key])} | {_fmt(theirs[key])} | "
                     f"**{_fmt(ratio[key], 2)}** | ≥ {goals[key]} ({met}) |")
    per_round = ["/".join(_fmt(r[k], 2) for r in result["ratio_vs_skyrl_per_round"])
                 for k in LABELS]
    lines += ["", "Per-round ratios (train, fan-out, batch): " + "; ".join(per_round) + ".", "",
              *_round_rows(result), "",
              "SkyRL JIT compiles per round (in the warm-up unless a timed step or round "
              "jumps): " + "; ".join(f"`{json.dumps(e['skyrl'].get('jit_compiles'))}`"
                                     for e in result["rounds"]) + ".", "",
              "Pooled over rounds: training = tokens per step ÷ the median of every timed step; "
              "sampling = generated tokens ÷ seconds of every timed round. Peers: "
              + ", ".join(result["affinity"]) + ".", ""]
    return "\n".join(lines)
