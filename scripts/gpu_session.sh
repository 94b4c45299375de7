#!/usr/bin/env bash
# The GPU VM's checks and measurements on a CUDA GPU, in one go: the
# real-GPU tests, `dvm bench ops --device cuda` and `dvm bench models --device cuda` (20 lengths),
# the two benchmarks again with DVM_GPU_VECTOR=1.
# Run from the repository root (about 5 minutes on an H200):
#
#     bash scripts/gpu_session.sh [--full]       # --full: all sizes of the ops benchmark (longer)
#
# It runs the project from the checkout (PYTHONPATH) on the machine's Python, whose PyTorch, Triton,
# transformers, ml_dtypes and pytest it uses (PYTHON=... to pick another interpreter; the GPU path
# needs neither numba nor numexpr), and writes eight files (logs, JSON) to $OUT (the
# device tool's output folder) or bench-results/gpu-session. Each step runs under a time limit
# (T_TESTS, T_OPS, T_MODELS seconds) so that one stuck step cannot spend a short GPU lease. The
# compiled VM's registers and spills: `python -m dvm.vm.gpu.resources --arch 90` (no GPU needed).
# The figures go to BENCHMARKS.md ("GPU VM" section).
set -uo pipefail
OUT="${OUT:-bench-results/gpu-session}"
mkdir -p "$OUT"
QUICK="--quick"
[ "${1:-}" = "--full" ] && QUICK=""
PY="${PYTHON:-python3}"
T_TESTS="${T_TESTS:-150}" T_OPS="${T_OPS:-220}" T_MODELS="${T_MODELS:-180}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET
status=0
step() { echo; echo "=== $* ($(date +%T))"; }

step environment
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  $PY -c "import sys, numpy, torch, triton, transformers; print('python', sys.version.split()[0], 'numpy', numpy.__version__,
'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
  nproc; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

step "real-GPU tests (limit ${T_TESTS} s)"
timeout "$T_TESTS" $PY -m pytest -p no:xdist -p no:cacheprovider -rs --durations=5 tests/test_gpu_device.py \
    > "$OUT/device_tests.log" 2>&1 || status=1
tail -15 "$OUT/device_tests.log"

step "dvm bench ops --device cuda $QUICK (limit ${T_OPS} s)"
timeout "$T_OPS" $PY -m dvm bench ops --device cuda $QUICK --json "$OUT/gpu_ops.json" --md - \
    > "$OUT/gpu_ops.log" 2>&1 || status=1
tail -30 "$OUT/gpu_ops.log"

step "dvm bench models --device cuda, 20 lengths (limit ${T_MODELS} s)"
timeout "$T_MODELS" $PY -m dvm bench models --device cuda --json "$OUT/gpu_models.json" --md - \
    > "$OUT/gpu_models.log" 2>&1 || status=1
tail -12 "$OUT/gpu_models.log"

# the same two with DVM_GPU_VECTOR=1 (specialised kernels' 4-lane fast path), against the runs above
for bench in ops models; do
    limit=$T_OPS; [ $bench = models ] && limit=$T_MODELS
    step "DVM_GPU_VECTOR=1 dvm bench $bench --device cuda (limit ${limit} s)"
    args="--device cuda"; [ $bench = ops ] && args="$args $QUICK"
    DVM_GPU_VECTOR=1 timeout "$limit" $PY -m dvm bench $bench $args --json "$OUT/gpu_${bench}_vector.json" \
        --md - 2>&1 | grep -v "^DEBUG" | tail -25 || status=1
done

step "done (status $status)"
exit $status
