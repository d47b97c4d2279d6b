#!/bin/bash
# Issue 36's GPU check (the fused Triton path), on the device machine with the environment of
# tools/gpu_run.sh (wheels from .whl/ into /tmp/site, PYTHONPATH). Logs go to $OUT. In order:
# 1. the float64 kernel's bit check: tests/runtime/test_fused_cuda.py's exact precision cases
#    (on by default since the sixth run, docs/gpu.md; the tests turn fused.FLOAT64 on themselves);
# 2. bench.compute's GPU section (exact RoPE on the kernel by default);
# 3. the rest of test_fused_cuda.py (the kernel now takes its scales as float64 and rounds them
#    in the kernel), the drift and GPU-path tests;
# 4. the device timeline of the Whisper and RoPE 16 MiB tables' queued calls and kernels
#    (bench.fused_tune --trace: the Whisper table's device idle time, docs/gpu.md "Fifth run"),
#    with kernels after 256 B and 2 KiB copies and at 64 frequencies per program.
# STEPS=1 adds the decode-step tests on GPU servers, bench.v2_infer and bench.floor (met in the
# fifth run); SWEEP=1 the launch-shape sweep of the 16 MiB RoPE table; PLAN_TESTS=1 the CPU plan
# tests (CI runs them). Usage: bash tools/gpu_check36.sh (worst case: the timeouts below add up to
# 575 s; STEPS=1 adds 195 s, SWEEP=1 75 s: then lower FUSED_TIMEOUT or EXACT_TIMEOUT).
source "$(dirname "$0")/gpu_env.sh"
OUT=${OUT:-/tmp/gpu_check36}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv;
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())";
  python3 -c "import triton; print('triton', triton.__version__)";
  python3 -c "import torch; from posenc.encodings import fused; print('fused usable:', fused.usable(torch.device('cuda')), 'ENABLED:', fused.ENABLED)";
  git log --oneline -1; } 2>&1 | tee "$OUT/machine36.txt"
rc=0
echo "== float64 kernel: exact precision cases of tests/runtime/test_fused_cuda.py"
timeout ${EXACT_TIMEOUT:-170} python3 -m pytest -q -p no:cacheprovider -n ${FUSED_WORKERS:-12} -rfEs tests/runtime/test_fused_cuda.py \
  -k "exact" > "$OUT/fused_exact_tests.log" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)" "$OUT/fused_exact_tests.log" | head -30; tail -3 "$OUT/fused_exact_tests.log"
echo "== bench.compute --gpu-only --no-plot"
start=$(date +%s)
timeout 80 python3 -m bench.compute --gpu-only --no-plot > "$OUT/bench_compute36.md" 2>&1 || rc=1
echo "bench took $(( $(date +%s) - start )) s"
tail -40 "$OUT/bench_compute36.md"
echo "== fused CUDA tests, reference precision (tests/runtime/test_fused_cuda.py)"
timeout ${FUSED_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider -n ${FUSED_WORKERS:-12} -rfEs tests/runtime/test_fused_cuda.py \
  -k "not exact" > "$OUT/fused_cuda_tests.log" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)" "$OUT/fused_cuda_tests.log" | head -30; tail -3 "$OUT/fused_cuda_tests.log"
echo "== drift and GPU paths (tests/runtime/test_gpu_drift.py tests/api/test_gpu_paths.py)"
timeout 90 python3 -m pytest -q -p no:cacheprovider -rfEs tests/runtime/test_gpu_drift.py tests/api/test_gpu_paths.py \
  > "$OUT/drift_tests.log" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)" "$OUT/drift_tests.log" | head -20; tail -3 "$OUT/drift_tests.log"
echo "== bench.fused_tune --trace (device timelines of the 16 MiB Whisper and RoPE tables)"
timeout 45 python3 -m bench.fused_tune --case "whisper 1024 fp32, 4 K" --case "rope d128 fp32, 16 K" --trace \
  > "$OUT/bench_fused_trace.md" 2>&1 || rc=1
tail -20 "$OUT/bench_fused_trace.md"
echo "== libdevice cos/sin in a Triton kernel against torch's CUDA cos/sin (tools/gpu_trig_check.py)"
timeout 40 python3 tools/gpu_trig_check.py > "$OUT/gpu_trig_check.txt" 2>&1 || rc=1
cat "$OUT/gpu_trig_check.txt"
if [ "${PLAN_TESTS:-0}" != 0 ]; then
echo "== plans and dispatch (tests/encodings/test_fused_plan.py, CPU)"
timeout 90 python3 -m pytest -q -p no:cacheprovider -n 8 -rfEs tests/encodings/test_fused_plan.py \
  > "$OUT/fused_plan_tests.log" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)" "$OUT/fused_plan_tests.log" | head -20; tail -3 "$OUT/fused_plan_tests.log"
fi
if [ "${SWEEP:-0}" != 0 ]; then
echo "== bench.fused_tune --case 'rope d128 fp32, 16 K'"
timeout 75 python3 -m bench.fused_tune --case "rope d128 fp32, 16 K" > "$OUT/bench_fused_tune.md" 2>&1 || rc=1
tail -36 "$OUT/bench_fused_tune.md"
fi
if [ "${STEPS:-0}" != 0 ]; then
echo "== decode steps on GPU servers (tests/api/test_v2_steps.py tests/api/test_grpc_steps.py)"
timeout 60 python3 -m pytest -q -p no:cacheprovider -n 4 -rfEs tests/api/test_v2_steps.py tests/api/test_grpc_steps.py \
  > "$OUT/steps_tests.log" 2>&1 || rc=1
grep -E "^(FAILED|ERROR)" "$OUT/steps_tests.log" | head -20; tail -3 "$OUT/steps_tests.log"
echo "== bench.v2_infer --device cuda --quick"
timeout 75 python3 -m bench.v2_infer --device cuda --quick > "$OUT/bench_v2_36.md" 2>&1 || rc=1
tail -16 "$OUT/bench_v2_36.md"
echo "== bench.floor --device cuda (small hits and decode steps from a GPU server against the floor)"
base=""; git cat-file -e 4be303f^{commit} 2>/dev/null && base="--baseline 4be303f"  # before host copies
timeout 60 python3 -m bench.floor --device cuda --rounds 3 --seconds 0.5 $base \
  > "$OUT/bench_floor36.md" 2>"$OUT/bench_floor36.err" || rc=1
head -30 "$OUT/bench_floor36.md"; tail -3 "$OUT/bench_floor36.err"
fi
exit $rc
