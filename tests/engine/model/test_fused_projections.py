"""Fused q/k/v projections, and RoPE, give the bits of the unfused HF formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from loraplex.engine.model.rope import RopeTable, apply_rope
from loraplex.engine.model.spec import ModelSpec, RopeSpec
from loraplex.engine.model.weights import fuse_projections, random_weights


@pytest.mark.parametrize(("d", "sizes"), [(576, (576, 192, 192)), (576, (1536, 1536)),
                                          (512, (512, 256, 256))])
def test_a_fused_gemm_gives_each_projection_the_bits_of_its_own_gemm(
        d: int, sizes: tuple[int, ...]) -> None:
    """The environment assumption `FusedProjections` rests on (MKL: an output column depends
    on its weight row only); fails loudly on a BLAS change."""
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, d, generator=gen) for n in sizes]
    for rows in (16, 64, 1024):
        x = torch.randn(rows, d, generator=gen)
        parts = F.linear(x, torch.cat(weights)).split(sizes, dim=1)
        for w, part in zip(weights, parts, strict=True):
            assert torch.equal(part, F.linear(x, w))


def test_fusing_rebinds_the_layer_fields_to_views_of_one_weight() -> None:
    spec = ModelSpec(arch="llama", vocab_size=64, hidden_size=32, intermediate_size=48,
                     num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6,
                     rope=RopeSpec(1e4), tie_word_embeddings=True, max_position_embeddings=64)
    layer = random_weights(spec, 0).layers[0]
    before = [t.clone() for t in (layer.q_proj, layer.k_proj, layer.v_proj)]
    fused = fuse_projections(layer)
    assert fused.qkv_sizes == (32, 16, 16)
    after = (layer.q_proj, layer.k_proj, layer.v_proj)
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old, new) and new.is_contiguous()
    assert layer.v_proj.data_ptr() == fused.qkv[48:].data_ptr()


def test_rope_is_transformers_rotary_embedding_bit_for_bit() -> None:
    table = RopeTable(RopeSpec(1e4), 64, torch.device("cpu"), torch.float32)
    positions = torch.tensor([0, 5, 130, 4097])
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(4, 9, 64, generator=gen), torch.randn(4, 3, 64, generator=gen)
    cos, signed_sin = table.lookup(positions)
    table_cos, table_sin = table.cos[positions], table.sin[positions]
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1), k.transpose(0, 1), table_cos, table_sin,
                                      unsqueeze_dim=0)
    assert torch.equal(apply_rope(q, cos, signed_sin), hf_q.transpose(0, 1))
    assert torch.equal(apply_rope(k, cos, signed_sin), hf_k.transpose(0, 1))


@pytest.mark.parametrize(("vocab", "d"), [(49152, 576), (3000, 256)])
def test_the_chunked_head_gives_the_bits_of_one_head_gemm(vocab: int, d: int) -> None:
    """`Transformer.logits` splits a small no-grad batch's head GEMM by vocab rows (the same
    MKL assumption as above); the trainer's one GEMM and the sampler's chunks must agree."""
    from loraplex.engine.model.transformer import HEAD_CHUNK, HEAD_CHUNK_MAX_ROWS

    gen = torch.Generator().manual_seed(2)
    head = torch.randn(vocab, d, generator=gen)
    for rows in (1, 16, 32, HEAD_CHUNK_MAX_ROWS):
        x = torch.randn(rows, d, generator=gen)
        chunked = torch.cat([F.linear(x, w) for w in head.split(HEAD_CHUNK)], dim=1)
        assert torch.equal(chunked, F.linear(x, head))
