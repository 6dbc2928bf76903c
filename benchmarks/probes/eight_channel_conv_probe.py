"""Convolutions of 8 and 24 f16 channels (16 and 48 bytes a filter tap), as the first
layer of an image network is once its 3 channels are padded: conv2d.tile with C fixed in
its header loads each tap's channels in 16-byte chunks by TMA, unswizzled, into wgmma's
interleaved layout (plan-gemm's `_k_major_swizzle`); with C a shape symbol the launch
refuses the tensor (C not a multiple of BK) and the thread-copy variant runs. Both with
the same tiles, and the fixed-C kernel tuned over conv2d.tile's space, against cuDNN
(F.conv2d, channels-last, cudnn.benchmark) in alternating rounds; N = 128.
With --bk, also the fixed-C kernel at K tiles of 32, 64 and 128 columns (BM 128,
BN 64, 4 and 6 stages): conv2d.tile's tune space has no BK, and for C = 24 a K tile
of 64 is eight 16-byte chunk loads of which the last K tile wastes 40 columns
(K = 216): is a shallower or deeper K tile the next lever for small C?

    python benchmarks/probes/eight_channel_conv_probe.py [--bk]"""
import os, sys, warnings
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Conv, versus_cudnn

LAYERS = [(112, 8, 64, 3, 1), (56, 8, 64, 3, 1), (224, 8, 64, 7, 2), (56, 24, 64, 3, 1)]   # hw, c, f, k, s
TILES = dict(BM=128, BN=64, STAGES=4)


def main():
    import torch
    import tilec
    torch.backends.cudnn.benchmark = True
    warnings.simplefilter("ignore", tilec.TmaFallbackWarning)
    src = open("examples/conv2d.tile").read()
    for hw, c, f, ks, s in LAYERS:
        L = Conv(hw, c, f, ks, s)
        fixed = src.replace("X: f16[N, H, W, C]", f"X: f16[N, H, W, {c}]").replace("KH * KW * C", f"KH * KW * {c}")
        kernels = {"C symbol, thread copies": tilec.compile(src, tune=False, **TILES, **L.consts),
                   f"C={c}, 16-byte chunks": tilec.compile(fixed, tune=False, **TILES, **L.consts),
                   f"C={c}, tuned": tilec.compile(fixed, **L.consts)}
        if "--bk" in sys.argv:
            for bk in (32, 64, 128):
                for stages in (4, 6):
                    try:
                        kernels[f"C={c}, BK={bk}, {stages} stages"] = tilec.compile(
                            fixed, tune=False, **{**TILES, "STAGES": stages, "BK": bk}, **L.consts)
                    except tilec.SemanticError as e:          # (6 stages of 128-deep tiles: no room)
                        print(f"BK={bk}, {stages} stages: {e.message}", flush=True)
        y = torch.empty(L.rows, L.f, device="cuda").half()
        kernels[f"C={c}, tuned"](L.x, L.wt, y)         # tunes
        torch.cuda.synchronize()
        print(f"{hw}x{hw} C{c}->{f} {ks}x{ks} s{s}: pick {kernels[f'C={c}, tuned'].best_config}", flush=True)
        versus_cudnn(L, kernels, f"{hw}x{hw} C{c}->{f} {ks}x{ks}")


main()
