"""What the probes share: one call timed as benchmarks/bench.py times it (its time_one:
alone, behind a GPU spin, CUDA events), alternating rounds over several calls, a conv layer's
tensors as bench.py builds them, and a hook on tilec's CUDA generation through which a probe
rewrites the emitted kernel before NVRTC sees it. torch is imported where it is used, so
a probe's compile-only part (rewrite, NVRTC, SASS) runs on a machine without it."""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
from tilec import kernel as tilec_kernel  # noqa: E402


def timed_into(spent: dict, phase: str, fn):
    """`fn` wrapped to add the seconds each call takes to spent[phase] (a probe's phase
    times: patch a tilec function with it)."""
    import time

    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            spent[phase] = spent.get(phase, 0.0) + time.perf_counter() - t
    return wrapper


def time_one(fn, before=None):
    """One call of `fn`, in ms (bench.time_one); `before()` queued ahead of its GPU spin,
    outside its events."""
    if before is not None:
        before()
    return bench.time_one(fn) * 1e3


def rounds(fns, n=9, reps=5, before=None):
    """{name: median ms}: three warm-up calls each, then `n` rounds of `reps` calls of
    every fn, every other round in reverse order (`before()` ahead of each timed call)."""
    import torch
    for fn in fns.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    t = {m: [] for m in fns}
    for r in range(n):
        for m in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t[m].extend(time_one(fns[m], before) for _ in range(reps))
    return {m: statistics.median(v) for m, v in t.items()}


def rounds_cold_l2(fns, n=9, reps=5):
    """rounds() with 256 MB written before each call's GPU spin (outside its events): the L2
    (50 MB) holds nothing of the last call's tensors, so they come from DRAM."""
    return rounds(fns, n, reps, before=bench.l2_flush())


def rewrite_cuda():
    """Install the hook once; returns {"fn": None}: set "fn" to a text -> text function to
    rewrite every kernel compiled after that (None: as emitted). Compile with a distinct
    source (a comment) per variant, or the in-process cache returns the earlier kernel."""
    generate = tilec_kernel.cuda_codegen.generate
    patch = getattr(generate, "probe_patch", None)
    if patch is None:
        patch = {"fn": None}

        def rewritten(*a, **kw):
            text = generate(*a, **kw)
            return patch["fn"](text) if patch["fn"] else text
        rewritten.probe_patch = patch
        tilec_kernel.cuda_codegen.generate = rewritten
    return patch


class Conv:
    """One NHWC conv layer as bench.py's _conv_layer builds it (N images, f16): `x`, the
    weights as conv2d.tile takes them (`wt`: [KH * KW * C, F]), the output's `rows`,
    `want` (cuDNN's result as [rows, F] f32), `cudnn()` the peer's call on NCHW views of
    channels-last memory, and `consts` the layer's shape consts for conv2d.tile."""

    def __init__(self, hw, c, f, ks, s, n=128):
        import torch
        import torch.nn.functional as F
        p = ks // 2
        self.x = torch.randn(n, hw, hw, c, device="cuda").half()
        w = torch.randn(f, c, ks, ks, device="cuda").half() / (ks * ks * c) ** 0.5
        self.wt = w.permute(2, 3, 1, 0).reshape(ks * ks * c, f).contiguous()
        o = (hw + 2 * p - ks) // s + 1
        self.rows, self.f = n * o * o, f
        xn, wn = self.x.permute(0, 3, 1, 2), w.contiguous(memory_format=torch.channels_last)
        self.cudnn = lambda: F.conv2d(xn, wn, stride=s, padding=p)
        self.want = self.cudnn().permute(0, 2, 3, 1).reshape(-1, f).float()
        self.consts = dict(S=s) if ks == 3 else dict(KH=ks, KW=ks, S=s, P=p)

    def relerr(self, y):
        return ((y.float() - self.want).norm() / self.want.norm()).item()


def versus_cudnn(L, kernels: dict, tag: str, n=9):
    """Each of `kernels` ({name: tilec kernel, or (kernel, grid hook)}) run once on
    conv layer L (relative error printed), then all with cuDNN in `n` alternating
    rounds: their medians and ratios printed. A grid hook is called before each
    launch (a probe's persistent grid). Returns {name: median ms}."""
    import torch
    fns = {"cudnn": L.cudnn}
    for name, k in kernels.items():
        k, before = k if isinstance(k, tuple) else (k, lambda: None)
        y = torch.empty(L.rows, L.f, device="cuda").half()
        y.fill_(0); before(); k(L.x, L.wt, y); torch.cuda.synchronize()
        print(f"  {tag} {name}: relerr {L.relerr(y):.2e}", flush=True)
        fns[name] = (lambda k=k, y=y, before=before: (before(), k(L.x, L.wt, y)))
    med = rounds(fns, n=n)
    for m in fns:
        print(f"  {tag} {m:22s} {med[m]*1e3:8.1f} us  vs cuDNN {med['cudnn']/med[m]:.3f}", flush=True)
    return med


def gemm_case(M, N, K, dtype=None):
    """Random operands a [M, K], b [K, N] (f16 unless `dtype`), their product in f32,
    and {"cublas": torch.matmul(a, b)} to time tilec's calls beside."""
    import torch
    dtype = dtype or torch.float16
    a = torch.randn(M, K, device="cuda", dtype=dtype)
    b = torch.randn(K, N, device="cuda", dtype=dtype)
    return a, b, a.float() @ b.float(), {"cublas": lambda: torch.matmul(a, b)}


def checked_gemm(k, a, b, ref, what=""):
    """k(a, b, c) into an M x N view `c` inside a buffer filled with 7.0: asserts the result
    near `ref` (a @ b in f32) and the margin intact, then returns (call, c), `call()` running
    it again into the same view (its margin refilled for the next check)."""
    import torch
    M, N = a.shape[0], b.shape[1]
    big = torch.full((M + 2, N + 16), 7.0, device="cuda", dtype=a.dtype)
    c = big[1:M + 1, 8:N + 8]
    k(a, b, c)
    torch.cuda.synchronize()
    err = (c.float() - ref).abs().max().item() / ref.abs().max().item()
    big[1:M + 1, 8:N + 8] = 7
    assert err < 1e-2 and bool((big == 7).all()), (what, M, N, err)
    return (lambda: k(a, b, c)), c


def tune_cold(k, a, b, ref):
    """The TunedKernel `k` tuned afresh on a @ b (an empty disk cache, the process's choices
    cleared) into a guarded view: (seconds the tune took, its chosen consts)."""
    import tempfile
    import time
    import torch
    from tilec import autotune
    os.environ["TILEC_CACHE_DIR"] = tempfile.mkdtemp()
    autotune._CHOICES.clear()
    k._chosen.clear()
    t0 = time.perf_counter()
    checked_gemm(k, a, b, ref, "tune")
    torch.cuda.synchronize()
    return time.perf_counter() - t0, dict(k.best_config)


def gemm_config_name(c):
    """gemm.tile's tuned consts in short: 128x256/4 pr1 pe1 sk."""
    return f"{c['BM']}x{c['BN']}/{c['STAGES']} pr{c['PRODUCER']} pe{c['PERSISTENT']}" + \
        (" sk" if c.get("STREAM_K") else "")


def tuned_picks_vs_cublas(spaces: dict, shapes, dtype_name="f16", n=9, report=False, cold_l2=False):
    """For each M x N x K of `shapes`: each of `spaces` ({name: gemm.tile source}) tuned cold
    (tune_cold; with `report`, its timed candidates, fastest first), then the picks and cuBLAS
    in alternating rounds (`n`), printed against cuBLAS; with `cold_l2`, rounds with the L2
    flushed before each call (rounds_cold_l2) printed after them."""
    import re
    import torch
    import tilec
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    kernels = {name: tilec.compile(src) for name, src in spaces.items()}
    for M, N, K in shapes:
        a, b, ref, fns = gemm_case(M, N, K, dtype)
        for name, k in kernels.items():
            tune_s, best = tune_cold(k, a, b, ref)
            print(f"{M}x{N}x{K} {dtype_name} {name}: tuned in {tune_s:.2f} s, pick {gemm_config_name(best)}",
                  flush=True)
            if report:
                timed = [(float(m.group(1)), line) for line in k.tune_report().splitlines()
                         for m in [re.search(r": ([0-9.]+) ms", line)] if m]
                print("\n".join(line for _, line in sorted(timed)), flush=True)
            pick = tilec.compile(spaces[name], tune=False, **best)
            fns[f"{name} {gemm_config_name(best)}"] = checked_gemm(pick, a, b, ref, name)[0]
        for l2, timing in (("", rounds), (" DRAM", rounds_cold_l2))[:2 if cold_l2 else 1]:
            med = timing(fns, n=n)
            for m in fns:
                tflops = 2 * M * N * K / (med[m] * 1e-3) / 1e12
                print(f"  {M}x{N}x{K} {dtype_name}{l2} {m:34s} {med[m] * 1e3:8.1f} us {tflops:6.0f} TFLOPS  "
                      f"vs cuBLAS {med['cublas'] / med[m]:.3f}", flush=True)
