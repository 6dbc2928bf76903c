"""Same-process probe: a 2-CTA cluster with TMA multicast of B (the operand the cluster's two
tiles share: consecutive tile numbers in group order share bx) on 128x256/4, producer, persistent."""
import os, re, statistics, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd())
import tilec
try:
    import torch
except ImportError:
    torch = None
from tilec import kernel as tk

SRC = open("examples/gemm.tile").read()
orig_generate = tk.cuda_codegen.generate
PATCH = {"fn": None}
def generate(*a, **kw):
    text = orig_generate(*a, **kw)
    return PATCH["fn"](text) if PATCH["fn"] else text
tk.cuda_codegen.generate = generate

HELPERS = r'''
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r;
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_peer(unsigned long long* bar) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(bar)), "r"(cluster_rank() ^ 1));
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
}
__device__ __forceinline__ void tma_load_2d_mc(void* dst, const CUtensorMap* map, unsigned long long* bar,
                                               int c0, int c1, unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%3, %4}], [%2], %5;"
      :: "r"(smem_addr(dst)), "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "h"(mask) : "memory");
}
'''

def cluster(text, multicast, mode="mc"):
    text = text.replace("extern \"C\" __global__ void __launch_bounds__",
                        "extern \"C\" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__")
    text = text.replace("template <class A, class B> __device__ __forceinline__ auto tl_min", HELPERS + "\ntemplate <class A, class B> __device__ __forceinline__ auto tl_min", 1)
    i = text.index("  __syncthreads();\n")
    text = text[:i] + "  cluster_sync_all();\n" + text[i + len("  __syncthreads();\n"):]
    assert text.endswith("  }\n}\n"), text[-30:]
    text = text[:-2] + "  cluster_sync_all();\n}\n"
    if mode == "cta":
        text = text.replace("mbarrier.arrive.release.cluster.shared::cluster.b64", "mbarrier.arrive.shared::cluster.b64")
    if mode == "nosync":
        text = text.replace("mbarrier_arrive_peer(\\1);", "")
    if multicast:
        text = re.sub(r"mbarrier_init\(&tl_empty1\[(\d)\], (\d)\)", lambda m: f"mbarrier_init(&tl_empty1[{m.group(1)}], {2 * int(m.group(2))})", text)
        text = re.sub(r"if \(threadIdx.x % 128 == 0\) mbarrier_arrive\((&tl_empty1\[[^;]*\])\);",
                      r"if (threadIdx.x % 128 == 0) { mbarrier_arrive(\1); mbarrier_arrive_peer(\1); }" if mode != "nosync" else
                      r"if (threadIdx.x % 128 == 0) { mbarrier_arrive(\1); mbarrier_arrive(\1); }", text)
        lines = text.split("\n")
        bl = [j for j, l in enumerate(lines) if "tma_load_2d(reinterpret_cast<unsigned char*>(b)" in l]
        nb = len(bl)
        assert nb in (2, 4), bl
        m = re.search(r"tma_load_2d\(reinterpret_cast<unsigned char\*>\(b\) \+ (.*?) \* (\d+), &tl_tmap_B, (&tl_full0\[.*?\]), bx \* (\d+), k \* 64\);", lines[bl[0]])
        stage, stride, bar, bn = m.group(1), m.group(2), m.group(3), m.group(4)
        h = nb // 2
        new = (f"          for (unsigned tl_j = {h} * cluster_rank(); tl_j < {h} * cluster_rank() + {h}; ++tl_j)\n"
               f"            tma_load_2d_mc(reinterpret_cast<unsigned char*>(b) + {stage} * {stride} + tl_j * 8192, &tl_tmap_B, {bar}, bx * {bn} + tl_j * 64, k * 64, 3);")
        if mode == "self":      # remote arrivals, no multicast: every CTA loads its whole B
            new = (f"          for (unsigned tl_j = 0; tl_j < {nb}; ++tl_j)\n"
                   f"            tma_load_2d(reinterpret_cast<unsigned char*>(b) + {stage} * {stride} + tl_j * 8192, &tl_tmap_B, {bar}, bx * {bn} + tl_j * 64, k * 64);")
        lines[bl[0]:bl[-1] + 1] = [new]
        text = "\n".join(lines)
    return text

SLEEP = 300_000
def time_one(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP); s.record(); fn(); e.record(); e.synchronize()
    return s.elapsed_time(e)

VARIANTS = {"base": None, "cl": lambda t: cluster(t, False), "mc": lambda t: cluster(t, True),
            "self": lambda t: cluster(t, True, "self"), "nosync": lambda t: cluster(t, True, "nosync"),
            "cta": lambda t: cluster(t, True, "cta")}

def run(size, dtype, configs, rounds=9, reps=5):
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
    for fn in fns.values():
        for _ in range(3): fn()
    torch.cuda.synchronize()
    t = {m: [] for m in fns}
    for r in range(rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        for m in order:
            t[m].extend(time_one(fns[m]) for _ in range(reps))
    med = {m: statistics.median(v) for m, v in t.items()}
    for m in fns:
        print(f"  {size} {str(dtype)[6:]} {m:14s} {med[m]*1e3:8.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}", flush=True)

P = dict(BN=256, STAGES=4, PERSISTENT=1, PRODUCER=1)
CONFIGS = {"base": ("base", P), "mc": ("mc", P), "self": ("self", P), "cta": ("cta", P),
           "mc_np": ("mc", dict(P, PERSISTENT=0)), "base_np": ("base", dict(P, PERSISTENT=0)),
           "self_np": ("self", dict(P, PERSISTENT=0))}
if torch is not None:
    for size in (4096, 8192):
        for dtype in (torch.float16,):
            run(size, dtype, CONFIGS)
