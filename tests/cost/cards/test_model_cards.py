"""The catalogued cards against the publishers' headline parameter counts and known KV sizes."""

from __future__ import annotations

import pytest

from loraplex.cost.cards.models import MODEL_CARDS, get_model_card
from loraplex.errors import UserError

# (card, published total, published active or None, tolerance). Sources: the HF model cards
# ("Number of Parameters"), Kimi-K2's README ("1T total, 32B activated"; rounded, hence 3%),
# DeepSeek-V3's README (671B main model, 37B activated), gpt-oss's model card (116.8B, 5.1B
# active: OpenAI counts the unembedding but not the embedding lookup, our `matmul_params`).
HEADLINES = [
    ("Qwen/Qwen3-4B", 4.0e9, None, 0.01),
    ("Qwen/Qwen3-8B", 8.2e9, None, 0.01),
    ("Qwen/Qwen3-32B", 32.8e9, None, 0.01),
    ("Qwen/Qwen3-30B-A3B", 30.5e9, 3.3e9, 0.02),
    ("Qwen/Qwen3-235B-A22B", 235e9, 22e9, 0.01),
    ("meta-llama/Llama-3.1-8B", 8.03e9, None, 0.01),
    ("meta-llama/Llama-3.1-70B", 70.6e9, None, 0.01),
    ("moonshotai/Kimi-K2-Instruct", 1.0e12, 32e9, 0.03),
    ("deepseek-ai/DeepSeek-V3", 671e9, 37e9, 0.02),
    # Qwen3.5's headlines include the vision tower (≈0.4B at 27B+) the text cards leave out.
    ("Qwen/Qwen3.5-27B", 27e9, None, 0.02),
    ("Qwen/Qwen3.5-35B-A3B", 35e9, 3.45e9, 0.02),
    ("Qwen/Qwen3.5-397B-A17B", 397e9, 17e9, 0.03),
]


@pytest.mark.parametrize(("name", "total", "active", "tol"), HEADLINES)
def test_derived_counts_match_published_headlines(name: str, total: float,
                                                  active: float | None, tol: float) -> None:
    card = get_model_card(name)
    assert card.total_params == pytest.approx(total, rel=tol)
    assert card.active_params == pytest.approx(active or total, rel=tol)


def test_gpt_oss_counts() -> None:
    card = get_model_card("openai/gpt-oss-120b")
    assert card.total_params == pytest.approx(116.8e9, rel=0.01)
    assert card.matmul_params == pytest.approx(5.13e9, rel=0.01)
    assert card.weight_bytes() == pytest.approx(65e9, rel=0.03)  # MXFP4 checkpoint size


def test_gpt_oss_20b_counts() -> None:
    card = get_model_card("openai/gpt-oss-20b")
    assert card.total_params == pytest.approx(20.9e9, rel=0.01)  # OpenAI: 20.9B
    assert card.matmul_params == pytest.approx(3.6e9, rel=0.02)  # OpenAI: 3.6B active


def test_qwen3_5_hybrid_memory() -> None:
    """A quarter of the layers hold a KV cache; the rest a fixed fp32 state per sequence."""
    card = get_model_card("Qwen/Qwen3.5-27B")
    assert card.num_full_attention_layers == 16 and card.num_linear_layers == 48
    assert card.kv_bytes_per_token() == 16 * 2 * 4 * 256 * 2
    assert card.linear_state_bytes() == 48 * 48 * 128 * 128 * 4
    dense = get_model_card("Qwen/Qwen3-32B")  # 64 full-attention layers
    assert card.kv_bytes(32768) < dense.kv_bytes(32768) / 3


def test_qwen3_8b_non_embedding_count_matches_its_model_card() -> None:
    card = get_model_card("Qwen/Qwen3-8B")
    # Qwen's "Non-Embedding: 6.95B" excludes the input table and the untied head.
    assert card.total_params - 2 * 151936 * 4096 == pytest.approx(6.95e9, rel=0.005)


@pytest.mark.parametrize(("name", "kv_bytes"), [
    ("Qwen/Qwen3-4B", 36 * 2 * 8 * 128 * 2),   # 147,456 B (144 KiB)
    ("Qwen/Qwen3-8B", 36 * 2 * 8 * 128 * 2),
    ("Qwen/Qwen3-32B", 64 * 2 * 8 * 128 * 2),  # 262,144 B
    ("moonshotai/Kimi-K2-Thinking", 61 * (512 + 64) * 2),  # 70,272 B (MLA latent + rope key)
    ("meta-llama/Llama-3.1-70B", 80 * 2 * 8 * 128 * 2),
])
def test_kv_bytes_per_token(name: str, kv_bytes: int) -> None:
    assert get_model_card(name).kv_bytes_per_token() == kv_bytes


def test_catalogue_covers_the_required_models_and_cites_config_fields() -> None:
    required = {"Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B",
                "Qwen/Qwen3-235B-A22B", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B",
                "moonshotai/Kimi-K2-Instruct", "deepseek-ai/DeepSeek-V3", "openai/gpt-oss-120b"}
    assert required <= set(MODEL_CARDS)
    for card in MODEL_CARDS.values():
        assert "config.json" in card.source and "huggingface.co/" in card.source


def test_unknown_model_lists_known_names() -> None:
    with pytest.raises(UserError, match="Qwen/Qwen3-8B"):
        get_model_card("nope/nope")
