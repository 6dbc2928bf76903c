"""Convolutions of 16 and 32 channels on tensor cores: conv2d.tile with its K tile as wide
as the channels (BK = 16 / 32 f16: im2col tiles of 32 / 64 bytes, TMA's 32- and 64-byte
swizzles), and with C fixed in its header and BK = 64 (each K tile spans 64 / C filter
taps, one swizzled chunk and one TMA load per tap); the rest of its tune space tuned per
layer; against cuDNN (F.conv2d, channels-last, cudnn.benchmark) in alternating rounds
(common.versus_cudnn); N = 128.

    python benchmarks/probes/narrow_conv_probe.py"""
import os, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Conv, versus_cudnn

LAYERS = [(112, 16, 64, 3, 1), (56, 32, 64, 3, 1), (56, 16, 64, 3, 1), (28, 32, 128, 3, 1)]   # hw, c, f, k, s


def main():
    import torch
    import tilec
    torch.backends.cudnn.benchmark = True
    for hw, c, f, ks, s in LAYERS:
        L = Conv(hw, c, f, ks, s)
        src = open("examples/conv2d.tile").read()
        fixed = src.replace("X: f16[N, H, W, C]", f"X: f16[N, H, W, {c}]").replace("KH * KW * C", f"KH * KW * {c}")
        kernels = {f"tilec BK={c}": tilec.compile(src, BK=c, **L.consts),
                   f"tilec C={c} BK=64 (taps)": tilec.compile(fixed, BK=64, **L.consts)}
        for name, k in kernels.items():
            y = torch.empty(L.rows, L.f, device="cuda").half()
            k(L.x, L.wt, y)                 # tunes
            torch.cuda.synchronize()
            print(f"{hw}x{hw} C{c}->{f} {ks}x{ks} s{s} {name}: pick {k.best_config}", flush=True)
        versus_cudnn(L, kernels, f"{hw}x{hw} C{c}->{f}")


main()
