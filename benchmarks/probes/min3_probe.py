"""Session 22's random-program hunt (seed 11 #84): `r = min(-r, r); if (r >= 0.0) r = 0;` on
i32 left 0 where r was positive on the H100, -r in the interpreter (right). The PTX is right
(neg.s32, min.s32 of r and -r, min.s32 with 0); ptxas fuses the two mins into one three-input
VIMNMX3, and NVRTC 13.0-13.3's drop the negation there (VIMNMX3 R3, R6, R6, RZ: min(r, r, 0));
13.4's keep it (a separate negation). This checks those min / max forms on the GPU against
numpy, printing the NVRTC version and the min/max SASS of the cubin (nvdisasm or cuobjdump on
PATH, when installed).

    python benchmarks/probes/min3_probe.py      (GPU; one line per output)"""
import shutil
import subprocess
import tempfile

import numpy as np
import torch

import tilec
from tilec.runtime import nvrtc

SRC = """
kernel m3(A: i32[N], B: i32[N], Y0: i32[N], Y1: i32[N], Y2: i32[N], Y3: i32[N], Y4: i32[N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    local a: i32[128];
    local b: i32[128];
    local o0: i32[128];
    local o1: i32[128];
    local o2: i32[128];
    local o3: i32[128];
    local o4: i32[128];
    copy(A[bx * 128], a);
    copy(B[bx * 128], b);
    parallel (i) in (128) {
        o0[i] = min(min(a[i], -a[i]), 0);
        o1[i] = min(min(a[i], b[i]), 7);
        o2[i] = max(max(a[i], b[i]), -7);
        o3[i] = min(-a[i], a[i]);
        if (o3[i] >= 0) {
            o3[i] = 0;
        }
        o4[i] = min(a[i], b[i]);
    }
    copy(o0, Y0[bx * 128]);
    copy(o1, Y1[bx * 128]);
    copy(o2, Y2[bx * 128]);
    copy(o3, Y3[bx * 128]);
    copy(o4, Y4[bx * 128]);
}
"""
k = tilec.compile(SRC)
nvdisasm = shutil.which("nvdisasm") or shutil.which("cuobjdump")
if nvdisasm:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.cubin)
        f.flush()
        args = [nvdisasm, "-c", f.name] if nvdisasm.endswith("nvdisasm") else [nvdisasm, "-sass", f.name]
        sass = subprocess.run(args, capture_output=True, text=True).stdout
    ops = sorted({ln.split()[1] if ln.split()[1][0] != "@" else ln.split()[2]
                  for ln in sass.splitlines() if "MNMX" in ln and "/*" in ln})
    print("min/max SASS:", ops)
n = 1024
g = torch.Generator().manual_seed(0)
a = torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32)
b = torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32)
ys = [torch.empty(n, dtype=torch.int32, device="cuda") for _ in range(5)]
k(a.cuda(), b.cuda(), *ys)
torch.cuda.synchronize()
A, B = a.numpy(), b.numpy()
want = [np.minimum(np.minimum(A, -A), 0), np.minimum(np.minimum(A, B), 7), np.maximum(np.maximum(A, B), -7),
        np.minimum(np.minimum(-A, A), 0), np.minimum(A, B)]
for name, y, w in zip(["min(min(a, -a), 0)", "min(min(a, b), 7)", "max(max(a, b), -7)",
                       "min(-a, a); if >= 0: 0", "min(a, b)"], ys, want):
    bad = y.cpu().numpy() != w
    first = np.flatnonzero(bad)[:3]
    print(f"{name:26s} {int(bad.sum()):5d} of {n} wrong" +
          "".join(f"; a={A[i]} b={B[i]}: got {y[i].item()} want {w[i]}" for i in first), flush=True)
print("NVRTC %d.%d" % nvrtc.version())
