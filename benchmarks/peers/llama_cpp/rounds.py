"""The measurement: the parity check, then warm-up and interleaved rounds (ours, llama.cpp
batched, llama.cpp high-level, per shape and sampling mode), the same prompts for every side
within a round and fresh prompts each round."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmarks.base_gemms import sampling_floor
from benchmarks.peers.llama_cpp.ours import Ours
from benchmarks.peers.llama_cpp.peer import LlamaCppPeer
from benchmarks.peers.llama_cpp.summary import (
    LLAMA_MODES,
    greedy_agreement,
    latency,
    parity,
    ratios,
    run_record,
    summarize,
)
from benchmarks.peers.llama_cpp.workload import TEMPERATURES, WORKLOADS, Workload, prompts

PARITY_TEXT = ("Summarise in one sentence why the sky is blue, then list three colours of a "
               "rainbow.")
PARITY_NEW_TOKENS = 32


@dataclass(frozen=True)
class Plan:
    """What each round runs: the shapes, the sampling modes, llama.cpp's ways to sample."""

    workloads: dict[str, Workload]
    modes: tuple[str, ...]
    sides: tuple[str, ...]

    @classmethod
    def parse(cls, shapes: str, modes: str, llama_modes: str, fast: bool = True) -> Plan:
        """From comma-separated names; ``fast``: our fast mode runs too.

        Raises:
            ValueError: an unknown name.
        """
        chosen = {name: _known(name, WORKLOADS) for name in shapes.split(",")}
        ours = ("ours", "ours_fast") if fast else ("ours",)
        return cls({name: WORKLOADS[name] for name in chosen},
                   tuple(_known(m, TEMPERATURES) for m in modes.split(",")),
                   (*ours, *(_known(m, LLAMA_MODES) for m in llama_modes.split(","))))

    def entries(self) -> Iterator[tuple[str, Workload, float, str]]:
        """(run name, workload, temperature, side) in the order a round runs them."""
        for shape, workload in self.workloads.items():
            for mode in self.modes:
                for side in self.sides:
                    yield f"{shape}/{mode}/{side}", workload, TEMPERATURES[mode], side


def _known(name: str, known: Any) -> str:
    if name not in known:
        raise ValueError(f"unknown {name!r}; known: {', '.join(known)}")
    return name


def run_side(ours: dict[str, Ours], peer: LlamaCppPeer, side: str, workload: Workload,
             batch: list[list[int]], temperature: float, seed: int) -> dict[str, Any]:
    """One run of ``workload`` on ``side`` (one of ``ours``, a llama.cpp mode): the raw
    record."""
    if side in ours:
        return ours[side].run(workload, batch, temperature, seed)
    return peer.request({"op": "run", "mode": side.removeprefix("llama_"), "prompts": batch,
                         "num_samples": workload.num_samples,
                         "new_tokens": workload.new_tokens, "temperature": temperature,
                         "seed": seed})


def measure(ours: dict[str, Ours], peer: LlamaCppPeer, plan: Plan, rounds: int
            ) -> dict[str, Any]:
    """Warm-up (every entry once, 4 new tokens, untimed), then ``rounds`` interleaved rounds,
    then our decode-step profiles and GEMM floors; the payload's ``runs``,
    ``ratio_vs_llama_cpp`` and the rest."""
    vocab = ours["ours"].model.spec.vocab_size
    entries = list(plan.entries())
    for _, workload, temperature, side in tqdm(entries, desc="warm-up"):
        short = replace(workload, new_tokens=4)
        run_side(ours, peer, side, short, prompts(short, 0, vocab), temperature, 0)
    records: dict[str, list[dict[str, Any]]] = {}
    greedy_tokens: dict[str, list[list[int]]] = {}
    for r in tqdm(range(rounds), desc="rounds"):
        for name, workload, temperature, side in tqdm(entries, desc=f"round {r + 1}",
                                                      leave=False):
            raw = run_side(ours, peer, side, workload, prompts(workload, 1000 + r, vocab),
                           temperature, 1000 * r)
            records.setdefault(name, []).append(run_record(raw))
            if r == 0 and temperature == 0:
                greedy_tokens[name] = raw["tokens"]
    return analyse(ours, plan, records, greedy_tokens)


def analyse(ours: dict[str, Ours], plan: Plan, records: dict[str, list[dict[str, Any]]],
            greedy_tokens: dict[str, list[list[int]]]) -> dict[str, Any]:
    """The rounds' numbers (`summary`), plus our profile (prefill and decode step) and
    base-GEMM floor per shape, measured now, apart from the rounds."""
    vocab = ours["ours"].model.spec.vocab_size
    runs = {name: summarize(recs) for name, recs in records.items()}
    by_mode = {mode: ratios(runs, mode) for mode in plan.modes}
    headline = "sample" if "sample" in plan.modes else plan.modes[0]
    single = plan.workloads.get("single")
    return {
        "headline_mode": headline,
        "ratio_vs_llama_cpp": {shape: v["ratio"] for shape, v in by_mode[headline].items()},
        "ratios": by_mode,
        "single_stream": ({mode: latency(runs, mode, single.new_tokens) for mode in plan.modes}
                          if single else {}),
        "greedy_agreement": {name: greedy_agreement(greedy_tokens[ours_name(name)], tokens)
                             for name, tokens in greedy_tokens.items() if name != ours_name(name)},
        "runs": runs,
        "records": records,
        "ours_profile": {f"{shape}/{side}": ours[side].profile(w, prompts(w, 7, vocab))
                         for side in ours for shape, w in plan.workloads.items()},
        "gemm_floor": {f"{shape}/{side}": gemm_floor(
                           ours[side], w, runs, f"{shape}/{headline}",
                           by_mode[headline][shape]["llama_cpp_best"], side)
                       for side in ours for shape, w in plan.workloads.items()},
    }


def gemm_floor(ours: Ours, workload: Workload, runs: dict[str, dict[str, Any]], prefix: str,
               llama_side: str, side: str) -> dict[str, float]:
    """``workload``'s base-model GEMMs alone as our model runs them (`sampling_floor`: each
    prompt's prefill, then ``new_tokens - 1`` decode steps, rows padded as the mode pads them),
    CPU seconds, against the faster llama.cpp mode's and ours' median CPU seconds."""
    def cpu(name: str) -> float:
        return statistics.median(runs[f"{prefix}/{name}"]["cpu_seconds"])

    shape = (workload.num_prompts, workload.prompt_len, workload.num_samples,
             workload.new_tokens)
    floor = sampling_floor(ours.model, shape, cpu(llama_side), cpu(side))
    return {**floor, "llama_cpp_side": llama_side}


def ours_name(name: str) -> str:
    """``fanout/greedy/llama_high`` → ``fanout/greedy/ours``."""
    return name.rsplit("/", 1)[0] + "/ours"


def check_parity(ours: Ours, peer: LlamaCppPeer, model_dir: Path) -> dict[str, Any]:
    """Both sides on one chat prompt (the same ids): teacher-forced prompt logprobs and a
    greedy continuation; llama.cpp ``exact`` (F32 KV cache, flash attention off: the weights
    alone differ, and they do not) and as the timed runs run it (F16 KV, flash attention as
    configured)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PARITY_TEXT}],
                                        add_generation_prompt=True, tokenize=True)
    ids = [int(i) for i in getattr(ids, "input_ids", ids)]
    mine = ours.parity(ids, PARITY_NEW_TOKENS)
    out: dict[str, Any] = {"prompt": PARITY_TEXT, "prompt_tokens": len(ids),
                           "greedy_text_ours": tokenizer.decode(mine["greedy_tokens"])}
    for exact in (True, False):
        theirs = peer.request({"op": "parity", "prompt": ids, "new_tokens": PARITY_NEW_TOKENS,
                               "exact": exact})
        out["exact" if exact else "as_timed"] = parity(mine, theirs)
    return out
