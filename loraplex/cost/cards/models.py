"""The catalogue of model cards: public config.json numbers of the models the cost model prices.

Each card cites the Hugging Face repo whose config.json it copies and the fields used; the
derived parameter counts are checked against the publishers' headline numbers in
tests/cost/cards/test_models.py. A model loraplex has loaded describes itself with a card of
its own (`ModelInfo.card`, built by the engine from its config.json).
"""

from __future__ import annotations

from dataclasses import replace

from loraplex.cost.catalogue import look_up
from loraplex.domain.model_card import LinearAttentionCard, MlaSpec, ModelCard, MoeSpec

_QWEN3_FIELDS = ("hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
                 "num_key_value_heads, head_dim, vocab_size, tie_word_embeddings")
_QWEN3_MOE_FIELDS = _QWEN3_FIELDS + ", num_experts, num_experts_per_tok, moe_intermediate_size"
_DEEPSEEK_FIELDS = ("hidden_size, intermediate_size, moe_intermediate_size, num_hidden_layers, "
                    "num_attention_heads, n_routed_experts, n_shared_experts, "
                    "num_experts_per_tok, first_k_dense_replace, q_lora_rank, kv_lora_rank, "
                    "qk_nope_head_dim, qk_rope_head_dim, v_head_dim, vocab_size")
_LLAMA3_FIELDS = ("hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
                  "num_key_value_heads, vocab_size, tie_word_embeddings (head_dim = hidden_size "
                  "/ heads)")


def _qwen3(repo: str, num_layers: int, hidden_size: int, num_heads: int, num_kv_heads: int,
           intermediate_size: int, moe: MoeSpec | None = None, tied: bool = False,
           note: str = "") -> ModelCard:
    """A Qwen3 card: every size shares head_dim 128 and the 151,936-token vocabulary."""
    fields = _QWEN3_MOE_FIELDS if moe else _QWEN3_FIELDS
    return ModelCard(
        name=repo, num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=128, intermediate_size=intermediate_size,
        vocab_size=151936, tie_word_embeddings=tied, moe=moe,
        source=f"huggingface.co/{repo} config.json: {fields}{f' ({note})' if note else ''}")


def _llama3(repo: str, num_layers: int, hidden_size: int, num_heads: int,
            intermediate_size: int) -> ModelCard:
    """A Llama 3.1 card: 8 KV heads of 128, the 128,256-token vocabulary, untied head."""
    return ModelCard(
        name=repo, num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads,
        num_kv_heads=8, head_dim=128, intermediate_size=intermediate_size, vocab_size=128256,
        source=f"huggingface.co/{repo} config.json: {_LLAMA3_FIELDS}")


_QWEN3_5_FIELDS = ("text_config: hidden_size, intermediate_size or moe_intermediate_size and "
                   "shared_expert_intermediate_size, num_hidden_layers, num_attention_heads, "
                   "num_key_value_heads, head_dim 256, linear_num_key_heads 16, "
                   "linear_key_head_dim 128, linear_num_value_heads, linear_value_head_dim "
                   "128, full_attention_interval 4 (a quarter of the layers attend fully), "
                   "vocab_size 248320; text model only (the vision tower and the MTP layer "
                   "are not counted); LoRA counts checked against tinker-cookbook 0.6.1")


def _qwen3_5(repo: str, num_layers: int, hidden_size: int, num_heads: int, num_kv_heads: int,
             intermediate_size: int, linear_value_heads: int, moe: MoeSpec | None = None,
             tied: bool = False) -> ModelCard:
    """A Qwen3.5 / 3.6 card: three gated-DeltaNet layers of four, gated full attention."""
    return ModelCard(
        name=repo, num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=256, intermediate_size=intermediate_size,
        vocab_size=248320, tie_word_embeddings=tied, moe=moe, attention_gate=True,
        linear=LinearAttentionCard(num_layers=num_layers * 3 // 4, num_k_heads=16,
                                   k_head_dim=128, num_v_heads=linear_value_heads,
                                   v_head_dim=128),
        source=f"huggingface.co/{repo} config.json {_QWEN3_5_FIELDS}")


def _gpt_oss(repo: str, num_layers: int, num_experts: int, weight_bytes_per_param: float,
             fields: str) -> ModelCard:
    """A gpt-oss card: width 2880, 64 query heads of 64 over 8 KV heads, top-4 experts of 2880,
    the 201,088-token vocabulary; half the layers attend to a 128-token window."""
    return ModelCard(
        name=repo, num_layers=num_layers, hidden_size=2880, num_heads=64, num_kv_heads=8,
        head_dim=64, intermediate_size=2880, vocab_size=201088,
        moe=MoeSpec(num_experts=num_experts, top_k=4, expert_intermediate_size=2880),
        sliding_window=128, num_sliding_layers=num_layers // 2,
        weight_bytes_per_param=weight_bytes_per_param,
        source=f"huggingface.co/{repo} config.json: {fields}")


def _kimi_k2(repo: str, weight_bytes_per_param: float, dtype_note: str) -> ModelCard:
    return ModelCard(
        name=repo, num_layers=61, hidden_size=7168, num_heads=64, num_kv_heads=64, head_dim=128,
        intermediate_size=18432, vocab_size=163840,
        mla=MlaSpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                    qk_rope_head_dim=64, v_head_dim=128),
        moe=MoeSpec(num_experts=384, top_k=8, expert_intermediate_size=2048,
                    num_shared_experts=1, num_dense_layers=1),
        weight_bytes_per_param=weight_bytes_per_param,
        source=f"huggingface.co/{repo} config.json: {_DEEPSEEK_FIELDS}; {dtype_note}")


# Qwen3 and Llama rows: repo, num_hidden_layers, hidden_size, num_attention_heads,
# [num_key_value_heads,] intermediate_size.
MODEL_CARDS: dict[str, ModelCard] = {card.name: card for card in (
    # Instruct-2507 (the Tinker model) has Qwen3-4B's architecture; only max_position_embeddings
    # differs.
    *(_qwen3(repo, 36, 2560, 32, 8, 9728, tied=True)
      for repo in ("Qwen/Qwen3-4B", "Qwen/Qwen3-4B-Instruct-2507")),
    _qwen3("Qwen/Qwen3-8B", 36, 4096, 32, 8, 12288),
    _qwen3("Qwen/Qwen3-32B", 64, 5120, 64, 8, 25600),
    _qwen3("Qwen/Qwen3-30B-A3B", 48, 2048, 32, 4, 6144,
           moe=MoeSpec(num_experts=128, top_k=8, expert_intermediate_size=768),
           note="every layer sparse: decoder_sparse_step 1, mlp_only_layers []"),
    _qwen3("Qwen/Qwen3-235B-A22B", 94, 4096, 64, 4, 12288,
           moe=MoeSpec(num_experts=128, top_k=8, expert_intermediate_size=1536),
           note="Qwen3-235B-A22B-Instruct-2507 has the same architecture"),
    _llama3("meta-llama/Llama-3.1-8B", 32, 4096, 32, 14336),
    _llama3("meta-llama/Llama-3.1-70B", 80, 8192, 64, 28672),
    _kimi_k2("moonshotai/Kimi-K2-Instruct", 1.0,
             "weights published in block-scaled FP8 (quantization_config fp8)"),
    # Same architecture; experts published as INT4 (compressed-tensors, group 32), the rest bf16.
    _kimi_k2("moonshotai/Kimi-K2-Thinking", 0.6,
             "routed experts published in INT4 (compressed-tensors, group size 32)"),
    ModelCard(
        name="deepseek-ai/DeepSeek-V3", num_layers=61, hidden_size=7168, num_heads=128,
        num_kv_heads=128, head_dim=128, intermediate_size=18432, vocab_size=129280,
        mla=MlaSpec(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                    qk_rope_head_dim=64, v_head_dim=128),
        moe=MoeSpec(num_experts=256, top_k=8, expert_intermediate_size=2048,
                    num_shared_experts=1, num_dense_layers=3),
        weight_bytes_per_param=1.0,
        source=f"huggingface.co/deepseek-ai/DeepSeek-V3 config.json: {_DEEPSEEK_FIELDS}; "
               "FP8 weights; the multi-token-prediction layer (num_nextn_predict_layers) is not "
               "counted (it is not used for sampling or training here)"),
    # MXFP4 experts (4.25 bits) and bf16 attention/embeddings: ~65 GB for 117B weights.
    _gpt_oss("openai/gpt-oss-120b", 36, 128, 0.56,
             "hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
             "num_key_value_heads, head_dim, num_local_experts, num_experts_per_tok, "
             "vocab_size, sliding_window, layer_types (alternating sliding/full)"),
    _gpt_oss("openai/gpt-oss-20b", 24, 32, 0.6,
             "the 120b's fields (24 layers, 32 experts); MXFP4 experts: ~13 GB for 21B weights"),
    _qwen3_5("Qwen/Qwen3.5-4B", 32, 2560, 16, 4, 9216, 32, tied=True),
    _qwen3_5("Qwen/Qwen3.5-27B", 64, 5120, 24, 4, 17408, 48),
    _qwen3_5("Qwen/Qwen3.6-27B", 64, 5120, 24, 4, 17408, 48),
    *(_qwen3_5(repo, 40, 2048, 16, 2, 0, 32,
               moe=MoeSpec(num_experts=256, top_k=8, expert_intermediate_size=512,
                           num_shared_experts=1))
      for repo in ("Qwen/Qwen3.5-35B-A3B", "Qwen/Qwen3.5-35B-A3B-Base", "Qwen/Qwen3.6-35B-A3B")),
    _qwen3_5("Qwen/Qwen3.5-397B-A17B", 60, 4096, 32, 2, 0, 64,
             moe=MoeSpec(num_experts=512, top_k=10, expert_intermediate_size=1024,
                         num_shared_experts=1)),
)}
#: Qwen3-VL: its text model is the Qwen3-MoE of the same size (text_config); the frozen vision
#: tower adds ~0.4B parameters Tinker neither adapts nor (by its LoRA counts) prices.
MODEL_CARDS |= {vl: replace(MODEL_CARDS[text], name=vl, source=(
    MODEL_CARDS[text].source.replace(text, vl) + " (text_config; the vision tower is frozen)"))
    for vl, text in (("Qwen/Qwen3-VL-30B-A3B-Instruct", "Qwen/Qwen3-30B-A3B"),
                     ("Qwen/Qwen3-VL-235B-A22B-Instruct", "Qwen/Qwen3-235B-A22B"))}


def get_model_card(name: str) -> ModelCard:
    """The catalogued card for ``name`` (an HF repo id).

    Raises:
        UserError: the model is not catalogued; the message lists the known names.
    """
    return look_up(MODEL_CARDS, name, "model", "model card")
