"""GGUF weights: our forward on a GGUF file against transformers loading the same file
(``from_pretrained(dir, gguf_file=…)``), for the Llama and Qwen3 families and every required
quantisation type; the ``gguf`` package's dequantisers against transformers' independent torch
ones; unsupported types and architectures refused with errors naming them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loraplex.cli.model_sources import resolve_source
from loraplex.engine.builtin.tokenizer import build_tokenizer
from loraplex.engine.gguf.config import hf_config_dict
from loraplex.engine.gguf.model_dir import ensure_gguf_model_dir
from loraplex.engine.model.compute_options import ComputeOptions
from loraplex.engine.model.gguf_index import GGUFIndex
from loraplex.engine.model.gguf_weights import load_gguf_weights, open_reader
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.model.transformer import Transformer
from loraplex.errors import UserError
from tests.engine.gguf.gguf_files import random_k_blocks, write_gguf

TOL = 1e-4
ARCHS = ("llama", "qwen3")
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
#: Every type on Llama (q/k permuted, untied); on Qwen3 (unpermuted, q/k norms, tied) the
#: float path and one of each block family, as the dequantisers are the same code.
CASES = [("llama", t) for t in TYPES] + [("qwen3", t) for t in ("F32", "BF16", "Q4_1", "Q6_K")]


def tiny_hf_model(arch: str, vocab_size: int, seed: int = 0) -> Any:
    """Rows of 256 and 512 inputs, so every K-quant block fits; Llama untied, Qwen3 tied with
    Qwen3's head size 128 ≠ hidden / heads (transformers' GGUF loader ignores
    ``qwen3.attention.key_length`` and takes Qwen3Config's default, 128)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    kw: dict[str, Any] = dict(vocab_size=vocab_size, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=128 if arch == "qwen3" else 64,
                              max_position_embeddings=512, rms_norm_eps=1e-5,
                              tie_word_embeddings=arch == "qwen3")
    config = (Qwen3Config(**kw, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
              if arch == "qwen3" else
              LlamaConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": 1e4}))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.uniform_(0.5, 1.5) if name.endswith("norm.weight") else p.normal_(0.0, 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def families() -> dict[str, tuple[Any, Any]]:
    """arch → (random HF model, its family's tiny byte-level BPE tokenizer)."""
    out = {}
    for arch in ARCHS:
        tokenizer = build_tokenizer(arch, 1024, seed=0, corpus_chars=60_000)
        out[arch] = (tiny_hf_model(arch, len(tokenizer)), tokenizer)
    return out


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 1024, (37,), generator=torch.Generator().manual_seed(seed))


def our_logits(model: Transformer, seq: torch.Tensor) -> torch.Tensor:
    batch = model.pack([SequenceInput(seq.tolist())])
    with torch.no_grad():
        return model.logits(model.forward(batch))[: len(seq)]


def transformers_gguf_logits(path: Path, seq: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32).eval()
    with torch.no_grad():
        return model(seq[None]).logits[0]


@pytest.mark.parametrize(("arch", "qtype"), CASES)
def test_logits_match_transformers_loading_the_same_gguf(
        families: dict[str, tuple[Any, Any]], tmp_path: Path, arch: str, qtype: str) -> None:
    hf_model, tokenizer = families[arch]
    path = write_gguf(tmp_path / f"{arch}-{qtype}.gguf", hf_model, tokenizer, arch, qtype)
    if qtype == "F32":  # the whole serving path: config + tokenizer directory, then the loader
        model = load_model(ensure_gguf_model_dir(path, tmp_path / "served"))
    else:  # the same weight loader, the spec straight from the file's metadata
        spec = ModelSpec.from_config(hf_config_dict(open_reader(path), path))
        weights = load_gguf_weights(path, spec, torch.device("cpu"), torch.float32)
        model = Transformer(spec, weights, ComputeOptions())
    seq = tokens()
    ours, reference = our_logits(model, seq), transformers_gguf_logits(path, seq)
    assert reference.abs().max() > 1.0, "a degenerate model would hide layout errors"
    assert (ours - reference).abs().max().item() <= TOL
    if qtype == "F32":  # lossless: also the original model, independent of transformers' GGUF
        with torch.no_grad():
            original = hf_model(seq[None]).logits[0]
        assert (ours - original).abs().max().item() <= TOL


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_gguf_dequantisers_agree_with_transformers_torch_dequantisers(qtype: str) -> None:
    reference = pytest.importorskip("transformers.integrations.gguf.dequant")
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    kind = GGMLQuantizationType[qtype]
    if qtype.endswith("_K"):
        blocks = random_k_blocks(8, 512, qtype, seed=3)
    else:
        values = np.random.default_rng(3).normal(size=(8, 512)).astype(np.float32)
        blocks = quantize(values, kind)
    ours = dequantize(blocks, kind)
    theirs = reference.dequantize(torch.from_numpy(blocks.copy()), int(kind)).reshape(8, 512)
    assert np.abs(ours).max() > 0
    np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6, atol=1e-7)


def test_unsupported_quantisation_type_is_refused_naming_tensor_and_type(
        families: dict[str, tuple[Any, Any]], tmp_path: Path) -> None:
    hf_model, tokenizer = families["llama"]
    path = write_gguf(tmp_path / "iq.gguf", hf_model, tokenizer, "llama", "Q8_0",
                      overrides={"blk.1.ffn_up.weight": "IQ4_NL"})
    with pytest.raises(UserError, match=r"blk\.1\.ffn_up\.weight has GGML type IQ4_NL"):
        resolve_source(f"gguf:{path}", str(tmp_path / "data"))
    models = tmp_path / "data" / "models"
    assert not models.exists() or not any(models.iterdir()), "nothing half-written is left"


def test_unsupported_architecture_is_refused_naming_general_architecture(
        families: dict[str, tuple[Any, Any]], tmp_path: Path) -> None:
    hf_model, tokenizer = families["qwen3"]
    path = write_gguf(tmp_path / "qwen2.gguf", hf_model, tokenizer, "qwen3", "F16",
                      general_architecture="qwen2")
    with pytest.raises(UserError, match=r"general\.architecture.*'qwen2' is not supported"):
        resolve_source(f"gguf:{path}", str(tmp_path / "data"))


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(UserError, match="not a readable GGUF file"):
        resolve_source(f"gguf:{path}", str(tmp_path / "data"))
    with pytest.raises(UserError, match="no such file"):
        resolve_source(f"gguf:{tmp_path / 'absent.gguf'}", str(tmp_path / "data"))


def test_quick_index_reads_what_the_gguf_packages_reader_reads(
        families: dict[str, tuple[Any, Any]], tmp_path: Path) -> None:
    from gguf import GGUFReader

    hf_model, tokenizer = families["qwen3"]
    path = write_gguf(tmp_path / "m.gguf", hf_model, tokenizer, "qwen3", "Q4_1",
                      overrides={"blk.0.ffn_down.weight": "BF16", "blk.1.attn_q.weight": "F16"})
    reference, ours = GGUFReader(str(path)), GGUFIndex(path, full_arrays=("tokenizer.ggml.tokens",))
    assert set(ours.fields) == set(reference.fields) - {"GGUF.version", "GGUF.tensor_count",
                                                        "GGUF.kv_count"}
    for key, field in reference.fields.items():
        if key in ours.fields and key != "tokenizer.ggml.merges":
            assert ours.fields[key] == pytest.approx(field.contents()), key
    assert len(ours.fields["tokenizer.ggml.merges"]) == len(reference.fields[
        "tokenizer.ggml.merges"].contents()), "a skipped string array keeps its length"
    assert [t.name for t in ours.tensors] == [t.name for t in reference.tensors]
    for mine, theirs in zip(ours.tensors, reference.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type
        np.testing.assert_array_equal(mine.data, theirs.data)


@pytest.mark.parametrize(("extra", "message"), [
    ({"extra_kv": {"llama.rope.scaling.type": "linear"}},
     r"llama\.rope\.scaling\.type.*'linear' is not supported"),
    ({"extra_tensors": {"rope_freqs.weight": np.ones(32)}},
     r"rope_freqs\.weight: per-frequency RoPE factors"),
    ({"extra_tensors": {"blk.0.attn_q.bias": np.zeros(256)}},
     r"tensor blk\.0\.attn_q\.bias is not one a llama/qwen3 model has"),
])
def test_features_the_engine_cannot_run_are_refused_by_name(
        families: dict[str, tuple[Any, Any]], tmp_path: Path, extra: dict[str, Any],
        message: str) -> None:
    hf_model, tokenizer = families["llama"]
    path = write_gguf(tmp_path / "x.gguf", hf_model, tokenizer, "llama", "F16", **extra)
    with pytest.raises(UserError, match=message):
        resolve_source(f"gguf:{path}", str(tmp_path / "data"))
