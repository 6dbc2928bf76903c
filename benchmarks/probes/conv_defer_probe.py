"""Same process: conv2d.tile layers, persistent producer configs, as emitted vs the epilogue deferred
under the next tile's first wgmmas (benchmarks/probes/defer.py), against cuDNN."""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import tilec
from common import Conv, rewrite_cuda, rounds
from defer import deferred
torch.backends.cudnn.benchmark = True
SRC = open("examples/conv2d.tile").read()
GSRC = open("examples/gemm.tile").read()
PATCH = rewrite_cuda()

def build(src, tag, defer, consts):
    PATCH["fn"] = deferred if defer else None
    return tilec.compile(f"// {tag} {defer}\n" + src, tune=False, **consts)

def conv(hw, c, f, ks, s, configs):
    L = Conv(hw, c, f, ks, s)
    fns = {"cudnn": L.cudnn}
    for cfg in configs:
        for defer in (False, True):
            name = "x".join(map(str, cfg)) + ("/def" if defer else "")
            k = build(SRC, f"{hw}{c}{f}{ks}{s}", defer, dict(L.consts, BM=cfg[0], BN=cfg[1], STAGES=cfg[2], PRODUCER=1, PERSISTENT=1))
            big = torch.full((L.rows + 2, f + 16), 3.0, device="cuda").half()
            y = big[1:-1, 8:f + 8]
            k(L.x, L.wt, y); torch.cuda.synchronize()
            err = L.relerr(y)
            y.fill_(3.0)
            ok = bool((big == 3).all())
            fns[name] = (lambda k=k, y=y: k(L.x, L.wt, y))
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
