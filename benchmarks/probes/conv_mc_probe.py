"""Same process: conv layers whose output tiles form one column (F == BN), as emitted vs with
B (the weights, shared by consecutive tiles) multicast over 2-CTA clusters; and gemm 4096^3."""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import tilec
from common import Conv, rewrite_cuda, rounds
from mc import cluster
torch.backends.cudnn.benchmark = True
SRC = open("examples/conv2d.tile").read()
PATCH = rewrite_cuda()

def conv(hw, c, f, ks, s, configs):
    L = Conv(hw, c, f, ks, s)
    fns = {"cudnn": L.cudnn}
    for cfg in configs:
        for mc in (False, True):
            name = "x".join(map(str, cfg)) + ("/mc" if mc else "")
            PATCH["fn"] = cluster if mc else None
            k = tilec.compile(f"// {hw}{c}{f}{s} {mc}\n" + SRC, tune=False,
                              **dict(L.consts, BM=cfg[0], BN=cfg[1], STAGES=cfg[2], PRODUCER=cfg[3], PERSISTENT=1))
            y = torch.empty(L.rows, f, device="cuda").half()
            y.fill_(0); k(L.x, L.wt, y); torch.cuda.synchronize()
            print(f"conv {hw}x{hw} C{c}->{f} s{s} {name}: relerr {L.relerr(y):.2e}", flush=True)
            fns[name] = (lambda k=k, y=y: k(L.x, L.wt, y))
    med = rounds(fns, n=11)
    for m in fns:
        print(f"  conv {hw} C{c}->{f} {ks}x{ks} s{s} {m:16s} {med[m]*1e3:8.1f} us  vs cuDNN {med['cudnn']/med[m]:.3f}", flush=True)

conv(56, 128, 128, 3, 2, [(128, 128, 4, 1), (128, 128, 3, 1)])
conv(28, 128, 128, 3, 1, [(128, 128, 4, 1)])
conv(14, 256, 256, 3, 1, [(128, 256, 4, 1)])
