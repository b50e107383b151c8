"""GGUF → model directory: the tokenizer and chat template rebuilt from the metadata encode and
render exactly like the tokenizer the file was written from; config and generation config carry
the file's numbers; ``loraplex model import-gguf`` writes a directory transformers loads with
the same logits; llama.cpp's ``smollm`` pre-tokenizer isolates digits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from loraplex.cli.main import main
from loraplex.engine.builtin.tokenizer import build_tokenizer
from loraplex.engine.gguf.model_dir import ensure_gguf_model_dir
from loraplex.engine.model.gguf_weights import POINTER_FILE
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.packed_batch import SequenceInput
from tests.engine.gguf.gguf_files import write_gguf
from tests.engine.gguf.test_gguf_weights import tiny_hf_model, tokens

TEXTS = ["hello world, this is loraplex", "def clamp(x, lo, hi):\n    return x  # 12345",
         "<|im_start|>user\nhi<|im_end|>", "  spaces\t\tand\nnewlines  ", "ünïcödé 漢字 🙂"]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def written(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[str, Any, Any, Path, Path]:
    """(arch, HF model, original tokenizer, GGUF path, serving directory)."""
    arch = request.param
    tokenizer = build_tokenizer(arch, 1024, seed=0, corpus_chars=60_000)
    model = tiny_hf_model(arch, len(tokenizer))
    root = tmp_path_factory.mktemp(f"gguf-dir-{arch}")
    path = write_gguf(root / "model.gguf", model, tokenizer, arch, "Q8_0")
    return arch, model, tokenizer, path, ensure_gguf_model_dir(path, root / "served")


def test_tokenizer_and_chat_template_match_the_original(written: tuple[Any, ...]) -> None:
    from transformers import AutoTokenizer

    _, _, original, _, served = written
    rebuilt = AutoTokenizer.from_pretrained(served)
    for text in TEXTS:
        assert rebuilt.encode(text) == original.encode(text), text
    ids = original.encode(TEXTS[1])
    assert rebuilt.decode(ids, skip_special_tokens=True) == TEXTS[1] == original.decode(
        ids, skip_special_tokens=True)
    assert (rebuilt.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
            == original.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True))
    assert rebuilt.eos_token == original.eos_token
    assert len(rebuilt) == len(original)


def test_config_and_generation_config_carry_the_files_numbers(written: tuple[Any, ...]) -> None:
    _, model, tokenizer, path, served = written
    config = json.loads((served / "config.json").read_text())
    hf = model.config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings"):
        assert config[key] == getattr(hf, key), key
    assert config["rope_parameters"]["rope_theta"] == hf.rope_parameters["rope_theta"]
    generation = json.loads((served / "generation_config.json").read_text())
    assert generation["eos_token_id"] in (tokenizer.eos_token_id, [tokenizer.eos_token_id])
    pointer = json.loads((served / POINTER_FILE).read_text())
    assert pointer["gguf_file"] == str(path.resolve())
    assert not list(served.glob("*.safetensors")), "weights stay in the GGUF file"


def test_serving_dir_is_remade_when_the_file_changes(written: tuple[Any, ...],
                                                     tmp_path: Path) -> None:
    arch, model, tokenizer, _, _ = written
    path = write_gguf(tmp_path / "m.gguf", model, tokenizer, arch, "F16")
    served = ensure_gguf_model_dir(path, tmp_path / "served")
    first = (served / POINTER_FILE).read_text()
    assert ensure_gguf_model_dir(path, tmp_path / "served") == served
    assert (served / POINTER_FILE).read_text() == first, "unchanged file: kept"
    write_gguf(path, model, tokenizer, arch, "Q8_0")
    ensure_gguf_model_dir(path, tmp_path / "served")
    assert json.loads((served / POINTER_FILE).read_text())["size"] == path.stat().st_size


def test_import_gguf_writes_a_directory_transformers_loads(written: tuple[Any, ...],
                                                           tmp_path: Path, capsys: Any) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, original, path, served = written
    target = tmp_path / "imported"
    assert main(["model", "import-gguf", str(path), str(target)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert (target / "model.safetensors").is_file() and not (target / POINTER_FILE).exists()
    hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    seq = tokens(1)
    with torch.no_grad():
        reference = hf(seq[None]).logits[0]
    for directory in (target, served):  # the exported copy and the GGUF-backed one agree
        model = load_model(directory)
        batch = model.pack([SequenceInput(seq.tolist())])
        with torch.no_grad():
            ours = model.logits(model.forward(batch))[: len(seq)]
        assert (ours - reference).abs().max().item() <= 1e-4
    assert AutoTokenizer.from_pretrained(target).encode(TEXTS[0]) == original.encode(TEXTS[0])
    assert main(["model", "import-gguf", str(path), str(target)]) == 2, "non-empty target"
    assert "not empty" in capsys.readouterr().err


def test_smollm_pre_tokenizer_isolates_every_digit(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = build_tokenizer("llama", 1024, seed=0, corpus_chars=60_000)
    grouped = tokenizer.tokenize(" 1234 5678")
    assert any(len(piece.strip("Ġ")) > 1 and piece.strip("Ġ").isdigit() for piece in grouped), \
        "the llama vocabulary merges digits, so the test can tell the two splits apart"
    model = tiny_hf_model("llama", len(tokenizer))
    path = write_gguf(tmp_path / "smol.gguf", model, tokenizer, "llama", "Q8_0", pre="smollm")
    served = ensure_gguf_model_dir(path, tmp_path / "served")
    pieces = AutoTokenizer.from_pretrained(served).tokenize(" 1234 5678")
    assert [p for p in pieces if p.strip("Ġ")] == list("12345678")

