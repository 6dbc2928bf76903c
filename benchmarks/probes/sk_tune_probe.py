"""gemm.tile's tune space as shipped against a wider one (`STREAM_K in (0, 1)` when it was not
shipped; with `--bm64`, BM = 64 as well, on small and LLM-like shapes), on shapes whose tile
counts fill whole waves well and badly: each tuned cold (fresh disk cache; the
candidates' cubins compiled in the same process before, so the tune time is mostly timing,
and printed), then the two picks and cuBLAS timed in alternating rounds. Outputs are views
with a sentinel margin.

    python benchmarks/probes/sk_tune_probe.py [f16|bf16] [--bm64]
"""
import os, sys, tempfile, time
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import tilec
from tilec import autotune
from common import rounds

DT = "bf16" if "bf16" in sys.argv else "f16"
dtype = torch.float16 if DT == "f16" else torch.bfloat16
SHIPPED = open("examples/gemm.tile").read().replace("f16", DT)
TUNE = "tune BM in (128, 192), BN in (128, 256), STAGES in (3, 4), PRODUCER in (0, 1), PERSISTENT in (0, 1)"
assert TUNE in SHIPPED
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (3072, 3072, 4096), (5120, 5120, 5120),
          (2048, 2048, 8192), (4096, 11008, 4096), (1024, 4096, 8192), (6144, 6144, 6144)]
if "--bm64" in sys.argv:
    SPACES = {"shipped": SHIPPED, "+BM 64": SHIPPED.replace("tune BM in (128, 192)", "tune BM in (64, 128, 192)")}
    SHAPES = [(1024, 4096, 4096), (1024, 4096, 8192), (2048, 2048, 8192), (2048, 4096, 4096),
              (1024, 14336, 4096), (3072, 3072, 4096), (4096, 4096, 4096), (8192, 8192, 8192)]
elif "STREAM_K in" in SHIPPED:
    sys.exit("gemm.tile already tunes STREAM_K: run with --bm64")
else:
    SPACES = {"shipped": SHIPPED, "+stream-K": SHIPPED.replace(TUNE + ";", TUNE + ", STREAM_K in (0, 1);")}


def cfg_name(c):
    return f"{c['BM']}x{c['BN']}/{c['STAGES']} pr{c['PRODUCER']} pe{c['PERSISTENT']}" + \
        (" sk" if c.get("STREAM_K") else "")


kernels = {name: tilec.compile(src) for name, src in SPACES.items()}
for M, N, K in SHAPES:
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    ref = a.float() @ b.float()
    fns = {"cublas": lambda: torch.matmul(a, b)}
    for name, k in kernels.items():
        os.environ["TILEC_CACHE_DIR"] = tempfile.mkdtemp()
        autotune._CHOICES.clear()
        k._chosen.clear()
        big = torch.full((M + 2, N + 16), 7.0, device="cuda", dtype=dtype)
        c = big[1:M + 1, 8:N + 8]
        t0 = time.perf_counter()
        k(a, b, c)
        torch.cuda.synchronize()
        tune_s = time.perf_counter() - t0
        err = (c.float() - ref).abs().max().item() / ref.abs().max().item()
        big[1:M + 1, 8:N + 8] = 7
        assert err < 1e-2 and bool((big == 7).all()), (name, err)
        best = dict(k.best_config)
        pick = tilec.compile(SPACES[name], tune=False, **best)
        print(f"{M}x{N}x{K} {DT} {name}: tuned in {tune_s:.2f} s, pick {cfg_name(best)}", flush=True)
        fns[f"{name} {cfg_name(best)}"] = (lambda p=pick, c=c: p(a, b, c))
    med = rounds(fns, n=9)
    for m in fns:
        print(f"  {M}x{N}x{K} {DT} {m:34s} {med[m]*1e3:8.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}", flush=True)
