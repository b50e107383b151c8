"""Checkpoint IO through the Engine: exact resume, moments reset, config checks, atomic layout."""

from __future__ import annotations

import json
import os
from array import array
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.domain.optim import AdamParams, DimuonParams, OptimParams
from loraplex.domain.results import ForwardBackwardResult
from loraplex.domain.sampling import SamplingParams
from loraplex.domain.work import (
    ForwardBackwardWork,
    LoadWork,
    OptimStepWork,
    SampleWork,
    SaveWork,
)
from loraplex.engine.checkpoint_io import MANIFEST, OPTIMIZER, WEIGHTS
from loraplex.engine.executor import Engine
from loraplex.errors import ConflictError, UserError
from tests.engine.train_works import ce_datum, create_random_adapter, rl_datum, work

VOCAB = 1024
CONFIG = LoraConfig(rank=8, alpha=16.0, seed=3)
ADAM = AdamParams(learning_rate=5e-3, beta1=0.9, beta2=0.95, weight_decay=0.01,
                  grad_clip_norm=1.0)


def engine_with(model_dir: Path, adapter_id: str = "a") -> Engine:
    engine = Engine(str(model_dir), EngineConfig())
    create_random_adapter(engine, adapter_id, CONFIG, seed=1)
    return engine


def batches(num: int) -> list[list[ForwardBackwardWork]]:
    """Training steps with different data and losses (recreated identically each call)."""
    gen = torch.Generator().manual_seed(0)
    return [[work(f"r{i}", "?", [ce_datum(gen, 20 + i, VOCAB, signed_weights=True)]),
             work(f"s{i}", "?", [rl_datum(gen, 9, VOCAB)], "ppo")] for i in range(num)]


def train(engine: Engine, adapter_id: str, steps: list[list[ForwardBackwardWork]],
          optimizer: OptimParams = ADAM) -> list[ForwardBackwardResult]:
    results = []
    for step in steps:
        outcomes = engine.forward_backward([ForwardBackwardWork(
            w.request_id, adapter_id, w.data, w.loss_fn, w.loss_fn_config, w.forward_only)
            for w in step])
        assert all(isinstance(o, ForwardBackwardResult) for o in outcomes), outcomes
        results += outcomes  # type: ignore[arg-type]
        engine.optim_step([OptimStepWork("o", adapter_id, optimizer)])
    return results


@pytest.mark.parametrize("optimizer", [ADAM, DimuonParams(learning_rate=0.02, damping=1e-3)],
                         ids=["adamw", "dimuon"])
def test_resume_with_optimizer_is_bitwise_identical_to_never_stopping(
        tiny_model_dir: Path, tmp_path: Path, optimizer: OptimParams) -> None:
    steps = batches(6)
    uninterrupted = engine_with(tiny_model_dir)
    train(uninterrupted, "a", steps[:3], optimizer)
    uninterrupted.save_adapter(SaveWork("a", str(tmp_path / "ckpt"), with_optimizer=True))
    expected = train(uninterrupted, "a", steps[3:], optimizer)

    resumed = Engine(str(tiny_model_dir), EngineConfig())  # a fresh process, in effect
    loaded = resumed.load_adapter(LoadWork("b", str(tmp_path / "ckpt"), with_optimizer=True,
                                           expect_config=CONFIG))
    assert loaded.config == CONFIG
    state = resumed.trainer.optimizer_state("b")
    assert state is not None and state.num_steps == 3 and state.family == optimizer.family
    got = train(resumed, "b", steps[3:], optimizer)
    assert [r.logprobs for r in got] == [r.logprobs for r in expected]
    assert [r.metrics for r in got] == [r.metrics for r in expected]
    for p, q in zip(resumed.bank.get("b").parameters(), uninterrupted.bank.get("a").parameters(),
                    strict=True):
        assert torch.equal(p, q)


def test_load_without_optimizer_restarts_the_moments(tiny_model_dir: Path, tmp_path: Path
                                                      ) -> None:
    steps = batches(3)
    engine = engine_with(tiny_model_dir)
    train(engine, "a", steps[:2])
    engine.save_adapter(SaveWork("a", str(tmp_path / "ckpt"), with_optimizer=True))
    weights = [p.detach().clone() for p in engine.bank.get("a").parameters()]
    engine.load_adapter(LoadWork("a", str(tmp_path / "ckpt"), with_optimizer=False))
    assert engine.trainer.optimizer_state("a") is None
    assert all(torch.equal(p, w) for p, w in zip(engine.bank.get("a").parameters(), weights,
                                                  strict=True))
    # Same as a fresh adapter holding these weights, whose AdamW starts at step 0.
    fresh = engine_with(tiny_model_dir, "f")
    with torch.no_grad():
        for p, w in zip(fresh.bank.get("f").parameters(), weights, strict=True):
            p.copy_(w)
    assert [r.logprobs for r in train(engine, "a", steps[2:] * 2)] == [
        r.logprobs for r in train(fresh, "f", steps[2:] * 2)]
    assert engine.trainer.optimizer_state("a").num_steps == 2  # type: ignore[union-attr]


def test_checkpoint_directory_layout(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = engine_with(tiny_model_dir)
    train(engine, "a", batches(1))
    size = engine.save_adapter(SaveWork("a", str(tmp_path / "w"), with_optimizer=False)).size_bytes
    assert sorted(os.listdir(tmp_path / "w")) == sorted([MANIFEST, WEIGHTS])
    assert size == sum(f.stat().st_size for f in (tmp_path / "w").iterdir())
    manifest = json.loads((tmp_path / "w" / MANIFEST).read_text())
    assert manifest["lora_config"]["rank"] == 8 and manifest["has_optimizer"] is False
    tensors = load_file(tmp_path / "w" / WEIGHTS)
    adapter = engine.bank.get("a")
    assert list(tensors) == sorted(n for n, _ in adapter.named_parameters())
    for name, p in adapter.named_parameters():
        assert torch.equal(tensors[name], p.detach())
    engine.save_adapter(SaveWork("a", str(tmp_path / "s"), with_optimizer=True))
    moments = load_file(tmp_path / "s" / OPTIMIZER)
    assert moments["step"].item() == 1.0
    assert len(moments) == 1 + 2 * len(adapter.named_parameters())
    assert sorted(os.listdir(tmp_path)) == ["s", "w"]  # no temporary directories left


def test_save_refuses_an_existing_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = engine_with(tiny_model_dir)
    (tmp_path / "taken").mkdir()
    with pytest.raises(ConflictError):
        engine.save_adapter(SaveWork("a", str(tmp_path / "taken"), with_optimizer=True))
    assert os.listdir(tmp_path / "taken") == [] and os.listdir(tmp_path) == ["taken"]
    nested = tmp_path / "runs" / "r1" / "weights" / "step-1"  # parents are created
    engine.save_adapter(SaveWork("a", str(nested), with_optimizer=False))
    assert (nested / WEIGHTS).is_file()


def test_load_errors_name_the_problem_and_change_nothing(tiny_model_dir: Path,
                                                         tmp_path: Path) -> None:
    engine = engine_with(tiny_model_dir)
    engine.save_adapter(SaveWork("a", str(tmp_path / "w"), with_optimizer=False))
    before = [p.detach().clone() for p in engine.bank.get("a").parameters()]
    cases = {
        "rank": LoadWork("a", str(tmp_path / "w"), False, expect_config=LoraConfig(rank=16)),
        "train_mlp": LoadWork("a", str(tmp_path / "w"), False, expect_config=LoraConfig(
            rank=8, alpha=16.0, train_mlp=False)),
        "optimizer state": LoadWork("a", str(tmp_path / "w"), with_optimizer=True),
        "no loraplex adapter checkpoint": LoadWork("a", str(tmp_path / "missing"), False),
    }
    for needle, load in cases.items():
        with pytest.raises(UserError, match=needle) as info:
            engine.load_adapter(load)
        if needle == "rank":
            assert info.value.field == "lora_config.rank"
    manifest_path = tmp_path / "w" / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["base_model"]["hidden_size"] = 64
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="different base model"):
        engine.load_adapter(LoadWork("a", str(tmp_path / "w"), False))
    assert all(torch.equal(p, b) for p, b in zip(engine.bank.get("a").parameters(), before,
                                                  strict=True))


def test_a_sampler_checkpoint_is_read_and_installed_frozen(tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    """The protocol's path for a sampler's weights: ``read_checkpoint`` (IO thread), then
    ``install_adapter``; sampling an adapter the engine does not hold fails that request
    alone and reads nothing (no second, clock-thread loading path)."""
    engine = engine_with(tiny_model_dir)
    engine.save_adapter(SaveWork("a", str(tmp_path / "w"), with_optimizer=False))
    missing = SampleWork("s0", "sampler-1", str(tmp_path / "w"), array("q", [2, 3]), 1,
                         SamplingParams(max_tokens=2, seed=1))
    step = engine.sample_step([missing], 4)
    assert [(rid, type(out).__name__) for rid, out in step.finished] == [
        ("s0", "NotFoundError")]
    assert "sampler-1" not in engine.bank
    engine.install_adapter("sampler-1", engine.read_checkpoint(
        LoadWork("sampler-1", str(tmp_path / "w"), with_optimizer=False, frozen=True)))
    frozen = engine.bank.get("sampler-1")
    assert not any(p.requires_grad for p in frozen.parameters())
    gen = torch.Generator().manual_seed(0)
    data = [ce_datum(gen, 15, VOCAB)]
    outcomes = engine.forward_backward([work("x", "sampler-1", data, forward_only=True),
                                        work("y", "a", data, forward_only=True)])
    assert outcomes[0].logprobs == outcomes[1].logprobs  # type: ignore[union-attr]


def test_saving_state_before_any_step_writes_zero_moments(tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    engine = engine_with(tiny_model_dir)
    engine.save_adapter(SaveWork("a", str(tmp_path / "s"), with_optimizer=True))
    assert engine.trainer.optimizer_state("a") is None  # nothing allocated for the save
    engine.load_adapter(LoadWork("b", str(tmp_path / "s"), with_optimizer=True))
    state = engine.trainer.optimizer_state("b")
    assert state is not None and state.num_steps == 0
    assert all(not m.any() for m in state.exp_avg + state.exp_avg_sq)
