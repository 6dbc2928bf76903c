"""conv2d.tile's tune space with STAGES in (3, 4) (as shipped) vs (3, 4, 5, 6), each layer of
bench.py tuned both ways in the same process, the two picks and cuDNN then timed in
alternating rounds. For the producer loop's hoisted refills (NOTES.md session 13), after
which more stages pay."""
import os, sys, re
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Conv, rounds  # puts benchmarks/ on sys.path
import bench
import tilec

SRC = open("examples/conv2d.tile").read()
SHIPPED = re.search(r"tune (.*);", SRC).group(1)
SPACE = dict((name, tuple(int(v) for v in vals.split(","))) for name, vals in re.findall(r"(\w+) in \(([^)]*)\)", SHIPPED))


def layer(hw, c, f, ks, s):
    import torch
    torch.backends.cudnn.benchmark = True
    L = Conv(hw, c, f, ks, s)
    fns = {"cudnn": L.cudnn}
    for stages in ((3, 4), (3, 4, 5, 6)):
        space = dict(SPACE, STAGES=stages)
        k = tilec.compile(f"// stage space {stages}\n" + SRC, tune=space, **L.consts)
        y = torch.empty(L.rows, f, device="cuda").half()
        k(L.x, L.wt, y); torch.cuda.synchronize()
        err = L.relerr(y)
        assert err < 5e-3, err
        name = f"S{stages[-1]} space: {k.best_config}"
        lines = [l for l in k.tune_report().splitlines() if " ms" in l]
        lines.sort(key=lambda l: float(re.search(r"([\d.]+) ms", l).group(1)))
        print(f"{bench.conv_name(hw, c, f, ks, s)} S{stages[-1]} space, fastest 4 of {len(lines)}:", flush=True)
        for l in lines[:4]:
            print("    ", l.strip(), flush=True)
        fns[name] = (lambda k=k, y=y: k(L.x, L.wt, y))
    med = rounds(fns, n=9)
    for m in fns:
        print(f"  {bench.conv_name(hw, c, f, ks, s):32s} {m:80s} {med[m]*1e3:8.1f} us  vs cuDNN {med['cudnn']/med[m]:.3f}", flush=True)


if __name__ == "__main__":
    for lay in bench.CONV_3X3 + bench.CONV_1X1:
        layer(*lay)
