"""Same process: a persistent grid of as many blocks as the GPU holds (132) vs the fewest blocks
that still finish in the same number of tile waves (512 tiles: 4 waves -> 128 blocks), gemm."""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch, tilec
from tilec.runtime import host as rt
from common import rounds

BAL = {"on": False}
real = rt.Call.launch


def launch(self, grid, threads, smem_bytes, params, persistent=False, balanced=False):
    return real(self, grid, threads, smem_bytes, params, persistent, BAL["on"])     # the probe's choice, not the wrapper's


rt.Call.launch = launch

def run(n, dtype, cfg, n_rounds=11, reps=5):
    src = open("examples/gemm.tile").read()
    if dtype == torch.bfloat16: src = src.replace("f16", "bf16")
    a = torch.randn(n, n, device="cuda", dtype=dtype); b = torch.randn(n, n, device="cuda", dtype=dtype)
    want = a.float() @ b.float()
    k = tilec.compile(src, tune=False, PRODUCER=1, PERSISTENT=1, **cfg)
    c1 = torch.empty(n, n, device="cuda", dtype=dtype); c2 = torch.empty_like(c1)
    def plain(): BAL["on"] = False; k(a, b, c1)
    def bal(): BAL["on"] = True; k(a, b, c2)
    fns = {"cublas": lambda: torch.matmul(a, b), "132 blocks": plain, "balanced": bal}
    med = rounds(fns, n=n_rounds, reps=reps)
    assert (c1.float() - want).abs().max() < 2 and (c2.float() - want).abs().max() < 2
    for m in fns:
        print(f"  gemm {n} {str(dtype)[6:]} {cfg} {m:12s} {med[m]*1e3:8.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}", flush=True)

for dt in (torch.float16, torch.bfloat16):
    run(4096, dt, dict(BN=256, STAGES=4))
    run(8192, dt, dict(BM=192, STAGES=4))
    run(6144, dt, dict(BN=256, STAGES=4))
