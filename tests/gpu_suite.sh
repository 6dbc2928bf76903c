#!/usr/bin/env bash
# The GPU tests (pytest -m gpu) on the GPU machine, from the repository root, in
# the order the device tool's time allows: test_gpu_multi first (it wants two
# GPUs), then the rest in three parts at once, on GPUs $GA, $GB and $GC (by
# default 0, 1, 1 where nvidia-smi lists two GPUs or more, else 0, 0, 0: the
# parts then share the one GPU; part A is the gemm, conv, copy and
# random-program files, B the other test_gpu_* files, C the GPU tests of the
# remaining files), each under a limit of $LIMIT seconds (500),
# every test under pytest-timeout's 120 s (a wrong expect-tx or phase hangs);
# then the torch tests that run on the CPU. Logs go to $OUT (default /tmp/out);
# unbuffered, so a half stopped by its limit still shows how far it got.
#     bash tests/gpu_suite.sh
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "${gpus:-0}" -ge 2 ] && second=1 || second=0   # a part on a GPU that is not there would skip every test
GA=${GA:-0}; GB=${GB:-$second}; GC=${GC:-$GB}; LIMIT=${LIMIT:-500}
export PYTHONUNBUFFERED=1
P="python -m pytest -q -p no:cacheprovider --timeout 120"
timeout 200 $P -m gpu tests/test_gpu_multi.py > "$OUT/multi.log" 2>&1
echo "multi: $(tail -1 "$OUT/multi.log")"
A="tests/test_gpu_conv2d.py tests/test_gpu_copy.py tests/test_gpu_gemm.py tests/test_gpu_gemm_shapes.py
   tests/test_gpu_im2col.py tests/test_random_programs.py"
A=$(echo $A)  # one line, one space apart
B=""
for f in tests/test_gpu_*.py; do
    case " $A tests/test_gpu_multi.py " in *" $f "*) ;; *) B="$B $f" ;; esac
done
IGNORE=""
for f in $A $B tests/test_gpu_multi.py; do IGNORE="$IGNORE --ignore=$f"; done
CUDA_VISIBLE_DEVICES=$GA timeout "$LIMIT" $P -m gpu $A > "$OUT/a.log" 2>&1 &
CUDA_VISIBLE_DEVICES=$GB timeout "$LIMIT" $P -m gpu $B > "$OUT/b.log" 2>&1 &
CUDA_VISIBLE_DEVICES=$GC timeout "$LIMIT" $P -m gpu tests $IGNORE > "$OUT/c.log" 2>&1 &
wait
for part in a b c; do echo "$part: $(tail -1 "$OUT/$part.log")"; done
grep -E "^(FAILED|ERROR)" "$OUT/a.log" "$OUT/b.log" "$OUT/c.log" | head -30
timeout 120 $P -m "not gpu" tests/test_torch_op.py > "$OUT/torch.log" 2>&1
echo "torch on the CPU: $(tail -1 "$OUT/torch.log")"
