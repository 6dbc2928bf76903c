"""The s2 layer (and 28x28 C128) over a wider space than conv2d.tile's: one or two consumer
warpgroups for 128-row tiles (WG), 2-4 stages; the tuner's report, then the best few vs cuDNN."""
import os, statistics, sys, re
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd())
import torch, torch.nn.functional as F
import tilec
torch.backends.cudnn.benchmark = True
SRC = open("examples/conv2d.tile").read()
SRC = SRC.replace("threads 2 * BM;", "threads WG * 128;").replace("const BM = 128,", "const WG = 2, BM = 128,")
assert "WG * 128" in SRC

def time_one(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(300_000); s.record(); fn(); e.record(); e.synchronize()
    return s.elapsed_time(e)

def rounds(fns, n=9, reps=5):
    for fn in fns.values():
        for _ in range(3): fn()
    torch.cuda.synchronize()
    t = {m: [] for m in fns}
    for r in range(n):
        for m in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t[m].extend(time_one(fns[m]) for _ in range(reps))
    return {m: statistics.median(v) for m, v in t.items()}

def layer(hw, c, f, s, tune, N=128):
    x = torch.randn(N, hw, hw, c, device="cuda").half()
    w = torch.randn(f, c, 3, 3, device="cuda").half() / (9 * c) ** 0.5
    wt = w.permute(2, 3, 1, 0).reshape(9 * c, f).contiguous()
    o = (hw + 2 - 3) // s + 1
    y = torch.empty(N * o * o, f, device="cuda").half()
    xn = x.permute(0, 3, 1, 2); wn = w.contiguous(memory_format=torch.channels_last)
    k = tilec.compile(f"// {hw} {s}\n" + SRC, tune=tune, S=s)
    k(x, wt, y)
    rep = k.tune_report()
    lines = [l for l in rep.splitlines() if " ms" in l]
    timed = sorted(lines, key=lambda l: float(re.search(r"([\d.]+) ms", l).group(1)))
    print(f"== {hw}x{hw} C{c} s{s}: {len(lines)} timed; fastest 12:", flush=True)
    for l in timed[:12]: print("   ", l.strip())
    refused = [l for l in rep.splitlines() if "refused" in l]
    print(f"   refused {len(refused)}; e.g. {refused[:2]}")
    fns = {"cudnn": lambda: F.conv2d(xn, wn, stride=s, padding=1)}
    want = F.conv2d(xn, wn, stride=s, padding=1).permute(0, 2, 3, 1).reshape(-1, f).float()
    for l in timed[:5]:
        cfg = dict((kk, int(v)) for kk, v in re.findall(r"(\w+)=(\d+)", l.split(":")[0]))
        kk = tilec.compile(f"// {hw} {s}\n" + SRC, tune=False, S=s, **cfg)
        yy = torch.empty_like(y); kk(x, wt, yy); torch.cuda.synchronize()
        err = ((yy.float() - want).norm() / want.norm()).item()
        assert err < 5e-3, (cfg, err)
        fns[str(cfg)] = (lambda kk=kk, yy=yy: kk(x, wt, yy))
    med = rounds(fns)
    for m in fns:
        print(f"  {hw} C{c} s{s} {m:70s} {med[m]*1e3:7.1f} us  vs cuDNN {med['cudnn']/med[m]:.3f}", flush=True)

T = dict(WG=(1, 2), BN=(64, 128, 256), STAGES=(2, 3, 4), PRODUCER=(0, 1), PERSISTENT=(0, 1))
layer(56, 128, 128, 2, T)
layer(28, 128, 128, 1, T)
