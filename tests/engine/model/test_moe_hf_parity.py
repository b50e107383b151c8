"""Our Qwen3-MoE against transformers' ``Qwen3MoeForCausalLM`` on tiny random fp32 configs.

Logits of packed sequences ≤ 1e-4; LoRA gradients (every attention, dense-MLP, expert and head
factor) relative ≤ 1e-5 against transformers run on the merged weights
``W + (alpha/r)·B·A`` as a differentiable function of the same A/B (the definition of LoRA,
with Tinker's shared/per-expert factors broadcast over the experts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.func import functional_call

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer
from loraplex.errors import UserError

TOL, GRAD_REL_TOL = 1e-4, 1e-5
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
RANK, ALPHA = 4, 8.0
#: (tie, overrides): all layers sparse with renormalised top-k; a dense-only layer via
#: ``mlp_only_layers`` with raw top-k probabilities; every other layer sparse via
#: ``decoder_sparse_step``.
CONFIGS: dict[str, tuple[bool, dict[str, Any]]] = {
    "all-sparse": (False, {}),
    "mlp-only-layer": (True, dict(num_hidden_layers=3, mlp_only_layers=[1],
                                  norm_topk_prob=False)),
    "sparse-step-2": (False, dict(num_hidden_layers=4, decoder_sparse_step=2,
                                  num_experts_per_tok=3)),
}


def sequences(vocab: int, lengths: list[int], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen) for n in lengths]


def packed_logits(model: Transformer, seqs: list[torch.Tensor], adapter: str | None = None,
                  bank: AdapterBank | None = None) -> list[torch.Tensor]:
    batch = model.pack([SequenceInput(s.tolist(), adapter) for s in seqs])
    lora = None if bank is None else bank.stack(batch, rank_multiple=model.rank_multiple,
                                                dtype=model.dtype)
    logits = model.logits(model.forward(batch, lora), lora)
    return [logits[batch.seq_row_start[i]:batch.seq_row_start[i] + len(s)]
            for i, s in enumerate(seqs)]


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_logits_match_transformers(hf_model_factory, name: str, invariant: bool) -> None:
    tie, overrides = CONFIGS[name]
    path, hf_model = hf_model_factory("qwen3_moe", tie, **overrides)
    model = load_model(path, EngineConfig(batch_invariant=invariant))
    assert model.spec.experts is not None
    assert len(model.spec.dense_mlp_layers) == {"all-sparse": 0, "mlp-only-layer": 1,
                                                 "sparse-step-2": 2}[name]
    seqs = sequences(model.spec.vocab_size, [5, 70, 17, 1, 40], seed=0)
    with torch.no_grad():
        for seq, ours in zip(seqs, packed_logits(model, seqs), strict=True):
            theirs = hf_model(seq[None]).logits[0]
            assert (ours - theirs).abs().max().item() <= TOL


def test_routing_ties_go_as_in_transformers(hf_model_factory, tmp_path: Path) -> None:
    """Two experts with the same router row tie on every token; topk keeps the same one."""
    import copy

    _, hf_model = hf_model_factory("qwen3_moe", False)
    tied = copy.deepcopy(hf_model)
    with torch.no_grad():
        for layer in tied.model.layers:
            layer.mlp.gate.weight[5] = layer.mlp.gate.weight[2]
    tied.save_pretrained(tmp_path)
    for invariant in (True, False):
        model = load_model(tmp_path, EngineConfig(batch_invariant=invariant))
        seqs = sequences(model.spec.vocab_size, [50], seed=4)
        with torch.no_grad():
            (ours,) = packed_logits(model, seqs)
            out = tied(seqs[0][None], output_router_logits=True)
            assert (ours - out.logits[0]).abs().max().item() <= TOL
    # The tie is real and decides something: some token keeps exactly one of the twins.
    chosen = [torch.topk(logits.softmax(-1), 2, dim=-1).indices for logits in out.router_logits]
    one_twin = [((c == 2).any(-1) ^ (c == 5).any(-1)).sum().item() for c in chosen]
    assert sum(one_twin) > 0


def test_prefill_then_cached_decode_matches_transformers(hf_model_factory) -> None:
    path, hf_model = hf_model_factory("qwen3_moe", True, **CONFIGS["mlp-only-layer"][1])
    model = load_model(path, EngineConfig(batch_invariant=True))
    seq = sequences(model.spec.vocab_size, [90], seed=3)[0]
    cache = PagedKVCache.allocate(model.spec, 8, 64, model.device, model.dtype)
    outs = []
    with torch.no_grad():
        for start, end in [(0, 40), (40, 41), (41, 90)]:
            batch = model.pack([SequenceInput(seq[start:end].tolist(), None, start, [3, 1])])
            outs.append(model.logits(model.forward(batch, kv=cache))[:end - start])
        assert (torch.cat(outs) - hf_model(seq[None]).logits[0]).abs().max().item() <= TOL


def merged_parameters(hf_model: Any, model: Transformer, adapter: Any) -> dict[str, torch.Tensor]:
    """HF parameters with every adapted weight replaced by ``W + s·B·A`` (differentiable)."""
    s = adapter.config.scale
    params = dict(hf_model.named_parameters())
    out: dict[str, torch.Tensor] = {}
    spec = model.spec
    f = spec.experts.expert_intermediate_size
    for target, w in adapter.weights.items():
        for i in range(w.a_L_Rk_I.shape[0]):
            layer = w.model_layer(i)
            a, b = w.a_L_Rk_I[i], w.b_L_O_Rk[i]
            if target in ("w1", "w3", "w2"):
                delta_E_O_I = s * torch.matmul(b, a)  # broadcast the shared factor over experts
                if target == "w2":
                    name = f"model.layers.{layer}.mlp.experts.down_proj"
                    out[name] = out.get(name, params[name]) + delta_E_O_I
                else:
                    name = f"model.layers.{layer}.mlp.experts.gate_up_proj"
                    pad = (0, 0, 0, f) if target == "w1" else (0, 0, f, 0)
                    out[name] = out.get(name, params[name]) + torch.nn.functional.pad(
                        delta_E_O_I, pad)
            elif target == "unembed":
                out["lm_head.weight"] = params["lm_head.weight"] + s * b @ a
            else:
                part = "self_attn" if target in ATTENTION else "mlp"
                name = f"model.layers.{layer}.{part}.{target}.weight"
                out[name] = params[name] + s * b @ a
    return out


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
@pytest.mark.parametrize("name", ["all-sparse", "mlp-only-layer"])
def test_lora_logits_and_gradients_match_transformers(hf_model_factory, name: str,
                                                       invariant: bool) -> None:
    path, hf_model = hf_model_factory("qwen3_moe", False, **CONFIGS[name][1])
    model = load_model(path, EngineConfig(batch_invariant=invariant))
    bank = AdapterBank(model.spec, "cpu", max_rank=32)
    adapter = bank.create("a", LoraConfig(rank=RANK, alpha=ALPHA, seed=0))
    assert {"w1", "w2", "w3", "q_proj", "unembed"} <= set(adapter.weights)
    assert ("gate_proj" in adapter.weights) == bool(model.spec.dense_mlp_layers)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in adapter.weights.values():  # B ≠ 0 so every gradient path is exercised
            w.b_L_O_Rk.copy_(torch.randn(w.b_L_O_Rk.shape, generator=gen) * 0.3)
    seqs = sequences(model.spec.vocab_size, [23, 60, 5], seed=2)
    ours = packed_logits(model, seqs, "a", bank)
    leaves = adapter.parameters()
    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    ref_adapter = adapter.with_parameters(ref_leaves)
    merged = merged_parameters(hf_model, model, ref_adapter)
    loss = torch.zeros(())
    ref_loss = torch.zeros(())
    for seq, mine in zip(seqs, ours, strict=True):
        theirs = functional_call(hf_model, merged, (seq[None],)).logits[0]
        assert (mine - theirs).abs().max().item() <= TOL
        targets = torch.roll(seq, -1)[:, None]
        loss = loss + torch.log_softmax(mine, -1).gather(1, targets).sum()
        ref_loss = ref_loss + torch.log_softmax(theirs, -1).gather(1, targets).sum()
    loss.backward()
    ref_loss.backward()
    for (target, _), mine, theirs in zip(adapter.named_parameters(), leaves, ref_leaves,
                                         strict=True):
        assert mine.grad is not None and theirs.grad is not None
        err = (mine.grad - theirs.grad).norm() / theirs.grad.norm()
        assert err.item() <= GRAD_REL_TOL, target


def test_sharded_bf16_checkpoint_loads_into_fp32_compute(hf_model_factory, tmp_path: Path
                                                         ) -> None:
    import copy

    from transformers import AutoModelForCausalLM

    _, hf_model = hf_model_factory("qwen3_moe", True, **CONFIGS["mlp-only-layer"][1])
    copy.deepcopy(hf_model).to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="100KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    model = load_model(tmp_path, EngineConfig(dtype="float32"))
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    seqs = sequences(model.spec.vocab_size, [40], seed=5)
    with torch.no_grad():
        (ours,) = packed_logits(model, seqs)
        assert (ours - reference(seqs[0][None]).logits[0]).abs().max().item() <= TOL


def test_model_info_counts_match_transformers(hf_model_factory) -> None:
    for name, (tie, overrides) in CONFIGS.items():
        path, hf_model = hf_model_factory("qwen3_moe", tie, **overrides)
        info = load_model(path).model_info()
        assert info.num_params == sum(p.numel() for p in hf_model.parameters()), name
        assert info.card.moe is not None and info.card.moe.num_experts == 8


def test_fused_expert_checkpoint_loads(hf_model_factory, tmp_path: Path) -> None:
    """transformers 5's in-memory state dict (experts fused ``(E, 2f, d)`` / ``(E, d, f)``)
    written as it is, e.g. by a tool that skips ``save_pretrained``'s per-expert conversion."""
    from safetensors.torch import save_file

    path, hf_model = hf_model_factory("qwen3_moe", False, **CONFIGS["mlp-only-layer"][1])
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((path / "config.json").read_text())
    model = load_model(tmp_path)
    seqs = sequences(model.spec.vocab_size, [30], seed=6)
    with torch.no_grad():
        (ours,) = packed_logits(model, seqs)
        assert (ours - hf_model(seqs[0][None]).logits[0]).abs().max().item() <= TOL
    del state["model.layers.2.mlp.experts.down_proj"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="missing"):
        load_model(tmp_path)
