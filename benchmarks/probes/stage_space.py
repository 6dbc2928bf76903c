"""conv2d.tile's tune space two ways, each layer of bench.py tuned both ways in the same
process, the two picks and cuDNN then timed in alternating rounds: STAGES in (3, 4) vs
(3, 4, 5, 6) (for the producer loop's hoisted refills, NOTES.md session 13, after which more
stages pay), or with `--bm64` the shipped space with and without BM = 64 (the 1x1 layers
and 56x56 C64)."""
import os, sys, re
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Conv, rounds  # puts benchmarks/ on sys.path
import bench
import tilec

SRC = open("examples/conv2d.tile").read()
SHIPPED = re.search(r"tune (.*);", SRC).group(1)
SPACE = dict((name, tuple(int(v) for v in vals.split(","))) for name, vals in re.findall(r"(\w+) in \(([^)]*)\)", SHIPPED))


def layer(hw, c, f, ks, s, spaces):
    """Tune the layer over each of `spaces` ({name: space}); the picks and cuDNN in alternating rounds."""
    import torch
    torch.backends.cudnn.benchmark = True
    L = Conv(hw, c, f, ks, s)
    fns = {"cudnn": L.cudnn}
    for sname, space in spaces.items():
        k = tilec.compile(f"// space {sname}\n" + SRC, tune=space, **L.consts)
        y = torch.empty(L.rows, f, device="cuda").half()
        k(L.x, L.wt, y); torch.cuda.synchronize()
        err = L.relerr(y)
        assert err < 5e-3, err
        name = f"{sname}: {k.best_config}"
        lines = [l for l in k.tune_report().splitlines() if " ms" in l]
        lines.sort(key=lambda l: float(re.search(r"([\d.]+) ms", l).group(1)))
        print(f"{bench.conv_name(hw, c, f, ks, s)} {sname}, fastest 4 of {len(lines)}:", flush=True)
        for l in lines[:4]:
            print("    ", l.strip(), flush=True)
        fns[name] = (lambda k=k, y=y: k(L.x, L.wt, y))
    med = rounds(fns, n=9)
    for m in fns:
        print(f"  {bench.conv_name(hw, c, f, ks, s):32s} {m:80s} {med[m]*1e3:8.1f} us  vs cuDNN {med['cudnn']/med[m]:.3f}", flush=True)


if __name__ == "__main__":
    if "--bm64" in sys.argv:        # the shipped space with and without 64-row tiles
        spaces = {"shipped": SPACE, "BM 64 too": dict(SPACE, BM=(64,) + SPACE["BM"])}
        layers = bench.CONV_1X1 + bench.CONV_3X3[:1]
    else:                           # STAGES over (3, 4) and (3, 4, 5, 6)
        spaces = {"S4 space": dict(SPACE, STAGES=(3, 4)), "S6 space": dict(SPACE, STAGES=(3, 4, 5, 6))}
        layers = bench.CONV_3X3 + bench.CONV_1X1
    for lay in layers:
        layer(*lay, spaces)
