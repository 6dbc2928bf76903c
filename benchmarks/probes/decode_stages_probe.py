"""Deeper rings for few-row gemms: a stream-K piece of a 16-64-row gemm streams 16 K steps of
weights with little else to hide the latency of each load behind, so more stages in flight
may pay where 4 are what gemm.tile tunes at most. gemm.tile 64x128 and 128x128 (producer,
persistent, stream-K) at 4 / 6 / 8 stages (the 128x128 ring at 8: 256 KB, refused), with the
weights left in L2 by the call before and, `--cold-l2`, read from DRAM (256 MB written before
each timed call's GPU spin); same process, alternating rounds vs cuBLAS; outputs guarded.

    python benchmarks/probes/decode_stages_probe.py [--shapes MxNxK,...] [--cold-l2]
"""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilec
from common import checked_gemm, gemm_case, rounds, rounds_cold_l2

SRC = open("examples/gemm.tile").read()
SHAPES = [(16, 4096, 4096), (64, 4096, 4096), (256, 4096, 4096), (16, 4096, 14336), (64, 14336, 4096)]
CONFIGS = [(64, 128, 4), (64, 128, 6), (64, 128, 8), (128, 128, 4), (128, 128, 6)]
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]

kernels = {}
for bm, bn, st in CONFIGS:
    kernels[(bm, bn, st)] = tilec.compile(SRC, tune=False, BM=bm, BN=bn, STAGES=st, PRODUCER=1, PERSISTENT=1,
                                          STREAM_K=1)
if "--compile-only" in sys.argv:
    print({c: len(k.cubin) for c, k in kernels.items()})
    sys.exit()

import torch  # noqa: E402

for M, N, K in SHAPES:
    a, b, ref, fns = gemm_case(M, N, K)
    for cfg, k in kernels.items():
        fns[cfg] = checked_gemm(k, a, b, ref, cfg)[0]
    med = rounds_cold_l2(fns) if "--cold-l2" in sys.argv else rounds(fns, n=9)
    print(f"{M}x{N}x{K}{' cold L2' if '--cold-l2' in sys.argv else ''}: cuBLAS {med['cublas'] * 1e3:.1f} us; " +
          ", ".join(f"{bm}x{bn}/{st} {med['cublas'] / med[(bm, bn, st)]:.3f}" for bm, bn, st in CONFIGS), flush=True)
