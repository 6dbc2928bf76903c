"""gemm.tile's tune space of session 14 with and without `STREAM_K in (0, 1)`, or with
`--bm64` without and with `BM = 64` (as shipped since session 15) on small and LLM-like
shapes, on shapes whose tile counts fill whole waves well and badly: each tuned cold (fresh
disk cache; the candidates' cubins compiled in the same process before, so the tune time is
mostly timing, and printed), then the two picks and cuBLAS timed in alternating rounds.
Outputs are views with a sentinel margin.

    python benchmarks/probes/sk_tune_probe.py [f16|bf16] [--bm64]
"""
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import tuned_picks_vs_cublas

DT = "bf16" if "bf16" in sys.argv else "f16"
SHIPPED = open("examples/gemm.tile").read().replace("f16", DT)
assert "tune BM in (64, 128, 192)" in SHIPPED and ", STREAM_K in (0, 1);" in SHIPPED
WITHOUT_BM64 = SHIPPED.replace("tune BM in (64, 128, 192)", "tune BM in (128, 192)")     # session 14's
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (3072, 3072, 4096), (5120, 5120, 5120),
          (2048, 2048, 8192), (4096, 11008, 4096), (1024, 4096, 8192), (6144, 6144, 6144)]
if "--bm64" in sys.argv:
    SPACES = {"without BM 64": WITHOUT_BM64, "+BM 64": SHIPPED}
    SHAPES = [(1024, 4096, 4096), (1024, 4096, 8192), (2048, 2048, 8192), (2048, 4096, 4096),
              (1024, 14336, 4096), (3072, 3072, 4096), (4096, 4096, 4096), (8192, 8192, 8192)]
else:
    SPACES = {"without stream-K": WITHOUT_BM64.replace(", STREAM_K in (0, 1);", ";"), "+stream-K": WITHOUT_BM64}


tuned_picks_vs_cublas(SPACES, SHAPES, DT, n=9)
