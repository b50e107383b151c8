"""Our gpt-oss against transformers' ``GptOssForCausalLM`` on tiny random configs: ours in
fp32, transformers in float64 (its experts by their eager loop: grouped GEMMs take no float64).

Covered: attention sinks, alternating sliding-window (48 keys) and full layers, YaRN rope,
q/k/v/o biases, the biased router softmaxing its top-k logits, interleaved gate/up with biases,
the clamped SwiGLU. Logits of packed sequences (longer than the window and crossing KV blocks)
≤ 1e-4 in batch-invariant and fast mode; prefill + cached one-token decode ≤ 1e-4; LoRA logits
and gradients (attention, the experts' w1/w3/w2, the head) relative ≤ 1e-5 against transformers
on the merged weights ``W + (alpha/r)·B·A`` (Tinker's shared/per-expert factors broadcast,
interleaved into ``gate_up_proj`` as the cookbook merges them); MXFP4 experts (as OpenAI ships
them: ``*_blocks`` / ``*_scales``) dequantised exactly as transformers does, and a checkpoint of
them loading into the model the dense weights give.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.func import functional_call

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.gpt_oss_experts import FP4_VALUES, dequantize_mxfp4
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer

TOL, GRAD_REL_TOL = 1e-4, 1e-5
RANK, ALPHA = 4, 8.0
LENGTHS = [5, 70, 17, 1, 130, 64]


def config(**overrides: Any) -> Any:
    from transformers import GptOssConfig

    kw: dict[str, Any] = dict(
        vocab_size=320, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8,
        num_experts_per_tok=2, sliding_window=48, max_position_embeddings=8192,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 2.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096})
    kw.update(overrides)
    cfg = GptOssConfig(**kw)
    cfg.architectures = ["GptOssForCausalLM"]
    cfg._experts_implementation = "eager"
    return cfg


@pytest.fixture(scope="module")
def hf_gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(dir with the fp32 checkpoint, the float64 reference model)."""
    from transformers import GptOssForCausalLM

    torch.manual_seed(0)
    model = GptOssForCausalLM(config()).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("sinks"):
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 0.15)
    path = tmp_path_factory.mktemp("hf-gpt-oss")
    model.save_pretrained(path)
    return path, model.double()


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


def reference(hf64: Any, seq: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf64(seq[None]).logits[0].float()


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
def test_packed_logits_match_transformers(hf_gpt_oss: tuple[Path, Any], invariant: bool) -> None:
    path, hf64 = hf_gpt_oss
    model = load_model(path, EngineConfig(batch_invariant=invariant))
    spec = model.spec
    assert spec.layer_types == ("sliding_attention", "full_attention") * 2
    assert spec.sliding_window == 48 and spec.rope.kind == "yarn"
    assert spec.experts is not None and spec.experts.biases
    seqs = sequences(spec.vocab_size, LENGTHS, seed=1)
    with torch.no_grad():
        for seq, ours in zip(seqs, packed_logits(model, seqs), strict=True):
            assert (ours - reference(hf64, seq)).abs().max().item() <= TOL


def test_the_window_and_the_sinks_matter(hf_gpt_oss: tuple[Path, Any]) -> None:
    """Without the window (or the sinks) long sequences get other logits: the parity above
    checks them."""
    path, hf64 = hf_gpt_oss
    model = load_model(path, EngineConfig())
    seq = sequences(model.spec.vocab_size, [130], seed=1)[0]
    want = reference(hf64, seq)
    for i in model.spec.attention_layers:
        layer = model._attn_layers[i]
        model._attn_layers[i] = type(layer)(window=None, sinks_H=layer.sinks_H)
    with torch.no_grad():
        assert (packed_logits(model, [seq])[0] - want).abs().max().item() > 1e-2


def test_prefill_then_cached_decode_matches_transformers(hf_gpt_oss: tuple[Path, Any]) -> None:
    path, hf64 = hf_gpt_oss
    model = load_model(path, EngineConfig())
    seq = sequences(model.spec.vocab_size, [150], seed=5)[0]
    cache = PagedKVCache.allocate(model.spec, 8, 64, model.device, model.dtype)
    table = [4, 1, 6]
    outs, start = [], 0
    with torch.no_grad():
        for end in [100, *range(101, 151)]:
            batch = model.pack([SequenceInput(seq[start:end].tolist(), None, start, table)])
            outs.append(model.logits(model.forward(batch, kv=cache))[:end - start])
            start = end
    assert (torch.cat(outs) - reference(hf64, seq)).abs().max().item() <= TOL


def merged_parameters(hf: Any, adapter: Any) -> dict[str, torch.Tensor]:
    """transformers' parameters with every adapted weight ``W + s·B·A``: attention as
    ``(out, in)`` linears, the experts' ``x @ W`` tensors with gate and up interleaved."""
    s = adapter.config.scale
    params = dict(hf.named_parameters())
    out: dict[str, torch.Tensor] = {}
    for target, w in adapter.weights.items():
        for i in range(w.a_L_Rk_I.shape[0]):
            layer = w.model_layer(i)
            delta = s * torch.matmul(w.b_L_O_Rk[i], w.a_L_Rk_I[i])
            experts = f"model.layers.{layer}.mlp.experts"
            if target == "w2":  # delta (E, d, f) → x @ W layout (E, f, d)
                out[f"{experts}.down_proj"] = params[f"{experts}.down_proj"] + delta.transpose(
                    1, 2)
            elif target in ("w1", "w3"):  # (E, f, d) → columns 0::2 (gate) or 1::2 (up)
                name = f"{experts}.gate_up_proj"
                zero = torch.zeros_like(delta)
                pair = (delta, zero) if target == "w1" else (zero, delta)
                interleaved = torch.stack(pair, dim=2).flatten(1, 2).transpose(1, 2)
                out[name] = out.get(name, params[name]) + interleaved
            elif target == "unembed":
                out["lm_head.weight"] = params["lm_head.weight"] + delta
            else:
                name = f"model.layers.{layer}.self_attn.{target}.weight"
                out[name] = params[name] + delta
    return out


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
def test_lora_logits_and_gradients_match_transformers(hf_gpt_oss: tuple[Path, Any],
                                                       invariant: bool) -> None:
    path, hf64 = hf_gpt_oss
    model = load_model(path, EngineConfig(batch_invariant=invariant))
    bank = AdapterBank(model.spec, "cpu", max_rank=32)
    adapter = bank.create("a", LoraConfig(rank=RANK, alpha=ALPHA, seed=0))
    assert set(adapter.weights) == {"q_proj", "k_proj", "v_proj", "o_proj", "w1", "w3", "w2",
                                    "unembed"}
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in adapter.weights.values():
            w.b_L_O_Rk.copy_(torch.randn(w.b_L_O_Rk.shape, generator=gen) * 0.3)
    seqs = sequences(model.spec.vocab_size, [23, 80, 5], seed=2)
    ours = packed_logits(model, seqs, "a", bank)
    leaves = adapter.parameters()
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    merged = merged_parameters(hf64, adapter.with_parameters(ref_leaves))
    loss, ref_loss = torch.zeros(()), torch.zeros((), dtype=torch.float64)
    for seq, mine in zip(seqs, ours, strict=True):
        theirs = functional_call(hf64, merged, (seq[None],)).logits[0]
        assert (mine.double() - theirs).abs().max().item() <= TOL
        targets = torch.roll(seq, -1)[:, None]
        loss = loss + torch.log_softmax(mine, -1).gather(1, targets).sum()
        ref_loss = ref_loss + torch.log_softmax(theirs, -1).gather(1, targets).sum()
    loss.backward()
    ref_loss.backward()
    for (target, _), mine_leaf, ref_leaf in zip(adapter.named_parameters(), leaves, ref_leaves,
                                                strict=True):
        assert mine_leaf.grad is not None and ref_leaf.grad is not None
        err = (mine_leaf.grad.double() - ref_leaf.grad).norm() / ref_leaf.grad.norm()
        assert err.item() <= GRAD_REL_TOL, target


def quantize_mxfp4(w_X_K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round ``w`` (last dim a multiple of 32) to MXFP4: blocks ``[..., K/32, 16]`` and biased
    exponent scales ``[..., K/32]`` (each block's largest magnitude maps into e2m1's ±6)."""
    groups = w_X_K.unflatten(-1, (-1, 32))
    exponent = torch.floor(torch.log2(groups.abs().amax(-1).clamp(min=2.0 ** -100))) - 2
    scaled = groups / torch.exp2(exponent)[..., None]
    lut = torch.tensor(FP4_VALUES)
    codes = (scaled[..., None] - lut).abs().argmin(-1).to(torch.uint8)  # nearest e2m1 value
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks, (exponent + 127).to(torch.uint8)


def test_mxfp4_dequantisation_matches_transformers() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(3)
    blocks = torch.randint(0, 256, (3, 8, 4, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(110, 140, (3, 8, 4), generator=gen, dtype=torch.uint8)
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, K, R]
    assert torch.equal(dequantize_mxfp4(blocks, scales), theirs.transpose(1, 2))


def test_an_mxfp4_checkpoint_loads_as_its_dequantised_weights(hf_gpt_oss: tuple[Path, Any],
                                                               tmp_path: Path) -> None:
    """OpenAI's layout: the experts' matrices as MXFP4 blocks and scales, a quantization
    config; it gives the logits of the dense checkpoint holding the dequantised values."""
    path, _ = hf_gpt_oss
    state = load_file(path / "model.safetensors")
    dense, packed = dict(state), dict(state)
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        rows_out = state[name].transpose(1, 2).contiguous()  # (E, out, in): rows = outputs
        blocks, scales = quantize_mxfp4(rows_out)
        del packed[name]
        packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
        dense[name] = dequantize_mxfp4(blocks, scales).transpose(1, 2).contiguous()
    cfg = json.loads((path / "config.json").read_text())
    for directory, tensors, quant in ((tmp_path / "dense", dense, None),
                                      (tmp_path / "mxfp4", packed, {"quant_method": "mxfp4"})):
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(
            {**cfg, **({"quantization_config": quant} if quant else {})}))
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    seqs = sequences(cfg["vocab_size"], [40, 70], seed=6)
    with torch.no_grad():
        want = packed_logits(load_model(tmp_path / "dense", EngineConfig()), seqs)
        got = packed_logits(load_model(tmp_path / "mxfp4", EngineConfig()), seqs)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
