"""Where a few-row stream-K gemm spends its time (16 or 64 rows against 4096 x 4096
weights: 32 tiles of 64x128, each cut into 4 pieces of 16 K steps on 128 blocks):
consumer thread 0 of every block stamps %clock64 at its start, at each unit's start, at the end of its
K loop and at the block's end, and %globaltimer at the block's start and end (as
sk_probe.py does for 128x256 tiles); printed: the blocks' start offsets after the
first, each phase's spread, and the kernel's span, beside cuBLAS's time and the
time the weights take at 3.0 TB/s. Outputs guarded.

    python benchmarks/probes/decode_timeline.py [--shapes MxNxK,...] [--tile 64x128]
"""
import os, re, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
import sk_probe           # sets TILEC_CACHE=0 and installs the CUDA rewrite hook
import tilec
from common import rounds

SHAPES = [(16, 4096, 4096), (64, 4096, 4096), (16, 4096, 14336)]
BM, BN = 64, 128
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]
    if arg == "--tile":
        BM, BN = (int(x) for x in sys.argv[i + 1].split("x"))


def stamped(text):
    """sk_probe.timeline for any tile: its first substitution keyed on this kernel's setmaxnreg."""
    inc = re.search(r"    setmaxnreg_inc<\d+>\(\);\n", text).group(0)
    out = sk_probe.timeline(text.replace(inc, "    setmaxnreg_inc<232>();\n")).replace(
        "    setmaxnreg_inc<232>();\n", inc)
    start = "    if (threadIdx.x == 0) tl_probe_g[blockIdx.x * 2] = tl_probe_global();\n"
    assert out.count(start) == 1
    return out.replace(start, start + "    " + sk_probe.stamp("") + "\n")   # a clock stamp at the start too


def build(stamps):
    sk_probe.PATCH["fn"] = stamped if stamps else None
    k = tilec.compile(f"// decode timeline {stamps}\n" + sk_probe.SRC, tune=False, BM=BM, BN=BN, STAGES=4,
                      PRODUCER=1, PERSISTENT=1, STREAM_K=1)
    sk_probe.PATCH["fn"] = None
    return k


def main():
    import torch
    from cuda.bindings import driver as cu
    plain, k = build(False), build(True)
    for M, N, K in SHAPES:
        a = torch.randn(M, K, device="cuda", dtype=torch.float16)
        b = torch.randn(K, N, device="cuda", dtype=torch.float16)
        big, c = sk_probe.guarded(torch, M, N, torch.float16)
        ref = a.float() @ b.float()
        plain(a, b, c)
        torch.cuda.synchronize()
        err = (c.float() - ref).abs().max().item() / ref.abs().max().item()
        big[1:M + 1, 8:N + 8] = 7
        assert err < 1e-2 and bool((big == 7).all()), err
        med = rounds({"cublas": lambda: torch.matmul(a, b), "tilec": lambda: plain(a, b, c),
                      "stamped": lambda: k(a, b, c)}, n=7)
        mod = k._module(0).module
        _, t_ptr, t_size = cu.cuModuleGetGlobal(mod, b"tl_probe_t")
        _, g_ptr, g_size = cu.cuModuleGetGlobal(mod, b"tl_probe_g")
        cu.cuMemsetD8(t_ptr, 0, t_size); cu.cuMemsetD8(g_ptr, 0, g_size)
        torch.cuda.synchronize()
        torch.cuda._sleep(1_000_000)                 # as bench.py times a call: behind a GPU spin
        k(a, b, c)
        torch.cuda.synchronize()
        t = np.zeros(t_size // 8, dtype=np.uint64); g = np.zeros(g_size // 8, dtype=np.uint64)
        cu.cuMemcpyDtoH(t.ctypes.data, t_ptr, t_size); cu.cuMemcpyDtoH(g.ctypes.data, g_ptr, g_size)
        t = t.reshape(1024, sk_probe.EVENTS).astype(np.int64); g = g.reshape(1024, 2).astype(np.int64)
        blocks = int((g[:, 0] > 0).sum())
        g0 = g[:blocks, 0].min()
        starts = (g[:blocks, 0] - g0) / 1e3
        ends = (g[:blocks, 1] - g0) / 1e3
        loops, tails, firsts = [], [], []
        for blk in range(blocks):
            ev = t[blk][t[blk] > 0]                  # start, unit start, its loop's end, ..., end
            if len(ev) < 4:
                continue                              # a block with no K steps: start and end only
            ns = (g[blk, 1] - g[blk, 0]) / max(ev[-1] - ev[0], 1)
            rel = (ev - ev[0]) * ns / 1e3
            firsts.append(rel[1])
            loops.append(rel[2] - rel[1])
            tails.append(rel[-1] - rel[2])
        weights = K * N * 2 / 3.0e12 * 1e6
        print(f"{M}x{N}x{K} {BM}x{BN} sk: cuBLAS {med['cublas'] * 1e3:.1f} us, tilec {med['tilec'] * 1e3:.1f} us "
              f"(stamped {med['stamped'] * 1e3:.1f}); the weights at 3.0 TB/s {weights:.1f} us; {blocks} blocks, "
              f"{len(loops)} with K steps", flush=True)
        pct = lambda x: " / ".join(f"{np.percentile(x, p):.2f}" for p in (0, 50, 90, 100))   # noqa: E731
        print(f"  block starts after the first (min / median / p90 / max, us): {pct(starts)}")
        print(f"  block start to its unit's start: {pct(firsts)}")
        print(f"  K loop of a piece: {pct(loops)}; after it to the block's end: {pct(tails)}")
        print(f"  block ends: {pct(ends)}; kernel span (first start to last end) {ends.max():.1f} us", flush=True)


if __name__ == "__main__":
    if "--compile-only" in sys.argv:
        print(len(build(True).cubin))
    else:
        main()
