"""Our multimodal models against transformers 5.24 on tiny random fp32 configs: Qwen3-VL
(``Qwen3VLForConditionalGeneration``: DeepStack features into the first decoder layers),
Qwen3-VL-MoE and Qwen3.5 with its vision tower (no DeepStack; a gated-DeltaNet hybrid).

The reference is transformers run in float64 (Qwen3.5's delta rule by its recurrence, as in
`test_qwen3_5_hf_parity`); the bars are 1e-4 on vision features and logits and 1e-5 relative on
LoRA gradients, or twice transformers' own fp32 error where that is larger (Qwen3.5's fp32
noise sits at the bar: see that module). Sequences mix text and images of different grids
(text after an image takes M-RoPE positions shifted against its token index), packed together
with a text-only sequence; a sequence prefilled in chunks that cut an image, then decoded
from the cache, gives the same logits as one forward.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.func import functional_call

from loraplex.config import EngineConfig
from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.image_rows import ImageSpan
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer
from tests.engine.model.test_qwen3_5_hf_parity import float64_reference, randomise

TOL, GRAD_REL_TOL = 1e-4, 1e-5
IMAGE, START, END = 290, 288, 289
VISION = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=4,
              temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
              num_position_embeddings=16)
TEXT = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=1024, rms_norm_eps=1e-5)
#: (token grids of the images in sequence 0, sequence 1); each image's patch grid is twice it.
GRIDS = ([(1, 3, 2), (1, 1, 4)], [(1, 2, 2)])


def hf_model(name: str) -> Any:
    import transformers as tf

    ids = dict(image_token_id=IMAGE, video_token_id=291, vision_start_token_id=START,
               vision_end_token_id=END)
    mrope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
             "mrope_interleaved": True}
    if name == "qwen3_5":
        text = dict(TEXT, num_hidden_layers=4, layer_types=["linear_attention",
                                                            "full_attention"] * 2,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                    linear_value_head_dim=16, linear_conv_kernel_dim=4,
                    rope_parameters=dict(mrope, partial_rotary_factor=0.5))
        config: Any = tf.Qwen3_5Config(text_config=text, vision_config=VISION, **ids)
        return randomise(tf.Qwen3_5ForConditionalGeneration(config), seed=0)
    vision = dict(VISION, deepstack_visual_indexes=[0, 2])
    if name == "qwen3_vl_moe":
        text = dict(TEXT, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                    rope_parameters=mrope)
        config = tf.Qwen3VLMoeConfig(text_config=text, vision_config=vision, **ids)
        config.text_config._experts_implementation = "eager"
        model = tf.Qwen3VLMoeForConditionalGeneration(config)
    else:
        config = tf.Qwen3VLConfig(text_config=dict(TEXT, rope_parameters=mrope),
                                  vision_config=vision, **ids)
        model = tf.Qwen3VLForConditionalGeneration(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p_name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in p_name else 0.0, 0.1 if "norm" in p_name else 0.15)
    return model.eval()


NAMES = ["qwen3_vl", "qwen3_vl_moe", "qwen3_5"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cache: dict[str, tuple[Path, Any]] = {}

    def make(name: str) -> tuple[Path, Any]:
        if name not in cache:
            model = hf_model(name)
            path = tmp_path_factory.mktemp(f"hf-{name}")
            model.save_pretrained(path)
            cache[name] = (path, model)
        return cache[name]

    return make


def sequence(grids: list[tuple[int, int, int]], gen: torch.Generator, text: int = 7
             ) -> tuple[list[int], list[tuple[int, tuple[int, int, int], torch.Tensor]]]:
    """Tokens (text, then per image ``<vision_start> <image_pad>×n <vision_end>`` and text)
    and each image's (offset, token grid, random patches in merge-block order)."""
    tokens = torch.randint(0, 280, (text,), generator=gen).tolist()
    images = []
    for t, h, w in grids:
        tokens.append(START)
        patches = torch.randn(t * 4 * h * w, 3 * 2 * 4 * 4, generator=gen)
        images.append((len(tokens), (t, h, w), patches))
        tokens += [IMAGE] * (t * h * w) + [END]
        tokens += torch.randint(0, 280, (text,), generator=gen).tolist()
    return tokens, images


def hf_logits(hf: Any, tokens: list[int], images: list[Any], dtype: torch.dtype,
              params: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    ids = torch.tensor([tokens])
    kwargs: dict[str, Any] = {"input_ids": ids}
    if images:
        kwargs |= dict(pixel_values=torch.cat([p for _, _, p in images]).to(dtype),
                       image_grid_thw=torch.tensor([[t, 2 * h, 2 * w]
                                                    for _, (t, h, w), _ in images]),
                       mm_token_type_ids=(ids == IMAGE).int())
    if params is None:
        return hf(**kwargs).logits[0]
    return functional_call(hf, params, (), kwargs, tie_weights=False).logits[0]


def ours(model: Transformer, tokens: list[int], images: list[Any], **kw: Any) -> SequenceInput:
    spans = [ImageSpan(offset, grid, model.image_features(patches, (grid[0], 2 * grid[1],
                                                                     2 * grid[2])))
             for offset, grid, patches in images]
    return SequenceInput(tokens, images=spans, **kw)


def reference(hf: Any, tokens: list[int], images: list[Any]) -> tuple[torch.Tensor, float]:
    """float64 logits and the bar (`TOL` or twice transformers' fp32 error)."""
    with torch.no_grad(), float64_reference():
        ref = hf_logits(copy.deepcopy(hf).double(), tokens, images, torch.float64)
        fp32 = hf_logits(hf, tokens, images, torch.float32)
    return ref.float(), max(TOL, 2 * (fp32.double() - ref.double()).abs().max().item())


@pytest.mark.parametrize("name", NAMES)
def test_vision_features_match_transformers(models, name: str) -> None:
    path, hf = models(name)
    model = load_model(path, EngineConfig())
    assert model.vision is not None and model.spec.vision is not None
    assert len(model.spec.vision.deepstack_indexes) == (0 if name == "qwen3_5" else 2)
    gen = torch.Generator().manual_seed(3)
    for grid in [(1, 6, 4), (1, 2, 2), (1, 10, 8)]:
        patches = torch.randn(grid[0] * grid[1] * grid[2], 96, generator=gen)
        with torch.no_grad():
            theirs = hf.model.visual(patches, grid_thw=torch.tensor([grid]), return_dict=True)
        mine = model.image_features(patches, grid)
        assert (mine.embeds_N_D - theirs.pooler_output).abs().max() <= TOL
        deepstack = getattr(theirs, "deepstack_features", None) or []
        assert len(mine.deepstack) == len(deepstack)
        for a, b in zip(mine.deepstack, deepstack, strict=True):
            assert (a - b).abs().max() <= TOL


@pytest.mark.parametrize("invariant", [True, False], ids=["invariant", "fast"])
@pytest.mark.parametrize("name", NAMES)
def test_packed_image_sequences_match_transformers(models, name: str, invariant: bool) -> None:
    path, hf = models(name)
    model = load_model(path, EngineConfig(batch_invariant=invariant))
    gen = torch.Generator().manual_seed(1)
    seqs = [sequence(GRIDS[0], gen), sequence([], gen, text=20), sequence(GRIDS[1], gen)]
    batch = model.pack([ours(model, t, i, state_key=k) for k, (t, i) in enumerate(seqs)])
    with torch.no_grad():
        logits = model.logits(model.forward(batch))
    for k, (tokens, images) in enumerate(seqs):
        ref, bar = reference(hf, tokens, images)
        start = batch.seq_row_start[k]
        assert (logits[start:start + len(tokens)] - ref).abs().max().item() <= bar, k


@pytest.mark.parametrize("name", NAMES)
def test_chunked_prefill_through_an_image_then_decode(models, name: str) -> None:
    path, hf = models(name)
    model = load_model(path, EngineConfig())
    tokens, images = sequence(GRIDS[0], torch.Generator().manual_seed(5))
    cache = PagedKVCache.allocate(model.spec, 8, 64, model.device, model.dtype)
    outs, start = [], 0
    with torch.no_grad():  # chunks end inside the first image, then one token at a time
        for end in [11, 20, *range(21, len(tokens) + 1)]:
            seq = ours(model, tokens[start:end], images, num_cached=start,
                       block_table=[3, 1], state_key="s")
            batch = model.pack([seq])
            outs.append(model.logits(model.forward(batch, kv=cache))[:end - start])
            start = end
    ref, bar = reference(hf, tokens, images)
    assert (torch.cat(outs) - ref).abs().max().item() <= bar


def merged(hf: Any, adapter: Any) -> dict[str, torch.Tensor]:
    """HF's parameters with each adapted attention/MLP weight and the head ``W + s·B·A``."""
    s, params = adapter.config.scale, dict(hf.named_parameters())
    out: dict[str, torch.Tensor] = {}
    for target, w in adapter.weights.items():
        for i in range(w.a_L_Rk_I.shape[0]):
            delta = s * torch.matmul(w.b_L_O_Rk[i], w.a_L_Rk_I[i])
            if target == "unembed":
                name = "lm_head.weight"
                base = params.get(name, params["model.language_model.embed_tokens.weight"])
                out[name] = base + delta
                continue
            module = "self_attn" if target.endswith(("q_proj", "k_proj", "v_proj",
                                                     "o_proj")) else "mlp"
            name = f"model.language_model.layers.{w.model_layer(i)}.{module}.{target}.weight"
            out[name] = params[name] + delta
    return out


def test_lora_gradients_with_images_match_transformers(models) -> None:
    path, hf = models("qwen3_vl")
    model = load_model(path, EngineConfig())
    bank = AdapterBank(model.spec, "cpu", max_rank=32)
    adapter = bank.create("a", LoraConfig(rank=4, alpha=8.0, seed=0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in adapter.weights.values():
            w.b_L_O_Rk.copy_(torch.randn(w.b_L_O_Rk.shape, generator=gen) * 0.3)
    tokens, images = sequence(GRIDS[0], gen)
    targets = torch.roll(torch.tensor(tokens), -1)[:, None]
    batch = model.pack([ours(model, tokens, images, adapter_id="a")])
    lora = bank.stack(batch, rank_multiple=model.rank_multiple, dtype=model.dtype)
    mine = model.logits(model.forward(batch, lora), lora)[:len(tokens)]
    torch.log_softmax(mine, -1).gather(1, targets).sum().backward()
    grads = []
    for dtype in (torch.float64, torch.float32):
        ref = copy.deepcopy(hf).to(dtype)
        leaves = [t.detach().to(dtype).requires_grad_() for t in adapter.parameters()]
        params = merged(ref, adapter.with_parameters(leaves))
        with contextlib.nullcontext():
            theirs = hf_logits(ref, tokens, images, dtype, params)
        torch.log_softmax(theirs, -1).gather(1, targets).sum().backward()
        grads.append([leaf.grad.double() for leaf in leaves])  # type: ignore[union-attr]
    for (target, _), leaf, ref64, ref32 in zip(adapter.named_parameters(), adapter.parameters(),
                                               *grads, strict=True):
        assert leaf.grad is not None
        bar = max(GRAD_REL_TOL, 2 * ((ref32 - ref64).norm() / ref64.norm()).item())
        err = ((leaf.grad.double() - ref64).norm() / ref64.norm()).item()
        assert err <= bar, (target, err, bar)
