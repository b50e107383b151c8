"""`AdapterState` and `PageFile`: exact round trips through host memory and a page file, with
and without gradients, with AdamW and with Dimuon state; a page-out writes the state's bytes and
little more (the benchmark key ``page_bytes_vs_theory``)."""

from __future__ import annotations

from pathlib import Path

import torch

from loraplex.domain.lora import LoraConfig
from loraplex.domain.optim import AdamParams, OptimizerFamily
from loraplex.domain.work import OptimStepWork
from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.optim.optimizer_state import OptimizerState
from loraplex.engine.paging.adapter_state import AdapterState
from loraplex.engine.paging.page_file import PageFile
from tests.engine.paging.paging_rig import VOCAB, make_engine, same_bits
from tests.engine.train_works import ce_datum, work


def tensors_of(state: AdapterState) -> list[torch.Tensor]:
    out = [*state.params, *(g for g in state.grads if g is not None)]
    if state.optimizer is not None:
        out += [state.optimizer.step, *state.optimizer.exp_avg, *state.optimizer.exp_avg_sq]
    return out


def random_state(spec_dir: Path, with_training: bool, family: OptimizerFamily = "adamw"
                 ) -> AdapterState:
    engine = make_engine(spec_dir)
    adapter = LoraAdapter.create(engine.model.spec, LoraConfig(rank=4, seed=1))
    gen = torch.Generator().manual_seed(0)
    optimizer = None
    if with_training:
        for p in adapter.parameters()[::2]:  # only some leaves accumulated gradients
            p.grad = torch.randn(p.shape, generator=gen)
        named = adapter.named_parameters()
        optimizer = OptimizerState.zeros([n for n, _ in named], [p for _, p in named],
                                         family)
        for t in [optimizer.step, *optimizer.exp_avg, *optimizer.exp_avg_sq]:
            t.copy_(torch.randn(t.shape, generator=gen))
    return AdapterState.of(adapter, optimizer)


def test_a_page_file_round_trips_every_tensor_bitwise(tiny_model_dir: Path, tmp_path: Path
                                                      ) -> None:
    cases: list[tuple[bool, OptimizerFamily]] = [(True, "adamw"), (True, "dimuon"),
                                                 (False, "adamw")]
    for with_training, family in cases:
        state = random_state(tiny_model_dir, with_training, family)
        page = PageFile.write(state, str(tmp_path / f"{with_training}.safetensors"))
        back = page.read("cpu")
        assert back.names == state.names
        assert [g is None for g in back.grads] == [g is None for g in state.grads]
        assert (back.optimizer is None) == (state.optimizer is None)
        if state.optimizer is not None:
            assert back.optimizer is not None and back.optimizer.family == family
        assert all(same_bits(x, y)
                   for x, y in zip(tensors_of(back), tensors_of(state), strict=True))
        assert page.state_bytes == state.nbytes == sum(t.numel() * 4 for t in tensors_of(state))
        page.delete()
        assert not list(tmp_path.glob(f"{with_training}*"))


def test_moving_to_the_device_it_is_on_hands_the_same_tensors_over(tiny_model_dir: Path
                                                                   ) -> None:
    state = random_state(tiny_model_dir, with_training=True)
    moved, copied = state.to("cpu")
    assert copied == 0
    assert all(x is y for x, y in zip(tensors_of(moved), tensors_of(state), strict=True))


def test_a_page_out_writes_the_state_bytes_plus_a_small_header(tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    """``page_bytes_vs_theory``: bytes written for one page-out over leaves + gradients +
    moments + step of the adapter, computed from its tensors beforehand."""
    engine = make_engine(tiny_model_dir, adapter_memory_budget=0, host_memory_budget=0,
                         page_dir=str(tmp_path))
    engine.create_adapter("a", LoraConfig(rank=16, seed=0))
    gen = torch.Generator().manual_seed(0)
    engine.forward_backward([work("r", "a", [ce_datum(gen, 8, VOCAB)])])
    engine.optim_step([OptimStepWork("o", "a", AdamParams())])
    lease = engine.pager.acquire(["a"])
    engine.forward_backward([work("r", "a", [ce_datum(gen, 8, VOCAB)])])  # gradients again
    adapter, optimizer = engine.bank.get("a"), engine.trainer.optimizer_state("a")
    assert optimizer is not None
    theory = 2 * 4 * adapter.num_params + optimizer.nbytes  # leaves, grads; moments, step
    before = engine.memory_stats().paging.bytes_to_disk
    engine.pager.release(lease)  # a budget of 0: it pages out at once
    written = engine.memory_stats().paging.bytes_to_disk - before
    assert engine.memory_stats().num_disk == 1
    assert theory <= written <= 1.1 * theory
    assert written == sum(p.stat().st_size for p in tmp_path.rglob("*.safetensors"))
