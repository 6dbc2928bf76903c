"""Few-row gemms with the operands swapped: C^T = B^T @ A^T, so that B's N columns fill
wgmma's 64-row side and A's few rows are its N side (n8-n64), instead of A's rows padded
with zeros to 64 by the TMA unit. The kernel below is gemm.tile written that way (the
accumulator [BN, BM], transposed into a shared tile for the TMA store); tuned cold beside
gemm.tile as shipped, then both picks and cuBLAS in alternating rounds (common.
tuned_picks_vs_cublas; with `--cold-l2` also with the L2 flushed before each call). Outputs
are views with a sentinel margin, checked after each tune.

With `--bm 16,32,64,128,192`, gemm.tile with those BM is tuned beside them: plan-gemm swaps
the operands of tiles of fewer than 64 rows itself.

    python benchmarks/probes/swap_ab_probe.py [f16|bf16] [--shapes MxNxK,...] [--report] [--cold-l2] [--bm 16,32,...]
"""
import os, re, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import tuned_picks_vs_cublas

SWAPPED = """
kernel gemm_swap(A: f16[M, K], B: f16[K, N], C: f16[M, N]) {
    const BM = 16, BN = 128, BK = 64, STAGES = 8, PRODUCER = 1, PERSISTENT = 1, STREAM_K = 1;
    tune BM in (8, 16, 32, 64), BN in (64, 128, 256), STAGES in (4, 8), PRODUCER in (0, 1), PERSISTENT in (0, 1), STREAM_K in (0, 1);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM)), persistent = PERSISTENT, stream_k = STREAM_K;
    threads 2 * BN;
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    shared ct: f16[BM, BN];
    local acc: f32[BN, BM];
    fill(acc, 0);
    for k in pipelined(cdiv(K, BK), stages = STAGES, producer = PRODUCER) {
        copy(A[by * BM, k * BK], a);
        copy(B[k * BK, bx * BN], b);
        gemm(b, a, acc, transpose_a = true, transpose_b = true);   // acc^T += a @ b
    }
    parallel (j, i) in (BN, BM) {
        ct[i, j] = acc[j, i];
    }
    copy(ct, C[by * BM, bx * BN]);
}
"""
DT = "bf16" if "bf16" in sys.argv else "f16"
SHIPPED = open("examples/gemm.tile").read().replace("f16", DT)
SPACES = {"shipped": SHIPPED, "swapped": SWAPPED.replace("f16", DT)}
if "--bm" in sys.argv:      # gemm.tile with these BM (below 64: plan-gemm swaps the operands)
    bms = sys.argv[sys.argv.index("--bm") + 1]
    assert "threads 128 * max(1, BM / 64 * (BM % 64 == 0));" in SHIPPED    # one warpgroup per 64 rows, one for acc^T
    SPACES[f"BM in ({bms})"], n = re.subn(r"tune BM in \([^)]*\)", f"tune BM in ({bms})", SHIPPED)
    assert n == 1
SHAPES = [(m, n, k) for m in (8, 16, 32, 64) for n, k in ((4096, 4096), (4096, 14336), (14336, 4096))] + \
    [(128, 4096, 4096), (13, 4104, 4096), (50, 1000, 2008)]   # ragged: M, N and K not multiples of any tile
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]

tuned_picks_vs_cublas(SPACES, SHAPES, DT, n=7, report="--report" in sys.argv, cold_l2="--cold-l2" in sys.argv)
