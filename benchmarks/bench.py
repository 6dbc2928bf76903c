"""tilec next to the best peer, same inputs, same run; prints a table of ratios.

    python benchmarks/bench.py            (needs a Hopper GPU and torch)
    python benchmarks/bench.py gemm conv2d   (only the named benchmarks)

Kernel times: CUDA events, warm-up, median of repeats, rotating over several
buffers when they would fit in L2. Host times: perf_counter_ns over many calls."""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tilec  # noqa: E402
from tilec.kernel import _CACHE  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def time_gpu(fn, reps=30, warmup=5):
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    return statistics.median(times)


def compare(mine, peer, rounds=7, reps=10):
    """Times tilec and its peer in alternating rounds (peer, tilec, peer, ...), so
    that clock and temperature drift hit both alike. Returns the median times and
    the median, lowest and highest of the per-round ratios peer time / tilec time."""
    t_mine, t_peer, ratios = [], [], []
    for _ in range(rounds):
        tp = time_gpu(peer, reps=reps, warmup=2)
        tm = time_gpu(mine, reps=reps, warmup=2)
        t_peer.append(tp)
        t_mine.append(tm)
        ratios.append(tp / tm)
    return statistics.median(t_mine), statistics.median(t_peer), Ratio(ratios)


class Ratio(float):
    """A median ratio that remembers the spread of the rounds it came from."""
    def __new__(cls, ratios):
        r = super().__new__(cls, statistics.median(ratios))
        r.lo, r.hi = min(ratios), max(ratios)
        return r


def host_time_per_call(fn, calls=10_000):
    import torch
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t)
        if len(samples) % 1000 == 0:
            torch.cuda.synchronize()
    return statistics.median(samples) * 1e-3


def bench_copy(rows):
    _copy_against_torch(rows, tilec.compile(str(ROOT / "examples/copy2d.tile")), "copy2d 16384x16384 f32 (1 GiB)")


def bench_copy_prehopper(rows):
    """copy2d as sm_80 / sm_86 / sm_89 get it (no TMA: bounds-checked thread
    copies through shared memory), built for this GPU: the thread-copy variant of
    the sm_90a kernel, line for line the CUDA sm_80 gets (tests/test_arch.py)."""
    k = tilec.compile(str(ROOT / "examples/copy2d.tile"), arch="sm_90a").fallback
    assert "cp.async.bulk" not in k.ptx and "mbarrier" not in k.ptx
    _copy_against_torch(rows, k, "copy2d pre-Hopper lowering 16384^2 f32")


def _copy_against_torch(rows, k, label):
    """Copy kernel `k` on 1 GiB of f32 (16384^2) next to torch's copy_."""
    import torch
    a = torch.randn(16384, 16384, device="cuda")
    b = torch.empty_like(a)
    nbytes = 2 * a.numel() * a.element_size()           # read + write
    k(a, b)
    assert torch.equal(a, b), f"{label}: a wrong answer"
    t_tilec, t_torch, ratio = compare(lambda: k(a, b), lambda: b.copy_(a))
    rows.append((label, "torch copy_", nbytes / t_tilec / 1e9, nbytes / t_torch / 1e9, "GB/s", ratio))


def bench_ragged(rows):
    """Outputs whose rows end mid-granule, as views of padded buffers (a column slice),
    against the aligned shape in the same rounds: the store maps end at the last
    whole 16-byte granule and threads write the rest; the padding must stay intact."""
    import torch
    k = tilec.compile(str(ROOT / "examples/copy2d.tile"))
    n = 16384
    a = torch.randn(n, n, device="cuda")
    b = torch.full_like(a, -7777.0)
    a_r, b_r = a[:, :n - 1], b[:, :n - 1]
    k(a_r, b_r)
    assert torch.equal(b_r, a_r) and bool((b[:, -1] == -7777.0).all()), "copy2d into a view wrote outside it"
    t_ragged, t_aligned, ratio = compare(lambda: k(a_r, b_r), lambda: k(a, b))
    rows.append(("copy2d into [16384, 16383] of [16384, 16384] f32", "aligned 16384^2",
                 2 * a_r.numel() * 4 / t_ragged / 1e9, 2 * a.numel() * 4 / t_aligned / 1e9, "GB/s", ratio))
    for name in ("gemm", "gemm_128x256"):
        k = tilec.compile(str(ROOT / f"examples/{name}.tile"))
        n = 4096
        a = torch.randn(n, n, device="cuda").half()
        b = torch.randn(n, n, device="cuda").half()
        c = torch.full((n, n), -7.0, device="cuda").half()
        b_r, c_r = b[:, :n - 1], c[:, :n - 1]
        k(a, b_r, c_r)
        err = ((c_r.float() - (a @ b_r).float()).norm() / (a @ b_r).float().norm()).item()
        assert err < 1e-2 and bool((c[:, -1] == -7.0).all()), f"{name} into a view: error {err} or a write outside"
        t_ragged, t_aligned, ratio = compare(lambda: k(a, b_r, c_r), lambda: k(a, b, c))
        rows.append((f"{name} f16 4096x4095x4096, C a view", "N = 4096", 2 * n * n * (n - 1) / t_ragged / 1e12,
                     2 * n ** 3 / t_aligned / 1e12, "TFLOP", ratio))


def bench_scale(rows):
    import torch
    k = tilec.compile(str(ROOT / "examples/scale.tile"))
    x = torch.randn(16384, 16384, device="cuda")
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * 4
    t_tilec, t_torch, ratio = compare(lambda: k(x, y, 0.5),
                                      lambda: torch.add(torch.mul(x, 0.5, out=y), 1.0, out=y))
    rows.append(("scale 16384x16384 f32", "torch mul+add", nbytes / t_tilec / 1e9, nbytes / t_torch / 1e9,
                 "GB/s", ratio))


def bench_im2col(rows):
    """ResNet-50 layer: N=128, 56x56, C=64, 3x3, stride 1, pad 1 -> a [401408, 576] f16 matrix."""
    import torch
    import torch.nn.functional as F
    k = tilec.compile(str(ROOT / "examples/im2col.tile"))
    x = torch.randn(128, 56, 56, 64, device="cuda").half()
    y = torch.empty(128 * 56 * 56, 9 * 64, device="cuda", dtype=torch.float16)
    nbytes = (y.numel() + x.numel()) * 2    # device-memory traffic: the matrix written, the input read once
    k(x, y)
    xn = x.permute(0, 3, 1, 2)          # NCHW view of the same data (channels-last memory)

    def torch_unfold():                 # the same matrix: unfold, then (kh, kw, c) columns, pixel rows
        cols = F.unfold(xn, 3, padding=1)                       # [N, C*9, L], c slowest
        return cols.view(128, 64, 9, -1).permute(0, 3, 2, 1).reshape(-1, 9 * 64)
    got = torch_unfold()
    assert torch.equal(got, y), "im2col example gave a wrong answer"
    t_tilec, t_torch, ratio = compare(lambda: k(x, y), torch_unfold, rounds=5)
    rows.append(("im2col ResNet-50 3x3 (N128 56x56 C64) f16", "torch unfold", nbytes / t_tilec / 1e9,
                 nbytes / t_torch / 1e9, "GB/s", ratio))
    # the copy bandwidth in the same rounds: copy2d of a tensor of the matrix's size
    kc = tilec.compile(str(ROOT / "examples/copy2d.tile"))
    src = torch.randn(y.numel() // 2, device="cuda").view(-1, 9 * 64 // 2)
    dst = torch.empty_like(src)
    copy_bytes = 2 * src.numel() * 4
    t_im2col, t_copy, _ = compare(lambda: k(x, y), lambda: kc(src, dst), rounds=5)
    bw, copy_bw = nbytes / t_im2col / 1e9, copy_bytes / t_copy / 1e9
    rows.append(("im2col GB/s over copy2d GB/s (last col)", "copy2d", bw, copy_bw, "GB/s", bw / copy_bw))


def bench_gemm(rows):
    import torch
    for name, dt, tdt in (("gemm", "bf16", torch.bfloat16), ("gemm", "f16", torch.float16),
                          ("gemm_128x256", "bf16", torch.bfloat16), ("gemm_128x256", "f16", torch.float16)):
        k = tilec.compile(open(ROOT / f"examples/{name}.tile").read().replace("f16", dt))
        for n in (4096, 8192):
            a = torch.randn(n, n, device="cuda").to(tdt)
            b = torch.randn(n, n, device="cuda").to(tdt)
            c = torch.empty(n, n, device="cuda", dtype=tdt)
            k(a, b, c)
            want = a @ b
            err = ((c.float() - want.float()).norm() / want.float().norm()).item()
            assert err < 1e-2, f"gemm {dt} {n}: relative error {err}"
            flops = 2 * n ** 3
            t_tilec, t_torch, ratio = compare(lambda: k(a, b, c), lambda: torch.matmul(a, b, out=c))
            rows.append((f"{name} {dt} {n}^3", "torch.matmul", flops / t_tilec / 1e12,
                         flops / t_torch / 1e12, "TFLOP", ratio))


GEMM_TUNE = {"BN": (64, 128, 192, 256), "STAGES": (2, 3, 4, 5)}     # 16 candidates (BN=256 x 5 stages: refused)


def bench_autotune(rows):
    """gemm.tile autotuned over 16 candidates (tilec/autotune.py): the cold tune
    (a fresh disk cache: compile every candidate, time them on the real
    tensors, run the winner) and the warm start in a cleared process cache (the
    choice and the winner's cubin read from disk, one call), then the tuned
    kernel against cuBLAS."""
    import os
    import tempfile
    import torch
    from tilec import autotune
    saved = os.environ.get("TILEC_CACHE_DIR")
    with tempfile.TemporaryDirectory() as d:
        os.environ["TILEC_CACHE_DIR"] = d
        try:
            path = str(ROOT / "examples/gemm.tile")
            for n in (4096, 8192):
                a = torch.randn(n, n, device="cuda", dtype=torch.float16)
                b = torch.randn(n, n, device="cuda", dtype=torch.float16)
                c = torch.empty(n, n, device="cuda", dtype=torch.float16)
                _CACHE.clear()
                autotune._CHOICES.clear()
                torch.cuda.synchronize()
                t = time.perf_counter()
                k = tilec.compile(path, tune=GEMM_TUNE, key=("M", "N", "K"))
                k(a, b, c)
                torch.cuda.synchronize()
                cold = time.perf_counter() - t
                want = a @ b
                err = ((c.float() - want.float()).norm() / want.float().norm()).item()
                assert err < 1e-2, f"tuned gemm f16 {n}: relative error {err}"
                best = " ".join(f"{k_}={v}" for k_, v in k.best_config.items())
                rows.append((f"autotune gemm 16 candidates {n}^3 cold (compile + timing)", "-", cold, 0, "s", None))
                _CACHE.clear()
                autotune._CHOICES.clear()
                t = time.perf_counter()
                k = tilec.compile(path, tune=GEMM_TUNE, key=("M", "N", "K"))
                k(a, b, c)
                warm = time.perf_counter() - t
                rows.append((f"autotune gemm {n}^3 warm from disk (+1 call)", "-", warm * 1e3, 0, "ms", None))
                flops = 2 * n ** 3
                t_tilec, t_torch, ratio = compare(lambda: k(a, b, c), lambda: torch.matmul(a, b, out=c))
                rows.append((f"tuned gemm f16 {n}^3 ({best})", "torch.matmul", flops / t_tilec / 1e12,
                             flops / t_torch / 1e12, "TFLOP", ratio))
                from triton_matmul import matmul as triton_matmul   # Triton's autotuned matmul, the other peer
                c2 = torch.empty_like(c)
                triton_matmul(a, b, c2)                             # autotunes once per shape
                err = ((c2.float() - want.float()).norm() / want.float().norm()).item()
                assert err < 1e-2, f"triton matmul {n}: relative error {err}"
                t_tilec, t_triton, ratio = compare(lambda: k(a, b, c), lambda: triton_matmul(a, b, c2))
                rows.append((f"tuned gemm f16 {n}^3 ({best})", "triton autotuned", flops / t_tilec / 1e12,
                             flops / t_triton / 1e12, "TFLOP", ratio))
        finally:
            if saved is None:
                os.environ.pop("TILEC_CACHE_DIR", None)
            else:
                os.environ["TILEC_CACHE_DIR"] = saved
            _CACHE.clear()
            autotune._CHOICES.clear()


# conv2d.tile's consts per layer (BM x BN tiles, pipeline stages), the best of a
# sweep on the H100 (benchmarks/NOTES.md): 128-row tiles as wide as F allows
# (up to 256, then with 4 stages), 3 stages otherwise.
CONV_LAYERS = (((56, 64, 1), dict(BN=64)), ((28, 128, 1), {}), ((14, 256, 1), dict(BN=256, STAGES=4)),
               ((7, 512, 1), dict(BN=256, STAGES=4)), ((56, 128, 2), {}))


def bench_gemm_f8(rows):
    """e4m3 gemm (examples/gemm_f8.tile) against torch._scaled_mm (cuBLASLt fp8)
    with unit scales, f16 output, the same [M, K] x [N, K]^T operands, and
    use_fast_accum: like tilec, it keeps the sums in the tensor cores, whose fp8
    accumulation on Hopper is narrower than f32 (relative error ~2e-3 at
    K = 8192); without it cuBLAS adds partial sums in f32 on the side."""
    import torch
    k = tilec.compile(str(ROOT / "examples/gemm_f8.tile"))
    one = torch.ones((), device="cuda")
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        bt = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        c = torch.empty(n, n, device="cuda", dtype=torch.float16)
        k(a, bt, c)
        want = a.float() @ bt.float().t()
        err = ((c.float() - want).norm() / want.norm()).item()
        assert err < 5e-3, f"gemm_f8 {n}: relative error {err}"
        t_tilec, t_torch, ratio = compare(
            lambda: k(a, bt, c),
            lambda: torch._scaled_mm(a, bt.t(), scale_a=one, scale_b=one, out_dtype=torch.float16,
                                     use_fast_accum=True))
        flops = 2 * n ** 3
        rows.append((f"gemm_f8 e4m3 {n}^3", "torch._scaled_mm", flops / t_tilec / 1e12, flops / t_torch / 1e12,
                     "TFLOP", ratio))


def bench_conv2d(rows):
    """conv2d f16 NHWC, N=128, against F.conv2d on channels-last tensors (cuDNN)."""
    import math

    import torch
    import torch.nn.functional as F
    torch.backends.cudnn.benchmark = True      # the peer at its best: cuDNN times its algorithms first
    ratios = []
    for (hw, c, s), consts in CONV_LAYERS:
        ks = tilec.compile(str(ROOT / "examples/conv2d.tile"), S=s, **consts)
        x = torch.randn(128, hw, hw, c, device="cuda").half()
        weight = torch.randn(c, c, 3, 3, device="cuda").half() / (9 * c) ** 0.5
        wt = weight.permute(2, 3, 1, 0).reshape(9 * c, c).contiguous()
        o = (hw + 2 - 2 - 1) // s + 1
        y = torch.empty(128 * o * o, c, device="cuda").half()
        xn = x.permute(0, 3, 1, 2)                       # NCHW view of channels-last memory
        wn = weight.contiguous(memory_format=torch.channels_last)
        ks(x, wt, y)
        want = F.conv2d(xn, wn, stride=s, padding=1).permute(0, 2, 3, 1).reshape(-1, c)
        err = ((y.float() - want.float()).norm() / want.float().norm()).item()
        assert err < 5e-3, f"conv2d {hw}x{hw} C{c}: relative error {err}"
        flops = 2 * 128 * o * o * c * 9 * c
        t_tilec, t_torch, ratio = compare(lambda: ks(x, wt, y), lambda: F.conv2d(xn, wn, stride=s, padding=1))
        ratios.append(ratio)
        tiles = f"{ks.consts['BM']}x{ks.consts['BN']}/{ks.consts['STAGES']}"
        rows.append((f"conv2d {hw}x{hw} C{c}->{c} 3x3 s{s} ({tiles})", "F.conv2d cuDNN", flops / t_tilec / 1e12,
                     flops / t_torch / 1e12, "TFLOP", ratio))
    rows.append(("conv2d geomean of the 5 layers", "F.conv2d cuDNN", 0, 0, "", math.prod(ratios) ** (1 / 5)))


def bench_host(rows):
    import ctypes

    import torch
    k = tilec.compile(str(ROOT / "examples/copy2d.tile"))
    a = torch.randn(64, 128, device="cuda")
    b = torch.empty_like(a)
    us_tilec = host_time_per_call(lambda: k(a, b))
    us_torch = host_time_per_call(lambda: b.copy_(a))
    rows.append(("host time per call, copy2d 64x128", "torch copy_", us_tilec, us_torch, "us", us_torch / us_tilec))
    # the same kernel as a torch operator: the TorchOp (an eager replay, no dispatcher), and the
    # registered operator through torch's dispatcher (what a torch.compile'd graph calls)
    op = k.as_torch_op()
    for name, fn in (("torch op", lambda: op(a, b)), ("torch.ops dispatcher", lambda: op.op(a, b))):
        us = host_time_per_call(fn)
        rows.append((f"host per call: {name} ({us - us_tilec:+.2f} us)", "plain k(a, b)", us, us_tilec, "us",
                     us_tilec / us))
    # a raw cuLaunchKernel of the same cubin with the same (already encoded) parameters
    from cuda.bindings import driver as cu
    from tilec.runtime import host
    prepared = k._prepared[host.torch_call_key((a, b))]     # this call's launch (not an older one's)
    fn, ptrs = k._loaded[prepared.device].function, prepared.keep[0]
    stream = torch.cuda.current_stream().cuda_stream
    us_raw = host_time_per_call(lambda: cu.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 32768, stream,
                                                          ctypes.addressof(ptrs), 0))
    rows.append(("host time per call: raw cuLaunchKernel", "cuda.bindings", us_tilec, us_raw, "us", us_raw / us_tilec))
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return

    @triton.jit
    def triton_copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    n = a.numel()
    us_triton = host_time_per_call(lambda: triton_copy[(triton.cdiv(n, 1024),)](a, b, n, BLOCK=1024))
    rows.append(("host time per call: triton copy kernel", "triton", us_tilec, us_triton, "us",
                 us_triton / us_tilec))


def bench_compile(rows):
    """Cold compiles (a fresh disk cache: lowering + NVRTC) and the warm start of
    the same kernel from the disk cache (no NVRTC), in this process."""
    import os
    import tempfile
    saved = os.environ.get("TILEC_CACHE_DIR")
    with tempfile.TemporaryDirectory() as d:
        os.environ["TILEC_CACHE_DIR"] = d
        try:
            for name in ("copy2d", "gemm"):
                _CACHE.clear()
                t = time.perf_counter()
                k = tilec.compile(str(ROOT / f"examples/{name}.tile"))
                total = time.perf_counter() - t
                rows.append((f"cold compile {name} (whole / NVRTC)", "-", total * 1e3, k.compile_seconds * 1e3,
                             "ms", None))
                _CACHE.clear()
                t = time.perf_counter()
                k = tilec.compile(str(ROOT / f"examples/{name}.tile"))
                assert k.from_disk_cache
                rows.append((f"warm start {name} from the disk cache", "-", (time.perf_counter() - t) * 1e3, 0,
                             "ms", None))
        finally:
            if saved is None:
                os.environ.pop("TILEC_CACHE_DIR", None)
            else:
                os.environ["TILEC_CACHE_DIR"] = saved
            _CACHE.clear()


def main():
    rows = []
    benches = (bench_compile, bench_copy, bench_copy_prehopper, bench_ragged, bench_scale, bench_im2col, bench_gemm,
               bench_autotune, bench_gemm_f8, bench_conv2d, bench_host)
    wanted = set(sys.argv[1:])
    unknown = wanted - {b.__name__[len("bench_"):] for b in benches}
    if unknown:
        sys.exit(f"unknown benchmark {sorted(unknown)}; choose from "
                 f"{' '.join(b.__name__[len('bench_'):] for b in benches)}")
    for b in benches:
        if wanted and b.__name__[len("bench_"):] not in wanted:
            continue
        try:
            b(rows)
        except Exception as e:  # keep the table: one failing line must not hide the others
            rows.append((b.__name__, f"FAILED: {e}", 0, 0, "", None))
    print(f"\n{'benchmark':48s} {'peer':16s} {'tilec':>10s} {'peer':>10s} {'unit':5s} {'peer/tilec time':>16s}"
          "  rounds' range")
    for name, peer, mine, theirs, unit, ratio in rows:
        r = f"{ratio:16.3f}" if ratio is not None else f"{'-':>16s}"
        spread = f"  {ratio.lo:.3f}-{ratio.hi:.3f}" if isinstance(ratio, Ratio) else ""
        print(f"{name:48s} {peer:16s} {mine:10.2f} {theirs:10.2f} {unit:5s} {r}{spread}")


if __name__ == "__main__":
    main()
