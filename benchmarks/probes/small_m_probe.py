"""gemm.tile as shipped on the shapes of LLM decode and small batches (M of 16-512
rows against N x K weights of 4096-14336): each shape tuned cold (fresh disk cache),
then the pick and cuBLAS timed in alternating rounds (bench.py's timing). With
`--bm64` the same space with `BM in (64, 128, 192)` is tuned beside it. Outputs
are views with a sentinel margin, checked after the tune.

    python benchmarks/probes/small_m_probe.py [f16|bf16] [--bm64] [--shapes MxNxK,...] [--report]
"""
import os, re, sys, tempfile, time
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import tilec
from tilec import autotune
from common import rounds

DT = "bf16" if "bf16" in sys.argv else "f16"
dtype = torch.float16 if DT == "f16" else torch.bfloat16
SHIPPED = open("examples/gemm.tile").read().replace("f16", DT)
SPACES = {"shipped": SHIPPED}
if "--bm64" in sys.argv:
    assert "tune BM in (128, 192)" in SHIPPED
    SPACES["+BM 64"] = SHIPPED.replace("tune BM in (128, 192)", "tune BM in (64, 128, 192)")
SHAPES = [(m, n, k) for m in (16, 64, 256, 512) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]


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
        if "--report" in sys.argv:
            timed = [(float(m.group(1)), l) for l in k.tune_report().splitlines()
                     for m in [re.search(r": ([0-9.]+) ms", l)] if m]
            print("\n".join(l for _, l in sorted(timed)), flush=True)
        fns[f"{name} {cfg_name(best)}"] = (lambda p=pick, c=c: p(a, b, c))
    med = rounds(fns, n=7)
    for m in fns:
        tflops = 2 * M * N * K / (med[m] * 1e-3) / 1e12
        print(f"  {M}x{N}x{K} {DT} {m:34s} {med[m]*1e3:8.1f} us {tflops:6.0f} TFLOPS  vs cuBLAS "
              f"{med['cublas']/med[m]:.3f}", flush=True)
