"""Same-process probe: a 2-CTA cluster with TMA multicast of B (the operand the cluster's two
tiles share: consecutive tile numbers in group order share bx) on 128x256/4, producer, persistent."""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import tilec
from common import rewrite_cuda, rounds
from mc import cluster

SRC = open("examples/gemm.tile").read()
PATCH = rewrite_cuda()
VARIANTS = {"base": None, "cl": lambda t: cluster(t, multicast=False, peer_release="cluster"),
            "mc": lambda t: cluster(t, peer_release="cluster"),
            "self": lambda t: cluster(t, b_loads="self", peer_release="cluster"), "cta": cluster}

def run(size, dtype, configs, n_rounds=9, reps=5):
    M = N = K = size
    a = torch.randn(M, K, device="cuda", dtype=dtype); b = torch.randn(K, N, device="cuda", dtype=dtype)
    ref = a.float() @ b.float()
    fns = {"cublas": lambda: torch.matmul(a, b)}
    for name, (variant, consts) in configs.items():
        PATCH["fn"] = VARIANTS[variant]
        src = SRC.replace("f16", "bf16") if dtype == torch.bfloat16 else SRC
        k = tilec.compile(f"// probe {name}\n" + src, tune=False, **consts)
        big = torch.full((M + 2, N + 16), 7.0, device="cuda", dtype=dtype)
        c = big[1:M + 1, 8:N + 8]
        for _ in range(3):
            c.fill_(0); k(a, b, c)
        torch.cuda.synchronize()
        err = (c.float() - ref).abs().max().item()
        big[1:M + 1, 8:N + 8] = 7
        margin_ok = bool((big == 7).all())
        from cuda.bindings import driver as cu
        f = k._module(0).function
        regs = cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, f)[1]
        print(f"{size} {str(dtype)[6:]} {name}: regs {regs} maxerr {err:.3g} margin_ok {margin_ok}", flush=True)
        fns[name] = (lambda k=k, c=c: k(a, b, c))
    med = rounds(fns, n=n_rounds, reps=reps)
    for m in fns:
        print(f"  {size} {str(dtype)[6:]} {m:14s} {med[m]*1e3:8.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}", flush=True)

P = dict(BN=256, STAGES=4, PERSISTENT=1, PRODUCER=1)
CONFIGS = {"base": ("base", P), "mc": ("mc", P), "self": ("self", P), "cta": ("cta", P),
           "mc_np": ("mc", dict(P, PERSISTENT=0)), "base_np": ("base", dict(P, PERSISTENT=0)),
           "self_np": ("self", dict(P, PERSISTENT=0))}
for size in (4096, 8192):
    run(size, torch.float16, CONFIGS)
