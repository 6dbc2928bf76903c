"""Same process: is it shared memory size (the L1 left beside it) or the stage count that makes
5 and 6 stages slower than 4? conv 28x28 C128 and s2 (128x128, producer, persistent), and gemm
4096^3 128x256/4: as emitted, + prefetch.tensormap of every map by the producer thread, + a 32 KiB
static shared array (same stages, less L1)."""
import os, re, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import tilec
from common import Conv, rewrite_cuda, rounds
torch.backends.cudnn.benchmark = True
PATCH = rewrite_cuda()

def prefetch(text):
    maps = sorted(set(re.findall(r"const __grid_constant__ CUtensorMap (tl_tmap_\w+)", text)))
    m = re.search(r"\n( *)if \(threadIdx.x == (\d+)\) \{\n", text[text.index("setmaxnreg_dec"):])
    at = text.index("setmaxnreg_dec") + m.end()
    ind = m.group(1) + "  "
    lines = "".join(f'{ind}asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<unsigned long long>(&{n})) : "memory");\n' for n in maps)
    return text[:at] + lines + text[at:]

def dummy(text):
    at = text.index("  __shared__ __align__(8) unsigned long long tl_full0")
    return text[:at] + "  __shared__ volatile char tl_dummy[32768];\n  if (threadIdx.x > 100000) tl_dummy[threadIdx.x % 32768] = 1;\n" + text[at:]

VARIANTS = {"": None, "+pf": prefetch, "+32K": dummy}

def conv(hw, c, s, configs):
    SRC = open("examples/conv2d.tile").read()
    L = Conv(hw, c, c, 3, s)
    fns = {"cudnn": L.cudnn}
    for st, var in configs:
        PATCH["fn"] = VARIANTS[var]
        k = tilec.compile(f"// {hw} {s} {var}\n" + SRC, tune=False, S=s, STAGES=st, PRODUCER=1, PERSISTENT=1)
        y = torch.empty(L.rows, c, device="cuda").half(); k(L.x, L.wt, y); torch.cuda.synchronize()
        err = L.relerr(y); assert err < 5e-3, err
        fns[f"S{st}{var}"] = (lambda k=k, y=y: k(L.x, L.wt, y))
    med = rounds(fns, n=11)
    for m in fns:
        print(f"  conv {hw} C{c} s{s} {m:12s} {med[m]*1e3:7.1f} us  vs cuDNN {med['cudnn']/med[m]:.3f}", flush=True)

def gemm(n, configs):
    SRC = open("examples/gemm.tile").read()
    a = torch.randn(n, n, device="cuda").half(); b = torch.randn(n, n, device="cuda").half()
    want = a.float() @ b.float()
    fns = {"cublas": lambda: torch.matmul(a, b)}
    for st, var in configs:
        PATCH["fn"] = VARIANTS[var]
        k = tilec.compile(f"// g {var}\n" + SRC, tune=False, BN=256, STAGES=st, PRODUCER=1, PERSISTENT=1)
        c = torch.empty(n, n, device="cuda").half(); k(a, b, c); torch.cuda.synchronize()
        assert (c.float() - want).abs().max().item() < 1
        fns[f"S{st}{var}"] = (lambda k=k, c=c: k(a, b, c))
    med = rounds(fns, n=11)
    for m in fns:
        print(f"  gemm {n} {m:12s} {med[m]*1e3:7.1f} us  vs cuBLAS {med['cublas']/med[m]:.3f}", flush=True)

if __name__ == "__main__":
    CONV = [(4, ""), (4, "+pf"), (4, "+32K"), (5, ""), (5, "+pf"), (3, ""), (3, "+32K")]
    conv(28, 128, 1, CONV)
    conv(56, 128, 2, CONV)
    gemm(4096, [(4, ""), (4, "+pf"), (3, ""), (3, "+pf")])
