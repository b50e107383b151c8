"""SFT warm start: cross-entropy on a mix of correct and buggy clamp solutions."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import tinker

from loraplex.demo.config import DemoConfig
from loraplex.demo.rendering import Renderer, sft_datum
from loraplex.demo.task import DemoTask


def run_sft(
    training: tinker.TrainingClient, renderer: Renderer, task: DemoTask, cfg: DemoConfig,
    on_step: Callable[[dict[str, Any]], None],
) -> None:
    """`cfg.sft_steps` steps of pipelined forward_backward + optim_step over the warm-start mix
    (with the run's optimizer, `DemoConfig.optim_params`).

    Each step's row reports the mean NLL per completion token (``loss:sum`` / weight sum).
    """
    datums = [
        sft_datum(renderer.prompt_tokens(p.messages), renderer.completion_tokens(c),
                  renderer.end_token)
        for p, c in task.sft_pairs()
    ]
    optim_params = cfg.optim_params("sft")
    cursor = 0
    for step in range(cfg.sft_steps):
        batch = [datums[(cursor + i) % len(datums)] for i in range(cfg.sft_batch)]
        cursor += cfg.sft_batch
        t0 = time.perf_counter()
        fwd_bwd = training.forward_backward(batch, "cross_entropy")
        optim = training.optim_step(optim_params)
        out = fwd_bwd.result()
        optim.result()
        num_targets = sum(sum(d.loss_fn_inputs["weights"].tolist()) for d in batch)
        num_tokens = sum(d.model_input.length for d in batch)
        on_step({
            "phase": "sft", "step": step, "loss": out.metrics["loss:sum"] / num_targets,
            "pass_rate": None, "kl_sample_train": None,
            "tokens_per_s": num_tokens / (time.perf_counter() - t0),
        })
