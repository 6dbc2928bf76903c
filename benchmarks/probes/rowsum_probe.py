"""examples/rowsum.tile with its consts fixed (tune=False), each against torch.sum +
torch.amax over the rows, at shapes from many short rows to a few long ones
(NOTES.md session 29): ratio = torch time / tilec time, median and range of rounds.
Each config's result is checked first (maxima exact, sums within float rounding).

    python benchmarks/probes/rowsum_probe.py            (from the repository root, on a GPU)"""
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402

import tilec  # noqa: E402
from bench import compare  # noqa: E402

CONFIGS = [(4, 256, 128), (1, 1024, 128), (1, 1024, 256), (1, 2048, 256), (1, 2048, 512), (1, 4096, 512),
           (2, 1024, 256), (4, 256, 256)]
SHAPES = ((4096, 4096), (16384, 1024), (1024, 16384), (256, 65536), (128, 131072), (64, 16384))

kernels = {(bm, bn, t): tilec.compile("examples/rowsum.tile", BM=bm, BN=bn, THREADS=t, tune=False)
           for bm, bn, t in CONFIGS}
for m, n in SHAPES:
    x = torch.randn(m, n, device="cuda")
    ref_sum, ref_max = x.double().sum(1), x.amax(1)
    print(f"{m}x{n}:", flush=True)
    for (bm, bn, t), k in kernels.items():
        if bn > n:
            continue
        sums, maxes = torch.empty(m, device="cuda"), torch.empty(m, device="cuda")
        k(x, sums, maxes)
        torch.cuda.synchronize()
        assert torch.equal(maxes, ref_max)
        torch.testing.assert_close(sums.double(), ref_sum, rtol=1e-4, atol=1e-2)
        _, _, r = compare(lambda: k(x, sums, maxes), lambda: (torch.sum(x, 1, out=sums), torch.amax(x, 1, out=maxes)))
        print(f"   BM{bm} BN{bn} t{t:<4} {r:.3f} [{r.lo:.3f}-{r.hi:.3f}]", flush=True)
