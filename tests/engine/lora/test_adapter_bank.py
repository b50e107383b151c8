"""AdapterBank and LoraAdapter: lifecycle, init, naming, gradients, memory."""

from __future__ import annotations

import pytest
import torch

from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.adapter import LoraAdapter
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.compute_options import ComputeOptions
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.spec import ModelSpec, RopeSpec
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.model.weights import random_weights
from loraplex.errors import ConflictError, NotFoundError, UserError


def make_spec(tie: bool = True) -> ModelSpec:
    return ModelSpec(arch="llama", vocab_size=96, hidden_size=32, intermediate_size=48,
                     num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5,
                     rope=RopeSpec(1e4), tie_word_embeddings=tie, max_position_embeddings=256)


SPEC = make_spec()


def make_model(spec: ModelSpec = SPEC, invariant: bool = True) -> Transformer:
    return Transformer(spec, random_weights(spec, seed=1, std=0.2),
                       ComputeOptions(batch_invariant=invariant))


def randomize(adapter: LoraAdapter, seed: int, std: float = 0.1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def forward_logits(model: Transformer, bank: AdapterBank, seqs: list[SequenceInput]
                   ) -> torch.Tensor:
    batch = model.pack(seqs)
    lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    return model.logits(model.forward(batch, lora), lora)


def test_create_shapes_names_and_init() -> None:
    bank = AdapterBank(SPEC, "cpu", max_rank=32)
    adapter = bank.create("a", LoraConfig(rank=4, alpha=8.0, seed=3))
    names = [n for n, _ in adapter.named_parameters()]
    assert names[:2] == ["q_proj.lora_A", "q_proj.lora_B"]
    assert names[-2:] == ["unembed.lora_A", "unembed.lora_B"] and len(names) == 16
    q = adapter.weights["q_proj"]
    assert q.a_L_Rk_I.shape == (2, 4, 32) and q.b_L_O_Rk.shape == (2, 32, 4)
    assert adapter.weights["down_proj"].a_L_Rk_I.shape == (2, 4, 48)
    assert adapter.weights["k_proj"].b_L_O_Rk.shape == (2, 16, 4)
    assert adapter.weights["unembed"].b_L_O_Rk.shape == (1, 96, 4)
    assert all(w.b_L_O_Rk.abs().sum() == 0 for w in adapter.weights.values())
    a = adapter.weights["down_proj"].a_L_Rk_I
    assert a.abs().max() <= 1 / 48 ** 0.5 and a.std() > 0.5 / 48 ** 0.5 / 3 ** 0.5
    assert all(p.requires_grad and p.is_leaf for p in adapter.parameters())
    assert adapter.scale == 2.0


def test_seed_determines_init_and_targets_follow_config() -> None:
    bank = AdapterBank(SPEC, "cpu", max_rank=32)
    a1 = bank.create("a1", LoraConfig(rank=4, seed=5))
    a2 = bank.create("a2", LoraConfig(rank=4, seed=5))
    a3 = bank.create("a3", LoraConfig(rank=4, seed=6))
    assert all(torch.equal(p, q) for p, q in zip(a1.parameters(), a2.parameters(), strict=True))
    assert not torch.equal(a1.parameters()[0], a3.parameters()[0])
    mlp = bank.create("m", LoraConfig(rank=2, train_attn=False, train_unembed=False))
    assert list(mlp.weights) == ["gate_proj", "up_proj", "down_proj"]
    attn = bank.create("u", LoraConfig(rank=2, train_mlp=False))
    assert list(attn.weights) == ["q_proj", "k_proj", "v_proj", "o_proj", "unembed"]


def test_bank_lifecycle_errors() -> None:
    bank = AdapterBank(SPEC, "cpu", max_rank=8)
    bank.create("a", LoraConfig(rank=8))
    with pytest.raises(ConflictError):
        bank.create("a", LoraConfig(rank=2))
    with pytest.raises(UserError, match="rank"):
        bank.create("big", LoraConfig(rank=9))
    with pytest.raises(UserError):
        bank.create("none", LoraConfig(rank=2, train_attn=False, train_mlp=False,
                                       train_unembed=False))
    with pytest.raises(NotFoundError):
        bank.get("missing")
    bank.delete("missing")
    bank.delete("a")
    assert "a" not in bank and len(bank) == 0


@pytest.mark.parametrize("invariant", [True, False])
def test_fresh_adapter_is_exactly_the_base_model(invariant: bool) -> None:
    model = make_model(invariant=invariant)
    bank = AdapterBank(SPEC, "cpu", max_rank=32)
    bank.create("fresh", LoraConfig(rank=8, seed=0))
    tokens = list(range(1, 40))
    with torch.no_grad():
        base = forward_logits(model, bank, [SequenceInput(tokens)])
        adapted = forward_logits(model, bank, [SequenceInput(tokens, "fresh")])
    assert torch.equal(base[:39], adapted[:39])


def test_unembed_lora_acts_on_the_logits_of_a_tied_model() -> None:
    spec = make_spec(tie=True)
    model = make_model(spec)
    bank = AdapterBank(spec, "cpu", max_rank=8)
    adapter = bank.create("u", LoraConfig(rank=4, alpha=4.0, train_attn=False, train_mlp=False))
    randomize(adapter, 0)
    assert model.weights.lm_head is model.weights.embed
    batch = model.pack([SequenceInput(list(range(20)), "u")])
    lora = bank.stack(batch, rank_multiple=16, dtype=torch.float32)
    with torch.no_grad():
        hidden = model.forward(batch, lora)  # no block target trained: hidden is the base's
        w = adapter.weights["unembed"]
        real = hidden[:20]  # the pad rows after them carry no adapter
        expected = real @ spec_head(model).T + (real @ w.a_L_Rk_I[0].T) @ w.b_L_O_Rk[0].T
        adapted = model.logits(hidden, lora)[:20]
        assert torch.allclose(adapted, expected, atol=1e-5)
        assert not torch.allclose(adapted, model.logits(hidden)[:20], atol=1e-3)


def spec_head(model: Transformer) -> torch.Tensor:
    return model.weights.lm_head


def test_peft_state_dict_names_and_round_trip() -> None:
    bank = AdapterBank(SPEC, "cpu", max_rank=8)
    adapter = bank.create("a", LoraConfig(rank=4, seed=1))
    randomize(adapter, 1)
    state = adapter.peft_state_dict()
    assert state["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"].shape == (4, 32)
    assert state["base_model.model.model.layers.0.mlp.down_proj.lora_B.weight"].shape == (32, 4)
    assert state["base_model.model.model.unembed_tokens.lora_B.weight"].shape == (96, 4)
    assert len(state) == 2 * (7 * 2 + 1)
    other = bank.create("b", LoraConfig(rank=4, seed=2))
    other.load_peft_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(adapter.parameters(), other.parameters(),
                                                 strict=True))
    del state["base_model.model.model.unembed_tokens.lora_B.weight"]
    with pytest.raises(UserError, match="unembed_tokens"):
        other.load_peft_state_dict(state)


def test_gradients_accumulate_per_adapter_and_free_to_none() -> None:
    model = make_model()
    bank = AdapterBank(SPEC, "cpu", max_rank=16)
    for name, seed in (("a", 1), ("b", 2), ("idle", 3)):
        randomize(bank.create(name, LoraConfig(rank=4, seed=seed)), seed)
    seqs = [SequenceInput(list(range(3, 30)), "a"), SequenceInput(list(range(5, 17)), "b"),
            SequenceInput(list(range(7, 12)))]

    def step() -> None:
        logits = forward_logits(model, bank, seqs)
        logits.logsumexp(-1).sum().backward()

    step()
    first = {n: [p.grad.clone() for p in bank.get(n).parameters()] for n in ("a", "b")}
    assert all(g.abs().sum() > 0 for g in first["a"] + first["b"])
    assert all(p.grad is None for p in bank.get("idle").parameters())
    step()
    for n in ("a", "b"):
        for p, g in zip(bank.get(n).parameters(), first[n], strict=True):
            assert torch.allclose(p.grad, 2 * g, rtol=1e-5, atol=1e-7)
    adapter = bank.get("a")
    params_bytes = adapter.num_params * 4
    assert adapter.nbytes() == 2 * params_bytes
    adapter.free_grads()
    assert all(p.grad is None for p in adapter.parameters())
    assert adapter.nbytes() == params_bytes


def test_snapshot_is_frozen_against_later_training() -> None:
    bank = AdapterBank(SPEC, "cpu", max_rank=8)
    randomize(bank.create("live", LoraConfig(rank=2, seed=1)), 4)
    snap = bank.snapshot("live", "live@1")
    before = [p.clone() for p in snap.parameters()]
    with torch.no_grad():
        for p in bank.get("live").parameters():
            p.add_(1.0)
    assert all(torch.equal(p, q) for p, q in zip(snap.parameters(), before, strict=True))
    assert not any(p.requires_grad for p in snap.parameters())


def test_a_peft_named_head_loads_too() -> None:
    """Our PEFT export names the head ``lm_head``, as PEFT does; loading takes either name."""
    bank = AdapterBank(SPEC, "cpu", max_rank=8)
    adapter = bank.create("a", LoraConfig(rank=4, seed=1))
    randomize(adapter, 1)
    state = {k.replace("base_model.model.model.unembed_tokens.", "base_model.model.lm_head."): v
             for k, v in adapter.peft_state_dict().items()}
    other = bank.create("b", LoraConfig(rank=4, seed=2))
    other.load_peft_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(adapter.parameters(), other.parameters(),
                                                 strict=True))
