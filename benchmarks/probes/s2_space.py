"""The s2 layer (and 28x28 C128) over a wider space than conv2d.tile's: one or two consumer
warpgroups for 128-row tiles (WG), 2-4 stages; the tuner's report, then the best few vs cuDNN."""
import os, sys, re
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import tilec
from common import Conv, rounds
torch.backends.cudnn.benchmark = True
SRC = open("examples/conv2d.tile").read()
SRC = SRC.replace("threads 2 * BM;", "threads WG * 128;").replace("const BM = 128,", "const WG = 2, BM = 128,")
assert "WG * 128" in SRC

def layer(hw, c, f, s, tune):
    L = Conv(hw, c, f, 3, s)
    y = torch.empty(L.rows, f, device="cuda").half()
    k = tilec.compile(f"// {hw} {s}\n" + SRC, tune=tune, S=s)
    k(L.x, L.wt, y)
    rep = k.tune_report()
    lines = [l for l in rep.splitlines() if " ms" in l]
    timed = sorted(lines, key=lambda l: float(re.search(r"([\d.]+) ms", l).group(1)))
    print(f"== {hw}x{hw} C{c} s{s}: {len(lines)} timed; fastest 12:", flush=True)
    for l in timed[:12]: print("   ", l.strip())
    refused = [l for l in rep.splitlines() if "refused" in l]
    print(f"   refused {len(refused)}; e.g. {refused[:2]}")
    fns = {"cudnn": L.cudnn}
    for l in timed[:5]:
        cfg = dict((kk, int(v)) for kk, v in re.findall(r"(\w+)=(\d+)", l.split(":")[0]))
        kk = tilec.compile(f"// {hw} {s}\n" + SRC, tune=False, S=s, **cfg)
        yy = torch.empty_like(y); kk(L.x, L.wt, yy); torch.cuda.synchronize()
        err = L.relerr(yy)
        assert err < 5e-3, (cfg, err)
        fns[str(cfg)] = (lambda kk=kk, yy=yy: kk(L.x, L.wt, yy))
    med = rounds(fns)
    for m in fns:
        print(f"  {hw} C{c} s{s} {m:70s} {med[m]*1e3:7.1f} us  vs cuDNN {med['cudnn']/med[m]:.3f}", flush=True)

if __name__ == "__main__":
    T = dict(WG=(1, 2), BN=(64, 128, 256), STAGES=(2, 3, 4), PRODUCER=(0, 1), PERSISTENT=(0, 1))
    layer(56, 128, 128, 2, T)
    layer(28, 128, 128, 1, T)
