"""A sampler rig for the tests: the built-in tiny model, a bank of random adapters (B ≠ 0, so
each adapter changes the logits), request builders and a run-to-completion loop.

`work` and `NO_STOP` are the benchmarks' builders too (`benchmarks/harness/works.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.works import NO_STOP
from benchmarks.harness.works import sample_work as work
from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.domain.sampling import SampleResult
from loraplex.domain.work import SampleWork
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.sampling.sampler import Sampler
from loraplex.errors import LoraplexError

__all__ = ["ADAPTERS", "NO_STOP", "Rig", "make_rig", "ok", "random_tokens", "run", "work"]

ADAPTERS = {"a": LoraConfig(rank=8, seed=1), "b": LoraConfig(rank=16, seed=2),
            "c": LoraConfig(rank=4, seed=3, train_attn=False)}


@dataclass
class Rig:
    model_dir: Path
    model: Transformer
    bank: AdapterBank
    config: EngineConfig

    def sampler(self, **overrides: Any) -> Sampler:
        config = replace(self.config, **overrides)
        model = self.model
        if "batch_invariant" in overrides:
            model = load_model(self.model_dir, config)
        return Sampler(model, self.bank, config, str(self.model_dir))

    def training_logprobs(self, tokens: list[int], adapter: str | None,
                          others: Sequence[SequenceInput] = ()) -> torch.Tensor:
        """The training path: full forward of ``tokens`` (packed after ``others``), logprob of
        each next token (``[len(tokens) - 1]``)."""
        seqs = [*others, SequenceInput(tokens, adapter)]
        batch = self.model.pack(seqs)
        lora = self.bank.stack(batch, rank_multiple=self.model.rank_multiple,
                               dtype=self.model.dtype)
        targets = torch.tensor([t for s in seqs for t in [*s.tokens[1:], 0]])
        with torch.no_grad():
            hidden = self.model.forward(batch, lora)
            lp_R = self.model.token_logprobs(hidden, batch.scatter_to_rows(targets), lora)
        return batch.gather_from_rows(lp_R).split(list(batch.seq_num_new))[-1][:-1]


def make_rig(model_dir: Path, **config: Any) -> Rig:
    engine_config = EngineConfig(**{"kv_cache_blocks": 256, **config})
    model = load_model(model_dir, engine_config)
    bank = AdapterBank(model.spec, "cpu", max_rank=64)
    gen = torch.Generator().manual_seed(0)
    for name, lora in ADAPTERS.items():
        with torch.no_grad():
            for p in bank.create(name, lora).parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return Rig(model_dir, model, bank, engine_config)


def run(sampler: Sampler, works: Sequence[SampleWork], decode_steps: int = 8
        ) -> dict[str, SampleResult | LoraplexError]:
    """Step until every request is back."""
    out: dict[str, SampleResult | LoraplexError] = {}
    pending = list(works)
    while True:
        for request_id, outcome in sampler.step(pending, decode_steps):
            assert request_id not in out
            out[request_id] = outcome
        pending = []
        if sampler.num_running() == 0:
            return out


def ok(outcome: SampleResult | LoraplexError) -> SampleResult:
    assert isinstance(outcome, SampleResult), outcome
    return outcome


def random_tokens(gen: torch.Generator, n: int, vocab: int = 1024) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=gen).tolist()
