"""bfloat16 weights on CPU (``engine.dtype``): the packed kernel's weights held in bfloat16 and
widened exactly as they are read, everything computed in float32.

The reference is the float32 engine on the same weights rounded to bfloat16 (written to a
checkpoint as float32): logprobs, sampled logits and LoRA gradients must be its very bits.
``auto`` holds a bf16 checkpoint in bfloat16 (no bit changes) and leaves float32 weights that
are not bfloat16 values alone. Accuracy against transformers in float32 on the unrounded
weights: close, not equal (the rounding is the only difference).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.engine.kernels.gemm_order import gemm_kernel
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer
from tests.engine.model.test_transformer_hf_parity import hf_logits
from tests.engine.threads import one_thread  # noqa: F401  (autouse)

#: The checkpoint tensors the engine holds in bfloat16 (`weight_storage.kernel_weights`).
KERNEL_NAMES = re.compile(r"(embed_tokens|lm_head|_proj)\.weight$")


@pytest.fixture(autouse=True)
def needs_kernel() -> None:
    if gemm_kernel((64,), torch.device("cpu"), torch.float32, torch.bfloat16) is None:
        pytest.skip("the packed GEMM kernel is not available on this machine")


def rounded_copy(model_dir: Path, target: Path) -> Path:
    """``model_dir`` with its kernel weights rounded to bfloat16 and stored as float32."""
    target.mkdir()
    for path in model_dir.iterdir():
        if path.suffix == ".safetensors":
            tensors = load_file(path)
            save_file({n: t.to(torch.bfloat16).float() if KERNEL_NAMES.search(n) else t
                       for n, t in tensors.items()}, target / path.name)
        elif path.is_file():
            (target / path.name).write_bytes(path.read_bytes())
    return target


def bank_for(model: Transformer) -> AdapterBank:
    bank = AdapterBank(model.spec, "cpu", max_rank=16)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in bank.create("a", LoraConfig(rank=8, seed=1, train_unembed=True)).parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return bank


def train(model: Transformer, seqs: list[list[int]]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Training logprobs of ``seqs`` under adapter ``a`` and the adapter's gradients."""
    bank = bank_for(model)
    batch = model.pack([SequenceInput(s[:-1], "a") for s in seqs])
    lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    targets = batch.scatter_to_rows(torch.tensor([t for s in seqs for t in s[1:]]))
    logprobs = model.token_logprobs(model.forward(batch, lora), targets, lora)
    grads = torch.autograd.grad(-logprobs.sum(), list(bank.get("a").parameters()))
    return logprobs.detach(), list(grads)


def decode(model: Transformer, prompt: list[int]) -> list[torch.Tensor]:
    """Logits of a prefill and three decode steps through the KV cache."""
    bank = bank_for(model)
    cache = PagedKVCache.allocate(model.spec, 4, 64, model.device, model.dtype)
    steps = [[SequenceInput(prompt, "a", 0, [1, 2])]]
    steps += [[SequenceInput([7 + i], "a", len(prompt) + i, [1, 2])] for i in range(3)]
    out = []
    with torch.no_grad():
        for seqs in steps:
            batch = model.pack(seqs)
            lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
            out.append(model.logits(model.forward(batch, lora, cache), lora))
    return out


def sequences(vocab: int, lengths: tuple[int, ...] = (37, 90)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(2)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("arch,tie", [("llama", True), ("qwen3", False)])
def test_bf16_weights_compute_the_fp32_bits_of_the_rounded_weights(
        hf_model_factory, tmp_path: Path, arch: str, tie: bool) -> None:
    path, _ = hf_model_factory(arch, tie)
    ours = load_model(path, EngineConfig(dtype="bfloat16"))
    reference = load_model(rounded_copy(path, tmp_path / "rounded"),
                           EngineConfig(dtype="float32"))
    assert ours.dtype == torch.float32 and ours.weights.embed is not None
    assert ours.weights.embed.dtype == torch.bfloat16
    assert ours.weights.layers[0].q_proj is not None
    assert ours.weights.layers[0].q_proj.dtype == torch.bfloat16
    assert ours.weights.layers[0].input_norm.dtype == torch.float32
    assert (ours.weights.lm_head is ours.weights.embed) == tie
    assert ours.packed_bytes() * 2 == reference.packed_bytes() > 0
    assert "/bf16" in ours.options.label(ours.device, ours.dtype)
    seqs = sequences(ours.spec.vocab_size)
    (want_lp, want_grads), (got_lp, got_grads) = train(reference, seqs), train(ours, seqs)
    assert torch.equal(got_lp, want_lp)
    for want, got in zip(want_grads, got_grads, strict=True):
        assert torch.equal(got, want)
    for want, got in zip(decode(reference, seqs[1]), decode(ours, seqs[1]), strict=True):
        assert torch.equal(got, want)


def test_bf16_weights_stay_close_to_transformers_in_fp32(hf_model_factory) -> None:
    path, hf_model = hf_model_factory("qwen3", True)
    model = load_model(path, EngineConfig(dtype="bfloat16"))
    gen = torch.Generator().manual_seed(3)
    for n in (20, 9):
        seq = torch.randint(0, model.spec.vocab_size, (n,), generator=gen).tolist()
        batch = model.pack([SequenceInput(seq, None)])
        with torch.no_grad():
            ours = model.logits(model.forward(batch))[:n]
        ref = hf_logits(hf_model, torch.tensor(seq))
        assert not torch.equal(ours, ref)  # the rounding shows
        assert (ours - ref).abs().max().item() <= 0.05 * ref.abs().max().item()


def test_auto_holds_a_bf16_checkpoint_in_bf16_without_changing_a_bit(
        hf_model_factory, tmp_path: Path) -> None:
    _, hf_model = hf_model_factory("llama", False)
    import copy

    copy.deepcopy(hf_model).to(torch.bfloat16).save_pretrained(tmp_path)
    auto = load_model(tmp_path, EngineConfig())
    fp32 = load_model(tmp_path, EngineConfig(dtype="float32"))
    assert auto.weights.embed is not None and auto.weights.embed.dtype == torch.bfloat16
    assert fp32.weights.embed is not None and fp32.weights.embed.dtype == torch.float32
    seqs = sequences(auto.spec.vocab_size, (40, 13))
    (want_lp, want_grads), (got_lp, got_grads) = train(fp32, seqs), train(auto, seqs)
    assert torch.equal(got_lp, want_lp)
    for want, got in zip(want_grads, got_grads, strict=True):
        assert torch.equal(got, want)


def test_auto_keeps_fp32_weights_that_are_not_bf16_values(hf_model_factory) -> None:
    path, _ = hf_model_factory("llama", True)
    model = load_model(path, EngineConfig())
    assert model.weights.embed is not None and model.weights.embed.dtype == torch.float32
    assert "/bf16" not in model.options.label(model.device, model.dtype)


def test_without_the_kernel_bf16_falls_back_to_fp32_and_says_so(
        hf_model_factory, caplog: pytest.LogCaptureFixture) -> None:
    path, _ = hf_model_factory("llama", True)
    with caplog.at_level(logging.WARNING, logger="loraplex.engine.model.loader"):
        model = load_model(path, EngineConfig(dtype="bfloat16", native_kernels=False))
    assert model.weights.embed is not None and model.weights.embed.dtype == torch.float32
    assert "engine.dtype=bfloat16" in caplog.text
