"""Same process: a gemm that also writes each row's maximum of its output tile (reduce of the
accumulator in its fragments, session 32) against the same gemm without it, and against
torch.matmul followed by torch.amax over the row tiles (cuBLAS, then a second kernel that
reads C back). examples/gemm_128x256.tile with and without `reduce(acc, rowmax, axis = 1,
op = max)` and a store of rowmax; f16, 4096^3 and 8192^3; checked against torch first."""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilec  # noqa: E402

GEMM = open("examples/gemm_128x256.tile").read()
STATS = GEMM.replace("kernel gemm_128x256(A: f16[M, K], B: f16[K, N], C: f16[M, N]) {",
                     "kernel gemm_rowmax(A: f16[M, K], B: f16[K, N], C: f16[M, N], R: f32[NB, M]) {").replace(
    "    local acc: f32[BM, BN];\n", "    local acc: f32[BM, BN];\n    shared rowmax: f32[BM];\n").replace(
    "    copy(acc, C[by * BM, bx * BN]);    // converts f32 -> f16\n",
    "    copy(acc, C[by * BM, bx * BN]);    // converts f32 -> f16\n"
    "    reduce(acc, rowmax, axis = 1, op = max);\n    copy(rowmax, R[bx, by * BM]);\n")
assert STATS.count("reduce(acc") == 1


def main():
    import torch
    from common import rounds
    plain, stats = tilec.compile(GEMM), tilec.compile(STATS)
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda", dtype=torch.float16)
        b = torch.randn(n, n, device="cuda", dtype=torch.float16)
        c = torch.empty(n, n, device="cuda", dtype=torch.float16)
        r = torch.empty(n // 256, n, device="cuda", dtype=torch.float32)
        stats(a, b, c, r)
        want = (a.float() @ b.float())
        assert (c.float() - want).abs().max() < 2
        assert (r - want.view(n, n // 256, 256).amax(-1).t()).abs().max() < 0.1
        c2 = torch.empty_like(c)

        def peer():
            torch.matmul(a, b, out=c2)
            torch.amax(c2.view(n, n // 256, 256), dim=-1)
        med = rounds({"plain": lambda: plain(a, b, c), "rowmax": lambda: stats(a, b, c, r),
                      "torch": peer, "cublas": lambda: torch.matmul(a, b, out=c2)}, n=9, reps=5)
        print(f"gemm {n}^3 f16: with rowmax / without {med['plain'] / med['rowmax']:.3f} (speed), "
              f"vs torch matmul + amax {med['torch'] / med['rowmax']:.3f}, plain vs cuBLAS "
              f"{med['cublas'] / med['plain']:.3f}", flush=True)


if __name__ == "__main__":
    main()
