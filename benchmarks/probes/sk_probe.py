"""Stream-K against the plain persistent grid, same process, vs cuBLAS, on shapes whose tile
counts fill whole waves badly (128x256 tiles on 132 SMs: 3072^2 x 4096 is 2.18 waves,
2048^2 x 8192 0.97, 4096^3 3.88, 5120^3 6.06), then a timeline of one stream-K launch:
consumer thread 0 of every block stamps %clock64 at its start, at each unit's start
(a tile or a stream-K share of one), when the unit's K loop ends, and at its end, plus
%globaltimer at start and end (the blocks' offsets from each other). Outputs are views
with a sentinel margin.

    python benchmarks/probes/sk_probe.py [--compile-only] [--timeline-only] [--llm] [--waves]
"""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np
import tilec
from common import rewrite_cuda

SRC = open("examples/gemm.tile").read()
PATCH = rewrite_cuda()
EVENTS = 48         # stamps per block

STAMP = r"""
__device__ unsigned long long tl_probe_t[1024 * EVENTS];
__device__ unsigned long long tl_probe_g[1024 * 2];
__device__ __forceinline__ unsigned long long tl_probe_clock() {
  unsigned long long t; asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned long long tl_probe_global() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
""".replace("EVENTS", str(EVENTS))


def stamp(code):
    return f"if (threadIdx.x == 0 && tl_probe_i < {EVENTS}) tl_probe_t[blockIdx.x * {EVENTS} + tl_probe_i++] = tl_probe_clock(); {code}"


def timeline(text):
    """The emitted stream-K gemm with consumer thread 0's stamps."""
    head, sep, body = text.partition('extern "C" __global__')
    assert sep
    subs = [
        ("    setmaxnreg_inc<232>();\n",
         "    setmaxnreg_inc<232>();\n    int tl_probe_i = 0;\n"
         "    if (threadIdx.x == 0) tl_probe_g[blockIdx.x * 2] = tl_probe_global();\n"),
        # the unit's start: the consumers' fill of the accumulator
        ("      // <string>:11: fill(acc, 0);\n", "      " + stamp("") + "\n      // fill(acc, 0);\n"),
        # the unit's K loop has ended (the consumers' count of the ring's iterations)
        ("\n      tl_full0_base += ", "\n      " + stamp("") + "\n      tl_full0_base += "),
        # the block's end
        ("    if (threadIdx.x == 0) {\n      bulk_wait_group_read<0>();\n",
         "    " + stamp("") + "\n    if (threadIdx.x == 0) tl_probe_g[blockIdx.x * 2 + 1] = tl_probe_global();\n"
         "    if (threadIdx.x == 0) {\n      bulk_wait_group_read<0>();\n"),
    ]
    for old, new in subs:
        assert body.count(old) == 1, old
        body = body.replace(old, new)
    return head + STAMP + sep + body


def compile_variants(dtype_name="f16", stamps=False):
    src = SRC.replace("f16", "bf16") if dtype_name == "bf16" else SRC
    P = dict(BM=128, BN=256, STAGES=4, PERSISTENT=1, PRODUCER=1)
    ks = {}
    PATCH["fn"] = None
    ks["persistent"] = tilec.compile("// sk probe persistent\n" + src, tune=False, **P)
    ks["stream-K"] = tilec.compile("// sk probe stream-K\n" + src, tune=False, STREAM_K=1, **P)
    ks["192x128 pe"] = tilec.compile("// sk probe 192\n" + src, tune=False, BM=192, BN=128, STAGES=4,
                                      PERSISTENT=1, PRODUCER=1)
    ks["192x128 sk"] = tilec.compile("// sk probe 192 sk\n" + src, tune=False, BM=192, BN=128, STAGES=4,
                                      PERSISTENT=1, PRODUCER=1, STREAM_K=1)
    if stamps:
        PATCH["fn"] = timeline
        ks["stamped"] = tilec.compile("// sk probe stamped\n" + src, tune=False, STREAM_K=1, **P)
        ks["stamped plain"] = tilec.compile("// sk probe stamped plain\n" + src, tune=False, **P)
        PATCH["fn"] = None
    return ks


def guarded(torch, M, N, dtype):
    big = torch.full((M + 2, N + 16), 7.0, device="cuda", dtype=dtype)
    return big, big[1:M + 1, 8:N + 8]


def versus_cublas(ks, M, N, K, dtype):
    """Each kernel of `ks` checked once on an M x N x K product (its output a view with a
    sentinel margin), then all timed with cuBLAS in alternating rounds: {name: median ms}."""
    import torch
    from common import checked_gemm, gemm_case, rounds
    a, b, ref, fns = gemm_case(M, N, K, dtype)
    for v, k in ks.items():
        fns[v] = checked_gemm(k, a, b, ref, v)[0]
    return rounds(fns, n=9)


def speeds(shapes, dtype_name="f16"):
    import torch
    dtype = getattr(torch, {"f16": "float16", "bf16": "bfloat16"}[dtype_name])
    ks = compile_variants(dtype_name)
    for M, N, K in shapes:
        med = versus_cublas(ks, M, N, K, dtype)
        for m in med:
            print(f"  {M}x{N}x{K} {dtype_name} {m:12s} {med[m]*1e3:8.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}",
                  flush=True)


def show_timeline(M, N, K, which="stamped"):
    import torch
    from cuda.bindings import driver as cu
    k = compile_variants(stamps=True)[which]
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    big, c = guarded(torch, M, N, torch.float16)
    for _ in range(5):
        k(a, b, c)
    torch.cuda.synchronize()
    mod = k._module(0).module
    err, t_ptr, t_size = cu.cuModuleGetGlobal(mod, b"tl_probe_t")
    err2, g_ptr, g_size = cu.cuModuleGetGlobal(mod, b"tl_probe_g")
    assert int(err) == 0 and int(err2) == 0
    cu.cuMemsetD8(t_ptr, 0, t_size); cu.cuMemsetD8(g_ptr, 0, g_size)
    torch.cuda.synchronize()
    k(a, b, c)
    torch.cuda.synchronize()
    t = np.zeros(t_size // 8, dtype=np.uint64); g = np.zeros(g_size // 8, dtype=np.uint64)
    cu.cuMemcpyDtoH(t.ctypes.data, t_ptr, t_size); cu.cuMemcpyDtoH(g.ctypes.data, g_ptr, g_size)
    t = t.reshape(1024, EVENTS).astype(np.int64); g = g.reshape(1024, 2).astype(np.int64)
    blocks = int((g[:, 0] > 0).sum())
    g0 = g[:blocks, 0].min()
    tiles = (M // 128) * (N // 256); steps = K // 64
    rem = tiles % blocks
    sk_tiles = rem + blocks if (rem > 0 and rem * 2 < blocks and tiles >= rem + blocks) else rem
    if which != "stamped":
        sk_tiles = 0
    print(f"timeline {which} {M}x{N}x{K}: {blocks} blocks, {tiles} tiles of {steps} K steps, {sk_tiles} stream-K tiles "
          f"({sk_tiles * steps / blocks:.1f} steps per block), kernel {(g[:blocks, 1].max() - g0) / 1e3:.1f} us")
    rows = []
    for blk in range(blocks):
        ev = t[blk][t[blk] > 0]
        ns_per_cycle = (g[blk, 1] - g[blk, 0]) / max(ev[-1] - ev[0], 1)
        start = (g[blk, 0] - g0) / 1e3
        rel = (ev - ev[0]) * ns_per_cycle / 1e3           # us since the block's start stamp
        # ev: unit starts and loop ends alternate, the last stamp is the end
        units = [(rel[i], rel[i + 1], rel[i + 2] if i + 2 < len(rel) else rel[-1]) for i in range(0, len(rel) - 1, 2)]
        rows.append((blk, start, rel[-1], units))
    ends = np.array([r[1] + r[2] for r in rows])
    print(f"  block start offsets {min(r[1] for r in rows):.2f}-{max(r[1] for r in rows):.2f} us; "
          f"ends {ends.min():.1f}-{ends.max():.1f} us (median {np.median(ends):.1f})")
    late = sorted(rows, key=lambda r: -(r[1] + r[2]))[:6]
    print("  ends (us) in 2-us bins:", np.histogram(ends, bins=np.arange(np.floor(ends.min()), ends.max() + 2, 2))[0])
    for blk, start, end, units in rows[:3] + late:
        desc = " | ".join(f"{u0:.1f}+{l - u0:.1f} loop +{u1 - l:.1f} tail" for u0, l, u1 in units)
        print(f"  block {blk:3d} start {start:5.2f} end {start + end:6.1f}: {desc}")
    if which != "stamped":
        tiles_t = [u[2] - u[0] for r in rows for u in r[3]]
        print(f"  tiles: {np.median(tiles_t):.1f} us median ({np.min(tiles_t):.1f}-{np.max(tiles_t):.1f})")
        return
    first = np.array([u[0][1] - u[0][0] for _, _, _, u in rows])
    tails = np.array([u[0][2] - u[0][1] for _, _, _, u in rows])
    second_tail = np.array([u[1][2] - u[1][1] for _, _, _, u in rows if len(u) > 1])
    print(f"  unit 0: loop {np.median(first):.1f} us median, tail {np.median(tails):.2f} us median "
          f"(max {tails.max():.2f}); unit 1 tail median {np.median(second_tail):.2f} us (max {second_tail.max():.2f})")
    dp = [np.median([u[2] - u[0] for u in r[3][2:]]) for r in rows if len(r[3]) > 2]
    print(f"  whole tiles after the stream-K units: {np.median(dp):.1f} us each (median over blocks)")


if __name__ == "__main__" and "--waves" not in sys.argv:
    if "--compile-only" in sys.argv:
        for v, k in compile_variants(stamps=True).items():
            print(v, "cubin", len(k.cubin))
        sys.exit(0)
    if "--llm" in sys.argv:         # M of 1024-2048 against N of a transformer's projections
        speeds([(1024, 14336, 4096), (2048, 14336, 4096), (1024, 4096, 4096), (2048, 4096, 4096),
                (1024, 11008, 4096), (2048, 11008, 4096)])
        show_timeline(1024, 14336, 4096)
        show_timeline(1024, 14336, 4096, "stamped plain")
        sys.exit(0)
    if "--timeline-only" not in sys.argv:
        speeds([(4096, 4096, 4096), (3072, 3072, 4096), (2048, 2048, 8192), (5120, 5120, 5120),
                (8192, 8192, 8192)])
    show_timeline(4096, 4096, 4096)
    show_timeline(4096, 4096, 4096, "stamped plain")
    show_timeline(3072, 3072, 4096)
    show_timeline(3072, 3072, 4096, "stamped plain")


def always_a_wave_more(text):
    """Stream-K over the remainder plus a whole wave whenever there is a wave to borrow (the
    emitted rule adds it only when the remainder is under half a wave): every block's range is
    then at least a tile's K steps, so no tile is split three ways."""
    assert text.count("tl_sk_rem * 2 < tl_blocks") == 2
    return text.replace("tl_sk_rem * 2 < tl_blocks", "tl_sk_rem < tl_blocks")


def waves(shapes, configs):
    """Plain persistent, stream-K as emitted and stream-K with always a wave more, vs cuBLAS."""
    import torch
    for cfg in configs:
        P = dict(STAGES=4, PERSISTENT=1, PRODUCER=1, **cfg)
        tag = f"{cfg['BM']}x{cfg['BN']}"
        PATCH["fn"] = None
        ks = {f"{tag} plain": tilec.compile(f"// waves {tag} plain\n" + SRC, tune=False, **P),
              f"{tag} sk": tilec.compile(f"// waves {tag} sk\n" + SRC, tune=False, STREAM_K=1, **P)}
        PATCH["fn"] = always_a_wave_more
        ks[f"{tag} sk+wave"] = tilec.compile(f"// waves {tag} sk wave\n" + SRC, tune=False, STREAM_K=1, **P)
        PATCH["fn"] = None
        for M, N, K in shapes:
            med = versus_cublas(ks, M, N, K, torch.float16)
            tiles = -(-M // cfg["BM"]) * -(-N // cfg["BN"])
            line = " ".join(f"{m} {med['cublas'] / med[m]:.3f}" for m in med if m != "cublas")
            print(f"  {M}x{N}x{K} ({tiles} tiles, {tiles / 132:.2f} waves): {line}", flush=True)


if __name__ == "__main__" and "--waves" in sys.argv:
    waves([(4096, 4096, 4096), (6144, 6144, 6144), (7168, 7168, 7168), (8192, 8192, 8192),
           (4096, 11008, 4096), (5120, 5120, 5120)],
          [dict(BM=128, BN=256), dict(BM=192, BN=128)])
