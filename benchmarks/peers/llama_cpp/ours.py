"""Our side: loraplex's engine sampler (the one `loraplex serve` runs) on the imported
SmolLM2 directory, driven as `benchmarks.engine_sample` drives it, base model only (no
adapter: llama.cpp runs the bare weights), reporting what the llama.cpp worker reports: wall
and CPU seconds, time to first token, the end time of every decode step, the tokens.

One request per prompt with ``num_samples`` samples (the sampler prefills the prompt once and
forks its KV), EOS off, seeded per prompt; a fresh sampler per run (no prefix cache carried
over).
"""

from __future__ import annotations

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

    def profile_decode(self, workload: Workload, batch: list[list[int]], steps: int = 16
                       ) -> dict[str, Any]:
        """Per-op CPU time of ``steps`` decode steps of ``workload`` (after its prefill and
        4 steps): where one of our decode steps goes."""
        from torch.profiler import ProfilerActivity, profile

        sampler = self.sampler()
        params = SamplingParams(max_tokens=workload.new_tokens, stop=StopCondition(use_eos=False),
                                seed=0)
        sampler.step([SampleWork(f"p{i}", None, None, array("q", p), workload.num_samples,
                                 params) for i, p in enumerate(batch)], 4)
        cpu0 = time.process_time()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            sampler.step([], steps)
        cpu_ms = 1e3 * (time.process_time() - cpu0) / steps
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        return {"sequences": workload.num_sequences, "decode_steps": steps,
                "cpu_ms_per_step": cpu_ms,
                "torch_ops_ms_per_step": sum(e.self_cpu_time_total for e in ops) / 1e3 / steps,
                "top_ops_ms_per_step": {e.key: round(e.self_cpu_time_total / 1e3 / steps, 2)
                                        for e in ops[:8]}}

    @staticmethod
    def _collect(outcomes: list[Any], results: dict[str, SampleResult]) -> None:
        for request_id, outcome in outcomes:
            assert isinstance(outcome, SampleResult), outcome
            results[request_id] = outcome
