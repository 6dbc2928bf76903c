"""How stable gemm.tile's tuner pick is at 8192^3 f16: three cold tunes (fresh disk cache each),
each's report (fastest 6), then the distinct picks and the session's usual ones timed against
cuBLAS in alternating rounds (bench.py's timing), same process."""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import tilec  # noqa: E402
from tilec import autotune  # noqa: E402
from tilec.kernel import _CACHE  # noqa: E402
from common import rounds  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
a = torch.randn(N, N, device="cuda").half()
b = torch.randn(N, N, device="cuda").half()
c = torch.empty(N, N, device="cuda", dtype=torch.float16)
picks = []
for i in range(3):
    os.environ["TILEC_CACHE_DIR"] = tempfile.mkdtemp()
    _CACHE.clear()
    autotune._CHOICES.clear()
    k = tilec.compile("examples/gemm.tile")
    k(a, b, c)
    torch.cuda.synchronize()
    lines = [ln.strip() for ln in k.tune_report().splitlines() if " ms" in ln]
    lines.sort(key=lambda ln: float(re.search(r"([\d.]+) ms", ln).group(1)))
    print(f"tune {i}: {k.best_config}", flush=True)
    for ln in lines[:6]:
        print("    ", ln)
    picks.append(dict(k.best_config))
cands = {str(p): p for p in picks + [dict(BM=192, BN=128, STAGES=4, PRODUCER=1, PERSISTENT=1),
                                     dict(BM=128, BN=256, STAGES=4, PRODUCER=1, PERSISTENT=1),
                                     dict(BM=128, BN=256, STAGES=4, PRODUCER=0, PERSISTENT=0)]}
fns = {"cublas": lambda: torch.matmul(a, b, out=c)}
for name, cfg in cands.items():
    k = tilec.compile("examples/gemm.tile", tune=False, **cfg)
    out = torch.empty_like(c)
    fns[name] = (lambda k=k, out=out: k(a, b, out))
med = rounds(fns, n=9, reps=5)
for m in fns:
    print(f"  {N}^3 f16 {m:75s} {med[m] * 1e3:8.1f} us  vs cuBLAS {med['cublas'] / med[m]:.3f}", flush=True)
