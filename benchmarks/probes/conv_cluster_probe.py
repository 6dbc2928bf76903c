"""Same process: conv layers whose tiles all read the whole of B (F == BN), as emitted
(tilec's balanced persistent grid) against the same kernel with B multicast over clusters
of 2, 4 and 8 CTAs (mc_n.py), each on a persistent grid of G blocks where G is a multiple of
the cluster size, at most the clusters cuOccupancyMaxActiveClusters says fit times the size,
and every cluster's CTAs run equally many tiles. Controls: the plain kernel on the same Gs.
Usage: python benchmarks/probes/conv_cluster_probe.py [--compile-only]"""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilec
from tilec.runtime import host
from common import rewrite_cuda
from mc_n import cluster

SRC = open("examples/conv2d.tile").read()
PATCH = rewrite_cuda()
GRID = {"G": None}
_blocks = host.persistent_blocks
host.persistent_blocks = lambda tiles, resident, balanced: GRID["G"] or _blocks(tiles, resident, balanced)


def grids(tiles, n, cap):
    """Gs for clusters of n: the most blocks (<= cap) and the fewest with as few waves,
    each with every cluster's CTAs given the same tile count."""
    ok = [g for g in range(n, cap + 1, n) if (tiles % g) % n == 0]
    most = max(ok)
    waves = -(-tiles // most)
    fewest = min(g for g in ok if -(-tiles // g) == waves)
    return sorted({most, fewest})


def max_clusters(k, n, threads, smem):
    from cuda.bindings import driver as cu
    cfg = cu.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = n * 64, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
    cfg.sharedMemBytes = smem
    err, count = cu.cuOccupancyMaxActiveClusters(k._module(0).function, cfg)
    assert err == cu.CUresult.CUDA_SUCCESS, err
    return count


VARIANTS = {"plain": None,
            "launch": dict(multicast=False, lockstep=False, syncs=False),
            "cluster": dict(multicast=False, lockstep=False),
            "start only": dict(multicast=False, lockstep=False, end="none"),
            "lockstep": dict(multicast=False),
            "mc": dict(),
            "mc lanes": dict(lanes=True),
            "lockstep tail": dict(multicast=False, lanes=True, end="tail"),
            "mc tail": dict(lanes=True, end="tail")}


def compile_variant(tag, consts, n, variant):
    opts = VARIANTS[variant]
    PATCH["fn"] = (lambda t: cluster(t, n, **opts)) if opts is not None else None
    return tilec.compile(f"// {tag} n{n} {variant}\n" + SRC, tune=False, **consts)


def layer(hw, c, f, s, cfg, compile_only=False):
    consts = dict(S=s, BM=cfg[0], BN=cfg[1], STAGES=cfg[2], PRODUCER=1, PERSISTENT=1)
    tag = f"{hw}x{hw} C{c}->{f} s{s} {cfg[0]}x{cfg[1]}/{cfg[2]}"
    ks = {(1, "plain"): compile_variant(tag, consts, 1, "plain")}
    for n in (1, 2, 4, 8):
        for v in list(VARIANTS)[1:4 if n == 1 else None]:
            ks[(n, v)] = compile_variant(tag, consts, n, v)
    if compile_only:
        for (n, v), k in ks.items():
            print(tag, f"n={n} {v}", "cubin", len(k.cubin), "bytes")
        return
    import torch
    from common import Conv, versus_cudnn
    torch.backends.cudnn.benchmark = True
    L = Conv(hw, c, f, 3, s)
    tiles = -(-L.rows // cfg[0]) * (-(-f // cfg[1]))
    threads = 2 * cfg[0] + 128
    plain = ks[(1, "plain")]
    smem = plain._smem_bytes
    caps = {n: max_clusters(ks[(n, "mc")], n, threads, smem) * n for n in (2, 4, 8)}
    print(f"{tag}: {tiles} tiles; {plain._module(0).resident_blocks(threads, smem)} resident blocks; "
          f"clusters of 2 / 4 / 8 fit {caps[2] // 2} / {caps[4] // 4} / {caps[8] // 8}", flush=True)
    kernels = {}
    for (n, v), k in ks.items():
        gs = ([None, 132, 120] if v == "plain" else [132] if n == 1 else grids(tiles, n, caps[n])[-1:])
        for g in gs:
            kernels[f"n{n} {v} G{g or 'tilec'}"] = (k, lambda g=g: GRID.__setitem__("G", g))
    versus_cudnn(L, kernels, tag)
    GRID["G"] = None


def ncu_target(variant, n, g):
    """`--ncu VARIANT N G`: the s2 layer's kernel of that variant (N 1 with plain) on a grid
    of G blocks (0: tilec's), three launches inside cudaProfilerStart/Stop, for
    `ncu --profile-from-start off`."""
    import torch
    from common import Conv
    L = Conv(56, 128, 128, 3, 2)
    consts = dict(S=2, BM=128, BN=128, STAGES=4, PRODUCER=1, PERSISTENT=1)
    k = compile_variant("ncu", consts, n, variant)
    GRID["G"] = g or None
    y = torch.empty(L.rows, L.f, device="cuda").half()
    for _ in range(3):
        k(L.x, L.wt, y)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(3):
        k(L.x, L.wt, y)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(variant, n, g, "relerr", L.relerr(y))


if __name__ == "__main__":
    if "--ncu" in sys.argv:
        i = sys.argv.index("--ncu")
        ncu_target(sys.argv[i + 1], int(sys.argv[i + 2]), int(sys.argv[i + 3]))
        sys.exit(0)
    co = "--compile-only" in sys.argv
    layer(56, 128, 128, 2, (128, 128, 4), co)
    layer(28, 128, 128, 1, (128, 128, 4), co)
