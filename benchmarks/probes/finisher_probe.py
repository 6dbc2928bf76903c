"""Stream-K's finisher: the block that ends a split tile adds the partial sums of the
blocks before it one slot at a time (thread 0 acquires the slot's flag, a block barrier,
then every thread loads its share and adds). Variants, by rewriting the emitted CUDA:
every flag acquired first and one barrier, then the slots loaded and added ("flags
first"), and the same with the slot loop unrolled by 2 or 4 so that the loads of several
slots are in flight together. gemm.tile's stream-K configs on few-row shapes (each tile
cut into up to 4 pieces) and on the large shapes where the tuner picks stream-K; same
process, alternating rounds vs cuBLAS (bench.py's timing); outputs guarded.

    python benchmarks/probes/finisher_probe.py [--shapes MxNxK,...]
"""
import os, re, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilec
from common import checked_gemm, gemm_case, rewrite_cuda, rounds

SRC = open("examples/gemm.tile").read()
PATCH = rewrite_cuda()
LOOP = re.compile(r"for \(int tl_part = 0; tl_part < (?P<n>[^;]+); \+\+tl_part\) \{\n(?P<ind>\s*)\{\n\s*"
                  r"if \(threadIdx\.x == 0\) tl_slot_acquire\(&tl_slot_ready\[tl_block - 1 - tl_part\]\);\n\s*"
                  r"(?P<sync>consumers_sync<\d+>\(\);|__syncthreads\(\);)[^\n]*\n")


def flags_first(unroll):
    def fn(text):
        def sub(m):
            ind = m.group("ind")
            pragma = f"#pragma unroll {unroll}\n{ind[:-2]}" if unroll else ""
            return (f"if (threadIdx.x == 0) for (int tl_p = 0; tl_p < {m.group('n')}; ++tl_p) "
                    f"tl_slot_acquire(&tl_slot_ready[tl_block - 1 - tl_p]);\n{ind[:-2]}{m.group('sync')}  "
                    f"// every slot's partial sums are visible to every thread\n{ind[:-2]}{pragma}"
                    f"for (int tl_part = 0; tl_part < {m.group('n')}; ++tl_part) {{\n{ind}{{\n")
        out, n = LOOP.subn(sub, text)
        assert n >= 1, "the finisher's loop was not found"
        return out
    return fn


VARIANTS = {"as emitted": None, "flags first": flags_first(0), "flags first, unroll 2": flags_first(2),
            "flags first, unroll 4": flags_first(4)}
CONFIGS = [(64, 128), (128, 128), (128, 256)]
SHAPES = [(16, 4096, 4096), (64, 4096, 4096), (256, 4096, 4096), (64, 4096, 14336), (256, 4096, 14336),
          (8192, 8192, 8192), (5120, 5120, 5120)]
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]


def build(bm, bn, variant):
    PATCH["fn"] = VARIANTS[variant]
    k = tilec.compile(f"// {variant}\n" + SRC, tune=False, BM=bm, BN=bn, STAGES=4, PRODUCER=1, PERSISTENT=1,
                      STREAM_K=1)
    PATCH["fn"] = None
    assert k.compile_log == "", k.compile_log
    return k


if "--compile-only" in sys.argv:
    for bm, bn in CONFIGS:
        for v in VARIANTS:
            build(bm, bn, v)
    print("compiled")
    sys.exit()

import torch  # noqa: E402
kernels = {(bm, bn, v): build(bm, bn, v) for bm, bn in CONFIGS for v in VARIANTS}
for M, N, K in SHAPES:
    a, b, ref, fns = gemm_case(M, N, K)
    configs = CONFIGS if M <= 512 else [(128, 256)]
    for (bm, bn, v), k in kernels.items():
        if (bm, bn) not in configs:
            continue
        fns[(bm, bn, v)] = checked_gemm(k, a, b, ref, (bm, bn, v))[0]
    med = rounds(fns, n=9 if M <= 512 else 5)
    print(f"{M}x{N}x{K}: cuBLAS {med['cublas'] * 1e3:.1f} us", flush=True)
    for bm, bn in configs:
        print(f"  {bm}x{bn}/4 pr pe sk: " + " / ".join(VARIANTS) + ": " +
              " / ".join(f"{med['cublas'] / med[(bm, bn, v)]:.3f}" for v in VARIANTS), flush=True)
