"""`ModelSpec`: the architecture numbers of a supported base model, parsed from ``config.json``.

The families are the `family.FAMILIES` records (Qwen3 dense and MoE, Llama 3, ...): a config
is matched to one by its ``architectures`` or ``model_type``, in both the transformers 4.x
(``rope_theta`` + ``rope_scaling``) and 5.x (``rope_parameters``) layouts. Anything this engine
does not implement (biases, sliding windows, other RoPE types, other activations) is refused
with an error naming the config key, never ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, assert_never

from loraplex.domain.model import ModelInfo
from loraplex.domain.model_card import LinearAttentionCard, ModelCard, MoeSpec
from loraplex.domain.pixel_spec import PixelSpec
from loraplex.engine.model.family import (
    FAMILIES,
    Family,
    family,
    family_of_class,
    family_of_model_type,
)
from loraplex.engine.model.linear_attention_spec import (
    LinearAttentionSpec,
    parse_layer_types,
    parse_linear_attention,
)
from loraplex.engine.model.moe_spec import ExpertSpec, parse_experts, parse_gpt_oss_experts
from loraplex.engine.model.rope_spec import RopeSpec, rope_of
from loraplex.engine.model.stage import Stage
from loraplex.engine.model.vision_spec import VisionSpec, vision_of
from loraplex.errors import user_error

__all__ = ["ModelSpec", "RopeSpec"]


@dataclass(frozen=True)
class ModelSpec:
    """Everything the transformer needs to know about a base model's shape.

    Attributes:
        arch: ``qwen3`` / ``qwen3_moe`` (q_norm/k_norm on each head) or ``llama``.
        vocab_size, hidden_size, intermediate_size, num_layers: usual meanings
            (``intermediate_size``: the dense MLPs; a MoE model's dense-only layers).
        num_heads, num_kv_heads, head_dim: attention shape; ``num_heads % num_kv_heads == 0``.
        rms_norm_eps: epsilon of every RMSNorm.
        rope: rotary embedding parameters.
        tie_word_embeddings: the output head reuses the input embedding matrix.
        max_position_embeddings: the model's context limit.
        bos_token_id: beginning-of-sequence token, if any.
        eos_token_ids: tokens that end a completion (config + generation_config).
        experts: the routed experts (mixture-of-experts models), None for dense ones.
        layer_types: each layer's token mixer (`linear_attention_spec`); empty: every layer
            full attention.
        linear: the linear-attention layers' shape (hybrid models), else None.
        sliding_window: keys a ``sliding_attention`` layer's query sees (its own included).
        weight_prefix: the prefix of the decoder's weight names in the checkpoint
            (``model.language_model.`` in a multimodal Qwen3.5 one).
        stage, whole: a pipeline stage's spec (`sliced`): its stage, and the whole model's
            spec; None for a whole model.
        vision: the vision tower of a multimodal checkpoint whose family runs one (None:
            text only; also when the config's image token is outside the vocabulary).
        pixels: its images' patching (``preprocessor_config.json``; set with ``vision``).
    """

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeSpec
    tie_word_embeddings: bool
    max_position_embeddings: int
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    experts: ExpertSpec | None = None
    layer_types: tuple[str, ...] = ()
    linear: LinearAttentionSpec | None = None
    sliding_window: int | None = None
    weight_prefix: str = "model."
    stage: Stage | None = None
    whole: ModelSpec | None = None
    vision: VisionSpec | None = None
    pixels: PixelSpec | None = None

    def sliced(self, stage: Stage) -> ModelSpec:
        """The spec of one pipeline stage: its ``num_layers`` layers numbered from 0 (their
        model layers start at `first_layer`), the embedding and head where `holds_embed` and
        `holds_head` say, and `whole_spec` the model's."""
        experts = self.experts
        if experts is not None:
            experts = replace(experts, sparse_layers=tuple(
                i - stage.first_layer for i in experts.sparse_layers
                if stage.first_layer <= i < stage.end_layer))
        types = self.layer_types[stage.first_layer:stage.end_layer] if self.layer_types else ()
        return replace(self, num_layers=stage.num_layers, experts=experts, layer_types=types,
                       stage=stage, whole=self)

    @property
    def whole_spec(self) -> ModelSpec:
        """The whole model's spec (itself unless this is a stage's)."""
        return self.whole if self.whole is not None else self

    @property
    def first_layer(self) -> int:
        """The model layer of this spec's layer 0."""
        return 0 if self.stage is None else self.stage.first_layer

    @property
    def holds_head(self) -> bool:
        """Whether the final norm and the head are here (the last stage's)."""
        return self.stage is None or self.stage.is_last

    @property
    def holds_embed(self) -> bool:
        """Whether the embedding is here: the first stage's, or the last stage's when it is
        the head too (tied: held once)."""
        if self.stage is None:
            return True
        return self.stage.is_last if self.tie_word_embeddings else self.stage.is_first

    @property
    def family(self) -> Family:
        """This model's `Family` record."""
        return family(self.arch)

    @property
    def has_qk_norm(self) -> bool:
        return self.family.qk_norm

    def layer_type(self, layer: int) -> str:
        """Layer ``layer``'s token mixer."""
        return self.layer_types[layer] if self.layer_types else "full_attention"

    def is_linear(self, layer: int) -> bool:
        """Layer ``layer`` is a gated-DeltaNet (linear attention) layer."""
        return self.layer_type(layer) == "linear_attention"

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Layers with softmax attention (full or sliding-window)."""
        return tuple(i for i in range(self.num_layers) if not self.is_linear(i))

    @property
    def linear_layers(self) -> tuple[int, ...]:
        """Layers with linear attention."""
        return tuple(i for i in range(self.num_layers) if self.is_linear(i))

    @property
    def q_proj_size(self) -> int:
        """Rows of the query projection: the queries, and as many gate values with an output
        gate (Qwen3.5)."""
        return self.q_size * (2 if self.family.attention_gate else 1)

    def is_sparse(self, layer: int) -> bool:
        """Layer ``layer`` routes its tokens to experts (else it has a dense MLP)."""
        return self.experts is not None and self.experts.is_sparse(layer)

    @property
    def dense_mlp_layers(self) -> tuple[int, ...]:
        """Layers with a dense MLP (every layer of a dense model)."""
        return tuple(i for i in range(self.num_layers) if not self.is_sparse(i))

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_params(self, layer: int = 0) -> int:
        """Weights of one layer with a dense MLP (its attention or linear attention, MLP and
        norms)."""
        d, q, kv, ff = self.hidden_size, self.q_size, self.kv_size, self.intermediate_size
        if self.is_linear(layer):
            assert self.linear is not None
            return self.linear.layer_params(d) + 3 * d * ff + 2 * d
        norms = 2 * d + (2 * self.head_dim if self.has_qk_norm else 0)
        return d * self.q_proj_size + 2 * d * kv + q * d + 3 * d * ff + norms

    def num_params(self) -> int:
        """All parameters, embeddings included (a tied head counted once)."""
        if self.whole is not None:
            return self.whole.num_params()
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        blocks = sum(self.layer_params(i) for i in range(self.num_layers))
        if self.experts is not None:  # a sparse layer: router + experts instead of the MLP
            moe = self.experts.layer_params(self.hidden_size) - 3 * self.hidden_size * (
                self.intermediate_size)
            blocks += len(self.experts.sparse_layers) * moe
        return embed + head + blocks + self.hidden_size

    def model_info(self, max_context: int | None = None) -> ModelInfo:
        """The torch-free facts the rest of the system may know (the whole model's)."""
        if self.whole is not None:
            return self.whole.model_info(max_context)
        card = ModelCard(
            name=f"{self.arch} model", num_layers=self.num_layers, hidden_size=self.hidden_size,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            intermediate_size=self.intermediate_size, vocab_size=self.vocab_size,
            tie_word_embeddings=self.tie_word_embeddings, moe=self._moe_card(),
            sliding_window=self.sliding_window,
            num_sliding_layers=self.layer_types.count("sliding_attention"),
            linear=self._linear_card(), attention_gate=self.family.attention_gate,
            source="config.json")
        return ModelInfo(
            arch=self.arch, card=card,
            max_context=min(max_context or self.max_position_embeddings,
                            self.max_position_embeddings),
            eos_token_ids=self.eos_token_ids, num_params=self.num_params(),
            pixels=self.pixels if self.vision is not None else None,
            image_token_id=self.vision.image_token_id if self.vision is not None else None)

    def _moe_card(self) -> MoeSpec | None:
        e = self.experts
        if e is None:
            return None
        return MoeSpec(num_experts=e.num_experts, top_k=e.top_k,
                       expert_intermediate_size=e.expert_intermediate_size,
                       num_shared_experts=1 if e.shared_intermediate_size else 0,
                       num_dense_layers=self.num_layers - len(e.sparse_layers))

    def _linear_card(self) -> LinearAttentionCard | None:
        m = self.linear
        if m is None:
            return None
        return LinearAttentionCard(num_layers=len(self.linear_layers), num_k_heads=m.num_k_heads,
                                   k_head_dim=m.k_head_dim, num_v_heads=m.num_v_heads,
                                   v_head_dim=m.v_head_dim)

    @staticmethod
    def from_dir(model_dir: str | Path) -> ModelSpec:
        """Parse ``config.json`` (and ``generation_config.json`` for eos ids, when present)."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise user_error("model", f"{model_dir}: no config.json")
        config = json.loads(path.read_text())
        gen_path = Path(model_dir) / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
        pre_path = Path(model_dir) / "preprocessor_config.json"
        pre = json.loads(pre_path.read_text()) if pre_path.is_file() else None
        return ModelSpec.from_config(config, generation_config=gen, preprocessor=pre)

    @staticmethod
    def from_config(
        config: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None,
        preprocessor: Mapping[str, Any] | None = None,
    ) -> ModelSpec:
        """Parse a config.json mapping; unsupported features raise a UserError naming the key."""
        fam = _family_of(config)
        arch, nested = fam.arch, fam.text_config is not None and fam.text_config in config
        vision = vision_of(config) if fam.vision else None
        pixels = (PixelSpec.from_config(config["vision_config"], preprocessor)
                  if vision is not None else None)
        if nested:
            config = _text_config(config, fam)
        _refuse_unsupported(config, fam)
        hidden = int(config["hidden_size"])
        num_heads, num_kv_heads, head_dim = _heads(config, hidden)
        max_pos = int(config.get("max_position_embeddings", 2048))
        eos = _eos_ids(config, generation_config or {})
        bos = (generation_config or {}).get("bos_token_id", config.get("bos_token_id"))
        num_layers = int(config["num_hidden_layers"])
        experts = _experts_of(fam, config, num_layers)
        layer_types = parse_layer_types(config, num_layers, fam.layer_types)
        return ModelSpec(
            arch=arch,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=_intermediate_size(config, experts),
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope=_with_mrope(rope_of(config, max_pos), fam),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_position_embeddings=max_pos,
            bos_token_id=int(bos) if isinstance(bos, int) else None,
            eos_token_ids=eos,
            experts=experts,
            layer_types=layer_types,
            linear=(parse_linear_attention(config) if "linear_attention" in layer_types
                    else None),
            weight_prefix=fam.text_prefix if nested else "model.",
            sliding_window=(int(config["sliding_window"]) if "sliding_attention" in layer_types
                            else None),
            vision=(vision if vision is not None and vision.image_token_id < int(
                config["vocab_size"]) else None),
            pixels=pixels,
        )


def _with_mrope(rope: RopeSpec, fam: Family) -> RopeSpec:
    """A multimodal family's rope keeps transformers' default M-RoPE split when the config
    names none."""
    if rope.mrope_section is None and fam.mrope_section is not None:
        return replace(rope, mrope_section=fam.mrope_section)
    return rope


def _family_of(config: Mapping[str, Any]) -> Family:
    """The family a config names: by its ``architectures``, else its ``model_type``."""
    classes = config.get("architectures")
    for cls in classes or ():
        found = family_of_class(cls)
        if found is not None:
            return found
    if classes:
        known = sorted(c for f in FAMILIES.values() for c in f.hf_classes)
        raise user_error("config.architectures", f"unsupported {classes}; supported: {known}")
    model_type = config.get("model_type")
    found = family_of_model_type(model_type) if isinstance(model_type, str) else None
    if found is None:
        known = sorted(t for f in FAMILIES.values() for t in f.model_types)
        raise user_error("config.model_type", f"unsupported {model_type!r}; supported: {known}")
    return found



def _text_config(config: Mapping[str, Any], fam: Family) -> dict[str, Any]:
    """A multimodal config's text-model numbers, with the outer config's other keys (and its
    ``tie_word_embeddings``: the model class's outer config ties)."""
    assert fam.text_config is not None
    outer = {k: v for k, v in config.items() if k not in (fam.text_config, "vision_config")}
    text = {**outer, **config[fam.text_config]}
    if "tie_word_embeddings" in outer:
        text["tie_word_embeddings"] = outer["tie_word_embeddings"]
    return text


def _heads(config: Mapping[str, Any], hidden: int) -> tuple[int, int, int]:
    """``(num_heads, num_kv_heads, head_dim)``; the KV heads must divide the query heads."""
    num_heads = int(config["num_attention_heads"])
    num_kv_heads = int(config.get("num_key_value_heads") or num_heads)
    if num_heads % num_kv_heads:
        raise user_error("config.num_key_value_heads",
                         f"{num_kv_heads} does not divide num_attention_heads {num_heads}")
    return num_heads, num_kv_heads, int(config.get("head_dim") or hidden // num_heads)


def _refuse_unsupported(config: Mapping[str, Any], fam: Family) -> None:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise user_error("config.hidden_act", f"only silu is supported, got {act!r}")
    refused = ["mlp_bias", "use_sliding_window"] + ([] if fam.attention_bias
                                                     else ["attention_bias"])
    for key in refused:
        if config.get(key):
            raise user_error(f"config.{key}", "is not supported by this engine")
    quantization = config.get("quantization_config")
    if quantization and not (fam.experts == "gpt_oss"
                             and quantization.get("quant_method") == "mxfp4"):
        raise user_error("config.quantization_config",
                         "quantized checkpoints are not supported (but gpt-oss's MXFP4 experts)")


def _experts_of(fam: Family, config: Mapping[str, Any], num_layers: int) -> ExpertSpec | None:
    match fam.experts:
        case "none":
            return None
        case "gpt_oss":
            return parse_gpt_oss_experts(config, num_layers)
        case "qwen3_moe" | "qwen3_5_moe":
            return parse_experts(config, num_layers, shared=fam.experts == "qwen3_5_moe",
                                 renormalize=fam.experts_renormalize)
        case _ as unknown:
            assert_never(unknown)


def _intermediate_size(config: Mapping[str, Any], experts: ExpertSpec | None) -> int:
    """The dense MLPs' width; a MoE config whose layers are all sparse may have none
    (Qwen3.5-MoE; gpt-oss's ``intermediate_size`` is its experts'): 0 then."""
    if experts is not None and experts.router == "topk_softmax":
        return 0
    if "intermediate_size" in config:
        return int(config["intermediate_size"])
    if experts is not None and len(experts.sparse_layers) == int(config["num_hidden_layers"]):
        return 0
    raise user_error("config.intermediate_size", "is required")


def _eos_ids(config: Mapping[str, Any], generation_config: Mapping[str, Any]) -> tuple[int, ...]:
    ids: list[int] = []
    for source in (generation_config.get("eos_token_id"), config.get("eos_token_id")):
        values = source if isinstance(source, list) else [source]
        ids += [int(v) for v in values if isinstance(v, int) and int(v) not in ids]
    return tuple(ids)
