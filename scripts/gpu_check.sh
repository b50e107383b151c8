#!/usr/bin/env bash
# GPU readiness check (issue 24): on a machine with CUDA, in under 8 minutes:
#   1. the CUDA tests (tests/gpu: parity with transformers, bitwise prefill + decode, layer
#      recomputation and the windowed head keeping the bits, a 32K-token step in bounded memory,
#      and a two-GPU NCCL model-parallel group when there are two GPUs);
#   2. the batch-invariance suite on CUDA (LORAPLEX_TEST_DEVICE=cuda);
#   3. benchmarks/memory.py on CUDA (host and GPU peaks per point; 2K and 8K tokens);
#   4. benchmarks/model_parallel.py: on NCCL with two GPUs or more, else on the CPU's cores
#      (NCCL takes one rank per GPU), saying which.
# Results go to $OUT (default ./gpu-check-out). Usage: bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-./gpu-check-out}"
mkdir -p "$out"
py="${PYTHON:-.venv/bin/python}"
[ -x "$py" ] || { python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'; py=.venv/bin/python; }
"$py" - <<'PY' | tee "$out/device.txt"
import torch
print("cuda", torch.cuda.is_available(), torch.version.cuda, torch.cuda.device_count(),
      [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
PY
export NO_PROXY=127.0.0.1,localhost
start=$(date +%s)
echo "== CUDA tests"
timeout 240 "$py" -m pytest -q -m gpu tests/gpu 2>&1 | tee "$out/gpu_tests.txt" | tail -5 || true
echo "== invariance suite on CUDA"
LORAPLEX_TEST_DEVICE=cuda timeout 120 "$py" -m pytest -q tests/engine/model/test_batch_invariance.py \
    2>&1 | tee "$out/invariance.txt" | tail -3 || true
echo "== memory benchmark (CUDA)"
timeout 240 "$py" -m benchmarks.memory --tokens 2048,8192 --rounds 1 --skip-baseline \
    --no-small-long 2>&1 | tee "$out/memory.txt" | tail -3 || true
echo "== model_parallel benchmark"
ngpu=$("$py" -c "import torch; print(torch.cuda.device_count())")
if [ "$ngpu" -ge 2 ]; then device=cuda; else device=cpu; echo "one GPU: NCCL needs one per rank; the group runs on the CPU"; fi
timeout 180 "$py" -m benchmarks.model_parallel --rounds 1 --device "$device" 2>&1 \
    | tee "$out/model_parallel.txt" | tail -12 || true
cp -f benchmarks/results/memory.json benchmarks/results/model_parallel.json "$out/" 2>/dev/null || true
echo "gpu_check: $(( $(date +%s) - start )) s; results in $out"
