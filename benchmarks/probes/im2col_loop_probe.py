"""examples/im2col.tile (one [BM, BK] tile a block: its load, then its store) against
the same with a rotating pipeline over R row tiles a block (tile r + 1 .. r + S - 1
loading while tile r is stored), on bench.py's ResNet-50 layer (N128 56x56 C64 3x3):
GB/s (matrix written + input read once) over copy2d's GB/s on a tensor of the
matrix's size, same rounds (NOTES.md session 33). Each result is checked first.

    python benchmarks/probes/im2col_loop_probe.py            (from the repository root, on a GPU)"""
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tilec  # noqa: E402
from bench import ROOT, compare  # noqa: E402

LOOP = """
kernel im2col(X: f16[N, H, W, C], Y: f16[NP, KH * KW * C]) {
    const KH = 3, KW = 3, S = 1, P = 1, D = 1;
    const BM = 128, BK = 64, R = 4, STAGES = 2;
    let OH = (H + 2 * P - D * (KH - 1) - 1) / S + 1;
    let OW = (W + 2 * P - D * (KW - 1) - 1) / S + 1;
    require NP == N * OH * OW;
    grid (bx, by) = (cdiv(KH * KW * C, BK), cdiv(NP, BM * R));
    threads 128;
    let Xc = im2col(X, kernel = (KH, KW), stride = S, pad = P, dilation = D);
    shared t: f16[BM, BK];
    for r in pipelined(R, stages = STAGES) {
        copy(Xc[(by * R + r) * BM, bx * BK], t);
        copy(t, Y[(by * R + r) * BM, bx * BK]);
    }
}
"""
x = torch.randn(128, 56, 56, 64, device="cuda").half()
y = torch.empty(128 * 56 * 56, 9 * 64, device="cuda", dtype=torch.float16)
nbytes = (y.numel() + x.numel()) * 2
xn = x.permute(0, 3, 1, 2)
want = F.unfold(xn, 3, padding=1).view(128, 64, 9, -1).permute(0, 3, 2, 1).reshape(-1, 9 * 64)
kc = tilec.compile(str(ROOT / "examples/copy2d.tile"))
src = torch.randn(y.numel() // 2, device="cuda").view(-1, 9 * 64 // 2)
dst = torch.empty_like(src)
copy_bytes = 2 * src.numel() * 4

variants = {"shipped BM128": tilec.compile(str(ROOT / "examples/im2col.tile")),
            "shipped BM256": tilec.compile(str(ROOT / "examples/im2col.tile"), BM=256)}
for bm, r, s in [(128, 2, 2), (128, 4, 2), (128, 4, 3), (128, 8, 3), (128, 8, 4), (256, 2, 2), (256, 4, 2),
                 (256, 4, 3), (64, 8, 4), (64, 16, 6)]:
    variants[f"loop BM{bm} R{r} S{s}"] = tilec.compile(LOOP, BM=bm, R=r, STAGES=s)
for name, k in variants.items():
    y.zero_()
    try:
        k(x, y)
        torch.cuda.synchronize()
    except tilec.TilecError as e:
        print(f"{name:22s} {type(e).__name__}: {e}", flush=True)
        continue
    assert torch.equal(y, want), name
    t_k, t_copy, _ = compare(lambda: k(x, y), lambda: kc(src, dst), rounds=5)
    print(f"{name:22s} {nbytes / t_k / 1e9:7.0f} GB/s  over copy2d {nbytes / t_k / (copy_bytes / t_copy):.3f}",
          flush=True)
