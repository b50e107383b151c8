"""Our Qwen3.5 (gated-DeltaNet hybrid), dense and MoE, against transformers'
``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` on tiny random configs: ours in fp32, the
reference transformers' model in float64 (its delta rule replaced by the token-by-token
recurrence it computes in chunks: transformers' own function casts to fp32; its experts by
their eager loop: its grouped GEMMs take no float64). The bar is 1e-4 on logits and 1e-5
relative on gradients, or twice transformers' own fp32 error against the same float64
reference where that is larger: this architecture's fp32 noise sits at the bar (one ulp of
weight noise moves transformers' fp32 gradients by 4e-6..7e-6 relative; its fp32 logits
differ from float64 by up to 1e-4 on some random configs, measured), so "no worse than
transformers itself" is what fp32 can promise.

Logits of packed sequences (crossing the delta rule's 16-position chunks) ≤ 1e-4, in
batch-invariant and fast mode; the multimodal checkpoint layout (``model.language_model.*``
beside a vision tower, ``Qwen3_5ForConditionalGeneration``) loads and gives the text model's
logits; a prefill followed by cached one-token decode steps (the linear layers' carried state,
the full-attention layers' pages) ≤ 1e-4; LoRA logits and gradients of every target (the
full-attention projections with the gated query, the linear layers' ``in_proj_q/k/v`` slices of
``in_proj_qkv``, ``in_proj_z``, ``out_proj``, the MLP, the head) relative ≤ 1e-5 against
transformers run on the merged weights ``W + (alpha/r)·B·A`` as a differentiable function of
the same A/B.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from contextlib import contextmanager
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

TOL, GRAD_REL_TOL = 1e-4, 1e-5
RANK, ALPHA = 4, 8.0
LENGTHS = [5, 70, 17, 1, 130, 64]
#: Qwen3.5's own is 1e-6; the gated RMSNorm divides the delta rule's output by its root mean
#: square plus eps, and a random model's output is near zero at some positions (its query
#: nearly orthogonal to the few keys seen), where fp32 noise is amplified ~1000×.
RMS_EPS = 1e-5
LINEAR_SLICES = ("in_proj_q", "in_proj_k", "in_proj_v")
#: (tie, overrides of `text_config`); ``moe`` configs are Qwen3.5-MoE (8 experts of width 32,
#: top-2, a shared expert of width 48).
CONFIGS: dict[str, tuple[bool, dict[str, Any]]] = {
    "hybrid-untied": (False, {}),
    "tied-one-key-head": (True, dict(linear_num_key_heads=1, linear_num_value_heads=4,
                                     layer_types=["linear_attention", "linear_attention",
                                                  "linear_attention", "full_attention"])),
    "moe": (False, dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                        shared_expert_intermediate_size=48)),
}


def text_config(tie: bool, **overrides: Any) -> Any:
    from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    moe = "num_experts" in overrides
    kw: dict[str, Any] = dict(
        vocab_size=320, hidden_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, max_position_embeddings=1024, tie_word_embeddings=tie,
        rms_norm_eps=RMS_EPS,
        layer_types=["linear_attention", "full_attention"] * 2)
    kw.update(overrides)
    if moe:
        config: Any = Qwen3_5MoeTextConfig(**kw)
        config.architectures = ["Qwen3_5MoeForCausalLM"]
    else:
        config = Qwen3_5TextConfig(**kw, intermediate_size=96)
        config.architectures = ["Qwen3_5ForCausalLM"]
    return config


def causal_lm(config: Any) -> Any:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM

    moe = config.architectures == ["Qwen3_5MoeForCausalLM"]
    config._experts_implementation = "eager"  # a float64 reference (grouped_mm: no float64)
    return (Qwen3_5MoeForCausalLM if moe else Qwen3_5ForCausalLM)(config)


def randomise(model: Any, seed: int) -> Any:
    """Random weights in the ranges the real models have: zero-centred norms near 0, the
    gated norm near 1, decay rates ``exp(A_log)`` in [1, 16] (transformers' init); the
    linear layers' values large enough that the delta rule's output is not near zero (the
    gated RMSNorm divides by its root mean square: fp32 noise in a near-zero output would
    dominate the comparison)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(1.0, 16.0).log())
            elif name.endswith("dt_bias") or "linear_attn.norm" in name:
                p.uniform_(0.5, 1.5)
            elif "norm" in name:
                p.uniform_(-0.5, 0.5)
            elif "in_proj_qkv" in name:
                p.normal_(0.0, 0.3)
            else:
                p.normal_(0.0, 0.1)
    return model.eval()


def recurrent_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         g: torch.Tensor, beta: torch.Tensor,
                         initial_state: torch.Tensor | None = None,
                         output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                         **_: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The gated delta rule by its definition, one position at a time, in the inputs' dtype
    (``[B, T, H, D]`` like transformers' ``torch_chunk_gated_delta_rule``)."""
    groups = value.shape[2] // query.shape[2]
    q, k = query.repeat_interleave(groups, 2), key.repeat_interleave(groups, 2)
    if use_qk_l2norm_in_kernel:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * q.shape[-1] ** -0.5
    b, t, h, dk = k.shape
    state = (torch.zeros(b, h, dk, value.shape[-1], dtype=value.dtype)
             if initial_state is None else initial_state.to(value.dtype))
    outs = []
    for i in range(t):
        state = state * g[:, i].exp()[..., None, None]
        memory = (state * k[:, i, ..., None]).sum(-2)
        delta = (value[:, i] - memory) * beta[:, i, ..., None]
        state = state + k[:, i, ..., None] * delta[..., None, :]
        outs.append((state * q[:, i, ..., None]).sum(-2))
    return torch.stack(outs, 1), state if output_final_state else None


@contextmanager
def float64_reference() -> Iterator[None]:
    """transformers' Qwen3.5 with `recurrent_delta_rule` (so a float64 model stays float64)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe

    names = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
    modules = (modeling_qwen3_5, modeling_qwen3_5_moe)
    saved = [(m, n, getattr(m, n)) for m in modules for n in names]
    for m, n, _ in saved:
        setattr(m, n, recurrent_delta_rule)
    try:
        yield
    finally:
        for m, n, fn in saved:
            setattr(m, n, fn)


def reference_logits(hf64: Any, seq: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The float64 reference's logits, and the bar for ours: `TOL`, or twice transformers'
    own fp32 error against them."""
    hf32 = copy.deepcopy(hf64).float()
    with torch.no_grad():
        fp32 = hf32(seq[None]).logits[0]
        with float64_reference():
            ref = hf64(seq[None]).logits[0]
    return ref.float(), max(TOL, 2 * (fp32.double() - ref).abs().max().item())


def within(ours: torch.Tensor, reference: tuple[torch.Tensor, float]) -> bool:
    return (ours - reference[0]).abs().max().item() <= reference[1]


@pytest.fixture(scope="module")
def hf_qwen3_5(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``make(name) -> (dir, the float64 reference model)``, cached; the directory holds the
    fp32 weights."""
    cache: dict[str, tuple[Path, Any]] = {}

    def make(name: str) -> tuple[Path, Any]:
        if name not in cache:
            tie, overrides = CONFIGS[name]
            model = randomise(causal_lm(text_config(tie, **overrides)), seed=0)
            path = tmp_path_factory.mktemp(f"hf-qwen3_5-{name}")
            model.save_pretrained(path)
            cache[name] = (path, model.double())
        return cache[name]

    return make


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
def test_packed_logits_match_transformers(hf_qwen3_5, name: str, invariant: bool) -> None:
    path, hf_model = hf_qwen3_5(name)
    model = load_model(path, EngineConfig(batch_invariant=invariant))
    assert model.spec.linear_layers and model.spec.attention_layers
    assert (model.weights.lm_head is model.weights.embed) == CONFIGS[name][0]
    seqs = sequences(model.spec.vocab_size, LENGTHS, seed=1)
    with torch.no_grad():
        for seq, ours in zip(seqs, packed_logits(model, seqs), strict=True):
            assert within(ours, reference_logits(hf_model, seq))


def test_the_multimodal_checkpoint_layout_loads_as_its_text_model(tmp_path: Path) -> None:
    """A ``Qwen3_5ForConditionalGeneration`` checkpoint (text under ``model.language_model``,
    a vision tower the engine does not read): the text model's logits."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = text_config(False).to_dict()
    config = Qwen3_5Config(text_config=text, vision_config=dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8,
        out_hidden_size=64, num_position_embeddings=64), tie_word_embeddings=False)
    hf_model = randomise(Qwen3_5ForConditionalGeneration(config), seed=3)
    hf_model.save_pretrained(tmp_path)
    model = load_model(tmp_path, EngineConfig())
    assert model.spec.weight_prefix == "model.language_model."
    seqs = sequences(model.spec.vocab_size, [40, 90], seed=4)
    hf64 = hf_model.double()
    with torch.no_grad():
        for seq, ours in zip(seqs, packed_logits(model, seqs), strict=True):
            assert within(ours, reference_logits(hf64, seq))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_then_cached_decode_matches_transformers(hf_qwen3_5, name: str) -> None:
    path, hf_model = hf_qwen3_5(name)
    model = load_model(path, EngineConfig())
    seq = sequences(model.spec.vocab_size, [150], seed=5)[0]
    cache = PagedKVCache.allocate(model.spec, 8, 64, model.device, model.dtype)
    assert cache.linear is not None
    table = [4, 1, 6]
    outs, start = [], 0
    with torch.no_grad():
        for end in [100, *range(101, 151)]:  # a prefill, then one token at a time
            batch = model.pack([SequenceInput(seq[start:end].tolist(), None, start, table,
                                              state_key="s")])
            outs.append(model.logits(model.forward(batch, kv=cache))[:end - start])
            start = end
    assert within(torch.cat(outs), reference_logits(hf_model, seq))


def merged_parameters(hf_model: Any, adapter: Any) -> dict[str, torch.Tensor]:
    """HF parameters with every adapted weight replaced by ``W + s·B·A`` (differentiable);
    ``in_proj_q/k/v`` are row slices of ``in_proj_qkv``."""
    s = adapter.config.scale
    params = dict(hf_model.named_parameters())
    out: dict[str, torch.Tensor] = {}
    for target, w in adapter.weights.items():
        for i in range(w.a_L_Rk_I.shape[0]):
            layer = w.model_layer(i)
            delta = s * torch.matmul(w.b_L_O_Rk[i], w.a_L_Rk_I[i])  # experts: broadcast
            if target in ("w1", "w3", "w2"):
                experts = f"model.layers.{layer}.mlp.experts"
                if target == "w2":
                    out[f"{experts}.down_proj"] = out.get(
                        f"{experts}.down_proj", params[f"{experts}.down_proj"]) + delta
                    continue
                f = delta.shape[1]
                pad = (0, 0, 0, f) if target == "w1" else (0, 0, f, 0)
                name = f"{experts}.gate_up_proj"
                out[name] = out.get(name, params[name]) + torch.nn.functional.pad(delta, pad)
                continue
            if target.startswith("shared_"):
                name = f"model.layers.{layer}.mlp.shared_expert.{target[7:]}.weight"
                out[name] = params[name] + delta
                continue
            if target == "unembed":  # the head only, a tied one too (called untied)
                base = params.get("lm_head.weight", params["model.embed_tokens.weight"])
                out["lm_head.weight"] = base + delta
                continue
            if target in LINEAR_SLICES:
                name = f"model.layers.{layer}.linear_attn.in_proj_qkv.weight"
                w_qkv = params[name]
                key_dim = adapter.weights["in_proj_q"].b_L_O_Rk.shape[1]
                start = {"in_proj_q": 0, "in_proj_k": key_dim, "in_proj_v": 2 * key_dim}[target]
                pad = (0, 0, start, w_qkv.shape[0] - start - delta.shape[0])
                out[name] = out.get(name, w_qkv) + torch.nn.functional.pad(delta, pad)
                continue
            module = ("linear_attn" if target in ("in_proj_z", "out_proj") else
                      "self_attn" if target in ("q_proj", "k_proj", "v_proj", "o_proj")
                      else "mlp")
            name = f"model.layers.{layer}.{module}.{target}.weight"
            out[name] = params[name] + delta
    return out


def reference_run(hf: Any, adapter: Any, seqs: list[torch.Tensor]
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """transformers on the merged weights, in ``hf``'s dtype (float64: the reference, its
    delta rule `recurrent_delta_rule`; float32: transformers as it is): each sequence's
    logits, and the gradients of the summed next-token logprobs in every A/B."""
    dtype = next(hf.parameters()).dtype
    leaves = [t.detach().to(dtype).requires_grad_() for t in adapter.parameters()]
    merged = merged_parameters(hf, adapter.with_parameters(leaves))
    logits, loss = [], torch.zeros((), dtype=dtype)
    with float64_reference() if dtype == torch.float64 else contextlib.nullcontext():
        for seq in seqs:
            theirs = functional_call(hf, merged, (seq[None],), tie_weights=False).logits[0]
            logits.append(theirs.detach().double())
            loss = loss + torch.log_softmax(theirs, -1).gather(
                1, torch.roll(seq, -1)[:, None]).sum()
    loss.backward()
    return logits, [leaf.grad.double() for leaf in leaves]  # type: ignore[union-attr]


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_lora_logits_and_gradients_match_transformers(hf_qwen3_5, name: str,
                                                       invariant: bool) -> None:
    path, hf_model = hf_qwen3_5(name)
    model = load_model(path, EngineConfig(batch_invariant=invariant))
    bank = AdapterBank(model.spec, "cpu", max_rank=32)
    adapter = bank.create("a", LoraConfig(rank=RANK, alpha=ALPHA, seed=0))
    mlp = ({"w1", "w2", "w3", "shared_gate_proj", "shared_down_proj"} if name == "moe"
           else {"gate_proj"})
    assert {"q_proj", "in_proj_q", "in_proj_k", "in_proj_v", "in_proj_z", "out_proj",
            "unembed", *mlp} <= set(adapter.weights)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in adapter.weights.values():  # B ≠ 0 so every gradient path is exercised
            w.b_L_O_Rk.copy_(torch.randn(w.b_L_O_Rk.shape, generator=gen) * 0.3)
    seqs = sequences(model.spec.vocab_size, [23, 80, 5], seed=2)
    ours = packed_logits(model, seqs, "a", bank)
    leaves = adapter.parameters()
    ref_logits, ref_grads = reference_run(hf_model, adapter, seqs)
    hf_logits, hf_grads = reference_run(copy.deepcopy(hf_model).float(), adapter, seqs)
    loss = torch.zeros(())
    for seq, mine, theirs, hf32 in zip(seqs, ours, ref_logits, hf_logits, strict=True):
        bar = max(TOL, 2 * (hf32 - theirs).abs().max().item())
        assert (mine.double() - theirs).abs().max().item() <= bar
        loss = loss + torch.log_softmax(mine, -1).gather(1, torch.roll(seq, -1)[:, None]).sum()
    loss.backward()
    for (target, _), mine_leaf, ref, hf32 in zip(adapter.named_parameters(), leaves, ref_grads,
                                                 hf_grads, strict=True):
        assert mine_leaf.grad is not None
        bar = max(GRAD_REL_TOL, 2 * ((hf32 - ref).norm() / ref.norm()).item())
        err = ((mine_leaf.grad.double() - ref).norm() / ref.norm()).item()
        assert err <= bar, (target, err, bar)
