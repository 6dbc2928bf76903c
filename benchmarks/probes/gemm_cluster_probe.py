"""Same process: gemm.tile 128x256/4, producer, persistent (tilec's balanced grid) against the
same kernel in 2-CTA clusters (mc_n.py): the cluster launch alone, each CTA loading its own B
with stages released cluster-wide ("lockstep"), and B multicast, each with the producer tail
at exit, and session 11's multicast with a cluster barrier at exit. A cluster's two CTAs take
consecutive tile numbers, which share bx in tilec's group order (groups of an even number of
rows). Outputs are views with a sentinel margin."""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilec
from common import rewrite_cuda
from mc_n import cluster

SRC = open("examples/gemm.tile").read()
PATCH = rewrite_cuda()
VARIANTS = {"base": None,
            "launch": dict(multicast=False, lockstep=False, syncs=False),
            "lockstep tail": dict(multicast=False, lanes=True, end="tail"),
            "mc tail": dict(lanes=True, end="tail"),
            "mc sync": dict(lanes=True)}
P = dict(BM=128, BN=256, STAGES=4, PERSISTENT=1, PRODUCER=1)


def run(size, dtype_name, compile_only=False):
    ks = {}
    for v, opts in VARIANTS.items():
        PATCH["fn"] = (lambda t, o=opts: cluster(t, 2, **o)) if opts is not None else None
        src = SRC.replace("f16", "bf16") if dtype_name == "bf16" else SRC
        ks[v] = tilec.compile(f"// gemm cluster probe {v}\n" + src, tune=False, **P)
    if compile_only:
        for v, k in ks.items():
            print(size, dtype_name, v, "cubin", len(k.cubin))
        return
    import torch
    from common import rounds
    dtype = getattr(torch, {"f16": "float16", "bf16": "bfloat16"}[dtype_name])
    M, N, K = size if isinstance(size, tuple) else (size,) * 3
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    ref = a.float() @ b.float()
    fns = {"cublas": lambda: torch.matmul(a, b)}
    for v, k in ks.items():
        big = torch.full((M + 2, N + 16), 7.0, device="cuda", dtype=dtype)
        c = big[1:M + 1, 8:N + 8]
        c.fill_(0); k(a, b, c); torch.cuda.synchronize()
        err = (c.float() - ref).abs().max().item() / ref.abs().max().item()
        big[1:M + 1, 8:N + 8] = 7
        print(f"{size} {dtype_name} {v}: max rel err {err:.2e} margin intact {bool((big == 7).all())}", flush=True)
        fns[v] = (lambda k=k, c=c: k(a, b, c))
    med = rounds(fns, n=11)
    for m in fns:
        print(f"  {size} {dtype_name} {m:14s} {med[m]*1e3:8.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}", flush=True)


if __name__ == "__main__":
    for i, v in enumerate(sys.argv):          # --tile BMxBN: that tile instead of 128x256 (session 16: 128x128)
        if v == "--tile":
            P["BM"], P["BN"] = (int(x) for x in sys.argv[i + 1].split("x"))
    shapes = [tuple(int(x) for x in sys.argv[i + 1].split("x")) for i, v in enumerate(sys.argv) if v == "--shape"]
    for shape in shapes:                      # --shape MxNxK: those f16 shapes only
        run(shape, "f16", "--compile-only" in sys.argv)
    if shapes:
        sys.exit(0)
    for size in (4096, 8192):
        run(size, "f16", "--compile-only" in sys.argv)
    run(4096, "bf16", "--compile-only" in sys.argv)
