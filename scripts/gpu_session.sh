#!/usr/bin/env bash
# The GPU VM's checks and measurements on a CUDA GPU, in one go (about 6-8 minutes on an H100/H200):
# the compiled VM's resources, the real-GPU tests, `dvm bench ops --device cuda` and
# `dvm bench models --device cuda`. Run from the repository root:
#
#     bash scripts/gpu_session.sh [--full]       # --full: all sizes and 20 lengths (longer)
#
# It runs the project from the checkout (PYTHONPATH) on the machine's Python, whose PyTorch, Triton,
# transformers, ml_dtypes, numba and pytest it uses (PYTHON=... to pick another interpreter), and
# writes logs, JSON and markdown to $OUT (the device tool's output folder) or
# bench-results/gpu-session. The figures go to BENCHMARKS.md ("GPU VM" section).
set -uo pipefail
OUT="${OUT:-bench-results/gpu-session}"
mkdir -p "$OUT"
QUICK="--quick"
[ "${1:-}" = "--full" ] && QUICK=""
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

step environment
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/env.txt"
$PY -c "import sys, torch, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())" 2>&1 | tee -a "$OUT/env.txt"

step "compiled VM: registers, stack, spills (sm_90)"
$PY -m dvm.vm.gpu.resources --arch 90 2>&1 | tee "$OUT/resources.jsonl" || status=1

step "real-GPU tests"
$PY -m pytest -p no:xdist -p no:cacheprovider -rs tests/test_gpu_device.py 2>&1 | tee "$OUT/device_tests.log" | tail -15 || status=1

step "dvm bench ops --device cuda $QUICK"
$PY -m dvm bench ops --device cuda $QUICK --json "$OUT/gpu_ops.json" --md "$OUT/gpu_ops.md" 2>&1 | tee "$OUT/gpu_ops.log" | tail -40 || status=1

step "dvm bench models --device cuda $QUICK"
$PY -m dvm bench models --device cuda $QUICK --json "$OUT/gpu_models.json" --md "$OUT/gpu_models.md" 2>&1 | tee "$OUT/gpu_models.log" | tail -20 || status=1

step "done (status $status)"
exit $status
