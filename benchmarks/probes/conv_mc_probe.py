"""Same process: conv layers whose output tiles form one column (F == BN), as emitted vs with
B (the weights, shared by consecutive tiles) multicast over 2-CTA clusters; and gemm 4096^3."""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import tilec
from common import Conv, rewrite_cuda, versus_cudnn
from mc import cluster
torch.backends.cudnn.benchmark = True
SRC = open("examples/conv2d.tile").read()
PATCH = rewrite_cuda()

def conv(hw, c, f, ks, s, configs):
    L = Conv(hw, c, f, ks, s)
    kernels = {}
    for cfg in configs:
        for mc in (False, True):
            PATCH["fn"] = cluster if mc else None
            kernels["x".join(map(str, cfg)) + ("/mc" if mc else "")] = tilec.compile(
                f"// {hw}{c}{f}{s} {mc}\n" + SRC, tune=False,
                **dict(L.consts, BM=cfg[0], BN=cfg[1], STAGES=cfg[2], PRODUCER=cfg[3], PERSISTENT=1))
    versus_cudnn(L, kernels, f"conv {hw}x{hw} C{c}->{f} {ks}x{ks} s{s}", n=11)

conv(56, 128, 128, 3, 2, [(128, 128, 4, 1), (128, 128, 3, 1)])
conv(28, 128, 128, 3, 1, [(128, 128, 4, 1)])
conv(14, 256, 256, 3, 1, [(128, 256, 4, 1)])
