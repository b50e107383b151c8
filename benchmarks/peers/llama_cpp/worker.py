"""llama.cpp's side of `benchmarks.peers.llama_cpp`, run by the llama-cpp-python venv's python
(never loraplex's): loads one GGUF once, then answers one JSON command per stdin line with one
JSON line on stdout, so the parent interleaves it with our engine round by round.

Two ways to sample, both as a knowledgeable user writes them:

* ``high``: the high-level ``llama_cpp.Llama``, one sequence at a time (``Llama.generate``,
  which reuses the longest common prefix of the previous sequence's KV: G samples of a prompt
  prefill it once, plus one token);
* ``batched``: llama.cpp's own multi-sequence batching through the low-level API, as its
  ``batched`` example: all prompts prefilled in one ``llama_batch`` (one seq_id each), each
  prompt's KV copied to its other G - 1 sequences with ``llama_memory_seq_cp``, then every
  sequence's next token decoded in one batch per step, one sampler chain per sequence.

Both ignore EOS (every sequence runs its full length). Imports only the standard library,
numpy and llama_cpp (the venv has nothing else), and llama_cpp only after ``--help``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def log_softmax(logits: Any) -> Any:
    import numpy as np

    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())


class Worker:
    """The loaded model, a high-level ``Llama`` on it, and one low-level context per shape."""

    def __init__(self, model_path: str, threads: int, flash_attn: bool) -> None:
        import llama_cpp

        self.lib = llama_cpp
        self.threads, self.flash_attn = threads, flash_attn
        llama_cpp.llama_backend_init()
        self.llm = llama_cpp.Llama(model_path, n_ctx=512, n_threads=threads,
                                   n_threads_batch=threads, flash_attn=flash_attn,
                                   verbose=False)
        self.model = llama_cpp.llama_model_load_from_file(
            model_path.encode(), llama_cpp.llama_model_default_params())
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        self._contexts: dict[tuple[Any, ...], Any] = {}

    def info(self) -> dict[str, Any]:
        return {"llama_cpp_python": self.lib.__version__,
                "system_info": self.lib.llama_print_system_info().decode(),
                "n_vocab": self.n_vocab, "threads": self.threads,
                "flash_attn": self.flash_attn, "kv_cache_type": "f16 (llama.cpp's default)"}

    def context(self, num_seqs: int, per_seq: int, n_batch: int, exact: bool = False) -> Any:
        """A context for ``num_seqs`` sequences of up to ``per_seq`` positions each (a KV
        stream per sequence: llama.cpp's default, non-unified cache), made once per shape (a
        warm-up's shorter run reuses its run's context). ``exact``: an F32 KV cache, flash
        attention off (it rounds Q, K and V to F16 on a CPU) and every position's logits, for
        the parity check; otherwise llama.cpp's defaults (F16 KV) and the worker's flash
        attention setting."""
        per_seq = -(-per_seq // 256) * 256  # llama.cpp pads a stream to this anyway
        key = (num_seqs, per_seq, n_batch, exact)
        if key not in self._contexts:
            lib = self.lib
            params = lib.llama_context_default_params()
            params.n_ctx = num_seqs * per_seq
            params.n_batch = n_batch
            params.n_seq_max = num_seqs
            params.n_threads = params.n_threads_batch = self.threads
            params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED
                                      if self.flash_attn and not exact
                                      else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
            if exact:
                params.type_k = params.type_v = lib.GGML_TYPE_F32
                params.n_outputs_max_per_seq = 0  # every prompt position's logits
            ctx = lib.llama_init_from_model(self.model, params)
            if not ctx:
                raise RuntimeError(f"llama_init_from_model failed for {key}")
            self._contexts[key] = ctx
        return self._contexts[key]

    def sampler(self, temperature: float, seed: int) -> Any:
        lib = self.lib
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if temperature == 0:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(temperature))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(seed))
        return chain

    # ---- the two ways to sample -----------------------------------------------------------

    def run_high(self, prompts: list[list[int]], num_samples: int, new_tokens: int,
                 temperature: float, seed: int) -> dict[str, Any]:
        """Every sample in turn through ``Llama.generate`` (its sampler chain with every
        filter neutral: top-k 0, top-p 1, min-p 0, typical 1, no penalties)."""
        llm = self.llm
        llm.reset()
        outputs, token_times = [], []
        clock = Clock()
        for p, prompt in enumerate(prompts):
            for g in range(num_samples):
                llm.set_seed(seed + p * num_samples + g)
                tokens = []
                stream = llm.generate(prompt, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0,
                                      temp=temperature, repeat_penalty=1.0)
                for token in stream:
                    token_times.append(clock.elapsed())
                    tokens.append(int(token))
                    if len(tokens) == new_tokens:
                        break
                stream.close()
                outputs.append(tokens)
        return clock.report(outputs, token_times[0], token_times)

    def run_batched(self, prompts: list[list[int]], num_samples: int, new_tokens: int,
                    temperature: float, seed: int) -> dict[str, Any]:
        """llama.cpp's batched decoding (see the module docstring); the step times are one
        decode of every sequence plus its sampling."""
        lib = self.lib
        num_seqs, length = len(prompts) * num_samples, len(prompts[0])
        prompt_tokens = sum(len(p) for p in prompts)
        ctx = self.context(num_seqs, length + new_tokens, max(prompt_tokens, num_seqs))
        memory = lib.llama_get_memory(ctx)
        lib.llama_memory_clear(memory, True)
        samplers = [self.sampler(temperature, seed + s) for s in range(num_seqs)]
        batch = lib.llama_batch_init(max(prompt_tokens, num_seqs), 0, 1)
        try:
            clock = Clock()
            rows = []  # (token, position, seq_id, wants logits)
            for p, prompt in enumerate(prompts):
                rows += [(t, i, p * num_samples, i == len(prompt) - 1)
                         for i, t in enumerate(prompt)]
            decode(lib, ctx, batch, rows)
            for p in range(len(prompts)):
                for g in range(1, num_samples):
                    lib.llama_memory_seq_cp(memory, p * num_samples, p * num_samples + g, -1, -1)
            last_row = [(s // num_samples + 1) * length - 1 for s in range(num_seqs)]
            sample_start = clock.elapsed()
            outputs = [[lib.llama_sampler_sample(samplers[s], ctx, last_row[s])]
                       for s in range(num_seqs)]
            clock.sampling += clock.elapsed() - sample_start
            step_times = [clock.elapsed()]
            for step in range(1, new_tokens):
                decode(lib, ctx, batch, [(out[-1], length + step - 1, s, True)
                                         for s, out in enumerate(outputs)])
                sample_start = clock.elapsed()
                for s, out in enumerate(outputs):
                    out.append(lib.llama_sampler_sample(samplers[s], ctx, s))
                clock.sampling += clock.elapsed() - sample_start
                step_times.append(clock.elapsed())
            return clock.report(outputs, step_times[0], step_times)
        finally:
            lib.llama_batch_free(batch)
            for chain in samplers:
                lib.llama_sampler_free(chain)

    # ---- the parity check -----------------------------------------------------------------

    def parity(self, prompt: list[int], new_tokens: int, exact: bool) -> dict[str, Any]:
        """Teacher-forced logprob of every prompt token after the first, then a greedy
        continuation with each chosen token's logprob (fp64 log-softmax of llama.cpp's
        logits); ``exact``: see `context`."""
        lib = self.lib
        ctx = self.context(1, len(prompt) + new_tokens, len(prompt), exact)
        lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
        batch = lib.llama_batch_init(len(prompt), 0, 1)
        try:
            decode(lib, ctx, batch, [(t, i, 0, True) for i, t in enumerate(prompt)])
            prompt_logprobs = [float(log_softmax(self.logits(ctx, i))[prompt[i + 1]])
                               for i in range(len(prompt) - 1)]
            greedy, logprobs, row = [], [], len(prompt) - 1
            for step in range(new_tokens):
                scores = log_softmax(self.logits(ctx, row))
                greedy.append(int(scores.argmax()))
                logprobs.append(float(scores[greedy[-1]]))
                if step + 1 < new_tokens:
                    decode(lib, ctx, batch, [(greedy[-1], len(prompt) + step, 0, True)])
                    row = 0
        finally:
            lib.llama_batch_free(batch)
        return {"prompt_logprobs": prompt_logprobs, "greedy_tokens": greedy,
                "greedy_logprobs": logprobs}

    def logits(self, ctx: Any, row: int) -> Any:
        import numpy as np

        pointer = self.lib.llama_get_logits_ith(ctx, row)
        return np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy()


def decode(lib: Any, ctx: Any, batch: Any, rows: list[tuple[int, int, int, bool]]) -> None:
    """Fill ``batch`` with ``rows`` (token, position, seq_id, wants logits) and decode it."""
    for n, (token, position, seq_id, wants_logits) in enumerate(rows):
        batch.token[n] = token
        batch.pos[n] = position
        batch.n_seq_id[n] = 1
        batch.seq_id[n][0] = seq_id
        batch.logits[n] = wants_logits
    batch.n_tokens = len(rows)
    status = lib.llama_decode(ctx, batch)
    if status != 0:
        raise RuntimeError(f"llama_decode returned {status}")


class Clock:
    """Wall and process CPU time since construction, and the seconds spent sampling."""

    def __init__(self) -> None:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        self.sampling = 0.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.wall0

    def report(self, outputs: list[list[int]], first_token_s: float, marks: list[float]
               ) -> dict[str, Any]:
        """``marks``: the time each step (batched) or each token (high) ended."""
        return {"wall_s": self.elapsed(), "cpu_s": time.process_time() - self.cpu0,
                "first_token_s": first_token_s, "sampling_s": self.sampling,
                "step_ends_s": marks, "generated": sum(len(o) for o in outputs),
                "tokens": outputs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the GGUF file")
    parser.add_argument("--threads", type=int, default=1, help="n_threads and n_threads_batch")
    parser.add_argument("--flash-attn", choices=("on", "off"), default="off")
    args = parser.parse_args()
    worker = Worker(args.model, args.threads, args.flash_attn == "on")
    ops = {"info": lambda r: worker.info(),
           "run": lambda r: (worker.run_high if r["mode"] == "high" else worker.run_batched)(
               r["prompts"], r["num_samples"], r["new_tokens"], r["temperature"], r["seed"]),
           "parity": lambda r: worker.parity(r["prompt"], r["new_tokens"], r["exact"])}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            break
        print(json.dumps(ops[request["op"]](request)), flush=True)


if __name__ == "__main__":
    main()
