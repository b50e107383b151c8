"""Built-in models: HF-loadable tokenizer and weights, chat tokens, determinism, sizes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from loraplex.engine.builtin.model import builtin_spec, create_builtin_model
from loraplex.engine.builtin.tokenizer import TOKENIZER_FAMILIES as FAMILIES
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from loraplex.errors import UserError

TEXTS = [
    "Hello world, what is 123 + 456?",
    "def add(a, b):\n    return a + b\n",
    "Unicode survives: héllo, 世界, emoji 🙂, tabs\tand  double  spaces.",
    "",
]


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return create_builtin_model(tmp_path_factory.mktemp("b") / "tiny-llama", "llama", "tiny", 0)


@pytest.fixture(params=["qwen3", "llama"])
def builtin_dir(request: pytest.FixtureRequest, tiny_model_dir: Path,
                tiny_llama_dir: Path) -> tuple[str, Path]:
    return request.param, tiny_model_dir if request.param == "qwen3" else tiny_llama_dir


def test_autotokenizer_round_trips_and_special_tokens_are_single_ids(
        builtin_dir: tuple[str, Path]) -> None:
    from transformers import AutoTokenizer

    arch, path = builtin_dir
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.is_fast and len(tok) == builtin_spec(arch, "tiny").vocab_size
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert tok.decode(ids) == text
    family = FAMILIES[arch]
    for token in (*family.special, *family.added):
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids) == [token]
    assert tok.eos_token == family.eos and tok.pad_token == family.pad
    if arch == "llama":
        assert tok.encode("hi")[0] == tok.convert_tokens_to_ids("<|begin_of_text|>")
    else:
        assert tok.bos_token is None
        assert tok.decode(tok.encode("<think>x</think>"), skip_special_tokens=True) == \
            "<think>x</think>"


def test_chat_template_uses_the_family_tokens(builtin_dir: tuple[str, Path]) -> None:
    from transformers import AutoTokenizer

    arch, path = builtin_dir
    tok = AutoTokenizer.from_pretrained(path)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if arch == "qwen3":
        assert text == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    else:
        assert text == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n"
                        "What is 2 + 2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
                        "\n\n")


def test_transformers_loads_the_weights_and_matches_our_forward(
        builtin_dir: tuple[str, Path]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    arch, path = builtin_dir
    hf_model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), info  # no missing / unexpected / mismatched keys
    tok = AutoTokenizer.from_pretrained(path)
    eos_ids = {tok.convert_tokens_to_ids(t) for t in FAMILIES[arch].generation_eos}
    model = load_model(path)
    assert set(model.spec.eos_token_ids) == eos_ids
    ids = torch.tensor(tok.encode(TEXTS[0] + TEXTS[1]))
    with torch.no_grad():
        batch = model.pack([SequenceInput(ids.tolist())])
        ours = model.logits(model.forward(batch))[:len(ids)]
        theirs = hf_model.eval()(ids[None]).logits[0]
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_creation_is_deterministic_per_seed(tmp_path: Path, tiny_model_dir: Path) -> None:
    def digest(path: Path, name: str) -> str:
        return hashlib.sha256((path / name).read_bytes()).hexdigest()

    again = create_builtin_model(tmp_path / "again", "qwen3", "tiny", seed=0)
    other = create_builtin_model(tmp_path / "other", "qwen3", "tiny", seed=1)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert digest(again, name) == digest(tiny_model_dir, name)
    assert digest(other, "model.safetensors") != digest(again, "model.safetensors")


def test_sizes_match_their_budgets() -> None:
    for arch in ("qwen3", "llama"):
        tiny, small = builtin_spec(arch, "tiny"), builtin_spec(arch, "small")
        assert tiny.num_params() <= 1_000_000
        assert 18e6 <= small.num_params() <= 22e6
        assert small.num_layers == 4 and small.hidden_size == 512 and small.vocab_size == 8192
        assert small.num_heads > small.num_kv_heads  # GQA


def test_refuses_a_non_empty_directory_and_unknown_names(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("taken")
    with pytest.raises(UserError, match="not empty"):
        create_builtin_model(tmp_path, "qwen3", "tiny")
    with pytest.raises(UserError, match="arch"):
        create_builtin_model(tmp_path / "a", "gpt2", "tiny")
    with pytest.raises(UserError, match="size"):
        create_builtin_model(tmp_path / "b", "qwen3", "huge")


def test_moe_builtin_has_the_qwen3_tokenizer_and_matches_transformers(
        tiny_moe_model_dir: Path, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    path = tiny_moe_model_dir
    tokenizer = (path / "tokenizer.json").read_bytes()
    assert tokenizer == (tiny_model_dir / "tokenizer.json").read_bytes()
    hf_model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), info
    assert type(hf_model).__name__ == "Qwen3MoeForCausalLM"
    model = load_model(path)
    assert model.spec.experts is not None and model.spec.experts.num_experts == 8
    assert model.spec.experts.top_k == 2 and model.spec.dense_mlp_layers == ()
    ids = torch.randint(0, model.spec.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.logits(model.forward(model.pack([SequenceInput(ids.tolist())])))[:40]
        theirs = hf_model.eval()(ids[None]).logits[0]
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_moe_sizes_match_their_budgets() -> None:
    tiny, small = builtin_spec("qwen3_moe", "tiny"), builtin_spec("qwen3_moe", "small")
    assert tiny.num_params() <= 1_000_000
    assert 30e6 <= small.num_params() <= 40e6
    info = small.model_info()
    assert info.card.active_params < 0.55 * info.card.total_params  # 2 of 8 experts active
    assert small.num_layers == 4 and small.hidden_size == 512 and small.vocab_size == 8192
