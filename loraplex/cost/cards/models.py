"""The catalogue of model cards: public config.json numbers of the models the cost model prices.

Each card cites the Hugging Face repo whose config.json it copies and the fields used; the
derived parameter counts are checked against the publishers' headline numbers in
tests/cost/cards/test_models.py. `card_from_model_info` builds a card for any model loraplex
has loaded (e.g. a tiny test model), from its `ModelInfo`.
"""

from __future__ import annotations

import dataclasses

from loraplex.cost.cards.architecture import MlaSpec, ModelCard, MoeSpec
from loraplex.domain.model import ModelInfo
from loraplex.errors import user_error

_QWEN3_FIELDS = ("hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "
                 "num_key_value_heads, head_dim, vocab_size, tie_word_embeddings")
_QWEN3_MOE_FIELDS = _QWEN3_FIELDS + ", num_experts, num_experts_per_tok, moe_intermediate_size"
_DEEPSEEK_FIELDS = ("hidden_size, intermediate_size, moe_intermediate_size, num_hidden_layers, "
                    "num_attention_heads, n_routed_experts, n_shared_experts, "
                    "num_experts_per_tok, first_k_dense_replace, q_lora_rank, kv_lora_rank, "
                    "qk_nope_head_dim, qk_rope_head_dim, v_head_dim, vocab_size")


def _qwen3_4b(repo: str) -> ModelCard:
    return ModelCard(
        name=repo, num_layers=36, hidden_size=2560, num_heads=32, num_kv_heads=8, head_dim=128,
        intermediate_size=9728, vocab_size=151936, tie_word_embeddings=True,
        source=f"huggingface.co/{repo} config.json: {_QWEN3_FIELDS}")


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


MODEL_CARDS: dict[str, ModelCard] = {card.name: card for card in (
    _qwen3_4b("Qwen/Qwen3-4B"),
    # Same architecture as Qwen3-4B (only max_position_embeddings differs); the Tinker model.
    _qwen3_4b("Qwen/Qwen3-4B-Instruct-2507"),
    ModelCard(
        name="Qwen/Qwen3-8B", num_layers=36, hidden_size=4096, num_heads=32, num_kv_heads=8,
        head_dim=128, intermediate_size=12288, vocab_size=151936,
        source=f"huggingface.co/Qwen/Qwen3-8B config.json: {_QWEN3_FIELDS}"),
    ModelCard(
        name="Qwen/Qwen3-32B", num_layers=64, hidden_size=5120, num_heads=64, num_kv_heads=8,
        head_dim=128, intermediate_size=25600, vocab_size=151936,
        source=f"huggingface.co/Qwen/Qwen3-32B config.json: {_QWEN3_FIELDS}"),
    ModelCard(
        name="Qwen/Qwen3-30B-A3B", num_layers=48, hidden_size=2048, num_heads=32,
        num_kv_heads=4, head_dim=128, intermediate_size=6144, vocab_size=151936,
        moe=MoeSpec(num_experts=128, top_k=8, expert_intermediate_size=768),
        source=f"huggingface.co/Qwen/Qwen3-30B-A3B config.json: {_QWEN3_MOE_FIELDS} "
               "(every layer sparse: decoder_sparse_step 1, mlp_only_layers [])"),
    ModelCard(
        name="Qwen/Qwen3-235B-A22B", num_layers=94, hidden_size=4096, num_heads=64,
        num_kv_heads=4, head_dim=128, intermediate_size=12288, vocab_size=151936,
        moe=MoeSpec(num_experts=128, top_k=8, expert_intermediate_size=1536),
        source=f"huggingface.co/Qwen/Qwen3-235B-A22B config.json: {_QWEN3_MOE_FIELDS} "
               "(Qwen3-235B-A22B-Instruct-2507 has the same architecture)"),
    ModelCard(
        name="meta-llama/Llama-3.1-8B", num_layers=32, hidden_size=4096, num_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
        source="huggingface.co/meta-llama/Llama-3.1-8B config.json: hidden_size, "
               "intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, "
               "vocab_size, tie_word_embeddings (head_dim = hidden_size / heads)"),
    ModelCard(
        name="meta-llama/Llama-3.1-70B", num_layers=80, hidden_size=8192, num_heads=64,
        num_kv_heads=8, head_dim=128, intermediate_size=28672, vocab_size=128256,
        source="huggingface.co/meta-llama/Llama-3.1-70B config.json: hidden_size, "
               "intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, "
               "vocab_size, tie_word_embeddings (head_dim = hidden_size / heads)"),
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
    ModelCard(
        name="openai/gpt-oss-120b", num_layers=36, hidden_size=2880, num_heads=64,
        num_kv_heads=8, head_dim=64, intermediate_size=2880, vocab_size=201088,
        moe=MoeSpec(num_experts=128, top_k=4, expert_intermediate_size=2880),
        sliding_window=128, num_sliding_layers=18,
        # MXFP4 experts (4.25 bits) and bf16 attention/embeddings: ~65 GB for 117B weights.
        weight_bytes_per_param=0.56,
        source="huggingface.co/openai/gpt-oss-120b config.json: hidden_size, "
               "intermediate_size, num_hidden_layers, num_attention_heads, "
               "num_key_value_heads, head_dim, num_local_experts, num_experts_per_tok, "
               "vocab_size, sliding_window, layer_types (alternating sliding/full)"),
)}


def get_model_card(name: str) -> ModelCard:
    """The catalogued card for ``name`` (an HF repo id).

    Raises:
        UserError: the model is not catalogued; the message lists the known names.
    """
    card = MODEL_CARDS.get(name)
    if card is None:
        raise user_error("model", f"no model card for {name!r}; known: {sorted(MODEL_CARDS)}")
    return card


def card_from_model_info(info: ModelInfo, name: str = "loaded-model") -> ModelCard:
    """A dense card for a model loraplex has loaded, from its architecture numbers.

    Whether the output head is tied is read off ``num_params``: a tied model stores the
    ``vocab × hidden`` table once.
    """
    untied = ModelCard(
        name=name, num_layers=info.num_layers, hidden_size=info.hidden_size,
        num_heads=info.num_heads, num_kv_heads=info.num_kv_heads, head_dim=info.head_dim,
        intermediate_size=info.intermediate_size, vocab_size=info.vocab_size,
        source=f"loaded {info.arch} model")
    table = info.vocab_size * info.hidden_size
    is_tied = abs(info.num_params - (untied.total_params - table)) < abs(
        info.num_params - untied.total_params)
    if not is_tied:
        return untied
    return dataclasses.replace(untied, tie_word_embeddings=True)
