"""Few-row gemms with narrower tiles than gemm.tile's, each space tuned cold, then the picks
and cuBLAS in alternating rounds (common.tuned_picks_vs_cublas), outputs guarded. With N = 4096
and 64-column tiles a 64-row gemm has 64 output tiles for 132 SMs. Spaces (session 19), by
the gemm.tile they start from:
- before c31f2d9: `BN 32` (32-column tiles for 64-row tiles: 128 tiles of half the B bytes),
  `BM 32` (32-row tiles, acc^T, for M <= 128), `BM 32 BK 128` (the same, 128 deep, over 32
  rows) and `halves` (tiles of 24-56 rows where they are half of M: shipped in c31f2d9);
- c31f2d9: `halves to 240 rows` (tiles of 72-120 rows too: shipped in b241b7f);
- since: `shipped` only.

    python benchmarks/probes/narrow_tiles_probe.py [f16|bf16] [--shapes MxNxK,...] [--report] [--cold-l2] [--spaces 'shipped,halves']
"""
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import tuned_picks_vs_cublas

DT = "bf16" if "bf16" in sys.argv else "f16"
SHIPPED = open("examples/gemm.tile").read().replace("f16", DT)
SPACES = {"shipped": SHIPPED}
OLD_BM, OLD_BN = "BM in (8, 16, 64, 128, 192)", "BN in (64, 128, 256)"
if OLD_BM in SHIPPED:                     # gemm.tile before session 19 shipped `halves`
    # 32 columns only with 64-row tiles (acc^T tiles need N a multiple of 64), and only for M <= 1024
    SPACES["BN 32"] = SHIPPED.replace(OLD_BN, "BN in (32, 64, 128, 256)").replace(
        "where STREAM_K <= PERSISTENT", "where STREAM_K <= PERSISTENT && (BN != 32 || BM == 64 && M <= 1024)")
    SPACES["BM 32"] = SHIPPED.replace(OLD_BM, "BM in (8, 16, 32, 64, 128, 192)")
    # the 32-row tiles that placed in the first run's reports (64 x 4096 x 4096 and x 14336): 128 deep, over 32 rows
    SPACES["BM 32 BK 128"] = SPACES["BM 32"].replace(
        "where STREAM_K <= PERSISTENT", "where STREAM_K <= PERSISTENT && (BM != 32 || M > 32 && BK == 128)")
    # tiles half as tall as M (rounded up to 8 rows): two tiles of rows for 33-128 rows, 128 blocks at N = 4096
    SPACES["halves"] = SHIPPED.replace(OLD_BM, "BM in (8, 16, 24, 32, 40, 48, 56, 64, 128, 192)").replace(
        "where STREAM_K <= PERSISTENT",
        "where STREAM_K <= PERSISTENT && (BM <= 16 || BM % 64 == 0 || BK == 128 && M > 2 * BM - 16 && M <= 2 * BM)")
elif "BM in (8, 16, 24, 32, 40, 48, 56, 64, 128, 192)" in SHIPPED:   # c31f2d9: the same for 129-240 rows, 72-120 rows (acc^T on one
    HALF_BM = "BM in (8, 16, 24, 32, 40, 48, 56, 64, 128, 192)"    # warpgroup: `threads` gives 128 threads to a
    HALF_RULE = "M > 2 * BM - 16 && M <= 2 * BM && BK == 128 && PRODUCER == 1 && STAGES >= 4"  # tile of rows no
    THREADS = "threads 2 * max(BM, 64);"                                                     # multiple of 64), 64 deep
    assert SHIPPED.count(HALF_BM) == 1 and SHIPPED.count(HALF_RULE) == 1 and SHIPPED.count(THREADS) == 1
    SPACES["halves to 240 rows"] = SHIPPED.replace(
        HALF_BM, "BM in (8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 192)").replace(
        HALF_RULE, "M > 2 * BM - 16 && M <= 2 * BM && (BK == 128 || BM > 64) && PRODUCER == 1 && STAGES >= 4").replace(
        THREADS, "threads 128 * max(1, BM / 64 * (BM % 64 == 0));")
if "--spaces" in sys.argv:
    chosen = sys.argv[sys.argv.index("--spaces") + 1].split(",")
    SPACES = {name: SPACES[name] for name in chosen}
SHAPES = [(64, 4096, 4096), (32, 4096, 4096), (8, 4096, 4096), (128, 4096, 4096), (64, 4096, 14336)]
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]

tuned_picks_vs_cublas(SPACES, SHAPES, DT, n=7, report="--report" in sys.argv, cold_l2="--cold-l2" in sys.argv)
