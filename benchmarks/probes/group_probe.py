"""Same process: gemm.tile's tuned picks at 8192^3 (192x128/4 and 128x256/4, producer, persistent)
with the tile order in groups of GROUP = 4, 8 (shipped), 16 and 32 rows, against cuBLAS and Triton's
autotuned matmul (benchmarks/triton_matmul.py), f16 and bf16; 11 alternating rounds."""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import rounds  # puts benchmarks/ on sys.path
import tilec

SRC = open("examples/gemm.tile").read()


def run(n, dt):
    import torch
    from triton_matmul import chosen, matmul
    dtype = getattr(torch, {"f16": "float16", "bf16": "bfloat16"}[dt])
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ref = a.float() @ b.float()
    ct = torch.empty(n, n, device="cuda", dtype=dtype)
    matmul(a, b, ct)
    fns = {"cublas": lambda: torch.matmul(a, b), f"triton {chosen()}": lambda: matmul(a, b, ct)}
    src = SRC.replace("f16", dt) if dt != "f16" else SRC
    for bm, bn in ((192, 128), (128, 256)):
        for g in (4, 8, 16, 32):
            k = tilec.compile(src, tune=False, BM=bm, BN=bn, STAGES=4, PRODUCER=1, PERSISTENT=1, GROUP=g)
            c = torch.empty(n, n, device="cuda", dtype=dtype)
            k(a, b, c); torch.cuda.synchronize()
            err = ((c.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (bm, bn, g, err)
            fns[f"{bm}x{bn} G{g}"] = (lambda k=k, c=c: k(a, b, c))
    med = rounds(fns, n=11)
    tri = [m for m in fns if m.startswith("triton")][0]
    for m in fns:
        print(f"{n} {dt} {m:28s} {med[m]*1e3:8.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}  vs Triton {med[tri]/med[m]:.3f}",
              flush=True)


if __name__ == "__main__":
    for dt in ("f16", "bf16"):
        run(8192, dt)
    run(4096, "f16")
