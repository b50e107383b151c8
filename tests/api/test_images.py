"""Image inputs through the official SDK 0.38 on the built-in tiny Qwen3-VL-MoE, served as
``Qwen/Qwen3-VL-30B-A3B-Instruct``: ``ImageChunk``s in training datums and sample prompts.

Image token counts are the client's (transformers' image processor loaded from the model's
own ``preprocessor_config.json``, as the cookbook computes ``expected_tokens``). Training on
image datums lowers the loss; an image datum's logprobs are bitwise the same alone and in a
batch with others; a sample's logprobs equal the trainer's for the same tokens
(``kl_sample_train = 0``), also when a group of samples shares the image prompt's pages and
when another image of the same size is cached (its placeholder tokens are equal, its pages
must not be shared); bad images are refused with a 400 naming the chunk and change nothing.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tinker
from PIL import Image
from tinker import types

from loraplex.cli.model_sources import builtin_dir
from loraplex.config import ModelSource
from tests.api.conftest import EXECUTOR, Server
from tests.api.live_server import live_server
from tests.integration.serve_fake import fake_context

pytestmark = pytest.mark.skipif(EXECUTOR != "engine", reason="needs the torch engine")

MODEL = "Qwen/Qwen3-VL-30B-A3B-Instruct"
BUILTIN = "tiny-vl-moe"
ADAM = types.AdamParams(learning_rate=5e-3)


@pytest.fixture(scope="module")
def vl_dir(builtin_model_dir: Callable[[str], Path]) -> Path:
    return builtin_model_dir(BUILTIN)


@pytest.fixture(scope="module")
def suite_server(tmp_path_factory: pytest.TempPathFactory, vl_dir: Path) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp("loraplex-vl")
    shutil.copytree(vl_dir, builtin_dir(str(data_dir), BUILTIN))
    ctx = fake_context(str(data_dir), models=(ModelSource(MODEL, f"builtin:{BUILTIN}"),),
                       executor="engine")
    with live_server(ctx) as url:
        yield Server(url, ctx)
    ctx.stores.close()


class Images:
    """PNG images and chunks as a client makes them (token counts from HF's processor)."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(str(model_dir))
        config = json.loads((model_dir / "config.json").read_text())
        self.start, self.end = config["vision_start_token_id"], config["vision_end_token_id"]
        self.pad = config["image_token_id"]

    def png(self, colour: tuple[int, int, int], size: tuple[int, int] = (48, 40)) -> bytes:
        image = Image.new("RGB", size, colour)
        for x in range(0, size[0], 7):  # some structure, so pixels differ across the image
            image.putpixel((x, x % size[1]), (255 - colour[0], colour[1], 40))
        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()

    def tokens(self, size: tuple[int, int]) -> int:
        merge = self.processor.merge_size
        return self.processor.get_number_of_image_patches(size[1], size[0], {}) // merge ** 2

    def chunk(self, colour: tuple[int, int, int], size: tuple[int, int] = (48, 40)
              ) -> types.ImageChunk:
        return types.ImageChunk(data=self.png(colour, size), format="png",
                                expected_tokens=self.tokens(size))

    def prompt(self, colour: tuple[int, int, int], text: list[int],
               size: tuple[int, int] = (48, 40)) -> types.ModelInput:
        return types.ModelInput(chunks=[
            types.EncodedTextChunk(tokens=[5, 9, self.start]), self.chunk(colour, size),
            types.EncodedTextChunk(tokens=[self.end, *text])])


@pytest.fixture(scope="module")
def images(vl_dir: Path) -> Images:
    return Images(vl_dir)


COLOURS = {"red": (220, 30, 30), "blue": (30, 40, 220), "green": (30, 200, 60)}
ANSWERS = {"red": [70, 71, 72], "blue": [80, 81], "green": [90, 91, 92, 93]}


def datum(images: Images, colour: str) -> types.Datum:
    """``<text> <image> <text> answer``: the answer tokens are trained, the rest weight 0."""
    prompt = images.prompt(COLOURS[colour], [11, 12])
    answer = ANSWERS[colour]
    n = prompt.length + len(answer)
    model_input = prompt.append(types.EncodedTextChunk(tokens=answer[:-1]))
    full = [0] * (n - 1)
    weights = [0.0] * (n - 1)
    for i, token in enumerate(answer):
        full[prompt.length - 1 + i] = token
        weights[prompt.length - 1 + i] = 1.0
    return types.Datum(model_input=model_input, loss_fn_inputs={
        "target_tokens": types.TensorData(data=full, dtype="int64", shape=[n - 1]),
        "weights": types.TensorData(data=weights, dtype="float32", shape=[n - 1])})


def test_training_on_image_datums_lowers_the_loss(server: Server, service_client: Any,
                                                  new_key: Any, images: Images) -> None:
    """And bills an image as the tokens it takes (the SDK's ``ModelInput.length``)."""
    import httpx

    key = new_key()
    tc = service_client(key).create_lora_training_client(base_model=MODEL, rank=8)
    data = [datum(images, c) for c in COLOURS]
    losses = []
    for _ in range(10):
        out = tc.forward_backward(data, "cross_entropy").result()
        losses.append(out.metrics["loss:sum"])
        tc.optim_step(ADAM).result()
    assert losses[-1] < 0.5 * losses[0], losses
    assert len(out.loss_fn_outputs[0]["logprobs"].data) == data[0].model_input.length
    report = httpx.get(f"{server.url}/api/v1/loraplex/usage", headers={"X-API-Key": key},
                       trust_env=False, timeout=30).json()
    run = next(r for r in report["runs"] if r["run_id"] == tc.model_id)
    assert run["tokens"]["trained_tokens"] == 10 * sum(d.model_input.length for d in data)


def test_image_datum_logprobs_are_the_same_alone_and_batched(service_client: Any,
                                                             new_key: Any,
                                                             images: Images) -> None:
    tc = service_client(new_key()).create_lora_training_client(base_model=MODEL, rank=4)
    red, blue, green = (datum(images, c) for c in COLOURS)
    alone = tc.forward([blue], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].data
    batched = tc.forward([red, blue, green], "cross_entropy").result()
    assert batched.loss_fn_outputs[1]["logprobs"].data == alone
    assert batched.loss_fn_outputs[0]["logprobs"].data != alone


def test_sampled_logprobs_equal_the_trainers_with_images(service_client: Any, new_key: Any,
                                                         images: Images) -> None:
    """kl_sample_train = 0: a group of 3 samples of an image prompt (sharing its pages), each
    completion's logprobs bitwise those the trainer computes for the same tokens; a second
    image of the same size sampled in between does not borrow the first's pages."""
    sc = service_client(new_key())
    tc = sc.create_lora_training_client(base_model=MODEL, rank=4)
    tc.forward_backward([datum(images, "red")], "cross_entropy").result()
    tc.optim_step(ADAM).result()
    sampler = tc.save_weights_and_get_sampling_client("vl")
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3, stop=[])
    for colour in ("red", "blue", "red"):
        prompt = images.prompt(COLOURS[colour], [11, 12])
        result = sampler.sample(prompt, num_samples=3, sampling_params=params).result()
        data = []
        for seq in result.sequences:
            model_input = prompt.append(types.EncodedTextChunk(tokens=seq.tokens[:-1]))
            n = model_input.length
            targets = [0] * (prompt.length - 1) + list(seq.tokens)
            data.append(types.Datum(model_input=model_input, loss_fn_inputs={
                "target_tokens": types.TensorData(data=targets, dtype="int64", shape=[n]),
                "weights": types.TensorData(data=[1.0] * n, dtype="float32", shape=[n])}))
        outs = tc.forward(data, "cross_entropy").result().loss_fn_outputs
        for seq, out in zip(result.sequences, outs, strict=True):
            assert out["logprobs"].data[prompt.length - 1:] == list(seq.logprobs)


def test_compute_logprobs_of_an_image_prompt(service_client: Any, new_key: Any,
                                             images: Images) -> None:
    sampler = service_client(new_key()).create_sampling_client(base_model=MODEL)
    red = images.prompt(COLOURS["red"], [11, 12, 13])
    blue = images.prompt(COLOURS["blue"], [11, 12, 13])
    lp_red = sampler.compute_logprobs(red).result()
    lp_blue = sampler.compute_logprobs(blue).result()
    assert len(lp_red) == red.length and lp_red[0] is None
    assert all(isinstance(x, float) for x in lp_red[1:])
    after = red.length - 3  # the text after the image reads the image
    assert lp_red[after:] != lp_blue[after:]
    assert sampler.compute_logprobs(red).result() == lp_red  # its own cached pages


def refused(call: Callable[[], Any]) -> str:
    with pytest.raises(tinker.BadRequestError) as err:
        call()
    return str(err.value)


def test_bad_images_are_refused_naming_the_chunk(service_client: Any, new_key: Any,
                                                 images: Images) -> None:
    sampler = service_client(new_key()).create_sampling_client(base_model=MODEL)
    params = types.SamplingParams(max_tokens=2)
    good = images.png((1, 2, 3))

    def sample_with(chunk: Any) -> Any:
        prompt = types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[5]), chunk])
        return sampler.sample(prompt, num_samples=1, sampling_params=params).result()

    bomb = bytearray(good)
    bomb[16:24] = (100_000).to_bytes(4, "big") * 2  # IHDR width, height (CRC now wrong)
    cases = {
        "truncated": types.ImageChunk(data=good[: len(good) // 2], format="png"),
        "bomb": types.ImageChunk(data=bytes(bomb), format="png"),
        "wrong format": types.ImageChunk(data=good, format="jpeg"),
        "gif": types.ImageChunk(data=b"GIF89a" + good[6:], format="png"),
        "expected_tokens": types.ImageChunk(data=good, format="png", expected_tokens=7),
    }
    for name, chunk in cases.items():
        message = refused(lambda chunk=chunk: sample_with(chunk))
        assert "prompt.chunks[1]" in message, (name, message)
    ok = sample_with(types.ImageChunk(data=good, format="png"))
    assert len(ok.sequences) == 1


def test_a_bad_image_in_a_datum_fails_its_request_only(service_client: Any, new_key: Any,
                                                       images: Images) -> None:
    tc = service_client(new_key()).create_lora_training_client(base_model=MODEL, rank=4)
    good = datum(images, "red")
    chunks = list(good.model_input.chunks)
    png = images.png(COLOURS["red"])
    chunks[1] = types.ImageChunk(data=png[: len(png) - 30], format="png", expected_tokens=6)
    bad = types.Datum(model_input=types.ModelInput(chunks=chunks),
                      loss_fn_inputs=good.loss_fn_inputs)
    with pytest.raises((tinker.BadRequestError, tinker.RequestFailedError)) as err:
        tc.forward([good, bad], "cross_entropy").result()
    assert "data[1].model_input.chunks[1]" in str(err.value)
    out = tc.forward([good], "cross_entropy").result()  # the slot and the run go on
    assert len(out.loss_fn_outputs) == 1


def test_openai_chat_takes_data_url_images(server: Server, new_key: Any,
                                           images: Images) -> None:
    """``image_url`` parts with ``data:`` URLs: the chat's image is the Tinker prompt's image
    (greedy completions equal ``asample`` on the chunks the cookbook's renderer would make);
    a remote URL is refused, not fetched."""
    import base64

    import httpx
    import openai

    key = new_key()
    oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0,
                        http_client=httpx.Client(trust_env=False, timeout=60))
    png = images.png(COLOURS["green"])
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    content = [{"type": "text", "text": "what is"},
               {"type": "image_url", "image_url": {"url": url}}]
    reply = oai.chat.completions.create(model=MODEL, max_tokens=5, temperature=0.0, seed=1,
                                        messages=[{"role": "user", "content": content}])
    assert reply.usage.prompt_tokens > images.tokens((48, 40))
    text = server.ctx.catalog.get(MODEL)
    from loraplex.api.openai_text import ModelText

    tokenizer = ModelText(str(text.model_dir))
    rendered = tokenizer.chat_prompt([{"role": "user", "content":
                                       "what is<|vision_start|><|image_pad|><|vision_end|>"}])
    at = rendered.index(images.pad)
    prompt = types.ModelInput(chunks=[
        types.EncodedTextChunk(tokens=rendered[:at]),
        types.ImageChunk(data=png, format="png", expected_tokens=images.tokens((48, 40))),
        types.EncodedTextChunk(tokens=rendered[at + 1:])])
    sampler = tinker.ServiceClient(base_url=server.url, api_key=key).create_sampling_client(
        base_model=MODEL)
    tinker_out = sampler.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(
        max_tokens=5, temperature=0.0, seed=1)).result().sequences[0].tokens
    assert reply.usage.prompt_tokens == prompt.length
    assert reply.choices[0].message.content == tokenizer.decode(
        [t for t in tinker_out if t not in text.info.eos_token_ids])
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model=MODEL, max_tokens=2, messages=[{
            "role": "user", "content": [{"type": "image_url", "image_url": {
                "url": "https://example.com/cat.png"}}]}])
    assert "messages[0].content[0].image_url.url" in str(err.value)
