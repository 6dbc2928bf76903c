"""Few-row gemms with a deeper K step: gemm.tile as shipped against the same space with
`BK in (64, 128)` added (a 128-deep step moves twice the bytes per barrier round trip; with
8- or 16-row tiles a 64-deep step moves 16-32 KB of B, and the per-step handshake may
bound the rate). Each tuned cold, then both picks and cuBLAS in alternating rounds
(common.tuned_picks_vs_cublas); outputs are views with a sentinel margin.

    python benchmarks/probes/decode_bk_probe.py [f16|bf16] [--shapes MxNxK,...] [--report]

Once gemm.tile tuned BK (session 18), the second space is gemm.tile with 128-deep steps for
64-row tiles too and 6-stage rings.
"""
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import tuned_picks_vs_cublas

DT = "bf16" if "bf16" in sys.argv else "f16"
SHIPPED = open("examples/gemm.tile").read().replace("f16", DT)
if "BK in (64, 128)" not in SHIPPED:       # session 18, before gemm.tile tuned BK
    assert SHIPPED.count("STREAM_K in (0, 1)") == 1 and "BK = 64" in SHIPPED
    SPACES = {"shipped": SHIPPED,
              "BK in (64, 128)": SHIPPED.replace("STREAM_K in (0, 1)", "STREAM_K in (0, 1), BK in (64, 128)")}
else:                                     # --wide: 128-deep steps for 64-row tiles too, and 6-stage rings
    wide = SHIPPED.replace("STAGES in (3, 4, 8)", "STAGES in (3, 4, 6, 8)").replace("BM < 64 && BN <= 128",
                                                                                   "BM <= 64 && BN <= 128")
    assert wide.count("STAGES in (3, 4, 6, 8)") == 1 and wide.count("BM <= 64 && BN <= 128") == 1
    SPACES = {"shipped": SHIPPED, "BK 128 for 64 rows, 6 stages": wide}
SHAPES = [(1, 4096, 4096), (8, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (16, 4096, 14336), (256, 4096, 4096)]
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]

tuned_picks_vs_cublas(SPACES, SHAPES, DT, n=7, report="--report" in sys.argv)
