"""Batch invariance with images, on the float bits (torch.equal), on the built-in tiny Qwen3-VL
loaded as the server loads it (C kernels where the machine has them).

An image sequence's logprobs do not depend on what shares its batch (alone, among text and
other image sequences, with an adapter), nor on how they were computed: a training forward,
or a prefill cut inside the image then one-token decode steps from the cache. (At these
tiny shapes fast mode's compact rows happen to give the same bits too, measured; the check
that the tests can fail is that another image of the same size changes the bits after it.)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from loraplex.config import EngineConfig
from loraplex.domain.image import ImageInput
from loraplex.domain.lora import LoraConfig
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.kv_cache import PagedKVCache
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.engine.model.transformer import Transformer
from tests.api.test_images import Images
from tests.engine.threads import one_thread  # noqa: F401  (autouse)


@pytest.fixture(scope="module")
def vl(builtin_model_dir) -> tuple[Path, Images]:  # type: ignore[no-untyped-def]
    path = builtin_model_dir("tiny-vl")
    return path, Images(path)


def image_sequence(model: Transformer, images: Images, colour: tuple[int, int, int],
                   size: tuple[int, int], text: int) -> tuple[list[int], list[ImageInput]]:
    """``[text] <vision_start> <image> <vision_end> [text]`` and its image."""
    assert model.spec.pixels is not None and model.spec.vision is not None
    from loraplex.domain.pixel_spec import image_grid, num_image_tokens

    grid = image_grid(*size, model.spec.pixels)
    n = num_image_tokens(grid, model.spec.pixels.merge_size)
    head = [(7 * i + colour[0]) % 900 + 5 for i in range(text)] + [images.start]
    image = ImageInput(images.png(colour, size), "png", size, grid,
                       model.spec.pixels.merge_size, len(head))
    tokens = head + [images.pad] * n + [images.end] + [(3 * i + 11) % 900 for i in range(text)]
    return tokens, [image]


class Harness:
    def __init__(self, path: Path, invariant: bool = True) -> None:
        self.model = load_model(path, EngineConfig(batch_invariant=invariant))
        self.bank = AdapterBank(self.model.spec, "cpu", max_rank=16)
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in self.bank.create("a", LoraConfig(rank=8, seed=1)).parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)

    def logprobs(self, seqs: Sequence[SequenceInput], kv: PagedKVCache | None = None,
                 targets: Sequence[int] | None = None) -> list[torch.Tensor]:
        """Each sequence's logprob of the next token at each new position (last: of 0;
        ``targets``: these, for all new tokens in order)."""
        batch = self.model.pack(seqs)
        lora = self.bank.stack(batch, rank_multiple=self.model.rank_multiple,
                               dtype=self.model.dtype)
        if targets is None:
            targets = [t for s in seqs for t in [*s.tokens[1:], 0]]
        with torch.no_grad():
            hidden = self.model.forward(batch, lora, kv)
            lp_R = self.model.token_logprobs(hidden, batch.scatter_to_rows(
                torch.tensor(targets)), lora)
        return list(batch.gather_from_rows(lp_R).split(list(batch.seq_num_new)))

    def seq(self, tokens: list[int], images: list[ImageInput], adapter: str | None = "a",
            **kw: object) -> SequenceInput:
        return SequenceInput(tokens, adapter, images=self.model.image_spans(images),
                             **kw)  # type: ignore[arg-type]


def crowd(h: Harness, images: Images) -> list[SequenceInput]:
    """Other tenants' work: text sequences, base rows and another image of another size."""
    other, other_images = image_sequence(h.model, images, (20, 200, 90), (64, 33), 9)
    return [h.seq(list(range(40, 75)), [], None), h.seq(other, other_images),
            h.seq(list(range(100, 103)), []), h.seq(list(range(5, 60)), [], None)]


def test_an_image_sequence_has_the_same_bits_alone_and_in_a_crowd(vl) -> None:  # type: ignore[no-untyped-def]
    path, images = vl
    h = Harness(path)
    tokens, imgs = image_sequence(h.model, images, (200, 30, 30), (48, 40), 6)
    alone = h.logprobs([h.seq(tokens, imgs)])[0]
    others = crowd(h, images)
    for seqs, k in (([*others, h.seq(tokens, imgs)], 4), ([h.seq(tokens, imgs), *others], 0),
                    ([others[1], h.seq(tokens, imgs), others[0]], 1)):
        assert torch.equal(h.logprobs(seqs)[k], alone)


def test_prefill_through_the_image_then_decode_gives_the_training_bits(vl) -> None:  # type: ignore[no-untyped-def]
    path, images = vl
    h = Harness(path)
    tokens, imgs = image_sequence(h.model, images, (30, 30, 200), (48, 40), 6)
    full = h.logprobs([h.seq(tokens, imgs)])[0]
    cache = PagedKVCache.allocate(h.model.spec, 8, h.model.options.kv_block_size,
                                  h.model.device, h.model.dtype)
    cut = imgs[0].offset + 2  # inside the image
    targets = [*tokens[1:], 0]
    pieces = [h.logprobs([h.seq(tokens[:cut], imgs, num_cached=0, block_table=[2, 5])],
                         kv=cache, targets=targets[:cut])[0]]
    for i in range(cut, len(tokens)):  # one token at a time, as decode steps
        pieces.append(h.logprobs([h.seq(tokens[i:i + 1], imgs, num_cached=i,
                                        block_table=[2, 5])], kv=cache,
                                 targets=targets[i:i + 1])[0])
    assert torch.equal(torch.cat(pieces), full)


def test_the_image_decides_the_bits_after_it(vl) -> None:  # type: ignore[no-untyped-def]
    """So equal bits above are not an image ignored: another image of the same size (same
    tokens, same positions) changes every logprob from its first token on, none before."""
    path, images = vl
    h = Harness(path)
    red, red_images = image_sequence(h.model, images, (200, 30, 30), (48, 40), 6)
    blue, blue_images = image_sequence(h.model, images, (200, 200, 30), (48, 40), 6)
    assert red == blue
    a, b = (h.logprobs([h.seq(t, i)])[0] for t, i in ((red, red_images), (blue, blue_images)))
    first = red_images[0].offset
    assert torch.equal(a[:first - 1], b[:first - 1])
    assert bool((a[first:] != b[first:]).all())
