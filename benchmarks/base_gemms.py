"""Replays of a model's base-model GEMMs alone, on its own weights and shapes, as its forward
runs them (the packed kernel where the model uses it, else F.linear): the floor under a step,
above which sit LoRA, attention, norms, sampling and everything else.

Used by `step_overhead` (overhead per layer = step − replay) and `engine_sample` (the base-GEMM
floor of a whole workload, and so the most any sampler built on these GEMMs could gain over
the baseline). loraplex is imported lazily: `step_overhead`'s child process puts the revision
it measures on ``sys.path`` first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks.probe import median_seconds


def base_gemm_replay(model: Any, rows: int, backward: bool, head_rows: int | None = None
                     ) -> tuple[Callable[[], None], Callable[[], None]]:
    """Replays of every layer's base linears at ``rows`` rows, and of the LM head at
    ``head_rows`` (default ``rows``) as ``model.logits`` runs it without an adapter (with
    ``backward``: plus each one's input-gradient GEMM)."""
    import torch

    linears = _layer_linears(model)
    head = model.weights.lm_head
    head_rows = rows if head_rows is None else head_rows
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=model.dtype) for w, _, _ in linears}
    head_input = torch.randn(head_rows, head.shape[1], dtype=model.dtype)
    grads = {w.shape[0]: torch.randn(rows, w.shape[0], dtype=model.dtype)
             for w, _, _ in linears} if backward else {}
    head_grad = torch.randn(head_rows, head.shape[0], dtype=model.dtype) if backward else None
    head_grad_fn = _layer_linears(model, head=True)[-1][2]

    def layers() -> None:
        with torch.no_grad():
            for w, forward, input_grad in linears:
                forward(inputs[w.shape[1]])
                if backward:
                    input_grad(grads[w.shape[0]])

    def lm_head() -> None:
        with torch.no_grad():
            model.logits(head_input)
            if head_grad is not None:
                head_grad_fn(head_grad)

    return layers, lm_head


Linear = tuple[Any, Callable[[Any], Any], Callable[[Any], Any]]


def _layer_linears(model: Any, head: bool = False) -> list[Linear]:
    """(weight, forward, input gradient) of every layer's base GEMM as the model runs it
    (with ``head``: of the LM head alone): its own `FrozenLinear`s (the packed kernel where it
    applies), or F.linear and torch.mm at revisions from before them."""
    import torch
    import torch.nn.functional as F

    if hasattr(model, "base_linears"):
        found = model.base_linears()
        chosen = found[-1:] if head else found[:-1]
        return [(lin.weight, lin, lin.input_grad) for lin in chosen]
    weights = [model.weights.lm_head] if head else [
        w for layer in model.weights.layers
        for w in (layer.q_proj, layer.k_proj, layer.v_proj, layer.o_proj,
                  layer.gate_proj, layer.up_proj, layer.down_proj) if w is not None]
    return [(w, lambda x, w=w: F.linear(x, w), lambda g, w=w: torch.mm(g, w)) for w in weights]


def forward_floor_seconds(model: Any, rows: int, head_rows: int, repeats: int = 3) -> float:
    """CPU seconds of one forward's base GEMMs: ``rows`` through every layer, ``head_rows``
    through the head."""
    layers, lm_head = base_gemm_replay(model, rows, backward=False, head_rows=head_rows)
    return sum(median_seconds(fn, repeats, warmup=1, clock=time.process_time)
               for fn in (layers, lm_head))


def sampling_floor(model: Any, shape: tuple[int, int, int, int], baseline_seconds: float,
                   ours_seconds: float) -> dict[str, float]:
    """A sampling workload's base-model GEMMs alone at our sampler's shapes: each prompt's
    prefill once, then ``new_tokens - 1`` decode steps of every sequence, rows padded as
    ``model`` pads them. CPU seconds no sampler on these GEMMs can beat; ``max_ratio`` = the
    baseline's seconds ÷ that floor, the best ratio reachable without faster GEMMs.

    Args:
        shape: (prompts, prompt_len, samples per prompt, new_tokens).
    """
    prompts, prompt_len, samples, new_tokens = shape
    pad = model.options.effective_row_multiple

    def padded(n: int) -> int:
        return -(-n // pad) * pad

    prefill = forward_floor_seconds(model, padded(prompts * prompt_len), padded(prompts),
                                    repeats=2)
    decode = forward_floor_seconds(model, padded(prompts * samples), padded(prompts * samples),
                                   repeats=5)
    floor = prefill + (new_tokens - 1) * decode
    return {"prefill_s": prefill, "decode_step_s": decode, "floor_s": floor,
            "ours_above_floor_s": ours_seconds - floor, "max_ratio": baseline_seconds / floor}


def floor_table(floors: dict[str, dict[str, float]] | None) -> list[str]:
    """The base-GEMM floor lines of the report (absent from results older than the floor)."""
    if not floors:
        return []
    rows = [f"| {name} | {f['prefill_s']:.2f} | {1e3 * f['decode_step_s']:.1f} | "
            f"{f['floor_s']:.2f} | {f['ours_above_floor_s']:.2f} | **{f['max_ratio']:.2f}** |"
            for name, f in floors.items()]
    return ["The base-model GEMMs alone (`benchmarks.base_gemms`: every layer's seven linears "
            "and the LM head on the model's own weights, as the model runs them (the packed "
            "kernel where it applies), at our sampler's padded shapes, invariant mode), CPU "
            "seconds: the floor under our sampler, and `max_ratio` = HF's CPU seconds ÷ that "
            "floor, the best ratio any sampler on these GEMMs could reach.", "",
            "| workload | prefill GEMMs s | decode-step GEMMs ms | floor s | ours − floor s | "
            "max_ratio |", "|---|---|---|---|---|---|", *rows, ""]
