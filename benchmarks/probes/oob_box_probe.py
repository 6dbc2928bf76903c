"""A gemm's A operand with fewer rows than its tile (M < BM = 64: LLM decode): the TMA
unit fills the box's rows past M with zeros, and decode_timeline.py measured that fill in
the K loop (16 rows: 9.2 us for 16 K steps against 5.4 us at 64 rows). Here the emitted
gemm.tile (64x128/4, producer, persistent, stream-K) is rewritten so that A's box has
min(64, M) rows (the host wrapper's encode) and each stage's expect-tx counts the bytes
that box brings (the kernel); the tile's rows past M are then left as they were in shared
memory, feeding only accumulator rows the clipped store never writes. As emitted vs
clamped, same process, alternating rounds vs cuBLAS; outputs guarded and checked.

With `--cold-l2` every timed call follows a write of 256 MB (the L2 holds 50 MB), so the
weights come from DRAM, as each layer's do in a model's decode step.

    python benchmarks/probes/oob_box_probe.py [--shapes MxNxK,...] [--cold-l2] [--compile-only]
"""
import os, re, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilec
from tilec import kernel as tilec_kernel
from common import checked_gemm, gemm_case, rewrite_cuda, rounds, rounds_cold_l2

SRC = open("examples/gemm.tile").read()
CUDA = rewrite_cuda()
SHAPES = [(m, 4096, k) for k in (4096, 14336) for m in (8, 16, 32, 48, 64)]
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]

_generate_host = tilec_kernel.host_codegen.generate
HOST = {"fn": None}


def _host(*a, **kw):
    text = _generate_host(*a, **kw)
    return HOST["fn"](text) if HOST["fn"] else text


tilec_kernel.host_codegen.generate = _host


def clamp_host(text):
    at = text.index("tmap_A = call.cuTensorMapEncodeTiled(")
    end = text.index(")\n", text.index("oobFill", at))
    block = text[at:end]
    assert block.count("boxDim=(64, 64),") == 1
    return text[:at] + block.replace("boxDim=(64, 64),", "boxDim=(64, min(64, M)),") + text[end:]


def clamp_cuda(text):
    # A's box is 64 rows x 128 bytes; B's two 64-column boxes 64 x 128 bytes each: 24576 bytes a stage
    out, n = re.subn(r"mbarrier_arrive_expect_tx\((&tl_full0\[[^;]*\]), 24576\);",
                     r"mbarrier_arrive_expect_tx(\1, 24576 - (64 - tl_min(64, M)) * 128);", text)
    assert n == 1, n
    return out


def build(clamped):
    CUDA["fn"], HOST["fn"] = (clamp_cuda, clamp_host) if clamped else (None, None)
    k = tilec.compile(f"// oob box clamped {clamped}\n" + SRC, tune=False, BM=64, BN=128, STAGES=4, PRODUCER=1,
                      PERSISTENT=1, STREAM_K=1)
    CUDA["fn"] = HOST["fn"] = None
    assert k.compile_log == "", k.compile_log
    return k


if "--compile-only" in sys.argv:
    k = build(True)
    print(len(k.cubin), "boxDim=(64, min(64, M))" in k.host_source, "(64 - tl_min(64, M)) * 128" in k.cuda_source)
    sys.exit()

import torch  # noqa: E402

kernels = {"as emitted": build(False), "clamped": build(True)}
for M, N, K in SHAPES:
    a, b, ref, fns = gemm_case(M, N, K)
    for name, k in kernels.items():
        call, c = checked_gemm(k, a, b, ref, name)
        for _ in range(3):                  # stale rows from earlier launches must not leak either
            call()
        torch.cuda.synchronize()
        assert (c.float() - ref).abs().max().item() / ref.abs().max().item() < 1e-2, name
        fns[name] = call
    med = rounds_cold_l2(fns) if "--cold-l2" in sys.argv else rounds(fns, n=9)
    print(f"{M}x{N}x{K}: cuBLAS {med['cublas'] * 1e3:.1f} us; as emitted {med['as emitted'] * 1e3:.1f} us "
          f"{med['cublas'] / med['as emitted']:.3f}, clamped {med['clamped'] * 1e3:.1f} us "
          f"{med['cublas'] / med['clamped']:.3f}", flush=True)
