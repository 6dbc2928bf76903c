import os, sys, time, tempfile, cProfile, pstats, io
os.environ["TILEC_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, os.getcwd())
import torch, tilec
from tilec.kernel import _CACHE
from tilec import autotune
n = 4096
a = torch.randn(n, n, device="cuda", dtype=torch.float16); b = torch.randn(n, n, device="cuda", dtype=torch.float16)
c = torch.empty(n, n, device="cuda", dtype=torch.float16)
k = tilec.compile("examples/gemm.tile"); k(a, b, c); torch.cuda.synchronize()
for i in range(6):
    _CACHE.clear(); autotune._CHOICES.clear()
    t = time.perf_counter()
    if i == 5:
        pr = cProfile.Profile(); pr.enable()
    k = tilec.compile("examples/gemm.tile"); k(a, b, c)
    if i == 5:
        pr.disable()
    print(f"warm {1e3 * (time.perf_counter() - t):.2f} ms", flush=True)
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(30); print(s.getvalue()[:6000])
