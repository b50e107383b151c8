"""Our side: loraplex's engine sampler (the one `loraplex serve` runs) on the imported
SmolLM2 directory, driven as `benchmarks.engine_sample` drives it, base model only (no
adapter: llama.cpp runs the bare weights), reporting what the llama.cpp worker reports: wall
and CPU seconds, time to first token, the end time of every decode step, the tokens.

One request per prompt with ``num_samples`` samples (the sampler prefills the prompt once and
forks its KV), EOS off, seeded per prompt; a fresh sampler per run (no prefix cache carried
over).
"""

from __future__ import annotations

import cProfile
import pstats
import time
from array import array
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.peers.llama_cpp.workload import Workload
from loraplex.config import EngineConfig
from loraplex.domain.sampling import SampleResult, SamplingParams, StopCondition
from loraplex.domain.work import SampleWork
from loraplex.engine.lora.bank import AdapterBank
from loraplex.engine.model.loader import load_model
from loraplex.engine.model.transformer import Transformer
from loraplex.engine.sampling.sampler import Sampler

#: KV pages of each run's sampler (64 positions each): room for the largest shape.
KV_CACHE_BLOCKS = 1024


@dataclass
class Ours:
    """The loaded model and the (empty) adapter bank its sampler reads."""

    model_dir: Path
    config: EngineConfig
    model: Transformer
    bank: AdapterBank

    @classmethod
    def load(cls, model_dir: Path, dtype: str, batch_invariant: bool = True) -> Ours:
        """The engine's default configuration (batch-invariant), or its fast mode."""
        config = EngineConfig(dtype=dtype, kv_cache_blocks=KV_CACHE_BLOCKS,
                              batch_invariant=batch_invariant)
        model = load_model(model_dir, config)
        return cls(model_dir, config, model, AdapterBank(model.spec, model.device, max_rank=8))

    def sampler(self) -> Sampler:
        return Sampler(self.model, self.bank, self.config, str(self.model_dir))

    def run(self, workload: Workload, batch: list[list[int]], temperature: float, seed: int
            ) -> dict[str, Any]:
        """Sample ``workload`` from ``batch``'s prompts: one step that prefills and draws each
        sequence's first token, then one decode step per call (so each step's end is timed,
        as on llama.cpp's side)."""
        sampler = self.sampler()
        params = SamplingParams(max_tokens=workload.new_tokens, temperature=temperature,
                                stop=StopCondition(use_eos=False))
        works = [SampleWork(f"r{i}", None, None, array("q", prompt), workload.num_samples,
                            replace(params, seed=seed + i))
                 for i, prompt in enumerate(batch)]
        results: dict[str, SampleResult] = {}
        wall0, cpu0 = time.perf_counter(), time.process_time()
        self._collect(sampler.step(works, 0), results)
        step_ends = [time.perf_counter() - wall0]
        while sampler.num_running():
            self._collect(sampler.step([], 1), results)
            step_ends.append(time.perf_counter() - wall0)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        outputs = [list(seq.tokens) for i in range(len(works))
                   for seq in results[f"r{i}"].sequences]
        generated = sum(len(o) for o in outputs)
        assert generated == workload.generated, (generated, workload)
        return {"wall_s": wall, "cpu_s": cpu, "first_token_s": step_ends[0],
                "step_ends_s": step_ends, "generated": generated, "tokens": outputs,
                "sampler_stats": dict(vars(sampler.stats))}

    def parity(self, prompt: list[int], new_tokens: int) -> dict[str, Any]:
        """Teacher-forced logprobs of the prompt's tokens after the first, and a greedy
        continuation with its logprobs (the worker's ``parity`` on our side)."""
        work = SampleWork("parity", None, None, array("q", prompt), 1,
                          SamplingParams(max_tokens=new_tokens, temperature=0.0,
                                         stop=StopCondition(use_eos=False)),
                          prompt_logprobs=True)
        results: dict[str, SampleResult] = {}
        sampler = self.sampler()
        self._collect(sampler.step([work], new_tokens), results)
        result = results["parity"]
        assert result.prompt_logprobs is not None
        seq = result.sequences[0]
        return {"prompt_logprobs": list(result.prompt_logprobs)[1:],
                "greedy_tokens": list(seq.tokens), "greedy_logprobs": list(seq.logprobs)}

    def profile(self, workload: Workload, batch: list[list[int]], steps: int = 16
                ) -> dict[str, Any]:
        """Where our time goes on ``workload``: its prefill step (every prompt, and the first
        tokens) and ``steps`` decode steps after 4, each timed once as is (CPU ms) and once
        under cProfile, whose shares split it into the packed sgemm (base linears and head),
        the C attention kernel and the rest (norms, RoPE, KV writes, sampling, Python)."""
        params = SamplingParams(max_tokens=workload.new_tokens, stop=StopCondition(use_eos=False),
                                seed=0)
        works = [SampleWork(f"p{i}", None, None, array("q", p), workload.num_samples, params)
                 for i, p in enumerate(batch)]
        out = {}
        for part, (admit, count) in {"prefill": (works, 0), "decode": ([], steps)}.items():
            timed, profiled = self.sampler(), self.sampler()
            if part == "decode":
                timed.step(works, 4)
                profiled.step(works, 4)
            cpu0 = time.process_time()
            timed.step(admit, count)
            cpu_ms = 1e3 * (time.process_time() - cpu0) / max(count, 1)
            profiler = cProfile.Profile()
            profiler.runcall(profiled.step, admit, count)
            out[part] = {"cpu_ms": cpu_ms, **split_profile(profiler, cpu_ms)}
        return {"sequences": workload.num_sequences, "prompt_tokens": sum(map(len, batch)),
                "decode_steps": steps, **out}

    @staticmethod
    def _collect(outcomes: list[Any], results: dict[str, SampleResult]) -> None:
        for request_id, outcome in outcomes:
            assert isinstance(outcome, SampleResult), outcome
            results[request_id] = outcome


#: Source files whose functions' own time is one part of a step (cProfile's tottime of the
#: Python function that calls into the C kernel is the kernel's time).
PROFILE_PARTS = {"packed_sgemm": "kernels/packed_linear.py",
                 "attention_kernel": "kernels/attention_kernel.py"}


def split_profile(profiler: cProfile.Profile, cpu_ms: float) -> dict[str, float]:
    """``cpu_ms`` split in the shares the profile gives `PROFILE_PARTS` and the rest."""
    stats = pstats.Stats(profiler).stats
    total = sum(entry[2] for entry in stats.values()) or 1.0
    parts = {name: sum(entry[2] for key, entry in stats.items() if key[0].endswith(suffix))
             for name, suffix in PROFILE_PARTS.items()}
    out = {f"{name}_ms": cpu_ms * seconds / total for name, seconds in parts.items()}
    out["other_ms"] = cpu_ms - sum(out.values())
    return out
