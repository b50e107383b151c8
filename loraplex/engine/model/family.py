"""`Family`: one frozen record per supported model family, from which everything else derives.

A family names what a checkpoint says about itself (the transformers classes and
``model_type``s of its ``config.json``, where the text model's numbers sit, the prefix of its
weight names), what the engine computes differently for it (norm convention, attention
output gate and biases, q/k norms, its experts' flavour), how llama.cpp names it in a GGUF
file, which tokenizer its built-ins train, and the shapes of its built-in models. The spec
parser (`spec`), the weight names (`weights`), the built-ins (`engine.builtin`), GGUF loading
(`engine.gguf`) and the CLI's ``--arch`` choices all read these records: a new family is a new
record plus whatever new computation it needs. Knows no tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

ExpertKind = Literal["none", "qwen3_moe", "qwen3_5_moe", "gpt_oss"]
LayerType = Literal["full_attention", "linear_attention", "sliding_attention"]


@dataclass(frozen=True)
class BuiltinShape:
    """What a family's built-in models (``builtin:<size>[-<suffix>]``) add to the shared sizes
    of `engine.builtin.model.SIZES`.

    Attributes:
        suffix: the built-in name's suffix (``moe`` → ``builtin:tiny-moe``); None: the plain
            ``builtin:<size>`` names.
        intermediate_size: the dense MLP width per size.
        tied: the head reuses the embedding.
        rope_theta, rope_kind: rotary embedding (``llama3`` takes Llama 3.1's scaling,
            ``yarn`` gpt-oss's).
        partial_rotary_factor: the rotating fraction of each head (Qwen3.5: a quarter).
        rms_norm_eps: every norm's epsilon.
        layer_types: the token mixer of each layer per size (None: full attention throughout).
        extra_config: config.json keys the family's built-ins set beyond the shared ones.
        sizes: the sizes it is built in (`engine.builtin.model.SIZES` keys; a ``-long``
            size is its base size with a 40,960-position context).
        mrope: its rope has M-RoPE sections (Qwen3-VL's 24:20:20 split of the rotating
            frequencies, scaled to the head).
        deepstack: its built-in vision tower feeds DeepStack features (Qwen3-VL).
    """

    suffix: str | None
    intermediate_size: Mapping[str, int]
    tied: bool
    rope_theta: float = 1e6
    rope_kind: Literal["default", "llama3", "yarn"] = "default"
    partial_rotary_factor: float = 1.0
    rms_norm_eps: float = 1e-6
    layer_types: Mapping[str, tuple[LayerType, ...]] | None = None
    extra_config: Mapping[str, object] = field(default_factory=dict)
    sizes: tuple[str, ...] = ("tiny", "small")
    mrope: bool = False
    deepstack: bool = False


@dataclass(frozen=True)
class Family:
    """One model family (see the module docstring).

    Attributes:
        arch: the engine's name for it (``ModelSpec.arch``, ``--arch``).
        hf_classes: the ``architectures`` of its configs; the first is written by built-ins.
        model_types: its ``model_type``s (a multimodal config's outer one included).
        text_config: the config key holding the text model's numbers in a multimodal config
            (Qwen3.5's ``text_config``; its built-ins are written that way, as the released
            checkpoints are), or None: a text-only family.
        text_prefix: the decoder's weight-name prefix in such a multimodal checkpoint (a
            text-only config's is ``model.``).
        tokenizer: the tokenizer family its built-ins train (`engine.builtin.tokenizer`).
        gguf_arch, gguf_rope_theta: llama.cpp's ``general.architecture`` and its default
            rope base (None: no GGUF support).
        gguf_permutes_qk: llama.cpp's converter permuted the q/k rows for its rope layout
            (Llama), which loading undoes.
        qk_norm: RMSNorm on each query and key head (Qwen3, Qwen3.5).
        zero_centered_norms: RMSNorm weights stored as ``w`` and applied as ``1 + w``
            (Qwen3-Next / Qwen3.5); the loader adds the one.
        attention_gate: the query projection also yields a per-head output gate,
            ``out · sigmoid(gate)`` before ``o_proj`` (Qwen3.5).
        attention_bias: q/k/v/o projections carry biases (gpt-oss).
        attention_sinks: a learned per-head logit in every softmax denominator (gpt-oss).
        experts: the routed-experts flavour of its sparse layers (``none``: dense).
        layer_types: the token mixers its layers may have (`linear_attention_spec`).
        ignored_weights: name prefixes of checkpoint tensors the decoder does not use (a
            vision tower, read by `vision_weights` instead; multi-token-prediction heads).
        vision: a config with a ``vision_config`` carries a vision tower the engine runs
            (`vision_spec`): image inputs, M-RoPE positions.
        mrope_section: the M-RoPE split transformers assumes when a config names none.
        experts_renormalize: its routers always renormalise the top-k weights (a config
            without ``norm_topk_prob``: Qwen3-VL-MoE's).
        experts_transposed: its fused experts are stored ``(E, d, 2f)`` / ``(E, f, d)``
            (Qwen3-VL-MoE's checkpoints), and its built-ins write them so.
        builtin: its built-in models (None: none).
    """

    arch: str
    hf_classes: tuple[str, ...]
    model_types: tuple[str, ...]
    tokenizer: str
    text_config: str | None = None
    text_prefix: str = "model.language_model."
    gguf_arch: str | None = None
    gguf_rope_theta: float | None = None
    gguf_permutes_qk: bool = False
    qk_norm: bool = False
    zero_centered_norms: bool = False
    attention_gate: bool = False
    attention_bias: bool = False
    attention_sinks: bool = False
    experts: ExpertKind = "none"
    layer_types: tuple[LayerType, ...] = ("full_attention",)
    ignored_weights: tuple[str, ...] = ()
    vision: bool = False
    mrope_section: tuple[int, int, int] | None = None
    experts_renormalize: bool = False
    experts_transposed: bool = False
    builtin: BuiltinShape | None = None

    @property
    def hf_class(self) -> str:
        """The class built-ins write into ``architectures``."""
        return self.hf_classes[0]



_QWEN3_5_TYPES: dict[str, tuple[LayerType, ...]] = {
    "tiny": ("linear_attention", "full_attention"),
    "small": ("linear_attention",) * 3 + ("full_attention",)}
_QWEN3_5_LINEAR = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 32,
                   "linear_value_head_dim": 32, "linear_num_key_heads": 2,
                   "linear_num_value_heads": 4}

FAMILIES: dict[str, Family] = {f.arch: f for f in (
    Family(arch="qwen3", hf_classes=("Qwen3ForCausalLM",), model_types=("qwen3",),
           tokenizer="qwen3", gguf_arch="qwen3", gguf_rope_theta=1_000_000.0, qk_norm=True,
           builtin=BuiltinShape(suffix=None, intermediate_size={"tiny": 384, "small": 2048},
                                tied=True, sizes=("tiny", "small", "tiny-long", "small-long"))),
    Family(arch="llama", hf_classes=("LlamaForCausalLM",), model_types=("llama",),
           tokenizer="llama", gguf_arch="llama", gguf_rope_theta=10_000.0,
           gguf_permutes_qk=True,
           builtin=BuiltinShape(suffix="llama", intermediate_size={"tiny": 384, "small": 1536},
                                tied=False, rope_theta=5e5, rope_kind="llama3",
                                rms_norm_eps=1e-5)),
    Family(arch="qwen3_moe", hf_classes=("Qwen3MoeForCausalLM",), model_types=("qwen3_moe",),
           tokenizer="qwen3", qk_norm=True, experts="qwen3_moe",
           builtin=BuiltinShape(suffix="moe", intermediate_size={"tiny": 384, "small": 2048},
                                tied=False)),
    Family(arch="qwen3_5",
           hf_classes=("Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM"),
           model_types=("qwen3_5_text", "qwen3_5"), tokenizer="qwen3_5",
           text_config="text_config", qk_norm=True, zero_centered_norms=True,
           attention_gate=True, layer_types=("linear_attention", "full_attention"),
           ignored_weights=("model.visual.", "mtp."), vision=True,
           mrope_section=(11, 11, 10),
           builtin=BuiltinShape(suffix="qwen35", intermediate_size={"tiny": 384, "small": 2048},
                                tied=True, rope_theta=1e7, partial_rotary_factor=0.25,
                                layer_types=_QWEN3_5_TYPES, extra_config=_QWEN3_5_LINEAR)),
    Family(arch="gpt_oss", hf_classes=("GptOssForCausalLM",), model_types=("gpt_oss",),
           tokenizer="harmony", attention_bias=True, attention_sinks=True, experts="gpt_oss",
           layer_types=("sliding_attention", "full_attention"),
           builtin=BuiltinShape(suffix="gptoss", intermediate_size={"tiny": 96, "small": 512},
                                tied=False, rope_theta=150000.0, rope_kind="yarn",
                                rms_norm_eps=1e-5,
                                layer_types={"tiny": ("sliding_attention", "full_attention"),
                                             "small": ("sliding_attention",
                                                       "full_attention") * 2},
                                extra_config={"sliding_window": 48})),
    Family(arch="qwen3_5_moe",
           hf_classes=("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM"),
           model_types=("qwen3_5_moe_text", "qwen3_5_moe"), tokenizer="qwen3_5",
           text_config="text_config", qk_norm=True, zero_centered_norms=True,
           attention_gate=True, experts="qwen3_5_moe",
           layer_types=("linear_attention", "full_attention"),
           ignored_weights=("model.visual.", "mtp."), vision=True,
           mrope_section=(11, 11, 10),
           builtin=BuiltinShape(suffix="qwen35-moe",
                                intermediate_size={"tiny": 384, "small": 2048}, tied=False,
                                rope_theta=1e7, partial_rotary_factor=0.25,
                                layer_types=_QWEN3_5_TYPES, extra_config=_QWEN3_5_LINEAR)),
    Family(arch="qwen3_vl", hf_classes=("Qwen3VLForConditionalGeneration",),
           model_types=("qwen3_vl_text", "qwen3_vl"), tokenizer="qwen3_vl",
           text_config="text_config", qk_norm=True, ignored_weights=("model.visual.",),
           vision=True, mrope_section=(24, 20, 20),
           builtin=BuiltinShape(suffix="vl", intermediate_size={"tiny": 384, "small": 2048},
                                tied=True, rope_theta=5e6, mrope=True, deepstack=True)),
    Family(arch="qwen3_vl_moe", hf_classes=("Qwen3VLMoeForConditionalGeneration",),
           model_types=("qwen3_vl_moe_text", "qwen3_vl_moe"), tokenizer="qwen3_vl",
           text_config="text_config", qk_norm=True, experts="qwen3_moe",
           experts_renormalize=True, experts_transposed=True,
           ignored_weights=("model.visual.",), vision=True, mrope_section=(24, 20, 20),
           builtin=BuiltinShape(suffix="vl-moe",
                                intermediate_size={"tiny": 384, "small": 2048}, tied=False,
                                rope_theta=5e6, mrope=True, deepstack=True)),
)}
ARCHES: tuple[str, ...] = tuple(FAMILIES)


def family(arch: str) -> Family:
    """The record of ``arch`` (a KeyError names the known ones)."""
    if arch not in FAMILIES:
        raise KeyError(f"unknown arch {arch!r}; known: {list(FAMILIES)}")
    return FAMILIES[arch]


def family_of_class(hf_class: str) -> Family | None:
    return next((f for f in FAMILIES.values() if hf_class in f.hf_classes), None)


def family_of_model_type(model_type: str) -> Family | None:
    return next((f for f in FAMILIES.values() if model_type in f.model_types), None)


def family_of_gguf(gguf_arch: str) -> Family | None:
    return next((f for f in FAMILIES.values() if f.gguf_arch == gguf_arch), None)


def builtin_names() -> dict[str, tuple[str, str]]:
    """Every built-in name (without ``builtin:``) → (arch, size): the plain sizes of the
    family without a suffix, ``<size>-<suffix>`` of the others."""
    names: dict[str, tuple[str, str]] = {}
    for f in FAMILIES.values():
        if f.builtin is None:
            continue
        for size in f.builtin.sizes:
            names[size if f.builtin.suffix is None else f"{size}-{f.builtin.suffix}"] = (
                f.arch, size)
    return names
