"""Does NVRTC compile faster a second time, in a new process? (It does where a CUDA driver is
loaded: ptxas's output is kept in the CUDA compute cache, ~/.nv/ComputeCache or $CUDA_CACHE_PATH,
keyed by the PTX; CUDA_CACHE_DISABLE=1 turns it off.) One gemm.tile candidate's CUDA, with TAG in a
trailing comment (a new TAG: new source text, the same PTX), compiled once; run it several times:

    for t in a a b; do TILEC_CACHE=0 python benchmarks/probes/nvrtc_cache_probe.py $t; done
    CUDA_CACHE_DISABLE=1 TILEC_CACHE=0 python benchmarks/probes/nvrtc_cache_probe.py a"""
import os
import sys
import time

sys.path.insert(0, os.getcwd())
t0 = time.perf_counter()
import tilec  # noqa: E402
from tilec.runtime import nvrtc  # noqa: E402

k = tilec.compile("examples/gemm.tile", tune=False, BM=128, BN=256, STAGES=4, PRODUCER=1, PERSISTENT=1)
src = k.cuda_source + f"\n// {sys.argv[1] if len(sys.argv) > 1 else ''}\n"
t1 = time.perf_counter()
nvrtc.compile_cuda(src, "gemm", "sm_90a")
t2 = time.perf_counter()
print(f"tag {sys.argv[1:]}: import + lowering {t1 - t0:.2f} s, NVRTC {t2 - t1:.2f} s (NVRTC {nvrtc.version()}, "
      f"CUDA_CACHE_DISABLE={os.environ.get('CUDA_CACHE_DISABLE')}, "
      f"CUDA_CACHE_PATH={os.environ.get('CUDA_CACHE_PATH')})",
      flush=True)
