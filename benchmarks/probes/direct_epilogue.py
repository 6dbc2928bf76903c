"""The gemm's epilogue as direct global stores from the accumulator registers, against the
emitted one (staged in shared memory in 64-column chunks, TMA stores, block barriers between):
a tile that lies wholly inside C is written by each thread straight from its wgmma fragments
(a 32-bit store per pair of columns; a quad of lanes covers 16 contiguous bytes of a row), with
no barrier, so the consumers start the next tile's K loop at once and the stores drain behind
it; other tiles keep the emitted epilogue. Same process vs cuBLAS, outputs views with a
sentinel margin.

    python benchmarks/probes/direct_epilogue.py [--compile-only]
"""
import os, re, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilec
from common import rewrite_cuda

SRC = open("examples/gemm.tile").read()
PATCH = rewrite_cuda()


def direct(text, bm, bn, dt):
    """Wrap the consumers' epilogue: full tiles store from registers."""
    start = "      if (threadIdx.x == 0) {\n        bulk_wait_group_read<1>();\n      }\n      consumers_sync<"
    end = "\n    }\n    if (threadIdx.x == 0) {\n      bulk_wait_group_read<0>();"
    i = text.index(start)
    j = text.index(end, i)
    wg_rows = 64
    regs = bn // 2            # accumulator registers per thread: 64 x bn f32 over 128 threads
    fast = f"""      if ((by + 1) * {bm} <= M && (bx + 1) * {bn} <= N) {{  // probe: the tile lies inside C
        {dt}_t* const tl_c = C + static_cast<long long>(by * {bm} + (threadIdx.x / 128) * {wg_rows} + (threadIdx.x % 128) / 32 * 16 + (threadIdx.x % 32) / 4) * tl_C_stride0 + bx * {bn} + (threadIdx.x % 4) * 2;
        #pragma unroll
        for (int tl_r = 0; tl_r < {regs}; tl_r += 4) {{
          *reinterpret_cast<unsigned*>(tl_c + tl_r / 4 * 8) = tl_pack_{dt}x2(acc[tl_r], acc[tl_r + 1]);
          *reinterpret_cast<unsigned*>(tl_c + 8 * tl_C_stride0 + tl_r / 4 * 8) = tl_pack_{dt}x2(acc[tl_r + 2], acc[tl_r + 3]);
        }}
      }} else {{
"""
    return text[:i] + fast + text[i:j] + "\n      }" + text[j:]


def compile_variants(dt):
    src = SRC.replace("f16", dt) if dt != "f16" else SRC
    ks = {}
    for bm, bn in ((128, 256), (192, 128)):
        P = dict(BM=bm, BN=bn, STAGES=4, PERSISTENT=1, PRODUCER=1)
        PATCH["fn"] = None
        ks[f"{bm}x{bn} emitted"] = tilec.compile(f"// direct probe {bm}x{bn} emitted\n" + src, tune=False, **P)
        PATCH["fn"] = lambda t, bm=bm, bn=bn: direct(t, bm, bn, dt)
        ks[f"{bm}x{bn} direct"] = tilec.compile(f"// direct probe {bm}x{bn} direct\n" + src, tune=False, **P)
    PATCH["fn"] = None
    return ks


def run(shape, dt):
    import torch
    from common import rounds
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dt]
    M, N, K = shape
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    ref = a.float() @ b.float()
    fns = {"cublas": lambda: torch.matmul(a, b)}
    for v, k in compile_variants(dt).items():
        big = torch.full((M + 2, N + 16), 7.0, device="cuda", dtype=dtype)
        c = big[1:M + 1, 8:N + 8]
        c.fill_(0); k(a, b, c); torch.cuda.synchronize()
        err = (c.float() - ref).abs().max().item() / ref.abs().max().item()
        big[1:M + 1, 8:N + 8] = 7
        ok = bool((big == 7).all())
        assert err < 1e-2 and ok, (v, err, ok)
        fns[v] = (lambda k=k, c=c: k(a, b, c))
    med = rounds(fns, n=11)
    for m in fns:
        print(f"  {M}x{N}x{K} {dt} {m:18s} {med[m]*1e3:8.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}", flush=True)


if __name__ == "__main__":
    if "--compile-only" in sys.argv:
        for dt in ("f16", "bf16"):
            for v, k in compile_variants(dt).items():
                print(dt, v, "cubin", len(k.cubin))
        sys.exit(0)
    for shape in ((4096, 4096, 4096), (8192, 8192, 8192), (4000, 4000, 4096)):
        for dt in ("f16", "bf16"):
            run(shape, dt)
