"""One adapter == PEFT's LoRA on the same HF base with the same A/B: logits and A/B gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.lora.targets import peft_key
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
RANK, ALPHA = 8, 16.0
LOGIT_TOL, GRAD_REL_TOL = 1e-4, 1e-5


def peft_name(ours: str) -> str:
    """Our PEFT key → the parameter name inside a live PEFT model (adapter ``default``)."""
    ours = ours.replace("model.unembed_tokens", "lm_head")
    return ours.replace(".lora_A.weight", ".lora_A.default.weight").replace(
        ".lora_B.weight", ".lora_B.default.weight")


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_adapter_matches_peft_forward_and_gradients(hf_model_factory, arch: str,
                                                    invariant: bool) -> None:
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    path, hf_model = hf_model_factory(arch, False)
    model = load_model(path, EngineConfig(batch_invariant=invariant))
    bank = AdapterBank(model.spec, "cpu", max_rank=32)
    adapter = bank.create("a", LoraConfig(rank=RANK, alpha=ALPHA, seed=0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in adapter.weights.values():  # B ≠ 0 so every gradient path is exercised
            w.b_L_O_Rk.copy_(torch.randn(w.b_L_O_Rk.shape, generator=gen) * 0.1)
    peft_model = get_peft_model(copy.deepcopy(hf_model), PeftLoraConfig(
        r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS))
    peft_params = dict(peft_model.named_parameters())
    ours_state = adapter.peft_state_dict()
    with torch.no_grad():
        for key, tensor in ours_state.items():
            peft_params[peft_name(key)].copy_(tensor)
    assert sum(p.requires_grad for p in peft_model.parameters()) == len(ours_state)

    seqs = [torch.randint(0, model.spec.vocab_size, (n,), generator=gen) for n in (23, 70, 5)]
    batch = model.pack([SequenceInput(s.tolist(), "a") for s in seqs])
    lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    logits_R_V = model.logits(model.forward(batch, lora), lora)
    loss = torch.zeros(())
    peft_loss = torch.zeros(())
    for i, seq in enumerate(seqs):
        start = batch.seq_row_start[i]
        ours = logits_R_V[start:start + len(seq)]
        theirs = peft_model(input_ids=seq[None]).logits[0]
        assert (ours - theirs).abs().max().item() <= LOGIT_TOL
        targets = torch.roll(seq, -1)
        loss = loss + torch.log_softmax(ours, -1).gather(1, targets[:, None]).sum()
        peft_loss = peft_loss + torch.log_softmax(theirs, -1).gather(1, targets[:, None]).sum()
    loss.backward()
    peft_loss.backward()
    for layer_key, ours_grad in grads_by_peft_key(adapter).items():
        theirs_grad = peft_params[peft_name(layer_key)].grad
        assert theirs_grad is not None
        err = (ours_grad - theirs_grad).norm() / theirs_grad.norm()
        assert err.item() <= GRAD_REL_TOL, layer_key


def grads_by_peft_key(adapter: LoraAdapter) -> dict[str, torch.Tensor]:
    out = {}
    for target, w in adapter.weights.items():
        assert w.a_L_Rk_I.grad is not None and w.b_L_O_Rk.grad is not None
        for layer in range(w.a_L_Rk_I.shape[0]):
            out[peft_key(target, layer, "A")] = w.a_L_Rk_I.grad[layer]
            out[peft_key(target, layer, "B")] = w.b_L_O_Rk.grad[layer]
    return out
