#!/usr/bin/env bash
# The GPU tests (pytest -m gpu) on the GPU machine, from the repository root, in
# the order the device tool's time allows: test_gpu_multi first (it wants two
# GPUs), then the rest in two halves at once, on GPUs $GA and $GB (one GPU:
# GA=0 GB=0; they then share it), each under a limit of $LIMIT seconds (500),
# every test under pytest-timeout's 120 s (a wrong expect-tx or phase hangs);
# then the torch tests that run on the CPU. Logs go to $OUT (default /tmp/out);
# unbuffered, so a half stopped by its limit still shows how far it got.
#     GA=0 GB=0 bash tests/gpu_suite.sh
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
GA=${GA:-0}; GB=${GB:-1}; LIMIT=${LIMIT:-500}
export PYTHONUNBUFFERED=1
P="python -m pytest -q -p no:cacheprovider --timeout 120"
timeout 200 $P -m gpu tests/test_gpu_multi.py > "$OUT/multi.log" 2>&1
echo "multi: $(tail -1 "$OUT/multi.log")"
A="tests/test_gpu_conv2d.py tests/test_gpu_copy.py tests/test_gpu_gemm.py tests/test_gpu_gemm_shapes.py
   tests/test_gpu_im2col.py tests/test_random_programs.py"
IGNORE=""
for f in $A tests/test_gpu_multi.py; do IGNORE="$IGNORE --ignore=$f"; done
CUDA_VISIBLE_DEVICES=$GA timeout "$LIMIT" $P -m gpu $A > "$OUT/a.log" 2>&1 &
CUDA_VISIBLE_DEVICES=$GB timeout "$LIMIT" $P -m gpu tests $IGNORE > "$OUT/b.log" 2>&1 &
wait
echo "A: $(tail -1 "$OUT/a.log")"
echo "B: $(tail -1 "$OUT/b.log")"
grep -E "^(FAILED|ERROR)" "$OUT/a.log" "$OUT/b.log" | head -30
timeout 120 $P -m "not gpu" tests/test_torch_op.py > "$OUT/torch.log" 2>&1
echo "torch on the CPU: $(tail -1 "$OUT/torch.log")"
