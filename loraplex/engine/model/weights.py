"""`BaseWeights`: the frozen tensors of a base model, and their Hugging Face parameter names.

One `LayerWeights` per decoder block. Linear weights keep the HF ``(out, in)`` layout so
``F.linear(x, w)`` applies them. A mixture-of-experts layer has `ExpertWeights` instead of
the dense MLP (`expert_weights`); a linear-attention layer `DeltaNetWeights` instead of the
attention projections (`delta_net_weights`). A tied model's ``lm_head`` is the embedding
tensor itself (same storage). Names here are always ``model.…`` (a checkpoint's own prefix is
`checkpoint`'s business). Zero-centred RMSNorm weights (`Family.zero_centered_norms`: stored
``w``, applied ``1 + w``) are held as ``1 + w`` so every norm computes the same way.
Knows nothing about files; `checkpoint` reads and writes them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, fields

import torch

from loraplex.engine.model import delta_net_weights, gpt_oss_experts
from loraplex.engine.model.delta_net_weights import DeltaNetWeights, random_delta_net
from loraplex.engine.model.expert_weights import (
    ExpertWeights,
    expert_named_tensors,
    expert_names,
    experts_from_hf,
    fused_name,
    random_experts,
)
from loraplex.engine.model.spec import ModelSpec

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HF_MODULE_OF_LINEAR = {
    "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
HF_NAME_OF_NORM = {
    "input_norm": "input_layernorm", "post_attn_norm": "post_attention_layernorm",
    "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
}
#: The full name suffix (after ``model.layers.{i}.``) of every tensor field.
HF_SUFFIX = {
    **{name: f"{module}.weight" for name, module in HF_MODULE_OF_LINEAR.items()},
    **{name: f"{module}.weight" for name, module in HF_NAME_OF_NORM.items()},
    **{f"{p}_bias": f"self_attn.{p}_proj.bias" for p in "qkvo"},
    "sinks": "self_attn.sinks",
}


@dataclass
class LayerWeights:
    """One decoder block. Attention layers have ``q/k/v/o_proj`` (and ``q_norm``/``k_norm``,
    biases and ``sinks`` where the family has them); a linear-attention layer has ``linear``
    instead; a sparse layer has ``experts`` and no dense MLP."""

    input_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    q_proj: torch.Tensor | None = None
    k_proj: torch.Tensor | None = None
    v_proj: torch.Tensor | None = None
    o_proj: torch.Tensor | None = None
    gate_proj: torch.Tensor | None = None
    up_proj: torch.Tensor | None = None
    down_proj: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    sinks: torch.Tensor | None = None
    linear: DeltaNetWeights | None = None
    experts: ExpertWeights | None = None

    def linear_weight(self, name: str) -> torch.Tensor:
        weight: torch.Tensor = getattr(self, name)
        return weight

    def all_tensors(self) -> list[torch.Tensor]:
        """Every tensor held (groups included)."""
        out = [t for name in TENSOR_FIELDS if (t := getattr(self, name)) is not None]
        if self.linear is not None:
            out += list(self.linear.tensors())
        if self.experts is not None:
            out += [t for t in self.experts.tensors() if t is not None]
        return out


#: The single-tensor fields of `LayerWeights` (``linear`` and ``experts`` hold groups).
TENSOR_FIELDS = tuple(f.name for f in fields(LayerWeights)
                      if f.name not in ("linear", "experts"))
ATTENTION_FIELDS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_FIELDS = ("gate_proj", "up_proj", "down_proj")
#: Norms applied as ``1 + w`` in a zero-centred family (the DeltaNet's gated norm is not).
ZERO_CENTERED = ("input_norm", "post_attn_norm", "q_norm", "k_norm")


def layer_fields(spec: ModelSpec, layer: int) -> tuple[str, ...]:
    """The single-tensor fields one layer of ``spec`` has."""
    fam = spec.family
    present = ["input_norm", "post_attn_norm"]
    if not spec.is_linear(layer):
        present += ATTENTION_FIELDS
        present += ("q_norm", "k_norm") if fam.qk_norm else ()
        present += tuple(f"{p}_bias" for p in "qkvo") if fam.attention_bias else ()
        present += ("sinks",) if fam.attention_sinks else ()
    if not spec.is_sparse(layer):
        present += MLP_FIELDS
    return tuple(f for f in TENSOR_FIELDS if f in present)


@dataclass
class BaseWeights:
    """All frozen tensors of a base model (never require grad); a pipeline stage's hold its
    own layers, ``embed`` where it embeds tokens and ``final_norm``/``lm_head`` on the last
    stage (None elsewhere: `ModelSpec.holds_embed`, `holds_head`)."""

    embed: torch.Tensor | None
    layers: list[LayerWeights]
    final_norm: torch.Tensor | None
    lm_head: torch.Tensor | None

    @property
    def vocab(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(embed, final_norm, lm_head)``; a whole model's."""
        assert self.embed is not None and self.final_norm is not None
        assert self.lm_head is not None, "this stage holds no vocabulary"
        return self.embed, self.final_norm, self.lm_head

    def nbytes(self) -> int:
        """Bytes of the distinct tensors held (a tied head once)."""
        seen: dict[int, int] = {}
        tensors = [self.embed, self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors += layer.all_tensors()
        for t in tensors:
            if t is not None:
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        return sum(seen.values())

    def named_tensors(self, spec: ModelSpec) -> Iterator[tuple[str, torch.Tensor]]:
        """HF state-dict names and tensors (zero-centred norms as HF stores them, ``w``); a
        tied head is not listed (HF omits it too). A whole model's only."""
        embed, final_norm, lm_head = self.vocab
        centred = spec.family.zero_centered_norms
        yield "model.embed_tokens.weight", embed
        for i, layer in enumerate(self.layers):
            for name in TENSOR_FIELDS:
                tensor = getattr(layer, name)
                if tensor is not None:
                    stored = tensor - 1 if centred and name in ZERO_CENTERED else tensor
                    yield f"model.layers.{i}.{HF_SUFFIX[name]}", stored
            if layer.linear is not None:
                yield from delta_net_weights.named_tensors(i, layer.linear)
            if layer.experts is not None:
                yield from (gpt_oss_experts.named_tensors(i, layer.experts)
                            if layer.experts.biases is not None
                            else expert_named_tensors(
                                i, layer.experts, spec.family.experts_transposed))
        yield "model.norm.weight", final_norm - 1 if centred else final_norm
        if not spec.tie_word_embeddings:
            yield "lm_head.weight", lm_head

    def to(self, device: torch.device | str, dtype: torch.dtype) -> BaseWeights:
        """A copy on ``device`` in ``dtype`` (tying preserved)."""
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device=device, dtype=dtype).contiguous()

        old_embed, old_norm, old_head = self.vocab
        embed = move(old_embed)
        tied = old_head is old_embed
        layers = []
        for lw in self.layers:
            values = {name: getattr(lw, name) for name in TENSOR_FIELDS}
            experts = None if lw.experts is None else lw.experts.map(move)
            linear = None if lw.linear is None else lw.linear.map(move)
            layers.append(LayerWeights(**{k: None if t is None else move(t)  # type: ignore[arg-type]
                                          for k, t in values.items()}, linear=linear,
                                       experts=experts))
        return BaseWeights(embed, layers, move(old_norm), embed if tied else move(old_head))


@dataclass(frozen=True)
class FusedProjections:
    """One layer's q, k, v weights stacked by rows (``qkv_sizes`` rows each): one GEMM instead
    of three per step, with the very bits of the separate ones (an output column of MKL's
    sgemm depends on its weight row only). Gate/up stay two GEMMs: fused, the
    ``16 × 576 → 3072`` decode GEMM measured slower than two ``→ 1536`` ones here."""

    qkv: torch.Tensor
    qkv_sizes: tuple[int, int, int]


def fuse_projections(layer: LayerWeights) -> FusedProjections:
    """Concatenate the layer's q/k/v weights and rebind those fields to row views of the
    result: the same values, held once."""
    assert layer.q_proj is not None and layer.k_proj is not None and layer.v_proj is not None
    qkv = torch.cat([layer.q_proj, layer.k_proj, layer.v_proj])
    sizes = (layer.q_proj.shape[0], layer.k_proj.shape[0], layer.v_proj.shape[0])
    layer.q_proj, layer.k_proj, layer.v_proj = qkv.split(sizes)
    return FusedProjections(qkv, sizes)


def hf_module_path(layer: int, linear: str) -> str:
    """``model.layers.{i}.self_attn.q_proj``-style module path of a linear."""
    return f"model.layers.{layer}.{HF_MODULE_OF_LINEAR[linear]}"


def from_hf_state(spec: ModelSpec, tensors: dict[str, torch.Tensor]) -> BaseWeights:
    """Assemble `BaseWeights` from HF-named tensors (already on device and in dtype); a
    stage's spec takes its own layers (HF numbers from `ModelSpec.first_layer`) and the
    vocabulary only where it holds it.

    Raises:
        KeyError: a required tensor is missing (the caller turns it into a user error).
    """
    centred = spec.family.zero_centered_norms

    def norm(t: torch.Tensor) -> torch.Tensor:  # stored w, applied 1 + w (in fp32, as HF)
        return (1.0 + t.float()).to(t.dtype) if centred else t

    layers = []
    for i in range(spec.num_layers):
        g = spec.first_layer + i
        present = layer_fields(spec, i)
        values: dict[str, torch.Tensor | None] = {
            name: tensors[f"model.layers.{g}.{HF_SUFFIX[name]}"] if name in present
            else None for name in TENSOR_FIELDS}
        for name in ZERO_CENTERED:
            if values[name] is not None:
                values[name] = norm(values[name])  # type: ignore[arg-type]
        experts = None
        if spec.experts is not None and spec.is_sparse(i):
            experts = (gpt_oss_experts.from_hf(spec.experts, g, tensors) if spec.experts.biases
                       else experts_from_hf(spec.experts, g, tensors,
                                            spec.family.experts_transposed))
        linear = delta_net_weights.from_hf(g, tensors) if spec.is_linear(i) else None
        layers.append(LayerWeights(**values, linear=linear, experts=experts))  # type: ignore[arg-type]
    embed = tensors["model.embed_tokens.weight"] if spec.holds_embed else None
    if not spec.holds_head:
        return BaseWeights(embed, layers, None, None)
    head = embed if spec.tie_word_embeddings else tensors["lm_head.weight"]
    return BaseWeights(embed, layers, norm(tensors["model.norm.weight"]), head)


def fused_expert_layers(spec: ModelSpec, names: Collection[str]) -> tuple[int, ...]:
    """The sparse layers whose experts ``names`` (a checkpoint's) hold in the fused layout
    (gpt-oss's, always fused: in MXFP4)."""
    experts = spec.experts
    if experts is None:
        return ()
    if experts.biases:
        present = frozenset(names)
        return tuple(i for i in experts.sparse_layers
                     if gpt_oss_experts.is_quantized(spec.first_layer + i, present))
    return tuple(i for i in experts.sparse_layers
                 if fused_name(spec.first_layer + i, "gate_up_proj") in names)


def expected_names(spec: ModelSpec, fused_layers: Collection[int] = ()) -> set[str]:
    """HF names a checkpoint of this spec must contain (``fused_layers``: sparse layers whose
    experts the checkpoint stores fused, `expert_weights`); a stage's: its own."""
    names = set()
    if spec.holds_embed:
        names.add("model.embed_tokens.weight")
    if spec.holds_head:
        names.add("model.norm.weight")
        if not spec.tie_word_embeddings:
            names.add("lm_head.weight")
    for i in range(spec.num_layers):
        g = spec.first_layer + i
        names.update(f"model.layers.{g}.{HF_SUFFIX[name]}" for name in layer_fields(spec, i))
        if spec.is_linear(i):
            names.update(delta_net_weights.hf_names(g).values())
        if spec.experts is not None and spec.is_sparse(i):
            names.update(gpt_oss_experts.names(g, quantized=i in fused_layers)
                         if spec.experts.biases
                         else expert_names(spec.experts, g, fused=i in fused_layers))
    return names


def random_weights(spec: ModelSpec, seed: int, std: float = 0.02) -> BaseWeights:
    """Seeded random fp32 weights on CPU (norm weights 1): the built-in models' init (the
    draws of the older families in their original order, so their built-ins keep their
    bytes)."""
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    d, ff, fam = spec.hidden_size, spec.intermediate_size, spec.family
    layers = []
    for i in range(spec.num_layers):
        layer = LayerWeights(input_norm=torch.ones(d), post_attn_norm=torch.ones(d))
        if spec.is_linear(i):
            assert spec.linear is not None
            layer.linear = random_delta_net(spec.linear, d, normal, gen)
        else:
            layer.q_proj, layer.k_proj = normal(spec.q_proj_size, d), normal(spec.kv_size, d)
            layer.v_proj, layer.o_proj = normal(spec.kv_size, d), normal(d, spec.q_size)
            if fam.qk_norm:
                layer.q_norm, layer.k_norm = torch.ones(spec.head_dim), torch.ones(spec.head_dim)
        if spec.experts is not None and spec.is_sparse(i):
            layer.experts = random_experts(spec.experts, d, normal)
            if spec.experts.biases:
                layer.experts.biases = gpt_oss_experts.random_biases(spec.experts, d, normal)
        else:
            layer.gate_proj, layer.up_proj, layer.down_proj = (
                normal(ff, d), normal(ff, d), normal(d, ff))
        if fam.attention_bias and not spec.is_linear(i):
            layer.q_bias, layer.k_bias = normal(spec.q_size), normal(spec.kv_size)
            layer.v_bias, layer.o_bias = normal(spec.kv_size), normal(d)
        if fam.attention_sinks and not spec.is_linear(i):
            layer.sinks = torch.randn(spec.num_heads, generator=gen)
        layers.append(layer)
    embed = normal(spec.vocab_size, d)
    head = embed if spec.tie_word_embeddings else normal(spec.vocab_size, d)
    return BaseWeights(embed, layers, torch.ones(d), head)
