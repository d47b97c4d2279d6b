#!/bin/bash
# The GPU run of docs/gpu.md: the CUDA-only modules, the whole suite against a GPU server and the
# GPU benches, on a machine with CUDA torch and no network (the device machine). The wheels the
# machine lacks travel in .whl/ (docs/gpu.md lists them). Usage: bash tools/gpu_run.sh [quick]
source "$(dirname "$0")/gpu_env.sh"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv; uname -r; nproc; free -g | head -2;
  python3 -c "import torch,transformers,onnxruntime,numpy,sys;print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, onnxruntime.__version__, numpy.__version__, torch.cuda.get_device_name())"; git log --oneline -1; } 2>&1 | tee $OUT/machine.txt
echo "== CUDA modules"
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 8 -rfEs tests/api/test_gpu_paths.py tests/encodings/test_alibi.py \
  tests/encodings/test_t5_bias.py tests/encodings/test_learned.py tests/runtime 2>&1 | tee $OUT/cuda_tests.log | tail -15
echo "== suite"
timeout 330 python3 -m pytest -q -p no:cacheprovider -n 14 --dist loadgroup --ignore=tests/deploy --ignore=tests/ui \
  --deselect tests/client/test_fresh_venv.py::test_client_alone_in_a_fresh_venv -rfE 2>&1 | tee $OUT/suite.log | grep -E "^(FAILED|ERROR)|passed|failed" | tail -60
[ "$1" = quick ] && exit 0
echo "== bench.compute"
timeout 75 python3 -m bench.compute --gpu-only --no-plot > $OUT/bench_compute.md 2>&1; tail -30 $OUT/bench_compute.md
echo "== bench.v2_infer"
timeout 75 python3 -m bench.v2_infer --device cuda > $OUT/bench_v2.md 2>&1; tail -14 $OUT/bench_v2.md
