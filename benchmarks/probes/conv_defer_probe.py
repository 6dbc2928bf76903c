"""Same process: conv2d.tile layers, persistent producer configs, as emitted vs the epilogue deferred
under the next tile's first wgmmas (benchmarks/probes/defer.py), against cuDNN."""
import os, statistics, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch, torch.nn.functional as F
import tilec
from tilec import kernel as tk
from defer import deferred
torch.backends.cudnn.benchmark = True
SRC = open("examples/conv2d.tile").read()
GSRC = open("examples/gemm.tile").read()
orig = tk.cuda_codegen.generate
PATCH = {"fn": None}
tk.cuda_codegen.generate = lambda *a, **kw: (PATCH["fn"] or (lambda t: t))(orig(*a, **kw))

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

def build(src, tag, defer, consts):
    PATCH["fn"] = deferred if defer else None
    return tilec.compile(f"// {tag} {defer}\n" + src, tune=False, **consts)

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
        for defer in (False, True):
            name = "x".join(map(str, cfg)) + ("/def" if defer else "")
            k = build(SRC, f"{hw}{c}{f}{ks}{s}", defer, dict(shape, BM=cfg[0], BN=cfg[1], STAGES=cfg[2], PRODUCER=1, PERSISTENT=1))
            big = torch.full((N * o * o + 2, f + 16), 3.0, device="cuda").half()
            y = big[1:-1, 8:f + 8]
            k(x, wt, y); torch.cuda.synchronize()
            err = ((y.float() - want).norm() / want.norm()).item()
            y.fill_(3.0)
            ok = bool((big == 3).all())
            fns[name] = (lambda k=k, y=y: k(x, wt, y))
            print(f"conv {hw}x{hw} C{c}->{f} {ks}x{ks} s{s} {name}: relerr {err:.2e} margin {ok}", flush=True)
    med = rounds(fns)
    for m in fns:
        print(f"  conv {hw} C{c}->{f} {ks}x{ks} s{s} {m:16s} {med[m]*1e3:8.1f} us  vs cuDNN {med['cudnn']/med[m]:.3f}", flush=True)

def gemm(n, dtype, configs):
    a = torch.randn(n, n, device="cuda", dtype=dtype); b = torch.randn(n, n, device="cuda", dtype=dtype)
    fns = {"cublas": lambda: torch.matmul(a, b)}
    want = (a.float() @ b.float())
    src = GSRC.replace("f16", "bf16") if dtype == torch.bfloat16 else GSRC
    for cfg in configs:
        for defer in (False, True):
            name = "x".join(map(str, cfg)) + ("/def" if defer else "")
            k = build(src, f"g{n}", defer, dict(BM=cfg[0], BN=cfg[1], STAGES=cfg[2], PRODUCER=1, PERSISTENT=1))
            c = torch.empty(n, n, device="cuda", dtype=dtype)
            k(a, b, c); torch.cuda.synchronize()
            print(f"gemm {n} {name}: maxerr {(c.float() - want).abs().max().item():.3g}", flush=True)
            fns[name] = (lambda k=k, c=c: k(a, b, c))
    med = rounds(fns)
    for m in fns:
        print(f"  gemm {n} {str(dtype)[6:]} {m:16s} {med[m]*1e3:8.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}", flush=True)

C3 = [(128, 128, 4), (128, 256, 4), (192, 128, 4)]
conv(56, 128, 128, 3, 2, C3)
conv(28, 128, 128, 3, 1, C3)
conv(56, 64, 64, 3, 1, [(128, 64, 4), (192, 64, 4), (128, 128, 4)])
conv(14, 1024, 256, 1, 1, [(192, 128, 4), (128, 256, 4)])
gemm(4096, torch.float16, [(128, 256, 4)])
