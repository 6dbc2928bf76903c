"""The autotuned gemm's warm start (bench.py's autotune row: process caches cleared, the
choice and the winner's cubin read from the disk cache, one call), repeated, each split
into phases: tilec.compile of gemm.tile (the default candidate from disk), the choice
(disk-cache read of the choice and the winner), the module load, the rest of the first
call (tensor maps, launch), and the garbage collections that ran inside it (gc.callbacks).

    python benchmarks/probes/warm_phases.py [--n 4096] [--reps 30] [--freeze]

--freeze: gc.freeze() after the cold tune (everything alive then is left out of later
collections).
"""
import gc, os, sys, tempfile, time
os.environ["TILEC_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import tilec
from tilec import autotune
from tilec.kernel import _CACHE
from tilec.runtime import driver
from common import timed_into

n = int(sys.argv[sys.argv.index("--n") + 1]) if "--n" in sys.argv else 4096
reps = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 30
a = torch.randn(n, n, device="cuda", dtype=torch.float16)
b = torch.randn(n, n, device="cuda", dtype=torch.float16)
c = torch.empty(n, n, device="cuda", dtype=torch.float16)
t = time.perf_counter()
k = tilec.compile("examples/gemm.tile"); k(a, b, c); torch.cuda.synchronize()
print(f"cold tune {time.perf_counter() - t:.2f} s, pick {k.best_config}", flush=True)
if "--freeze" in sys.argv:
    gc.collect(); gc.freeze()
print(f"gc tracked objects {len(gc.get_objects())}, frozen {gc.get_freeze_count()}", flush=True)

phases = {}
autotune.TunedKernel._choose = timed_into(phases, "choose", autotune.TunedKernel._choose)
driver.LoadedKernel = timed_into(phases, "module load", driver.LoadedKernel)
collections = []
gc_start = {}
def on_gc(phase, info):
    if phase == "start":
        gc_start["t"] = time.perf_counter()
    else:
        collections.append((info["generation"], time.perf_counter() - gc_start["t"]))
gc.callbacks.append(on_gc)

rows = []
for i in range(reps):
    _CACHE.clear(); autotune._CHOICES.clear()
    phases.clear(); collections.clear()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    k = tilec.compile("examples/gemm.tile")
    t1 = time.perf_counter()
    k(a, b, c)
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    call = t2 - t1
    rows.append((t2 - t0, t1 - t0, phases.get("choose", 0.0), phases.get("module load", 0.0), call, list(collections)))
print(f"{'total':>8s} {'compile':>8s} {'choose':>8s} {'load':>8s} {'call':>8s}  (ms)  gc: (generation, ms)")
for tot, comp, choose, load, call, gcs in rows:
    print(f"{tot*1e3:8.2f} {comp*1e3:8.2f} {choose*1e3:8.2f} {load*1e3:8.2f} {call*1e3:8.2f}  "
          + " ".join(f"({g}, {s*1e3:.2f})" for g, s in gcs), flush=True)
tots = sorted(r[0] for r in rows)
print(f"median {tots[len(tots)//2]*1e3:.2f} ms, min {tots[0]*1e3:.2f}, max {tots[-1]*1e3:.2f}")
