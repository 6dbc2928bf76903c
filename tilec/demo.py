"""`tilec demo`: compile an example, print its CUDA, and where a GPU is present
run it on random data and check the answer against numpy."""
from __future__ import annotations

import time

import numpy as np

from ._resources import resource
from .errors import Source
from .kernel import compile as compile_kernel
from .runtime.driver import have_gpu


def main(path=None) -> None:
    src = path or Source("examples/copy2d.tile", (resource("examples") / "copy2d.tile").read_text())
    t0 = time.perf_counter()
    k = compile_kernel(src)
    ms = (time.perf_counter() - t0) * 1e3
    print(k.cuda_source)
    print(f"// tilec: compiled kernel {k.name} to a {len(k.cubin)}-byte {k.arch} cubin in {ms:.0f} ms")
    if not have_gpu():
        print("// tilec: no GPU here, so the kernel was compiled but not run")
        return
    if k.name != "copy2d":
        print(f"// tilec: the demo runs copy2d only; {k.name} was compiled, not run")
        return
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1000, 1000), dtype=np.float32)
    b = np.full_like(a, np.nan)
    k(a, b)
    ok = np.array_equal(a, b)
    print(f"// tilec: ran copy2d on a 1000x1000 f32 array: {'output equals input' if ok else 'WRONG ANSWER'}")
    if not ok:
        raise SystemExit(1)
