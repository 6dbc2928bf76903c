"""Same process: conv layers with 256-row tiles on two consumer warpgroups (each warpgroup 128
rows: two m64 wgmmas per K step, 128 accumulator registers), against conv2d.tile's tuned pick and
cuDNN. A 256x128 tile reads B once for twice the rows: 25% fewer bytes from L2 per output than
128x128 (the s2 layer is L2-bound, NOTES session 11)."""
import os
import sys

os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import tilec  # noqa: E402
from common import Conv, rounds  # noqa: E402

torch.backends.cudnn.benchmark = True
SHIPPED = open("examples/conv2d.tile").read()
SRC = SHIPPED.replace("threads 2 * BM;", "threads WG * 128;").replace("const BM = 128,", "const WG = 2, BM = 128,")
TALL = [dict(BN=128, STAGES=3, PRODUCER=1, PERSISTENT=1), dict(BN=128, STAGES=3, PRODUCER=1, PERSISTENT=0),
        dict(BN=128, STAGES=3, PRODUCER=0, PERSISTENT=0), dict(BN=128, STAGES=4, PRODUCER=0, PERSISTENT=0),
        dict(BN=64, STAGES=4, PRODUCER=1, PERSISTENT=1)]


def layer(hw, c, f, ks, s):
    L = Conv(hw, c, f, ks, s)
    tuned = tilec.compile(f"// {hw} {c} {f} {ks} {s}\n" + SHIPPED, **L.consts)
    y0 = torch.empty(L.rows, f, device="cuda").half()
    tuned(L.x, L.wt, y0)
    fns = {"cudnn": L.cudnn, f"tuned {tuned.best_config}": lambda: tuned(L.x, L.wt, y0)}
    for cfg in TALL:
        if cfg["BN"] > f:
            continue
        k = tilec.compile(f"// {hw} {c} {f} {ks} {s} tall\n" + SRC, tune=False, WG=2, BM=256, **L.consts, **cfg)
        y = torch.empty_like(y0)
        k(L.x, L.wt, y)
        torch.cuda.synchronize()
        assert L.relerr(y) < 5e-3, (cfg, L.relerr(y))
        fns[f"256 rows {cfg}"] = (lambda k=k, y=y: k(L.x, L.wt, y))
    med = rounds(fns, n=9)
    for m in fns:
        print(f"  {hw}x{hw} C{c}->{f} {ks}x{ks} s{s} {m:70s} {med[m] * 1e3:7.1f} us  vs cuDNN "
              f"{med['cudnn'] / med[m]:.3f}", flush=True)


if __name__ == "__main__":
    for args in ((56, 128, 128, 3, 2), (28, 128, 128, 3, 1), (56, 64, 256, 1, 1), (14, 1024, 256, 1, 1)):
        layer(*args)
