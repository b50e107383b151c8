"""`Transformer`: the decoder of every supported family over packed rows, with LoRA and a paged
KV cache (a dense layer's MLP is a `DenseMlp`, `dense_mlp`, a mixture-of-experts layer's a
`SparseMlp`, `moe`; a linear-attention layer's token mixer a `LinearAttention`,
`linear_attention`; each attention layer runs the backend `attention_backend` chose for it; how
it computes is its `ComputeOptions`, `compute_options`).

One forward serves training (full forward over packed sequences, keys/values written to
out-of-place scratch pages so autograd works), sampler prefill and one-token decode (keys/values
written in place into a `PagedKVCache`, then attended by the same kernel). Usage::

    batch = model.pack([SequenceInput(tokens, "adapter-1"), ...])
    lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    hidden_R_D = model.forward(batch, lora)      # or kv=cache for the sampler
    logprobs_R = model.token_logprobs(hidden_R_D, targets_R, lora)

Holds frozen base weights only; adapters arrive as data (`LoraBatch`). Knows nothing about
losses, optimizers, block allocation or tenants.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TypeVar

import torch
import torch.nn.functional as F

from loraplex.domain.image import ImageInput
from loraplex.domain.model import ModelInfo
from loraplex.engine.kernels.packed_linear import FrozenLinear, GemmKernel
from loraplex.engine.model.attention_backend import (
    AttentionBackend,
    LayerAttention,
    choose_backend,
)
from loraplex.engine.model.compute_options import RANK_MULTIPLE, ComputeOptions
from loraplex.engine.model.delta_net import DeltaLayout
from loraplex.engine.model.dense_mlp import DenseMlp
from loraplex.engine.model.image_encoder import ImageEncoder
from loraplex.engine.model.image_rows import ImageSpan
from loraplex.engine.model.kv_cache import PagedKVCache, scratch_pages
from loraplex.engine.model.layer_recompute import (
    activation_bytes_per_row,
    output_slots,
    recomputed,
    recomputed_layers,
    recomputes_head,
)
from loraplex.engine.model.linear_attention import LINEAR_TARGETS, LinearAttention
from loraplex.engine.model.linear_attention_spec import LinearAttentionSpec
from loraplex.engine.model.linear_states import LinearStates
from loraplex.engine.model.lora_batch import LoraBatch
from loraplex.engine.model.lora_linear import fused_lora_linear, lora_linear
from loraplex.engine.model.moe import SHARED_TARGETS, SparseMlp
from loraplex.engine.model.moe_dispatch import TokenRows
from loraplex.engine.model.packed_batch import PackedBatch, SequenceInput, pack_sequences
from loraplex.engine.model.rope import RopeTable, apply_rope
from loraplex.engine.model.spec import ModelSpec
from loraplex.engine.model.vision import ImageFeatures, VisionTower
from loraplex.engine.model.weights import (
    BaseWeights,
    LayerWeights,
    fuse_projections,
)
from loraplex.errors import user_error

#: Vocab rows per head GEMM in a small no-grad batch (decode, sampler prefill tails): MKL runs a
#: [≤256 rows] × [1024, d] GEMM out of cache at ~1.3× the speed of one [49152, d] GEMM, and an
#: output column depends on its weight row only, so the logits keep their bits.
HEAD_CHUNK = 1024
HEAD_CHUNK_MAX_ROWS = 256
T = TypeVar("T")


class Transformer:
    """A frozen base model on one device, in one compute dtype."""

    def __init__(self, spec: ModelSpec, weights: BaseWeights, options: ComputeOptions,
                 vision: VisionTower | None = None) -> None:
        self.spec = spec
        self.weights = weights
        self.options = options
        self.vision = vision
        self.images = (ImageEncoder(vision, spec.pixels)
                       if vision is not None and spec.pixels is not None else None)
        first = weights.layers[0].input_norm
        self.device, self.dtype = first.device, first.dtype
        self.rope = RopeTable(spec.rope, spec.head_dim, self.device, self.dtype)
        self._activation_row_bytes = activation_bytes_per_row(spec, first.element_size())
        # q/k/v as one GEMM; the layers' q/k/v fields become views of it.
        kernel = options.gemm
        self._fused = {i: fuse_projections(weights.layers[i]) for i in spec.attention_layers}
        self._qkv = {i: FrozenLinear(f.qkv, kernel) for i, f in self._fused.items()}
        self._o = {i: FrozenLinear(_present(weights.layers[i].o_proj), kernel)
                   for i in spec.attention_layers}
        # LoRA layer index of each attention layer (every layer but a hybrid's linear ones).
        self._attn_index = {layer: j for j, layer in enumerate(spec.attention_layers)}
        self._linear = {layer: LinearAttention(_present_linear(spec), _present(
            weights.layers[layer].linear), layer, j, kernel, spec.rms_norm_eps)
            for j, layer in enumerate(spec.linear_layers)}
        self._dense_mlps = {i: DenseMlp.of(weights.layers[i], kernel)
                            for i in spec.dense_mlp_layers}
        # The vocabulary (the last pipeline stage's, or a whole model's).
        self._head: FrozenLinear | None = None
        self._head_chunks: tuple[torch.Tensor, ...] = ()
        if weights.lm_head is not None:
            self._head = FrozenLinear(weights.lm_head, kernel)
            self._head_chunks = weights.lm_head.split(HEAD_CHUNK)
        # Each attention layer's extras and backend, chosen once (`attention_backend`).
        self._attn_layers = {i: LayerAttention(
            window=spec.sliding_window if spec.layer_type(i) == "sliding_attention" else None,
            sinks_H=weights.layers[i].sinks) for i in spec.attention_layers}
        self._backends: dict[int, AttentionBackend] = {
            i: choose_backend(a, native=options.attention,
                              batch_invariant=options.batch_invariant, device=self.device,
                              num_kv_heads=spec.num_kv_heads)
            for i, a in self._attn_layers.items()}
        # LoRA layer index of each dense MLP (all layers of a dense model) and sparse layer.
        self._dense_index = {layer: j for j, layer in enumerate(spec.dense_mlp_layers)}
        self._sparse = _sparse_mlps(spec, weights, options.effective_row_multiple, kernel)
        # Rows need no padding as a whole where every dense GEMM over them is the packed
        # kernel's (its rows never depend on the row count; LoRA segments stay padded) and
        # attention the C kernel's: not with a router, a linear-attention layer, a vision
        # tower, sinks or sliding windows (the tiled torch kernel) beside them.
        self._compact_rows = (
            kernel is not None and options.attention is not None and not self._sparse
            and not self._linear and vision is None and spec.sliding_window is None
            and not spec.family.attention_sinks
            and all(linear.is_packed for linear in self.base_linears()))

    def base_linears(self) -> list[FrozenLinear]:
        """The dense layers' base GEMMs as the forward runs them (q/k/v fused; gate/up fused
        where the packed kernel runs them), then the LM head."""
        mlps = [linear for mlp in self._dense_mlps.values()
                for linear in (*mlp.gate_up, mlp.down)]
        linear = [x for la in self._linear.values() for x in (la.in_proj, la.out_proj)]
        shared = [x for mlp in self._sparse.values() for x in (mlp.shared_linears or ())]
        return [*self._qkv.values(), *self._o.values(), *linear, *mlps, *shared,
                *([self._head] if self._head else [])]

    def packed_bytes(self) -> int:
        """Bytes of the base weights' packed copies (0: every base GEMM runs on F.linear)."""
        return sum(linear.nbytes_packed() for linear in self.base_linears())

    def model_info(self, max_context: int | None = None) -> ModelInfo:
        """The torch-free facts the rest of the system may know (`ModelSpec.model_info`)."""
        return self.spec.model_info(max_context)

    @property
    def rank_multiple(self) -> int:
        """LoRA rank padding `AdapterBank.stack` must use (`RANK_MULTIPLE` in batch-invariant
        mode)."""
        return RANK_MULTIPLE if self.options.batch_invariant else 1

    def pack(self, seqs: Sequence[SequenceInput]) -> PackedBatch:
        """`pack_sequences` with this model's layout options."""
        return pack_sequences(seqs, row_multiple=self.options.effective_row_multiple,
                              batch_multiple=1 if self._compact_rows else None,
                              block_size=self.options.kv_block_size,
                              num_heads=self.spec.num_heads, num_kv_heads=self.spec.num_kv_heads,
                              device=self.device)

    def forward(self, batch: PackedBatch, lora: LoraBatch | None = None,
                kv: PagedKVCache | None = None, x_R_D: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Final-norm hidden states ``[rows, hidden]`` of every row of ``batch`` (a pipeline
        stage's: the residual stream after its layers, normed on the last stage only).

        Args:
            batch: from `pack`; with ``kv`` its sequences carry block tables.
            lora: the stacked adapters of the batch's segments (None: base model only).
            kv: the sampler's cache; new keys/values are written into it in place. None for a
                training forward (scratch pages, differentiable).
            x_R_D: the residual stream entering this stage's first layer (a pipeline stage's
                input: the previous stage's output, or the embedded rows); None: embed the
                batch's tokens here.
        """
        if (kv is None) != (batch.num_scratch_blocks is not None):
            raise user_error("kv", "pass a cache exactly when the batch has block tables")
        if lora is not None and lora.rows is not batch.lora_rows:
            raise user_error("lora", "LoraBatch does not match the batch's adapter segments")
        if x_R_D is None:
            x_R_D = self.embed_rows(batch)
        cos, sin = self._rope(batch)
        tokens = TokenRows.of(batch, lora) if self._sparse else None
        layout = next(iter(self._linear.values())).layout(batch) if self._linear else None
        # Recomputation keeps a layer's input only; its backward reruns the layer (the same
        # deterministic ops, so the same bits) to get the activations it needs.
        training = kv is None and torch.is_grad_enabled()
        recompute = self.recomputed_layers(x_R_D.shape[0]) if training else 0
        slots = output_slots(x_R_D, recompute)
        for i in range(len(self.weights.layers)):
            layer = partial(self._layer, i, cos=cos, sin=sin, batch=batch, lora=lora, kv=kv,
                            tokens=tokens, layout=layout)
            x_R_D = (recomputed(layer, x_R_D, self._lora_views(i, lora), slots[i])
                     if i < recompute else layer(x_R_D))
            x_R_D = self._deepstack(i, x_R_D, batch)
        if not self.spec.holds_head:
            return x_R_D
        assert self.weights.final_norm is not None
        return rms_norm(x_R_D, self.weights.final_norm, self.spec.rms_norm_eps)

    def recomputed_layers(self, num_rows: int) -> int:
        """How many (leading) decoder layers a training forward of ``num_rows`` rows
        recomputes (`layer_recompute.recomputed_layers`)."""
        return recomputed_layers(self.options, len(self.weights.layers),
                                 self._activation_row_bytes, num_rows)

    def recomputes_head(self, num_rows: int) -> bool:
        """Whether a training forward's output head recomputes its windows in the backward
        (`layer_recompute.recomputes_head`)."""
        return recomputes_head(self.options, len(self.weights.layers),
                               self._activation_row_bytes, num_rows, self.spec.vocab_size)

    def embed_rows(self, batch: PackedBatch) -> torch.Tensor:
        """The batch's token embeddings ``[rows, hidden]`` (where the embedding is held); an
        image's rows take the vision tower's embeddings instead."""
        assert self.weights.embed is not None, "this pipeline stage holds no embedding"
        x_R_D = self.weights.embed[batch.tokens_R].to(self.dtype)  # bfloat16 rows widened
        if batch.images is None:
            return x_R_D
        return x_R_D.index_copy(0, batch.images.rows_I, batch.images.embeds_I_D.to(x_R_D.dtype))

    def _rope(self, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of every row: M-RoPE positions where the batch has images."""
        if batch.rope_positions_3_R is None:
            return self.rope.lookup(batch.positions_R)
        section = self.spec.rope.mrope_section
        if section is None:
            raise user_error("images", f"{self.spec.arch} models take no images")
        return self.rope.lookup_mrope(batch.rope_positions_3_R, section)

    def _deepstack(self, i: int, x_R_D: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """After decoder layer ``i``: add the images' DeepStack features of that layer to
        their rows (Qwen3-VL's first K layers)."""
        images, layer = batch.images, self.spec.first_layer + i
        if images is None or layer >= len(images.deepstack):
            return x_R_D
        return x_R_D.index_add(0, images.rows_I, images.deepstack[layer].to(x_R_D.dtype))

    def image_features(self, pixels_P_F: torch.Tensor,
                       grid: tuple[int, int, int]) -> ImageFeatures:
        """The vision tower's output for one image (this model's device)."""
        if self.vision is None:
            raise user_error("images", f"this {self.spec.arch} model has no vision tower")
        return self.vision(pixels_P_F.to(self.device), grid)

    def image_spans(self, images: Sequence[ImageInput]) -> tuple[ImageSpan, ...]:
        """A sequence's images as batches take them (`ImageEncoder`); () without any."""
        if not images:
            return ()
        if self.spec.stage is not None:
            raise user_error("images", "model-parallel groups do not take images yet")
        if self.images is None:
            raise user_error("images", f"this {self.spec.arch} model takes no images")
        return self.images.spans(images)

    def _lora_views(self, i: int, lora: LoraBatch | None) -> tuple[torch.Tensor, ...]:
        """The LoRA tensors decoder layer ``i`` reads (for `recomputed`)."""
        if lora is None:
            return ()
        index: dict[str, int] = {}
        if i in self._attn_index:
            index.update(dict.fromkeys(("q_proj", "k_proj", "v_proj", "o_proj"),
                                       self._attn_index[i]))
        if i in self._linear:
            index.update(dict.fromkeys(LINEAR_TARGETS, self._linear[i].lora_index))
        if i in self._dense_index:
            index.update(dict.fromkeys(("gate_proj", "up_proj", "down_proj"),
                                       self._dense_index[i]))
        if i in self._sparse:
            index.update(dict.fromkeys(("w1", "w2", "w3", *SHARED_TARGETS),
                                       self._sparse[i].index))
        return lora.layer_views(index)

    def _layer(self, i: int, x_R_D: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               batch: PackedBatch, lora: LoraBatch | None, kv: PagedKVCache | None,
               tokens: TokenRows | None, layout: DeltaLayout | None = None) -> torch.Tensor:
        """Decoder layer ``i``: attention (or linear attention) and MLP blocks, each with its
        residual."""
        layer = self.weights.layers[i]
        h_R_D = rms_norm(x_R_D, layer.input_norm, self.spec.rms_norm_eps)
        if i in self._linear:
            assert layout is not None
            x_R_D = x_R_D + self._linear[i](h_R_D, batch, layout, lora, _states(kv))
        else:
            x_R_D = x_R_D + self._attention(i, layer, h_R_D, cos, sin, batch, lora, kv)
        h_R_D = rms_norm(x_R_D, layer.post_attn_norm, self.spec.rms_norm_eps)
        sparse = self._sparse.get(i)
        if sparse is not None:
            assert tokens is not None
            return x_R_D + sparse(h_R_D, tokens, lora)
        return x_R_D + self._dense_mlps[i](h_R_D, lora, self._dense_index[i])

    def logits(self, hidden_R_D: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        """Output-head logits ``[rows, vocab]`` (compute dtype), unembed LoRA included."""
        assert self._head is not None, "this pipeline stage holds no head"
        base_R_V = (torch.cat([F.linear(hidden_R_D, w.to(hidden_R_D.dtype))
                               for w in self._head_chunks], dim=1)
                    if self._chunk_head(hidden_R_D) else self._head(hidden_R_D))
        return base_R_V if lora is None else lora.add_delta(base_R_V, hidden_R_D, "unembed", 0)

    def _chunk_head(self, hidden_R_D: torch.Tensor) -> bool:
        """`HEAD_CHUNK`ed head GEMMs: a small CPU batch outside autograd (where one GEMM's
        backward is cheaper than many)."""
        assert self._head is not None
        return (not self._head.is_packed and hidden_R_D.device.type == "cpu"
                and len(self._head_chunks) > 1
                and hidden_R_D.shape[0] <= HEAD_CHUNK_MAX_ROWS
                and not (torch.is_grad_enabled() and hidden_R_D.requires_grad))

    def token_logprobs(self, hidden_R_D: torch.Tensor, targets_R: torch.Tensor,
                       lora: LoraBatch | None = None) -> torch.Tensor:
        """fp32 ``log p(target)`` per row: row-local log_softmax over the vocab."""
        return token_logprobs(self.logits(hidden_R_D, lora), targets_R)

    def _attention(self, i: int, layer: LayerWeights, h_R_D: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, batch: PackedBatch, lora: LoraBatch | None,
                   kv: PagedKVCache | None) -> torch.Tensor:
        spec, rows, j = self.spec, h_R_D.shape[0], self._attn_index[i]
        q, k, v = fused_lora_linear(h_R_D, self._qkv[i], self._fused[i].qkv_sizes, lora,
                                    ("q_proj", "k_proj", "v_proj"), j,
                                    (layer.q_bias, layer.k_bias, layer.v_bias))
        gate = None
        if spec.family.attention_gate:  # per head: [query, gate] (Qwen3.5)
            q, gate = q.view(rows, spec.num_heads, 2 * spec.head_dim).chunk(2, dim=-1)
            gate = gate.reshape(rows, spec.q_size)
        q = q.reshape(rows, spec.num_heads, -1)
        k = k.view(rows, spec.num_kv_heads, -1)
        v = v.view(rows, spec.num_kv_heads, -1)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = rms_norm(q, layer.q_norm, spec.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, spec.rms_norm_eps)
        q = apply_rope(q, cos, sin) * spec.head_dim ** -0.5
        k = apply_rope(k, cos, sin)
        k_new = k.index_select(0, batch.write_rows_W)
        v_new = v.index_select(0, batch.write_rows_W)
        if kv is None:
            assert batch.num_scratch_blocks is not None
            k_pages = scratch_pages(batch.num_scratch_blocks, batch.block_size,
                                    batch.write_block_W, batch.write_offset_W, k_new)
            v_pages = scratch_pages(batch.num_scratch_blocks, batch.block_size,
                                    batch.write_block_W, batch.write_offset_W, v_new)
        else:
            kv.write(i, batch.write_block_W, batch.write_offset_W, k_new, v_new)
            k_pages, v_pages = kv.k[i], kv.v[i]
        out = self._backends[i](q, k_pages, v_pages, batch, self._attn_layers[i])
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return lora_linear(out, self._o[i], lora, "o_proj", j, layer.o_bias)


def _sparse_mlps(spec: ModelSpec, weights: BaseWeights, row_multiple: int,
                 kernel: GemmKernel | None) -> dict[int, SparseMlp]:
    """Each mixture-of-experts layer's `SparseMlp`, its LoRA layer index its place among them."""
    sparse: dict[int, SparseMlp] = {}
    if spec.experts is not None:
        for j, layer in enumerate(spec.experts.sparse_layers):
            experts = weights.layers[layer].experts
            assert experts is not None
            sparse[layer] = SparseMlp(spec.experts, experts, j, row_multiple, kernel)
    return sparse


def _present(value: T | None) -> T:
    assert value is not None
    return value


def _present_linear(spec: ModelSpec) -> LinearAttentionSpec:
    assert spec.linear is not None
    return spec.linear


def _states(kv: PagedKVCache | None) -> LinearStates | None:
    return None if kv is None else kv.linear


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm: normalise in fp32 over the last dim (row-local), scale in the input dtype."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def token_logprobs(logits_R_V: torch.Tensor, targets_R: torch.Tensor) -> torch.Tensor:
    """fp32 log-probability of each row's target under a row-local log_softmax."""
    logprobs_R_V = torch.log_softmax(logits_R_V.to(torch.float32), dim=-1)
    return logprobs_R_V.gather(1, targets_R[:, None]).squeeze(1)
