"""Writing small GGUF files from random HF models, as llama.cpp's ``convert_hf_to_gguf.py``
does: llama.cpp tensor names, Llama's q/k rows permuted, the byte-level BPE vocabulary
(``tokenizer.ggml.model = gpt2``) and chat template as metadata.

Types the ``gguf`` package can quantise (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) are
quantised from the model's weights; for the K-quants, which it can only dequantise, the model's
weights are replaced by random blocks with small scales (`random_k_blocks`), so the reference
(transformers loading the same file) sees exactly the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

HF_TO_GGUF = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
PRE = {"llama": "llama-bpe", "qwen3": "qwen2"}
#: Byte offsets of the fp16 super-block scales (d, dmin) inside one K-quant block.
K_SCALE_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
                   "Q6_K": (208,)}
CONTROL, USER_DEFINED, NORMAL = 3, 4, 1


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, module = hf_name.removesuffix(".weight").split(".", 3)
    return f"blk.{layer}.{HF_TO_GGUF[module]}.weight"


def permute_rows(weight_R_C: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` (HF half-split RoPE pairs → interleaved)."""
    rows = weight_R_C.shape[0]
    return (weight_R_C.reshape(num_heads, 2, rows // num_heads // 2, *weight_R_C.shape[1:])
            .swapaxes(1, 2).reshape(weight_R_C.shape))


def random_k_blocks(rows: int, cols: int, qtype: str, seed: int, peak: float = 0.2
                    ) -> np.ndarray:
    """Random ``qtype`` blocks for a ``rows × cols`` matrix whose values peak near ``peak``
    (other block types: random bytes as they come)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    kind = GGMLQuantizationType[qtype]
    block, size = GGML_QUANT_SIZES[kind]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    if qtype not in K_SCALE_OFFSETS:
        return data.reshape(rows, -1)
    for scale in (1.0, None):
        if scale is None:
            scale = peak / float(np.abs(dequantize(data.reshape(rows, -1), kind)).max())
        for offset in K_SCALE_OFFSETS[qtype]:
            data[:, :, offset:offset + 2] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    return data.reshape(rows, -1)


def tokenizer_vocab(tokenizer: Any) -> tuple[list[str], list[int], list[str]]:
    """(tokens in id order, llama.cpp token types, merges) of a byte-level BPE fast tokenizer."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    added = {t["id"]: t for t in state["added_tokens"]}
    vocab = {**state["model"]["vocab"], **{t["content"]: i for i, t in added.items()}}
    tokens = [""] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    types = [NORMAL if i not in added else CONTROL if added[i]["special"] else USER_DEFINED
             for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
    return tokens, types, merges


def write_gguf(path: Path, hf_model: Any, tokenizer: Any, arch: str, qtype: str = "F32", *,
               general_architecture: str | None = None, overrides: dict[str, str] | None = None,
               pre: str | None = None, extra_kv: dict[str, str] | None = None,
               extra_tensors: dict[str, np.ndarray] | None = None, seed: int = 0) -> Path:
    """Write ``hf_model`` (fp32) + ``tokenizer`` as a GGUF file; 2-D weights in ``qtype``
    (``overrides``: GGUF tensor name → type), norms in F32; ``pre``: llama.cpp pre-tokenizer
    name (default: the family's); ``extra_kv`` / ``extra_tensors``: more string metadata and F32
    tensors, as other converters write. Returns ``path``."""
    from gguf import GGUFWriter

    cfg = hf_model.config
    writer = GGUFWriter(str(path), general_architecture or arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    _add_tokenizer(writer, tokenizer, arch, pre or PRE[arch])
    for key, value in (extra_kv or {}).items():
        writer.add_string(key, value)
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, values.astype(np.float32))
    for index, (name, param) in enumerate(hf_model.state_dict().items()):
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        target = gguf_name(name)
        _add_tensor(writer, target, param, (overrides or {}).get(target, qtype), arch, cfg,
                    seed + index)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer: Any, tokenizer: Any, arch: str, pre: str) -> None:
    tokens, types, merges = tokenizer_vocab(tokenizer)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else \
        tokenizer.convert_tokens_to_ids(tokens[types.index(CONTROL)])
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(arch == "llama")
    writer.add_chat_template(tokenizer.chat_template)


def _add_tensor(writer: Any, name: str, param: torch.Tensor, qtype: str, arch: str, cfg: Any,
                seed: int) -> None:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    values = param.detach().float().numpy().copy()
    if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
        heads = cfg.num_attention_heads if "attn_q" in name else cfg.num_key_value_heads
        values = permute_rows(values, heads)
    if values.ndim == 1 or qtype == "F32":
        writer.add_tensor(name, values.astype(np.float32))
    elif qtype == "F16":
        writer.add_tensor(name, values.astype(np.float16))
    elif qtype in K_SCALE_OFFSETS or qtype.startswith("IQ"):  # no quantiser in `gguf`
        blocks = random_k_blocks(*values.shape, qtype, seed)
        writer.add_tensor(name, blocks, raw_dtype=GGMLQuantizationType[qtype])
    else:
        kind = GGMLQuantizationType[qtype]
        writer.add_tensor(name, quantize(values, kind), raw_dtype=kind)
