"""A transformer described by its config.json numbers, and every count derived from them.

Owns `ModelCard` and the one place that turns architecture numbers into parameter counts,
weight bytes, KV-cache bytes and attention widths: every linear layer a token passes through is
listed once (`LinearGroup`), and totals, active parameters, LoRA adapter sizes and decode weight
reads are sums over that list. Norms and biases are ignored (< 0.1% of any catalogued model).
Shared vocabulary: the cost model prices a card, and a loaded model describes itself with one
(`ModelInfo.card`), so the two never disagree. Knows nothing of prices, hardware or workloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from loraplex.errors import user_error

LinearKind = Literal["attn", "mlp", "expert", "router", "unembed", "frozen"]


@dataclass(frozen=True)
class LinearGroup:
    """Identical linear layers of one role across the model.

    Attributes:
        name: HF module name (``q_proj``, ``experts.gate_proj``, ``lm_head``, ...).
        kind: role, for LoRA targeting and for the MoE expert-touch model of decode.
        d_in, d_out: matrix shape (a token costs ``2·d_in·d_out`` FLOPs per pass).
        num_total: how many such matrices the model holds.
        num_active: how many one token passes through (``num_total`` unless routed).
    """

    name: str
    kind: LinearKind
    d_in: int
    d_out: int
    num_total: int
    num_active: int

    @property
    def params(self) -> int:
        return self.d_in * self.d_out


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V3 family): config.json ``q_lora_rank``,
    ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class LinearAttentionCard:
    """Gated-DeltaNet (linear attention) layers of a hybrid model (Qwen3.5): how many, and
    config.json ``linear_num_key_heads``, ``linear_key_head_dim``, ``linear_num_value_heads``,
    ``linear_value_head_dim``. Such a layer keeps a fixed-size state per sequence instead of a
    KV cache."""

    num_layers: int
    num_k_heads: int
    k_head_dim: int
    num_v_heads: int
    v_head_dim: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.v_head_dim


@dataclass(frozen=True)
class MoeSpec:
    """Routed experts: config.json ``n_routed_experts``/``num_experts``, ``num_experts_per_tok``,
    ``moe_intermediate_size``, ``n_shared_experts`` and ``first_k_dense_replace`` (leading
    layers that keep a dense MLP of ``intermediate_size``)."""

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    num_shared_experts: int = 0
    num_dense_layers: int = 0


@dataclass(frozen=True)
class ModelCard:
    """Architecture of one base model, as its public config.json states it.

    Attributes:
        name: catalogue key (the HF repo id the numbers come from).
        num_layers, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
            vocab_size, tie_word_embeddings: config.json fields of the same names.
        mla: set for multi-head latent attention (then num_kv_heads/head_dim are unused).
        moe: set for mixture-of-experts MLPs.
        sliding_window, num_sliding_layers: layers attending to a bounded window (gpt-oss).
        linear: the linear-attention layers of a hybrid model (the others attend fully).
        attention_gate: the query projection also yields an output gate (twice as wide).
        weight_bytes_per_param: bytes per weight of the published checkpoint (2 bf16, 1 fp8).
        source: which public config the numbers are copied from (the publishers' headline
            parameter counts are checked in tests/cost/cards/test_model_cards.py).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    mla: MlaSpec | None = None
    moe: MoeSpec | None = None
    sliding_window: int | None = None
    num_sliding_layers: int = 0
    linear: LinearAttentionCard | None = None
    attention_gate: bool = False
    weight_bytes_per_param: float = 2.0
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "head_dim", "vocab_size"):
            if getattr(self, field) < 1:
                raise user_error(f"model.{field}", "must be a positive integer")
        if self.num_sliding_layers + self.num_linear_layers > self.num_layers:
            raise user_error("model.num_sliding_layers", "with the linear layers, exceeds "
                                                         "num_layers")
        if self.num_sliding_layers and not self.sliding_window:
            raise user_error("model.sliding_window", "needed when num_sliding_layers > 0")

    @property
    def num_linear_layers(self) -> int:
        return 0 if self.linear is None else self.linear.num_layers

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query/key dot product."""
        if self.mla:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
        return self.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.head_dim

    def linear_groups(self) -> tuple[LinearGroup, ...]:
        """Every matmul weight, grouped by role (attention, MLP or experts, router, head)."""
        return (*self._attention_groups(), *self._mlp_groups(), LinearGroup(
            "lm_head", "unembed", self.hidden_size, self.vocab_size, 1, 1))

    def _attention_groups(self) -> tuple[LinearGroup, ...]:
        h, n = self.hidden_size, self.num_heads
        L = self.num_layers - self.num_linear_layers

        def g(name: str, d_in: int, d_out: int) -> LinearGroup:
            return LinearGroup(name, "attn", d_in, d_out, L, L)

        if self.mla is None:
            kv = self.num_kv_heads * self.head_dim
            q_out = n * self.head_dim * (2 if self.attention_gate else 1)
            return (g("q_proj", h, q_out), g("k_proj", h, kv), g("v_proj", h, kv),
                    g("o_proj", n * self.head_dim, h), *self._linear_groups())
        m = self.mla
        q_out = n * self.qk_head_dim
        q = ((g("q_proj", h, q_out),) if m.q_lora_rank is None else
             (g("q_a_proj", h, m.q_lora_rank), g("q_b_proj", m.q_lora_rank, q_out)))
        return (*q, g("kv_a_proj_with_mqa", h, m.kv_lora_rank + m.qk_rope_head_dim),
                g("kv_b_proj", m.kv_lora_rank, n * (m.qk_nope_head_dim + m.v_head_dim)),
                g("o_proj", n * m.v_head_dim, h))

    def _linear_groups(self) -> tuple[LinearGroup, ...]:
        """A linear-attention layer's projections as Tinker adapts them: ``in_proj_qkv`` as
        its q, k and v slices, ``in_proj_z``, ``out_proj``; ``in_proj_b``/``in_proj_a`` (one
        value per head) are never adapted."""
        if self.linear is None:
            return ()
        m, h, n = self.linear, self.hidden_size, self.linear.num_layers

        def g(name: str, d_in: int, d_out: int, kind: LinearKind = "attn") -> LinearGroup:
            return LinearGroup(name, kind, d_in, d_out, n, n)

        return (g("linear_attn.in_proj_q", h, m.key_dim), g("linear_attn.in_proj_k", h, m.key_dim),
                g("linear_attn.in_proj_v", h, m.value_dim),
                g("linear_attn.in_proj_z", h, m.value_dim),
                g("linear_attn.in_proj_ba", h, 2 * m.num_v_heads, "frozen"),
                g("linear_attn.out_proj", m.value_dim, h))

    def _mlp_groups(self) -> tuple[LinearGroup, ...]:
        h = self.hidden_size

        def gated(prefix: str, kind: LinearKind, inter: int, total: int, active: int
                  ) -> tuple[LinearGroup, ...]:
            return (LinearGroup(f"{prefix}gate_proj", kind, h, inter, total, active),
                    LinearGroup(f"{prefix}up_proj", kind, h, inter, total, active),
                    LinearGroup(f"{prefix}down_proj", kind, inter, h, total, active))

        if self.moe is None:
            return gated("", "mlp", self.intermediate_size, self.num_layers, self.num_layers)
        e = self.moe
        moe_layers = self.num_layers - e.num_dense_layers
        groups: list[LinearGroup] = []
        if e.num_dense_layers:
            groups += gated("dense.", "mlp", self.intermediate_size, e.num_dense_layers,
                            e.num_dense_layers)
        groups += gated("experts.", "expert", e.expert_intermediate_size,
                        moe_layers * e.num_experts, moe_layers * e.top_k)
        if e.num_shared_experts:
            shared = moe_layers * e.num_shared_experts
            groups += gated("shared_experts.", "mlp", e.expert_intermediate_size, shared, shared)
        groups.append(LinearGroup("gate", "router", h, e.num_experts, moe_layers, moe_layers))
        return tuple(groups)

    @property
    def embedding_params(self) -> int:
        """Input embedding table; shared with ``lm_head`` when tied (then counted there)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """All weights (what the checkpoint stores), embeddings included."""
        return sum(g.params * g.num_total for g in self.linear_groups()) + self.embedding_params

    @property
    def active_params(self) -> int:
        """Weights one token uses, embeddings included (the headline "A3B", "32B active")."""
        return self.matmul_params + self.embedding_params

    @property
    def matmul_params(self) -> int:
        """Weights one token multiplies (blocks + output head, routed experts at top-k): the N of
        "2·N FLOPs per token". The input embedding is a lookup and costs no FLOPs."""
        return sum(g.params * g.num_active for g in self.linear_groups())

    @property
    def routed_expert_params(self) -> int:
        return sum(g.params * g.num_total for g in self.linear_groups() if g.kind == "expert")

    def weight_bytes(self, bytes_per_param: float | None = None) -> float:
        """Bytes of all weights as served (default: the published checkpoint's dtype)."""
        bpp = self.weight_bytes_per_param if bytes_per_param is None else bytes_per_param
        return self.total_params * bpp

    def decode_weight_read_bytes(self, tokens_in_flight: float, bytes_per_param: float) -> float:
        """Weight bytes one decode iteration streams from HBM for ``tokens_in_flight`` tokens.

        Dense weights are read once per iteration. Each routed expert is read if any of the
        tokens picked it: with uniform routing a token misses a given expert with probability
        ``1 - k/E``, so ``b`` tokens touch a fraction ``1 - (1 - k/E)^b`` of them. The input
        embedding is not streamed (only looked-up rows are read).
        """
        dense = sum(g.params * g.num_total for g in self.linear_groups() if g.kind != "expert")
        if self.moe is None:
            return dense * bytes_per_param
        miss = 1.0 - self.moe.top_k / self.moe.num_experts
        touched: float = 1.0 - miss ** max(tokens_in_flight, 1.0)
        return (dense + self.routed_expert_params * touched) * bytes_per_param

    def kv_bytes_per_token(self, bytes_per_value: float = 2.0) -> float:
        """KV-cache bytes one token adds to the cache of every full-attention layer.

        GQA: ``2 (K and V) · layers · kv_heads · head_dim · bytes``. MLA caches one compressed
        latent plus the shared rope key: ``layers · (kv_lora_rank + qk_rope_head_dim) · bytes``.
        Sliding-window layers are excluded here (see `kv_bytes_sliding_per_token`).
        """
        return self.num_full_attention_layers * self._kv_values_per_layer() * bytes_per_value

    def kv_bytes_sliding_per_token(self, bytes_per_value: float = 2.0) -> float:
        """Like `kv_bytes_per_token` for the sliding-window layers (hold ≤ window tokens)."""
        return self.num_sliding_layers * self._kv_values_per_layer() * bytes_per_value

    def _kv_values_per_layer(self) -> int:
        if self.mla:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def kv_bytes(self, context: float, bytes_per_value: float = 2.0) -> float:
        """KV-cache bytes of one sequence of ``context`` tokens."""
        window = self.sliding_window or 0
        return (self.kv_bytes_per_token(bytes_per_value) * context
                + self.kv_bytes_sliding_per_token(bytes_per_value) * min(context, window))

    def lora_params(self, rank: int, *, attn: bool = True, mlp: bool = True,
                    unembed: bool = True) -> float:
        """Adapter parameters of a rank-``rank`` LoRA on the chosen targets.

        Routers are never adapted. Routed experts are adapted as Tinker does it (the cookbook's
        ``hyperparam_utils.get_lora_param_count``): every expert at the full rank, the factor
        on the hidden dimension shared by a layer's experts, the other one per expert, so an
        expert projection of a layer holds ``r·(hidden + E·f)``.
        """
        return sum(self._lora_width(g, g.num_total) * rank
                   for g in self._lora_targets(attn, mlp, unembed))

    def lora_rank_widths(self, rank: int, *, attn: bool = True, mlp: bool = True,
                         unembed: bool = True) -> float:
        """``Σ r·(d_in + d_out)`` over the adapted matrices one token passes through (a
        shared expert factor once per layer, the per-expert one per routed expert); one
        pass (forward, or one kind of gradient) through them costs twice that in FLOPs."""
        return sum(self._lora_width(g, g.num_active) * rank
                   for g in self._lora_targets(attn, mlp, unembed))

    def _lora_width(self, group: LinearGroup, count: int) -> float:
        """``Σ (d_in + d_out)`` of ``count`` matrices of ``group``; an expert group's hidden
        side counts once per layer (Tinker's shared outer factor)."""
        if group.kind != "expert" or self.moe is None:
            return float((group.d_in + group.d_out) * count)
        layers = group.num_total // self.moe.num_experts
        inner = group.d_out if group.d_in == self.hidden_size else group.d_in
        return float(self.hidden_size * layers + inner * count)

    def _lora_targets(self, attn: bool, mlp: bool, unembed: bool) -> tuple[LinearGroup, ...]:
        wanted = {"attn": attn, "mlp": mlp, "expert": mlp, "unembed": unembed, "router": False,
                  "frozen": False}
        return tuple(g for g in self.linear_groups() if wanted[g.kind])

    @property
    def attention_flops_per_position_per_layer(self) -> int:
        """FLOPs one token spends per attended position in one layer: ``QKᵀ`` and ``P·V`` are
        ``2·heads·(d_qk + d_v)`` (2 FLOPs per multiply-add)."""
        return 2 * self.num_heads * (self.qk_head_dim + self.v_head_dim)

    @property
    def num_full_attention_layers(self) -> int:
        return self.num_layers - self.num_sliding_layers - self.num_linear_layers

    def linear_state_bytes(self, bytes_per_value: float = 4.0) -> float:
        """Bytes of one sequence's recurrent state in every linear-attention layer (a
        ``k_head_dim × v_head_dim`` matrix per value head, kept in fp32), whatever its
        length: what such a layer holds instead of a KV cache."""
        m = self.linear
        if m is None:
            return 0.0
        return m.num_layers * m.num_v_heads * m.k_head_dim * m.v_head_dim * bytes_per_value

    @property
    def linear_flops_per_token_per_layer(self) -> float:
        """FLOPs of the chunked delta rule per token and linear layer (the engine's chunks of
        16): the state read and update, ``2·2·Hv·dk·dv``, and the in-chunk products and
        triangular solves, ``≈ 2·Hv·16·(3·dk + 2·dv)``."""
        m = self.linear
        if m is None:
            return 0.0
        return 2.0 * m.num_v_heads * (2 * m.k_head_dim * m.v_head_dim
                                      + 16 * (3 * m.k_head_dim + 2 * m.v_head_dim))
