"""Same process: conv layers whose output tiles form one column (F == BN), as emitted vs with
B (the weights, shared by consecutive tiles) multicast over 2-CTA clusters; and gemm 4096^3."""
import os, statistics, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch, torch.nn.functional as F
import tilec
from tilec import kernel as tk
from mc import multicast_b
torch.backends.cudnn.benchmark = True
SRC = open("examples/conv2d.tile").read()
orig = tk.cuda_codegen.generate
PATCH = {"fn": None}
tk.cuda_codegen.generate = lambda *a, **kw: (PATCH["fn"] or (lambda t: t))(orig(*a, **kw))

def time_one(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(300_000); s.record(); fn(); e.record(); e.synchronize()
    return s.elapsed_time(e)

def rounds(fns, n=11, reps=5):
    for fn in fns.values():
        for _ in range(3): fn()
    torch.cuda.synchronize()
    t = {m: [] for m in fns}
    for r in range(n):
        for m in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t[m].extend(time_one(fns[m]) for _ in range(reps))
    return {m: statistics.median(v) for m, v in t.items()}

def conv(hw, c, f, ks, s, configs, N=128):
    p = ks // 2
    x = torch.randn(N, hw, hw, c, device="cuda").half()
    w = torch.randn(f, c, ks, ks, device="cuda").half() / (ks * ks * c) ** 0.5
    wt = w.permute(2, 3, 1, 0).reshape(ks * ks * c, f).contiguous()
    o = (hw + 2 * p - ks) // s + 1
    xn = x.permute(0, 3, 1, 2); wn = w.contiguous(memory_format=torch.channels_last)
    want = F.conv2d(xn, wn, stride=s, padding=p).permute(0, 2, 3, 1).reshape(-1, f).float()
    fns = {"cudnn": lambda: F.conv2d(xn, wn, stride=s, padding=p)}
    shape = dict(S=s) if ks == 3 else dict(KH=ks, KW=ks, S=s, P=p)
    for cfg in configs:
        for mc in (False, True):
            name = "x".join(map(str, cfg)) + ("/mc" if mc else "")
            PATCH["fn"] = multicast_b if mc else None
            k = tilec.compile(f"// {hw}{c}{f}{s} {mc}\n" + SRC, tune=False,
                              **dict(shape, BM=cfg[0], BN=cfg[1], STAGES=cfg[2], PRODUCER=cfg[3], PERSISTENT=1))
            y = torch.empty(N * o * o, f, device="cuda").half()
            y.fill_(0); k(x, wt, y); torch.cuda.synchronize()
            err = ((y.float() - want).norm() / want.norm()).item()
            print(f"conv {hw}x{hw} C{c}->{f} s{s} {name}: relerr {err:.2e}", flush=True)
            fns[name] = (lambda k=k, y=y: k(x, wt, y))
    med = rounds(fns)
    for m in fns:
        print(f"  conv {hw} C{c}->{f} {ks}x{ks} s{s} {m:16s} {med[m]*1e3:8.1f} us  vs cuDNN {med['cudnn']/med[m]:.3f}", flush=True)

conv(56, 128, 128, 3, 2, [(128, 128, 4, 1), (128, 128, 3, 1)])
conv(28, 128, 128, 3, 1, [(128, 128, 4, 1)])
conv(14, 256, 256, 3, 1, [(128, 256, 4, 1)])
