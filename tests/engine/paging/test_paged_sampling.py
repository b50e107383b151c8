"""Sampling beside paging: a paged-out sampler snapshot (or checkpoint adapter) samples bitwise
what it samples without paging, also when it pages out between the decode steps of running
requests; its prefix-cache pages still hit after a page-out/in (same version), and paging it
out frees the sampler's stacked copies."""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import torch

from loraplex.domain.optim import AdamParams
from loraplex.domain.sampling import SampleResult, SamplingParams, StopCondition
from loraplex.domain.work import LoadWork, OptimStepWork, SampleWork, SaveWork
from loraplex.engine.executor import Engine
from tests.engine.paging.paging_rig import (
    LORA,
    VOCAB,
    budgeted_engine,
    check_accounting,
    create_adapters,
    make_engine,
)
from tests.engine.train_works import ce_datum, create_random_adapter, work

KV = {"kv_cache_blocks": 64, "kv_block_size": 16}
PROMPT = tuple(range(7, 47))  # 40 tokens: two full 16-token pages
TRAINED = ["x", "y"]  # their training pages the sampler's adapter out


def request(request_id: str, adapter_id: str | None, max_tokens: int,
            adapter_dir: str | None = None) -> SampleWork:
    params = SamplingParams(max_tokens=max_tokens, seed=5, temperature=1.0,
                            stop=StopCondition(use_eos=False))
    return SampleWork(request_id, adapter_id, adapter_dir, array("q", PROMPT), 2, params)


def sample_while_training(engine: Engine, works: list[SampleWork]) -> dict[str, Any]:
    """Step the sampler 2 decode steps at a time, training the other adapters in between."""
    gen = torch.Generator().manual_seed(3)
    out: dict[str, Any] = {}
    pending = works
    while pending or engine.num_running_samples():
        for request_id, outcome in engine.sample_step(pending, 2).finished:
            assert isinstance(outcome, SampleResult), outcome
            out[request_id] = [(s.tokens, s.logprobs) for s in outcome.sequences]
        pending = []
        for adapter_id in TRAINED:
            engine.forward_backward([work("t", adapter_id, [ce_datum(gen, 6, VOCAB)])])
        check_accounting(engine)
    return out


def prepare(engine: Engine, checkpoint: Path) -> None:
    """A trained adapter "s", its sampler snapshot "s@1", a checkpoint of it, two more."""
    create_random_adapter(engine, "s", LORA, seed=9)
    engine.forward_backward([work("t", "s", [ce_datum(torch.Generator(), 8, VOCAB)])])
    engine.optim_step([OptimStepWork("o", "s", AdamParams(learning_rate=1e-2))])
    engine.snapshot_adapter("s", "s@1")
    if not checkpoint.exists():
        engine.save_adapter(SaveWork("s", str(checkpoint), with_optimizer=False))
    create_adapters(engine, TRAINED)


def test_paged_out_sampler_adapters_sample_the_unpaged_tokens_and_logprobs(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    results = []
    for engine in (make_engine(tiny_model_dir, **KV),
                   budgeted_engine(tiny_model_dir, 1, host_memory_budget=0, **KV)):
        prepare(engine, tmp_path / "ckpt")
        engine.install_adapter("c@1", engine.read_checkpoint(  # as the scheduler does
            LoadWork("c@1", str(tmp_path / "ckpt"), with_optimizer=False, frozen=True)))
        works = [request("snapshot", "s@1", 12),
                 request("checkpoint", "c@1", 12, adapter_dir=str(tmp_path / "ckpt")),
                 request("base", None, 5)]
        results.append(sample_while_training(engine, works))
    assert results[0] == results[1]
    stats = engine.memory_stats().paging
    assert stats.from_disk > 0  # the sampler adapters came back from disk between steps


def test_prefix_cache_hits_survive_a_page_out_and_in(tiny_model_dir: Path, tmp_path: Path
                                                     ) -> None:
    engine = budgeted_engine(tiny_model_dir, 1, **KV)
    prepare(engine, tmp_path / "ckpt")
    first = sample_while_training(engine, [request("first", "s@1", 3)])
    assert not engine.pager.is_resident("s@1")
    assert all("s@1" not in {a for a, _ in key} for key in engine.sampler._stacks._stacks), \
        "paging out must free the sampler's stacked copies of the adapter"
    cached_before = engine.sampler.stats.cached_tokens
    second = sample_while_training(engine, [request("first", "s@1", 3)])
    assert second == first
    # The first sample finds the two full prompt pages cached by the first request (32
    # tokens), the second forks from it (the whole prompt); with a changed version, 40 only.
    assert engine.sampler.stats.cached_tokens - cached_before == 32 + len(PROMPT)
