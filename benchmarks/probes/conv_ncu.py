"""One conv layer's kernels for ncu: the s2 layer (56x56 C128->128 3x3 stride 2, N = 128) by
conv2d.tile with the tuner's usual pick (128x128/4, producer, persistent) and by cuDNN, each run a
few times after a warm-up, inside cudaProfilerStart/Stop: run
`python benchmarks/probes/conv_ncu.py tilec|cudnn [s2|28|1x1] [STAGES]` under
`ncu --profile-from-start off ...` (28: the 28x28 C128 layer instead, 1x1: 56x56 C64->256 1x1 with
128x256 tiles; STAGES: 4 unless given)."""
import os
import sys

os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import tilec  # noqa: E402
from common import Conv  # noqa: E402

torch.backends.cudnn.benchmark = True
which = sys.argv[1] if len(sys.argv) > 1 else "tilec"
layer = sys.argv[2] if len(sys.argv) > 2 else "s2"
stages = int(sys.argv[3]) if len(sys.argv) > 3 else 4
L = {"s2": lambda: Conv(56, 128, 128, 3, 2), "28": lambda: Conv(28, 128, 128, 3, 1),
     "1x1": lambda: Conv(56, 64, 256, 1, 1)}[layer]()
if which == "tilec":
    tiles = dict(BM=128, BN=256 if layer == "1x1" else 128, STAGES=stages, PRODUCER=1, PERSISTENT=1)
    k = tilec.compile("examples/conv2d.tile", tune=False, **tiles, **L.consts)
    y = torch.empty(L.rows, L.f, device="cuda").half()
    run = lambda: k(L.x, L.wt, y)     # noqa: E731
else:
    run = L.cudnn
for _ in range(3):
    run()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for _ in range(3):
    run()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
if which == "tilec":
    print("relerr", L.relerr(y))
