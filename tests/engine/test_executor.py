"""The `Engine` facade: the BatchExecutor protocol's surface, adapter lifecycle, model info,
resident memory per adapter after a step (parameters + two moments, no gradients), and
`sample_step` reading no checkpoint (adapters are resident by protocol)."""

from __future__ import annotations

import inspect
from array import array
from pathlib import Path

import pytest
import torch

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.domain.optim import AdamParams
from loraplex.domain.sampling import SampleResult, SamplingParams, StopCondition
from loraplex.domain.work import LoadWork, OptimStepWork, SampleWork, SaveWork
from loraplex.engine.executor import Engine
from loraplex.errors import ConflictError, NotFoundError, UserError
from loraplex.scheduler.executor import BatchExecutor
from tests.engine.train_works import ce_datum, work


def test_engine_implements_every_protocol_method_with_its_signature(tiny_model_dir: Path
                                                                     ) -> None:
    engine = Engine(str(tiny_model_dir), EngineConfig())
    for name, member in inspect.getmembers(BatchExecutor, inspect.isfunction):
        if name.startswith("_"):
            continue
        ours = inspect.signature(getattr(engine, name))
        theirs = inspect.signature(member)
        assert list(ours.parameters) == [p for p in theirs.parameters if p != "self"], name


def test_model_info_reports_the_configured_context(tiny_model_dir: Path) -> None:
    info = Engine(str(tiny_model_dir), EngineConfig(max_context=300)).model_info()
    assert info.max_context == 300 and info.vocab_size == 1024 and info.arch == "qwen3"
    assert info.eos_token_ids
    default = Engine(str(tiny_model_dir), EngineConfig()).model_info()
    assert default.max_context == 8192  # the model's own limit


def test_datums_longer_than_max_context_are_refused(tiny_model_dir: Path) -> None:
    engine = Engine(str(tiny_model_dir), EngineConfig(max_context=16))
    engine.create_adapter("a", LoraConfig(rank=4))
    gen = torch.Generator().manual_seed(0)
    outcomes = engine.forward_backward([work("r", "a", [ce_datum(gen, 16, 1024),
                                                        ce_datum(gen, 17, 1024)])])
    assert isinstance(outcomes[0], UserError) and "data[1].model_input" in str(outcomes[0])


def test_adapter_lifecycle(tiny_model_dir: Path) -> None:
    engine = Engine(str(tiny_model_dir), EngineConfig(max_lora_rank=32))
    engine.create_adapter("a", LoraConfig(rank=8))
    assert engine.has_adapter("a") and not engine.has_adapter("b")
    with pytest.raises(ConflictError):
        engine.create_adapter("a", LoraConfig(rank=8))
    with pytest.raises(UserError, match="rank"):
        engine.create_adapter("big", LoraConfig(rank=64))
    engine.snapshot_adapter("a", "a@0")
    with pytest.raises(NotFoundError):
        engine.snapshot_adapter("nope", "nope@0")
    gen = torch.Generator().manual_seed(0)
    engine.forward_backward([work("r", "a", [ce_datum(gen, 10, 1024)])])
    engine.optim_step([OptimStepWork("o", "a", AdamParams())])
    assert engine.trainer.optimizer_state("a") is not None
    engine.delete_adapter("a")
    engine.delete_adapter("never-existed")
    assert not engine.has_adapter("a") and engine.has_adapter("a@0")
    assert engine.trainer.optimizer_state("a") is None  # freed with the adapter
    engine.create_adapter("a", LoraConfig(rank=8))  # the id can be reused, fresh
    assert engine.trainer.optimizer_state("a") is None
    assert engine.num_running_samples() == 0


def test_resident_bytes_after_a_step_are_parameters_plus_two_moments(tiny_model_dir: Path
                                                                     ) -> None:
    engine = Engine(str(tiny_model_dir), EngineConfig())
    engine.create_adapter("a", LoraConfig(rank=16))
    gen = torch.Generator().manual_seed(0)
    engine.forward_backward([work("r", "a", [ce_datum(gen, 40, 1024)])])
    engine.optim_step([OptimStepWork("o", "a", AdamParams())])
    adapter = engine.bank.get("a")
    params_bytes = 4 * adapter.num_params
    assert adapter.nbytes() == params_bytes  # gradients freed by the step
    state = engine.trainer.optimizer_state("a")
    assert state is not None and state.nbytes == 2 * params_bytes + 4


def test_sample_step_reads_no_checkpoint_and_fails_a_request_whose_adapter_is_absent(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """Adapters are resident by protocol: ``sample_step`` never reads a checkpoint on the
    clock thread, even when the request names one; that request fails alone (NotFoundError),
    the others sample, and once installed the same request samples."""
    engine = Engine(str(tiny_model_dir), EngineConfig(kv_cache_blocks=64))
    engine.create_adapter("a", LoraConfig(rank=4, seed=1))
    engine.save_adapter(SaveWork("a", str(tmp_path / "ckpt"), with_optimizer=False))
    params = SamplingParams(max_tokens=2, seed=0, stop=StopCondition(use_eos=False))

    def request(request_id: str, adapter_id: str | None) -> SampleWork:
        return SampleWork(request_id, adapter_id, str(tmp_path / "ckpt"), array("q", (5, 6, 7)),
                          1, params)

    def run(pending: list[SampleWork]) -> dict[str, object]:
        outcomes: dict[str, object] = {}
        while pending or engine.num_running_samples():
            outcomes.update(engine.sample_step(pending, 4).finished)
            pending = []
        return outcomes

    outcomes = run([request("absent", "s1"), request("trained", "a"), request("base", None)])
    assert isinstance(outcomes["absent"], NotFoundError)
    assert all(isinstance(outcomes[r], SampleResult) for r in ("trained", "base"))
    assert not engine.has_adapter("s1")
    engine.install_adapter("s1", engine.read_checkpoint(
        LoadWork("s1", str(tmp_path / "ckpt"), with_optimizer=False, frozen=True)))
    again = run([request("installed", "s1")])
    assert isinstance(again["installed"], SampleResult)


def test_model_info_names_what_decides_the_bits(tiny_model_dir: Path) -> None:
    """`ModelInfo.compute` tells a worker on the C kernels from one on torch's fallback (the
    two differ in the last bits), and a fast-mode engine from a batch-invariant one."""
    engine = Engine(str(tiny_model_dir), EngineConfig())
    native, options = engine.model_info().compute, engine.model.options
    fallback = Engine(str(tiny_model_dir), EngineConfig(native_kernels=False)).model_info()
    fast = Engine(str(tiny_model_dir), EngineConfig(batch_invariant=False)).model_info()
    assert fallback.compute.startswith("cpu float32 invariant/")
    assert "gemm=torch attention=torch" in fallback.compute
    assert f"torch={torch.__version__}" in fallback.compute and " fast " in fast.compute
    if options.gemm is not None and options.attention is not None:  # the kernels run here
        assert f"gemm=packed-{options.gemm.lanes}" in native
        assert f"attention=native-{options.attention.lanes}" in native
        assert native != fallback.compute
