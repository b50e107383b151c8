"""The packed sgemm kernel vs F.linear (MKL) on SmolLM2-135M's base GEMMs, side by side.

    python -m benchmarks.packed_gemm [--rounds 5] [--threads 1] [--rows 8,32,256,2048]

For each row count: every layer's base linears (q/k/v fused, o, gate/up fused, down: 30
layers) and the tied LM head, at SmolLM2's shapes (hidden 576, MLP 1536, vocab 49152) on random
weights, forward through F.linear and through the kernel, interleaved round by round (ABAB), CPU
seconds; the forward outputs are compared bit for bit every round (and must match from 4 rows
up: MKL's 1-3-row path sums otherwise). With ``--backward``, also
the input gradient ``dy · w`` of the same GEMMs through torch.mm and through the kernel reading
the weights unpacked. The weights outgrow the caches (the layers' 424 MB, the head 113 MB),
as in a decode step. Records the load average and the GEMM probe; writes
``benchmarks/results/packed_gemm.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, not with -m: put the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from tqdm import tqdm

from benchmarks import RESULTS
from benchmarks.harness.result import Result, Run
from benchmarks.harness.writer import write
from loraplex.engine.kernels.gemm_order import gemm_kernel
from loraplex.engine.kernels.packed_linear import FrozenLinear

HIDDEN, MLP, VOCAB, LAYERS = 576, 1536, 49152, 30
#: (out, in) of each layer's base GEMMs as the engine runs them (q/k/v and gate/up fused).
LAYER_SHAPES = ((960, HIDDEN), (HIDDEN, HIDDEN), (2 * MLP, HIDDEN), (HIDDEN, MLP))


def build(kernel: Any) -> list[FrozenLinear]:
    gen = torch.Generator().manual_seed(0)
    shapes = [*(s for _ in range(LAYERS) for s in LAYER_SHAPES), (VOCAB, HIDDEN)]
    return [FrozenLinear(torch.randn(*s, generator=gen) * 0.02, kernel) for s in shapes]


def forward_runs(linears: list[FrozenLinear], rows: int
                 ) -> tuple[Callable[[], list[torch.Tensor]], Callable[[], list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(rows)
    inputs = {k: torch.randn(rows, k, generator=gen) for k in (HIDDEN, MLP)}

    def mkl() -> list[torch.Tensor]:
        return [F.linear(inputs[lin.weight.shape[1]], lin.weight) for lin in linears]

    def packed() -> list[torch.Tensor]:
        return [lin.forward_no_grad(inputs[lin.weight.shape[1]]) for lin in linears]

    return mkl, packed


def backward_runs(linears: list[FrozenLinear], rows: int
                  ) -> tuple[Callable[[], object], Callable[[], object]]:
    gen = torch.Generator().manual_seed(rows + 1)
    grads = {lin.weight.shape[0]: torch.randn(rows, lin.weight.shape[0], generator=gen)
             for lin in linears}

    def mkl() -> object:
        return [grads[lin.weight.shape[0]].mm(lin.weight) for lin in linears]

    def packed() -> object:
        return [lin.input_grad(grads[lin.weight.shape[0]]) for lin in linears]

    return mkl, packed


def cpu_seconds(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


#: Fewest rows at which MKL's sgemm runs its main kernel (1-3 rows take an edge path that sums
#: otherwise; batch-invariant mode pads rows to 8): where the kernel must give its bits.
MKL_MAIN_ROWS = 4


def measure(linears: list[FrozenLinear], rows_list: list[int], rounds: int, backward: bool
            ) -> dict[str, Any]:
    flops_per_row = 2 * sum(lin.weight.numel() for lin in linears)
    out: dict[str, Any] = {}
    for rows in tqdm(rows_list, desc="row counts"):
        mkl, packed = forward_runs(linears, rows)
        kinds = {"forward": (mkl, packed)}
        if backward:
            kinds["backward"] = backward_runs(linears, rows)
        for kind, (base, ours) in kinds.items():
            times: dict[str, list[float]] = {"mkl": [], "packed": []}
            equal = True
            for _ in range(rounds):
                mkl_s, want = cpu_seconds(base)
                ours_s, got = cpu_seconds(ours)
                times["mkl"].append(mkl_s)
                times["packed"].append(ours_s)
                equal &= all(torch.equal(a, b) for a, b in zip(want, got, strict=True))  # type: ignore[call-overload]
            if kind == "forward" and rows >= MKL_MAIN_ROWS:
                assert equal, f"the packed kernel lost F.linear's bits at {rows} rows"
            mkl_s, ours_s = (statistics.median(times[k]) for k in ("mkl", "packed"))
            out[f"{kind}/{rows}"] = {
                "rows": rows, "bitwise": equal, "mkl_s": mkl_s, "packed_s": ours_s,
                "speedup": mkl_s / ours_s,
                "mkl_gflops": flops_per_row * rows / mkl_s / 1e9,
                "packed_gflops": flops_per_row * rows / ours_s / 1e9,
                "rounds_mkl_s": times["mkl"], "rounds_packed_s": times["packed"]}
    return out


def markdown(record: Result) -> str:
    r = record.payload
    lines = [
        "# Packed sgemm kernel vs F.linear (MKL): SmolLM2-135M's base GEMMs", "",
        f"`python -m benchmarks.packed_gemm`, {r['threads']} "
        f"thread(s), {r['rounds']} interleaved rounds, CPU seconds (medians). Every layer's "
        "base GEMMs as the engine runs them (q/k/v fused 576→960, o 576→576, gate/up fused "
        "576→3072, down 1536→576) × 30 layers and the tied head 576→49152, random weights "
        "(537 MB, so they stream from memory as in a decode step). Forward outputs bitwise "
        f"equal to F.linear's in every round: **{r['bitwise_equal']}** (kernel block sizes "
        f"{r['blocks']}, {r['lanes']} lanes). {record.provenance()}", "",
        "| GEMMs | rows | F.linear / torch.mm s | packed kernel s | speedup | MKL GFLOP/s | "
        "kernel GFLOP/s | bits equal |", "|---|---|---|---|---|---|---|---|"]
    for key, m in r["results"].items():
        lines.append(f"| {key.split('/')[0]} | {m['rows']} | {m['mkl_s']:.4f} | "
                     f"{m['packed_s']:.4f} | **{m['speedup']:.2f}** | {m['mkl_gflops']:.1f} | "
                     f"{m['packed_gflops']:.1f} | {m.get('bitwise', '–')} |")
    lines += ["", "`forward`: y = x · wᵀ (the kernel on the packed copy); `backward`: the input "
              "gradient dy · w (torch.mm vs the kernel reading the weight unpacked; its bits "
              "need not match). The machine is shared: compare only numbers of one run.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default="8,32,256,2048")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernel = gemm_kernel((HIDDEN, MLP), torch.device("cpu"), torch.float32)
    if kernel is None:
        sys.exit("the packed GEMM kernel is not available on this machine (see the log)")
    run = Run("packed_gemm")
    linears = build(kernel)
    results = measure(linears, [int(r) for r in args.rows.split(",")], args.rounds,
                      args.backward)
    bitwise = all(r["bitwise"] for key, r in results.items()
                  if key.startswith("forward/") and r["rows"] >= MKL_MAIN_ROWS)
    result = run.finish({"threads": args.threads, "rounds": args.rounds, "bitwise_equal": bitwise,
                         "blocks": dict(kernel.blocks), "lanes": kernel.lanes,
                         "results": results}, model="SmolLM2-135M (shapes)")
    write(result, markdown(result), args.out)
    print(markdown(result))


if __name__ == "__main__":
    main()
