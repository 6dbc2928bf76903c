"""examples/gemm_f8.tile's loop with gemm.tile's schedule consts (producer warpgroup,
persistent grid, stream-K, group), fixed configs against torch._scaled_mm (unit
scales, f16 out, use_fast_accum), as bench.py's gemm_f8 rows time them; each result
checked first. Which configs would an f8 tune space need (NOTES.md session 33)?

    python benchmarks/probes/f8_space_probe.py            (from the repository root, on a GPU)"""
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402

import tilec  # noqa: E402
from bench import compare  # noqa: E402

SRC = """
kernel gemm_f8(A: f8e4m3[M, K], B: f8e4m3[N, K], C: f16[M, N]) {
    const BM = 128, BN = 256, BK = 128, STAGES = 4, PRODUCER = 0, PERSISTENT = 0, STREAM_K = 0, GROUP = 8;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM)), persistent = PERSISTENT, stream_k = STREAM_K, group = GROUP;
    threads 128 * (BM / 64);
    shared a: f8e4m3[BM, BK];
    shared b: f8e4m3[BN, BK];
    local acc: f32[BM, BN];
    fill(acc, 0);
    for k in pipelined(cdiv(K, BK), stages = STAGES, producer = PRODUCER) {
        copy(A[by * BM, k * BK], a);
        copy(B[bx * BN, k * BK], b);
        gemm(a, b, acc, transpose_b = true);
    }
    copy(acc, C[by * BM, bx * BN]);
}
"""
# (BM, BN, STAGES, PRODUCER, PERSISTENT, STREAM_K)
CONFIGS = [(128, 256, 4, 0, 0, 0), (128, 256, 4, 1, 0, 0), (128, 256, 4, 1, 1, 0), (128, 256, 4, 1, 1, 1),
           (128, 256, 3, 1, 1, 0), (192, 128, 4, 1, 1, 0), (192, 128, 5, 1, 1, 0), (192, 128, 5, 1, 1, 1),
           (128, 128, 6, 1, 1, 0), (128, 128, 8, 1, 1, 0), (256, 128, 3, 1, 1, 0), (256, 128, 3, 1, 1, 1)]

one = torch.ones((), device="cuda")
kernels = {}
for c in CONFIGS:
    bm, bn, s, p, pe, sk = c
    try:
        kernels[c] = tilec.compile(SRC, BM=bm, BN=bn, STAGES=s, PRODUCER=p, PERSISTENT=pe, STREAM_K=sk, tune=False)
    except tilec.TilecError as e:
        print(f"{c}: refused: {e}", flush=True)
for n in (4096, 8192):
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    bt = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    c16 = torch.empty(n, n, device="cuda", dtype=torch.float16)
    want = a.float() @ bt.float().t()
    print(f"{n}^3:", flush=True)
    for c, k in kernels.items():
        try:
            k(a, bt, c16)
            torch.cuda.synchronize()
        except Exception as e:      # noqa: BLE001 (a launch the GPU refuses: registers, shared memory)
            print(f"  {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
            continue
        err = ((c16.float() - want).norm() / want.norm()).item()
        assert err < 5e-3, (c, err)
        _, _, r = compare(lambda: k(a, bt, c16),
                          lambda: torch._scaled_mm(a, bt.t(), scale_a=one, scale_b=one, out_dtype=torch.float16,
                                                   use_fast_accum=True))
        print(f"  BM{c[0]} BN{c[1]} S{c[2]} pr{c[3]} pe{c[4]} sk{c[5]}: {r:.3f} [{r.lo:.3f}-{r.hi:.3f}]", flush=True)
