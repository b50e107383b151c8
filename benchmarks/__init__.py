"""Side-by-side benchmarks: each runs ours and a baseline interleaved in one process and reports
ratios, with the load average and a GEMM roofline probe recorded in the same run.

``python -m benchmarks NAME [args]`` runs one (``--list`` names them); each also runs by itself
as a module (`python -m benchmarks.X`, from the repo root) and as a script (`python
benchmarks/X.py`; a benchmark of several modules is a package, run as `benchmarks/X/__main__.py`).
A script's own folder, not the repo root, heads `sys.path`, so each entry point that imports this
repo opens with the same guard before those imports (it cannot live in this package, which is not
importable until the guard has run; ``parents[2]`` one package down):

    if not __package__:  # run as a script, not with -m: put the repo root on sys.path
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Each run is one `harness.result.Result` (name, model, revision, machine, start and end readings,
wall time, payload) written by `harness.writer.write` as JSON + markdown (+ plot).

`tests/benchmarks/test_entry_points.py` runs every entry point's `--help` both ways.
"""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Committed results (JSON + markdown + plots); benchmarks write here by default.
RESULTS = REPO / "benchmarks" / "results"
#: Git-ignored working space: models, venvs, server data dirs.
SCRATCH = REPO / ".scratch"
