"""Stream-K on fewer tiles than SMs (LLM decode and small batches: M of 16-512 rows
against N x K weights), where the launch runs every resident block and the kernel cuts
each tile's K steps into s equal pieces (s as many as the blocks per tile allow, no piece
under SK_MIN_STEPS): gemm.tile's stream-K configs with SK_MIN_STEPS of 8 / 16 / 32, and
with `--ranges` the first build's rule as well (all tiles' K steps laid end to end and cut
evenly over min(blocks, steps / MIN) blocks, pieces across tiles: "ranges" columns),
beside the plain persistent kernel of the same tile and cuBLAS, same process, alternating
rounds (bench.py's timing). Outputs are views with a sentinel margin, checked.

    python benchmarks/probes/sk_small_probe.py [--shapes MxNxK,...] [--mins 8,16,32] [--ranges] [--tiles 64x128,...]
"""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import tilec
from tilec.passes import make_persistent
from common import checked_gemm, gemm_case, rewrite_cuda, rounds

PATCH = rewrite_cuda()
PARTS = "(tl_tiles < tl_blocks ? tl_tiles * tl_max(1, tl_min(tl_blocks / tl_tiles, tl_steps / {m})) : tl_blocks)"
RANGES = "tl_min(tl_blocks, tl_max(tl_sk_tiles, tl_max(tl_sk_steps / {m}, 1LL)))"

SRC = open("examples/gemm.tile").read()
SHAPES = [(m, n, k) for m in (16, 64, 256, 512) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]
MINS = [8, 16, 32]
TILES = [(64, 128), (128, 128), (128, 256)]
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]
    if arg == "--mins":
        MINS = [int(x) for x in sys.argv[i + 1].split(",")]
    if arg == "--tiles":
        TILES = [tuple(int(x) for x in t.split("x")) for t in sys.argv[i + 1].split(",")]


def build(bm, bn, sk, min_steps, ranges=False):
    make_persistent.SK_MIN_STEPS = min_steps

    def old_rule(text):
        assert text.count(PARTS.format(m=min_steps)) >= 1
        return text.replace(PARTS.format(m=min_steps), RANGES.format(m=min_steps))
    PATCH["fn"] = old_rule if ranges else None
    k = tilec.compile(f"// sk {sk} min {min_steps} ranges {ranges}\n" + SRC, tune=False, BM=bm, BN=bn, STAGES=4,
                      PRODUCER=1, PERSISTENT=1, STREAM_K=sk)
    PATCH["fn"] = None
    return k


kernels = {}
for bm, bn in TILES:
    kernels[f"{bm}x{bn} plain"] = build(bm, bn, 0, 8)
    for m in MINS:
        kernels[f"{bm}x{bn} sk min {m}"] = build(bm, bn, 1, m)
    if "--ranges" in sys.argv:
        for m in MINS:
            kernels[f"{bm}x{bn} ranges min {m}"] = build(bm, bn, 1, m, ranges=True)
for M, N, K in SHAPES:
    a, b, ref, fns = gemm_case(M, N, K)
    for name, k in kernels.items():
        fns[name] = checked_gemm(k, a, b, ref, name)[0]
    med = rounds(fns, n=7)
    best = min((m for m in med if m != "cublas"), key=med.get)
    print(f"{M}x{N}x{K}: cuBLAS {med['cublas']*1e3:.1f} us, best {best} {med['cublas']/med[best]:.3f}", flush=True)
    for bm, bn in TILES:
        names = [f"{bm}x{bn} plain"] + [f"{bm}x{bn} sk min {m}" for m in MINS]
        head = "plain / pieces min " + " / ".join(map(str, MINS))
        if "--ranges" in sys.argv:
            names += [f"{bm}x{bn} ranges min {m}" for m in MINS]
            head += " / ranges min " + " / ".join(map(str, MINS))
        print(f"  {bm}x{bn}: {head}: " + " / ".join(f"{med['cublas']/med[n]:.3f}" for n in names), flush=True)
