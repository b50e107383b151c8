"""Parameter, KV and attention counts of hand-sized architectures, worked out by hand."""

from __future__ import annotations

import pytest

from loraplex.domain.model_card import MlaSpec, ModelCard, MoeSpec
from loraplex.errors import UserError

# L=2, hidden 8, 2 heads of 4, 1 KV head, MLP 16, vocab 10.
# Per layer: q 8·8 + k 8·4 + v 8·4 + o 8·8 = 192; MLP 3·8·16 = 384; 576 × 2 layers = 1,152.
# Head 8·10 = 80, embedding 80.
DENSE = ModelCard(name="tiny", num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1,
                  head_dim=4, intermediate_size=16, vocab_size=10)

# Layer 0 dense (MLP 16), layer 1 MoE: 4 experts of width 6 (top-2) + 1 shared expert + router.
MOE = ModelCard(name="tiny-moe", num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1,
                head_dim=4, intermediate_size=16, vocab_size=10,
                moe=MoeSpec(num_experts=4, top_k=2, expert_intermediate_size=6,
                            num_shared_experts=1, num_dense_layers=1))

# One layer of MLA: q 8→4→2·(2+1), kv 8→(3+1), 3→2·(2+2), o 2·2→8.
MLA = ModelCard(name="tiny-mla", num_layers=1, hidden_size=8, num_heads=2, num_kv_heads=2,
                head_dim=4, intermediate_size=16, vocab_size=10,
                mla=MlaSpec(q_lora_rank=4, kv_lora_rank=3, qk_nope_head_dim=2,
                            qk_rope_head_dim=1, v_head_dim=2))


def test_dense_parameter_counts() -> None:
    assert DENSE.total_params == 1152 + 80 + 80
    assert DENSE.matmul_params == 1152 + 80
    assert DENSE.active_params == DENSE.total_params
    assert DENSE.embedding_params == 80


def test_tied_embedding_is_counted_once() -> None:
    tied = ModelCard(**{**DENSE.__dict__, "tie_word_embeddings": True})
    assert tied.total_params == 1152 + 80
    assert tied.matmul_params == 1152 + 80


def test_moe_counts_all_experts_in_total_and_top_k_in_active() -> None:
    attn = 2 * 192
    dense_mlp = 384
    expert = 3 * 8 * 6  # 144
    router = 8 * 4
    assert MOE.total_params == attn + dense_mlp + 4 * expert + expert + router + 80 + 80
    assert MOE.matmul_params == attn + dense_mlp + 2 * expert + expert + router + 80
    assert MOE.active_params == MOE.matmul_params + 80
    assert MOE.routed_expert_params == 4 * expert


def test_mla_parameter_counts_and_latent_kv_cache() -> None:
    attn = 8 * 4 + 4 * 2 * 3 + 8 * 4 + 3 * 2 * 4 + 2 * 2 * 8  # 144
    assert MLA.total_params == attn + 384 + 80 + 80
    # The cache holds the latent (3) and the shared rope key (1) per layer: 4 values × 2 bytes.
    assert MLA.kv_bytes_per_token() == 8
    assert MLA.qk_head_dim == 3 and MLA.v_head_dim == 2


def test_gqa_kv_bytes_per_token() -> None:
    # K and V × 2 layers × 1 KV head × 4 dims × 2 bytes.
    assert DENSE.kv_bytes_per_token() == 2 * 2 * 1 * 4 * 2
    assert DENSE.kv_bytes_per_token(bytes_per_value=1) == 16
    assert DENSE.kv_bytes(100) == 3200


def test_sliding_window_layers_hold_at_most_the_window() -> None:
    card = ModelCard(**{**DENSE.__dict__, "sliding_window": 5, "num_sliding_layers": 1})
    per_layer = 2 * 1 * 4 * 2
    assert card.kv_bytes_per_token() == per_layer
    assert card.kv_bytes(100) == per_layer * 100 + per_layer * 5
    assert card.kv_bytes(3) == per_layer * 3 * 2


def test_attention_flops_per_position() -> None:
    # QKᵀ and PV: 2 FLOPs × heads × (d_qk + d_v) = 2 · 2 · 8 per layer.
    assert DENSE.attention_flops_per_position_per_layer == 32
    assert MLA.attention_flops_per_position_per_layer == 2 * 2 * (3 + 2)


def test_decode_reads_dense_weights_once_and_experts_by_touch_probability() -> None:
    dense = 2 * 192 + 384 + 144 + 32 + 80  # all but routed experts and the embedding
    # One token touches its 2 of 4 experts; two tokens touch 1 - (1/2)² = 3/4 of them.
    assert MOE.decode_weight_read_bytes(1, 2.0) == (dense + 0.5 * 576) * 2
    assert MOE.decode_weight_read_bytes(2, 1.0) == dense + 0.75 * 576
    assert DENSE.decode_weight_read_bytes(64, 2.0) == (1152 + 80) * 2


def test_lora_sizes_dense() -> None:
    # Σ (d_in + d_out) per layer: q 16, k 12, v 12, o 16, gate/up/down 24 each = 128; head 18.
    assert DENSE.lora_rank_widths(2) == 2 * (2 * 128 + 18)
    assert DENSE.lora_params(2) == 2 * (2 * 128 + 18)
    assert DENSE.lora_params(2, unembed=False, mlp=False) == 2 * 2 * 56


def test_lora_on_experts_shares_the_hidden_factor_across_experts() -> None:
    # Tinker's scheme: per expert projection of the MoE layer r·(hidden 8 + 4 experts · 6)
    # = 32 r parameters; a token passes the shared factor once and its 2 experts' factors:
    # r·(8 + 2 · 6) = 20 r.
    attn, dense_mlp, shared, head = 2 * 56, 72, 42, 18
    assert MOE.lora_rank_widths(2) == 2 * (attn + dense_mlp + shared + head) + 2 * 3 * 20
    assert MOE.lora_params(2) == 2 * (attn + dense_mlp + shared + head) + 2 * 3 * 32


def test_invalid_cards_are_user_errors() -> None:
    with pytest.raises(UserError, match="num_layers"):
        ModelCard(**{**DENSE.__dict__, "num_layers": 0})
    with pytest.raises(UserError, match="sliding_window"):
        ModelCard(**{**DENSE.__dict__, "num_sliding_layers": 1})
