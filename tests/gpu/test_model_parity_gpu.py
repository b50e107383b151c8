"""The transformer and LoRA bank on CUDA: parity with transformers (fp32), bf16 sanity,
training backward, and bitwise prefill+decode == full forward where the GPU allows it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.engine.builtin.model import create_builtin_model
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
LENGTHS = (5, 70, 17, 1, 130)


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_builtin_model(tmp_path_factory.mktemp("gpu") / request.param, request.param,
                                "tiny", seed=0)


def sequences(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in LENGTHS]


def packed_logits(model: Transformer, bank: AdapterBank | None, seqs: list[list[int]],
                  adapter: str | None = None) -> list[torch.Tensor]:
    batch = model.pack([SequenceInput(s, adapter) for s in seqs])
    lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype) if bank \
        else None
    logits = model.logits(model.forward(batch, lora), lora).float().cpu()
    return [logits[batch.seq_row_start[i]:batch.seq_row_start[i] + len(s)]
            for i, s in enumerate(seqs)]


@pytest.mark.parametrize("invariant", [True, False])
def test_fp32_cuda_matches_transformers(model_dir: Path, invariant: bool) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    torch.backends.cuda.matmul.allow_tf32 = False
    model = load_model(model_dir, EngineConfig(device="cuda", dtype="float32",
                                               batch_invariant=invariant))
    assert model.device.type == "cuda"
    seqs = sequences(model.spec.vocab_size)
    with torch.no_grad():
        ours = packed_logits(model, None, seqs)
        for seq, out in zip(seqs, ours, strict=True):
            ref = hf(torch.tensor([seq], device="cuda")).logits[0].cpu()
            assert (out - ref).abs().max().item() <= 1e-4


def test_bf16_default_on_cuda_with_lora_trains(model_dir: Path) -> None:
    model = load_model(model_dir, EngineConfig(device="auto", dtype="auto"))
    assert model.dtype == torch.bfloat16
    bank = AdapterBank(model.spec, model.device, max_rank=32)
    adapter = bank.create("a", LoraConfig(rank=8, seed=0))
    seqs = sequences(model.spec.vocab_size)
    batch = model.pack([SequenceInput(s, "a") for s in seqs])
    lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    targets = batch.scatter_to_rows(torch.tensor([t for s in seqs for t in s],
                                                 device=model.device))
    logprobs = model.token_logprobs(model.forward(batch, lora), targets, lora)
    assert logprobs.dtype == torch.float32 and torch.isfinite(logprobs).all()
    logprobs.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in adapter.parameters())


def test_prefill_and_decode_match_the_full_forward_on_cuda(model_dir: Path) -> None:
    model = load_model(model_dir, EngineConfig(device="cuda", dtype="float32"))
    tokens = sequences(model.spec.vocab_size)[4][:40]
    cache = PagedKVCache.allocate(model.spec, 8, 64, model.device, model.dtype)
    with torch.no_grad():
        full = packed_logits(model, None, [tokens])[0]
        steps = [model.logits(model.forward(model.pack([SequenceInput(tokens[:8], None, 0, [3])]),
                                            kv=cache))[:8].cpu()]
        for t in range(8, 40):
            batch = model.pack([SequenceInput([tokens[t]], None, t, [3])])
            steps.append(model.logits(model.forward(batch, kv=cache))[:1].cpu())
    assert (torch.cat(steps) - full).abs().max().item() <= 1e-5
