"""tilec next to the best peer, same inputs, same run; prints a table of ratios.

    python benchmarks/bench.py            (needs a Hopper GPU and torch; Triton for the gemm's second peer)
    python benchmarks/bench.py gemm conv2d   (only the named benchmarks; a wrong name lists them)
    python benchmarks/bench.py --runs 5 gemm conv2d autotune   (issue 13's table: ~3-4 min on an H100)

--runs N runs the selected benchmarks N times in this process (compiled and
tuned kernels kept; the autotune benchmark still starts cold each run). Rows
are matched across runs by name and peer; the table prints the median over
runs of each run's median ratio and the lowest-highest of those per-run
medians, then the "targets" section: issue 13's targets, each with its value,
range and PASS/MISS.

Kernel times: CUDA events around one call, the call queued behind a GPU sleep
so that its host work (the launch) is not timed; warm-up, median of repeats;
peer and tilec in alternating rounds (compare()). Host times: perf_counter_ns
over many calls."""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Where a CUDA driver is loaded, NVRTC keeps what ptxas made in the CUDA compute cache
# (~/.nv/ComputeCache, keyed by the PTX): a "cold" compile or tune after an earlier one of the
# same kernels, in any process, would read it (session 20, H100 machine: 0.02 s for a gemm.tile
# candidate that took 0.7-1.05 s the first time; gemm.tile's "cold" tune at 4096^3 4-5 s with it,
# 11-13 s without, 8 workers). Off for this process and the compile workers it starts, so that
# the cold rows are cold (CUDA_CACHE_DISABLE=0 in the environment measures with it).
os.environ.setdefault("CUDA_CACHE_DISABLE", "1")

import tilec  # noqa: E402
from tilec.kernel import _CACHE  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


# GPU cycles of the spin queued before each timed call (~0.15-0.2 ms at H100 clocks): the
# host queues the start event, the call and the end event while it runs, so the
# events time the GPU work alone, not the launch (tilec and torch copy_ 6-9 us, Triton's
# launcher ~20 us and its autotuner's lookup: ~10% of a 0.2 ms 4096^3 gemm).
SLEEP_CYCLES = 300_000


def time_one(fn, before=None) -> float:
    """One call of `fn`, in seconds: CUDA events around it, queued behind a GPU spin
    (and behind `before()`, untimed, where given)."""
    import torch
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if before is not None:
        before()
    torch.cuda._sleep(SLEEP_CYCLES)
    s.record()
    fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e-3


def time_gpu(fn, reps=30, warmup=5, before=None):
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median([time_one(fn, before) for _ in range(reps)])


def compare(mine, peer, rounds=7, reps=10, before=None):
    """Times tilec and its peer in alternating rounds (peer, tilec, peer, ...), so
    that clock and temperature drift hit both alike. Returns the median times and
    the median, lowest and highest of the per-round ratios peer time / tilec time.
    `before()`: queued ahead of each timed call, untimed (bench_gemm_decode's write of
    256 MB, which leaves none of the call's inputs in L2)."""
    t_mine, t_peer, ratios = [], [], []
    for _ in range(rounds):
        tp = time_gpu(peer, reps=reps, warmup=2, before=before)
        tm = time_gpu(mine, reps=reps, warmup=2, before=before)
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


def bench_rowsum(rows):
    """examples/rowsum.tile (each row's sum and maximum, one pass over X; tuned on
    the first call of each shape, the choice in the row's name) against torch.sum
    and torch.amax over the rows (two kernels, two passes); GB/s of X read once."""
    import torch
    k = tilec.compile(str(ROOT / "examples/rowsum.tile"))
    for m, n in ((4096, 4096), (16384, 1024), (1024, 16384), (256, 65536), (64, 16384)):
        x = torch.randn(m, n, device="cuda")
        sums, maxes = torch.empty(m, device="cuda"), torch.empty(m, device="cuda")
        k(x, sums, maxes)       # tunes
        assert torch.equal(maxes, x.amax(1)) and torch.allclose(sums.double(), x.double().sum(1), 1e-4, 1e-2)
        t_tilec, t_torch, ratio = compare(lambda: k(x, sums, maxes),
                                          lambda: (torch.sum(x, 1, out=sums), torch.amax(x, 1, out=maxes)))
        nbytes = x.numel() * 4
        chosen = " ".join(f"{c}={v}" for c, v in k.best_config.items())
        rows.append((f"rowsum {m}x{n} f32 (sum and max of each row; {chosen})", "torch sum+amax",
                     nbytes / t_tilec / 1e9, nbytes / t_torch / 1e9, "GB/s", ratio))


def bench_softmax(rows):
    """tests/softmax.tile (one pass where a row fits a tile, else two; tuned on the first
    call of each shape) against torch.softmax over the rows, f16 in and out; GB/s of X
    read once and Y written once. A test program, not a shipped example."""
    import torch
    k = tilec.compile(str(ROOT / "tests/softmax.tile"))
    for m, n in ((32768, 512), (8192, 1024), (4096, 1000), (4096, 4096), (2048, 32768)):
        x = torch.randn(m, n, device="cuda", dtype=torch.float16)
        y = torch.empty_like(x)
        k(x, y)                 # tunes
        err = (y.float() - torch.softmax(x.float(), 1)).abs().max().item()
        assert err < 1e-3, f"softmax {m}x{n}: error {err}"
        t_tilec, t_torch, ratio = compare(lambda: k(x, y), lambda: torch.softmax(x, 1))
        nbytes = 2 * x.numel() * 2
        rows.append((f"softmax {m}x{n} f16", "torch.softmax", nbytes / t_tilec / 1e9, nbytes / t_torch / 1e9,
                     "GB/s", ratio, chosen(k)))


def bench_attention(rows):
    """tests/attention.tile and tests/attention_overlap.tile (flash-attention forward,
    heads of 64; one or two key blocks a trip; each tuned on the first call of each
    shape) against torch's scaled_dot_product_attention on the same [H, L, 64] f16
    tensors. Test programs, not shipped examples."""
    import torch
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for program in ("attention", "attention_overlap"):
        k = tilec.compile(str(ROOT / f"tests/{program}.tile"))
        for h, length in ((32, 1024), (16, 4096), (8, 8192)):
            q, kk, v = (torch.randn(h, length, 64, device="cuda", dtype=torch.float16) for _ in range(3))
            o = torch.empty_like(q)
            k(q, kk, v, o, 0.125)   # tunes
            peer = lambda: sdpa(q[None], kk[None], v[None], scale=0.125)  # noqa: E731
            err = (o.float() - peer()[0].float()).abs().max().item()
            assert err < 2e-3, f"{program} {h}x{length}: error {err}"
            t_tilec, t_torch, ratio = compare(lambda: k(q, kk, v, o, 0.125), peer)
            flops = 4 * h * length * length * 64
            rows.append((f"{program}.tile {h} heads x {length}, d 64 f16", "torch SDPA", flops / t_tilec / 1e12,
                         flops / t_torch / 1e12, "TFLOP", ratio, chosen(k)))


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


GEMM = ROOT / "examples/gemm.tile"
GEMM_TUNE = {"BN": (64, 128, 192, 256), "STAGES": (2, 3, 4, 5)}     # 16 candidates (BN=256 x 5 stages: refused)
GEMM_DTYPES = ("f16", "bf16")
GEMM_SIZES = (4096, 8192)                    # square M = N = K
# M, N, K of the ragged gemm. Its B [K, N] and C [M, N] are column slices of buffers
# GEMM_RAGGED_LD = 4104 wide: TMA needs row strides that are multiples of 16 bytes, and
# 4097 f16 are not (dense [K, 4097] tensors would make the kernel fall back to its slow
# thread-copy variant with a TmaFallbackWarning); A [M, K] with K = 4096 is dense.
GEMM_RAGGED = (4095, 4097, 4096)
GEMM_RAGGED_LD = 4104
# M, N, K of few-row gemms (LLM decode and small batches against a layer's weights):
# fewer output tiles than SMs, where gemm.tile's stream-K splits the K steps
GEMM_SMALL = [(1, 4096, 4096), (8, 4096, 4096), (96, 4096, 4096), (160, 4096, 4096)] + \
    [(m, n, k) for m in (16, 64, 256) for n, k in ((4096, 4096), (4096, 14336), (14336, 4096))] + [(128, 4096, 4096)]

# M, N, K of a decode step's gemms with the weights read from DRAM (the L2 flushed before every
# timed call, tilec's and cuBLAS's alike), gemm.tile tuned with tune_l2="cold"
GEMM_DECODE = [(1, 4096, 4096), (8, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (16, 4096, 14336),
               (16, 14336, 4096)]

_KERNELS = {}       # what shipped() compiled, kept for the whole process (every --runs run)


@contextlib.contextmanager
def fresh_disk_cache():
    """TILEC_CACHE_DIR pointed at a new, empty directory (and the process caches
    cleared) for the duration; the old setting and empty process caches after.
    (NVRTC's own cache, the CUDA compute cache, is off: CUDA_CACHE_DISABLE above.)"""
    from tilec import autotune
    saved = os.environ.get("TILEC_CACHE_DIR")
    try:
        with tempfile.TemporaryDirectory() as d:
            os.environ["TILEC_CACHE_DIR"] = d
            _CACHE.clear()
            autotune._CHOICES.clear()
            yield d
    finally:
        if saved is None:
            os.environ.pop("TILEC_CACHE_DIR", None)
        else:
            os.environ["TILEC_CACHE_DIR"] = saved
        _CACHE.clear()
        autotune._CHOICES.clear()


def shipped(src, **consts):
    """tilec.compile(src, **consts), once per process: a Kernel, or a
    tilec.autotune.TunedKernel where the program has a `tune` statement."""
    key = (str(src), tuple(sorted(consts.items())))
    if key not in _KERNELS:
        _KERNELS[key] = tilec.compile(src, **consts)
    return _KERNELS[key]


def is_tuned(k) -> bool:
    return hasattr(k, "best_config")         # a TunedKernel (a plain Kernel has no such attribute)


def tuned_gemm(dt):
    """examples/gemm.tile as shipped, in dtype dt (f16 or bf16), autotuned: by its
    own `tune` statement when it has one, else over GEMM_TUNE keyed by M, N, K;
    once per process."""
    src = str(GEMM) if dt == "f16" else GEMM.read_text().replace("f16", dt)
    k = shipped(src)
    if is_tuned(k):
        return k
    key = ("tune=GEMM_TUNE", src)
    if key not in _KERNELS:
        _KERNELS[key] = tilec.compile(src, tune=GEMM_TUNE, key=("M", "N", "K"))
    return _KERNELS[key]


def chosen(k, shape=("KH", "KW", "S", "P", "D")) -> str:
    """The consts a kernel ran with: a TunedKernel's choice for its last call's key, or
    a plain Kernel's consts less those naming the problem's shape."""
    cfg = getattr(k, "best_config", None)
    if cfg is None:
        cfg = {n: v for n, v in k.consts.items() if n not in shape}
    return " ".join(f"{n}={v}" for n, v in cfg.items())


def rel_err(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def attempt(rows, name, fn, *args):
    """fn(*args), or None and a FAILED row `name`: one failing part must not hide the others."""
    try:
        return fn(*args)
    except Exception as e:
        rows.append((name, f"FAILED: {e}", 0, 0, "", None))
        return None


def bench_gemm(rows):
    """gemm.tile as shipped, autotuned (tuned_gemm), f16 and bf16: GEMM_SIZES
    (4096^3, 8192^3) against torch.matmul (cuBLAS) and Triton's autotuned matmul
    (benchmarks/triton_matmul.py), then the ragged GEMM_RAGGED against
    torch.matmul, then gemm_128x256.tile (fixed consts) against torch.matmul.
    Row names carry no config (rows match across --runs by name): the config
    column names the chosen ones."""
    for dt in GEMM_DTYPES:
        for n in GEMM_SIZES:
            attempt(rows, f"gemm {dt} {n}^3", _gemm_square, rows, dt, n)
    m, n, k = GEMM_RAGGED
    for dt in GEMM_DTYPES:
        attempt(rows, f"gemm {dt} {m}x{n}x{k} (B, C views)", _gemm_ragged, rows, dt)
    for dt in GEMM_DTYPES:
        for n in GEMM_SIZES:
            attempt(rows, f"gemm_128x256 {dt} {n}^3", _gemm_128x256, rows, dt, n)


def bench_gemm_small(rows):
    """gemm.tile as shipped, autotuned, f16, on GEMM_SMALL against torch.matmul
    (no target in issue 13; these shapes have fewer output tiles than SMs)."""
    for m, n, k in GEMM_SMALL:
        attempt(rows, f"gemm f16 {m}x{n}x{k}", _gemm_small, rows, m, n, k)


def l2_flush():
    """A call that writes 256 MB on the GPU (as Triton's do_bench does), queued ahead of a
    timed call so that none of the last call's tensors are left in the L2 (50 MB)."""
    import torch
    return torch.empty(256 << 20, dtype=torch.uint8, device="cuda").zero_


def bench_gemm_decode(rows):
    """gemm.tile as shipped, tuned with tune_l2="cold", f16, on GEMM_DECODE against
    torch.matmul, with the L2 flushed before each timed call of either (a model's
    decode step: each layer's weights come from DRAM; no target in issue 13)."""
    flush = l2_flush()
    k = shipped(GEMM, tune_l2="cold")
    for m, n, kk in GEMM_DECODE:
        attempt(rows, f"gemm f16 {m}x{n}x{kk} from DRAM", _gemm_small, rows, m, n, kk, k, flush)


def _gemm_small(rows, m, n, kk, k=None, before=None):
    import torch
    name = f"gemm f16 {m}x{n}x{kk}" + (" from DRAM" if before is not None else "")
    k = tuned_gemm("f16") if k is None else k
    a = torch.randn(m, kk, device="cuda").half()
    b = torch.randn(kk, n, device="cuda").half()
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    k(a, b, c)                                   # tunes on the first call with this shape
    err = rel_err(c, a @ b)
    assert err < 1e-2, f"{name}: relative error {err}"
    t_tilec, t_torch, ratio = compare(lambda: k(a, b, c), lambda: torch.matmul(a, b, out=c), before=before)
    flops = 2 * m * n * kk
    rows.append((name, "torch.matmul", flops / t_tilec / 1e12, flops / t_torch / 1e12, "TFLOP", ratio, chosen(k)))


def _torch_dtype(dt):
    import torch
    return {"f16": torch.float16, "bf16": torch.bfloat16}[dt]


def _gemm_square(rows, dt, n):
    import torch
    name, tdt, k = f"gemm {dt} {n}^3", _torch_dtype(dt), tuned_gemm(dt)
    a = torch.randn(n, n, device="cuda").to(tdt)
    b = torch.randn(n, n, device="cuda").to(tdt)
    c = torch.empty(n, n, device="cuda", dtype=tdt)
    k(a, b, c)                                   # tunes on the first call with this shape
    want = a @ b
    err = rel_err(c, want)
    assert err < 1e-2, f"{name}: relative error {err}"
    cfg = chosen(k)
    flops = 2 * n ** 3
    t_tilec, t_torch, ratio = compare(lambda: k(a, b, c), lambda: torch.matmul(a, b, out=c))
    rows.append((name, "torch.matmul", flops / t_tilec / 1e12, flops / t_torch / 1e12, "TFLOP", ratio, cfg))
    from triton_matmul import chosen as triton_chosen    # Triton's autotuned matmul, the other peer
    from triton_matmul import matmul as triton_matmul
    c2 = torch.empty_like(c)
    triton_matmul(a, b, c2)                      # autotunes once per shape and dtype
    err = rel_err(c2, want)
    assert err < 1e-2, f"triton matmul {dt} {n}: relative error {err}"
    t_tilec, t_triton, ratio = compare(lambda: k(a, b, c), lambda: triton_matmul(a, b, c2))
    rows.append((name, "triton autotuned", flops / t_tilec / 1e12, flops / t_triton / 1e12, "TFLOP", ratio,
                 f"{cfg}; triton {triton_chosen()}"))


def _gemm_ragged(rows, dt):
    import warnings

    import torch
    m, n, kk = GEMM_RAGGED
    name, tdt, k = f"gemm {dt} {m}x{n}x{kk} (B, C views)", _torch_dtype(dt), tuned_gemm(dt)
    a = torch.randn(m, kk, device="cuda").to(tdt)
    b_buf = torch.randn(kk, GEMM_RAGGED_LD, device="cuda").to(tdt)
    c_buf = torch.full((m, GEMM_RAGGED_LD), -7.0, device="cuda", dtype=tdt)
    b, c = b_buf[:, :n], c_buf[:, :n]           # 16-byte row strides: TMA, no fallback
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", tilec.TmaFallbackWarning)
        k(a, b, c)
    fell_back = [w for w in caught if issubclass(w.category, tilec.TmaFallbackWarning)]
    assert not fell_back, f"{name}: the kernel fell back to thread copies: {fell_back[0].message}"
    want = a @ b
    err = rel_err(c, want)
    assert err < 1e-2 and bool((c_buf[:, n:] == -7.0).all()), f"{name}: error {err} or a write outside C"
    # cuBLAS gets contiguous operands and output. Measured on the H100 it runs this shape at
    # 110-124 TFLOPS both on the views and contiguous (a 4097-element row is not a multiple
    # of 16 bytes, which its fast kernels need); tilec runs the views with TMA at ~0.9 of
    # its aligned 4096^3 speed
    b_dense, c_dense = b.contiguous(), torch.empty(m, n, device="cuda", dtype=tdt)
    t_tilec, t_torch, ratio = compare(lambda: k(a, b, c), lambda: torch.matmul(a, b_dense, out=c_dense))
    flops = 2 * m * n * kk
    rows.append((name, "torch.matmul", flops / t_tilec / 1e12, flops / t_torch / 1e12, "TFLOP", ratio, chosen(k)))


def _gemm_128x256(rows, dt, n):
    import torch
    name, tdt = f"gemm_128x256 {dt} {n}^3", _torch_dtype(dt)
    k = shipped((ROOT / "examples/gemm_128x256.tile").read_text().replace("f16", dt))
    a = torch.randn(n, n, device="cuda").to(tdt)
    b = torch.randn(n, n, device="cuda").to(tdt)
    c = torch.empty(n, n, device="cuda", dtype=tdt)
    k(a, b, c)
    err = rel_err(c, a @ b)
    assert err < 1e-2, f"{name}: relative error {err}"
    flops = 2 * n ** 3
    t_tilec, t_torch, ratio = compare(lambda: k(a, b, c), lambda: torch.matmul(a, b, out=c))
    rows.append((name, "torch.matmul", flops / t_tilec / 1e12, flops / t_torch / 1e12, "TFLOP", ratio, chosen(k)))


def bench_persistent(rows):
    """examples/gemm_persistent.tile (one block per SM looping over 128x256 output
    tiles, the ring carried across tiles) against torch.matmul, and against the
    same tiles launched one block per tile (gemm_128x256.tile), f16."""
    import torch
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pk = shipped(str(ROOT / "examples/gemm_persistent.tile"))
    flat = shipped(str(ROOT / "examples/gemm_128x256.tile"))
    for n in GEMM_SIZES:
        name = f"gemm_persistent f16 {n}^3"
        a = torch.randn(n, n, device="cuda").half()
        b = torch.randn(n, n, device="cuda").half()
        c = torch.empty(n, n, device="cuda").half()
        pk(a, b, c, sms)
        err = rel_err(c, a @ b)
        assert err < 1e-2, f"{name}: relative error {err}"
        flops = 2 * n ** 3
        t_tilec, t_torch, ratio = compare(lambda: pk(a, b, c, sms), lambda: torch.matmul(a, b, out=c))
        rows.append((name, "torch.matmul", flops / t_tilec / 1e12, flops / t_torch / 1e12, "TFLOP", ratio,
                     f"P={sms}"))
        t_tilec, t_flat, ratio = compare(lambda: pk(a, b, c, sms), lambda: flat(a, b, c))
        rows.append((name, "gemm_128x256", flops / t_tilec / 1e12, flops / t_flat / 1e12, "TFLOP", ratio,
                     "one block per tile"))


def bench_autotune(rows):
    """gemm.tile f16 autotuned as in bench_gemm (its own `tune` statement, else
    GEMM_TUNE's 16 candidates), for each size and in every run: the cold tune (a
    fresh, empty disk cache and cleared process caches: compile every candidate,
    time them on the real tensors, run the winner) and the warm start in a
    cleared process cache (the choice and the winner's cubin read from that disk
    cache, one call). The cold tune starts its compile workers too (those of
    earlier tunes in this process are stopped first). How fast the tuned kernel
    is: the gemm benchmark."""
    import torch
    from tilec import autotune
    from tilec.runtime import workers
    own_tune = is_tuned(shipped(str(GEMM)))      # (compiled before the clock, in the usual cache)

    def make():
        return tilec.compile(str(GEMM)) if own_tune else tilec.compile(str(GEMM), tune=GEMM_TUNE, key=("M", "N", "K"))
    for n in GEMM_SIZES:
        a = torch.randn(n, n, device="cuda", dtype=torch.float16)
        b = torch.randn(n, n, device="cuda", dtype=torch.float16)
        c = torch.empty(n, n, device="cuda", dtype=torch.float16)
        with fresh_disk_cache():
            workers.close_all()
            torch.cuda.synchronize()
            t = time.perf_counter()
            k = make()
            k(a, b, c)
            torch.cuda.synchronize()
            cold = time.perf_counter() - t
            err = rel_err(c, a @ b)
            assert err < 1e-2, f"tuned gemm f16 {n}: relative error {err}"
            tried = sum(line.startswith("  BM=") or line.startswith("  BN=") for line in k.tune_report().splitlines())
            space = f"{tried} of {len(getattr(k, '_candidates', ()))} candidates tried " \
                f"({'the file' if own_tune else 'GEMM_TUNE'})"
            rows.append((f"autotune gemm f16 {n}^3 cold (compile + timing)", "-", cold, 0, "s", None,
                         f"{space}: {chosen(k)}"))
            _CACHE.clear()
            autotune._CHOICES.clear()
            t = time.perf_counter()
            k = make()
            k(a, b, c)
            warm = time.perf_counter() - t
            rows.append((f"autotune gemm f16 {n}^3 warm from disk (+1 call)", "-", warm * 1e3, 0, "ms", None,
                         chosen(k)))
    _autotune_conv2d(rows, workers)


def _autotune_conv2d(rows, workers):
    """conv2d.tile's own space on one layer (28x28 C128->128 3x3, N = CONV_N), cold
    and warm as for the gemm: how long a conv's first call takes."""
    import torch
    import torch.nn.functional as F
    from tilec import autotune
    hw, c, f = 28, 128, 128
    x = torch.randn(CONV_N, hw, hw, c, device="cuda").half()
    weight = torch.randn(f, c, 3, 3, device="cuda").half() / (9 * c) ** 0.5
    wt = weight.permute(2, 3, 1, 0).reshape(9 * c, f).contiguous()
    y = torch.empty(CONV_N * hw * hw, f, device="cuda").half()
    name = f"autotune conv2d {hw}x{hw} C{c}->{f} 3x3"
    with fresh_disk_cache():
        workers.close_all()
        torch.cuda.synchronize()
        t = time.perf_counter()
        k = tilec.compile(str(ROOT / "examples/conv2d.tile"))
        k(x, wt, y)
        torch.cuda.synchronize()
        cold = time.perf_counter() - t
        want = F.conv2d(x.permute(0, 3, 1, 2), weight.contiguous(memory_format=torch.channels_last), padding=1)
        err = rel_err(y, want.permute(0, 2, 3, 1).reshape(-1, f))
        assert err < 5e-3, f"{name}: relative error {err}"
        rows.append((f"{name} cold (compile + timing)", "-", cold, 0, "s", None,
                     f"{len(k._candidates)} candidates (the file): {chosen(k)}"))
        _CACHE.clear()
        autotune._CHOICES.clear()
        t = time.perf_counter()
        k = tilec.compile(str(ROOT / "examples/conv2d.tile"))
        k(x, wt, y)
        warm = time.perf_counter() - t
        rows.append((f"{name} warm from disk (+1 call)", "-", warm * 1e3, 0, "ms", None, chosen(k)))


# The conv2d layers, N = CONV_N: (H = W, C, F, kernel size, stride). The five ResNet 3x3
# layers (pad 1), then ResNet-50's 1x1 layers (pad 0). conv2d.tile as shipped
# picks its own tiles; the consts passed are the problem's shape only.
CONV_3X3 = ((56, 64, 64, 3, 1), (28, 128, 128, 3, 1), (14, 256, 256, 3, 1), (7, 512, 512, 3, 1), (56, 128, 128, 3, 2))
CONV_1X1 = ((56, 64, 256, 1, 1), (28, 512, 128, 1, 1), (14, 1024, 256, 1, 1), (7, 2048, 512, 1, 1))
CONV_N = 128


def conv_name(hw, c, f, ks, s) -> str:
    return f"conv2d {hw}x{hw} C{c}->{f} {ks}x{ks} s{s}"


CONV_GEOMEAN = "conv2d geomean of the five 3x3 layers"


def bench_gemm_f8(rows):
    """e4m3 gemm (examples/gemm_f8.tile as shipped, autotuned on the first call of
    each shape) against torch._scaled_mm (cuBLASLt fp8)
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
                     "TFLOP", ratio, chosen(k)))


def bench_gemm_tf32(rows):
    """f32 gemm on tensor cores in tf32 (examples/gemm_tf32.tile as shipped, autotuned
    on the first call of each shape) against torch.matmul of the same [M, K] x [N, K]^T
    f32 operands with torch.backends.cuda.matmul.allow_tf32 (cuBLAS's tf32 kernels)."""
    import torch
    k = tilec.compile(str(ROOT / "examples/gemm_tf32.tile"))
    allowed = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        for n in (4096, 8192):
            a = torch.randn(n, n, device="cuda")
            bt = torch.randn(n, n, device="cuda")
            c = torch.empty(n, n, device="cuda")
            k(a, bt, c)
            want = a.double() @ bt.double().t()
            err = ((c.double() - want).norm() / want.norm()).item()
            assert err < 2e-3, f"gemm_tf32 {n}: relative error {err}"
            out = torch.empty_like(c)
            t_tilec, t_torch, ratio = compare(lambda: k(a, bt, c), lambda: torch.matmul(a, bt.t(), out=out))
            flops = 2 * n ** 3
            rows.append((f"gemm_tf32 {n}^3", "torch.matmul tf32", flops / t_tilec / 1e12, flops / t_torch / 1e12,
                         "TFLOP", ratio, chosen(k)))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed


def bench_gemm_i8(rows):
    """i8 gemm summed in i32 (examples/gemm_i8.tile as shipped, autotuned on the first
    call of each shape) against torch._int_mm (cuBLASLt's int8 kernels) of the same
    [M, K] x [N, K]^T operands, i32 outputs."""
    import torch
    k = tilec.compile(str(ROOT / "examples/gemm_i8.tile"))
    for n in (4096, 8192):
        a = torch.randint(-128, 128, (n, n), device="cuda", dtype=torch.int8)
        bt = torch.randint(-128, 128, (n, n), device="cuda", dtype=torch.int8)
        c = torch.empty(n, n, device="cuda", dtype=torch.int32)
        k(a, bt, c)
        want = torch._int_mm(a, bt.t())
        assert torch.equal(c, want), f"gemm_i8 {n}: {(c != want).sum().item()} elements differ from torch._int_mm"
        t_tilec, t_torch, ratio = compare(lambda: k(a, bt, c), lambda: torch._int_mm(a, bt.t()))
        ops = 2 * n ** 3
        rows.append((f"gemm_i8 {n}^3", "torch._int_mm", ops / t_tilec / 1e12, ops / t_torch / 1e12, "TOPS", ratio,
                     chosen(k)))


def bench_gemm_f8_blockscaled(rows):
    """Block-scaled e4m3 gemm (examples/gemm_f8_blockscaled.tile as shipped, autotuned
    on the first call of each shape): scales per row of A and of B for each 128-deep K
    block, against torch._scaled_mm with the same blockwise scales (cuBLASLt's 1x128
    recipe on both operands, f16 output); both keep the sums in f32 between K blocks."""
    import torch
    k = tilec.compile(str(ROOT / "examples/gemm_f8_blockscaled.tile"))
    for m, n, kdim in ((4096, 4096, 4096), (8192, 8192, 8192), (4096, 7168, 2048)):
        kb = -(-kdim // 128)
        a = (torch.randn(m, kdim, device="cuda") * 2).to(torch.float8_e4m3fn)
        bt = (torch.randn(n, kdim, device="cuda") * 2).to(torch.float8_e4m3fn)
        sa = torch.rand(kb, m, device="cuda") + 0.5
        sb = torch.rand(kb, n, device="cuda") + 0.5
        c = torch.empty(m, n, device="cuda", dtype=torch.float16)
        k(a, bt, sa, sb, c)
        peer = lambda: torch._scaled_mm(a, bt.t(), sa.t(), sb, out_dtype=torch.float16)  # noqa: E731
        want = peer().float()
        err = ((c.float() - want).norm() / want.norm()).item()
        assert err < 2e-3, f"gemm_f8_blockscaled {m}x{n}x{kdim}: relative error {err}"
        t_tilec, t_torch, ratio = compare(lambda: k(a, bt, sa, sb, c), peer)
        flops = 2 * m * n * kdim
        rows.append((f"gemm_f8 blockscaled {m}x{n}x{kdim}", "torch._scaled_mm", flops / t_tilec / 1e12,
                     flops / t_torch / 1e12, "TFLOP", ratio, chosen(k)))


def bench_conv2d(rows):
    """conv2d.tile as shipped (its own tiles, autotuned where the file says so),
    f16 NHWC, N = CONV_N, against F.conv2d on channels-last tensors (cuDNN, with
    cudnn.benchmark): CONV_3X3 and their geomean, then CONV_1X1. A layer that
    fails gets a FAILED row; the others still run."""
    import math

    import torch
    torch.backends.cudnn.benchmark = True      # the peer at its best: cuDNN times its algorithms first
    ratios = [attempt(rows, conv_name(*layer), _conv_layer, rows, *layer) for layer in CONV_3X3]
    if None not in ratios:
        rows.append((CONV_GEOMEAN, "F.conv2d cuDNN", 0, 0, "", math.prod(ratios) ** (1 / len(ratios))))
    for layer in CONV_1X1:
        attempt(rows, conv_name(*layer), _conv_layer, rows, *layer)


def _conv_layer(rows, hw, c, f, ks, s):
    """One conv2d layer next to cuDNN; appends its row, returns its ratio."""
    import torch
    import torch.nn.functional as F
    name, p = conv_name(hw, c, f, ks, s), ks // 2
    k = shipped(str(ROOT / "examples/conv2d.tile"), **(dict(S=s) if ks == 3 else dict(KH=ks, KW=ks, S=s, P=p)))
    x = torch.randn(CONV_N, hw, hw, c, device="cuda").half()
    weight = torch.randn(f, c, ks, ks, device="cuda").half() / (ks * ks * c) ** 0.5
    wt = weight.permute(2, 3, 1, 0).reshape(ks * ks * c, f).contiguous()     # [KH*KW*C, F], (kh, kw, c) rows
    o = (hw + 2 * p - ks) // s + 1
    y = torch.empty(CONV_N * o * o, f, device="cuda").half()
    xn = x.permute(0, 3, 1, 2)                       # NCHW view of channels-last memory
    wn = weight.contiguous(memory_format=torch.channels_last)
    k(x, wt, y)                                      # tunes on the first call with this shape, if tuned
    want = F.conv2d(xn, wn, stride=s, padding=p).permute(0, 2, 3, 1).reshape(-1, f)
    err = rel_err(y, want)
    assert err < 5e-3, f"{name}: relative error {err}"
    cfg = chosen(k)
    flops = 2 * CONV_N * o * o * f * ks * ks * c
    t_tilec, t_torch, ratio = compare(lambda: k(x, wt, y), lambda: F.conv2d(xn, wn, stride=s, padding=p))
    rows.append((name, "F.conv2d cuDNN", flops / t_tilec / 1e12, flops / t_torch / 1e12, "TFLOP", ratio, cfg))
    return ratio


PATCH_LAYERS = ((56, 8), (112, 8), (56, 16), (56, 24), (56, 32))   # (H = W, C); N = CONV_N, 64 filters, 3x3


def bench_conv2d_patch(rows):
    """examples/conv2d_patch.tile (one patch a tile of 16 x 8 output pixels, C fixed
    per layer) and examples/conv2d_stem.tile (the 7x7 stride-2 first layer over 8
    channels), each as shipped (tuned) and at fixed ROWS on a grid and persistent,
    against F.conv2d on channels-last tensors (cuDNN, cudnn.benchmark), N = CONV_N,
    64 filters; each output checked against cuDNN's."""
    import torch
    torch.backends.cudnn.benchmark = True
    for hw, c in PATCH_LAYERS:
        for extra in ({}, {"ROWS": 4, "PERSISTENT": 0}, {"ROWS": 4, "PERSISTENT": 1}):
            name = f"conv2d_patch {hw}x{hw} C{c}->64 3x3" + "".join(f" {n}={v}" for n, v in extra.items())
            attempt(rows, name, _patch_layer, rows, name, "conv2d_patch", hw, c, 3, 1, dict(C=c, **extra))
    for extra in ({}, {"ROWS": 7, "PERSISTENT": 0}, {"ROWS": 7, "PERSISTENT": 1}):
        name = "conv2d_stem 224x224 C8->64 7x7 s2" + "".join(f" {n}={v}" for n, v in extra.items())
        attempt(rows, name, _patch_layer, rows, name, "conv2d_stem", 224, 8, 7, 2, extra)


def _patch_layer(rows, name, example, hw, c, ks, s, consts):
    """examples/<example>.tile with `consts` on one KS x KS, stride-S layer (pad KS / 2)
    next to cuDNN: conv2d.tile's weights [KS * KS * C, 64], rows (kh, kw, c)."""
    import torch
    import torch.nn.functional as F
    p = ks // 2
    o = (hw + 2 * p - ks) // s + 1
    x = torch.randn(CONV_N, hw, hw, c, device="cuda").half()
    weight = torch.randn(64, c, ks, ks, device="cuda").half() / (ks * ks * c) ** 0.5
    wt = weight.permute(2, 3, 1, 0).reshape(ks * ks * c, 64).contiguous()
    y = torch.empty(CONV_N, o, o, 64, device="cuda").half()
    xn, wn = x.permute(0, 3, 1, 2), weight.contiguous(memory_format=torch.channels_last)
    peer = lambda: F.conv2d(xn, wn, stride=s, padding=p)        # noqa: E731
    k = shipped(str(ROOT / f"examples/{example}.tile"), **consts)
    k(x, wt, y)
    err = rel_err(y, peer().permute(0, 2, 3, 1))
    assert err < 5e-3, f"{name}: relative error {err}"
    flops = 2 * CONV_N * o * o * 64 * ks * ks * c
    t_tilec, t_torch, ratio = compare(lambda: k(x, wt, y), peer)
    rows.append((name, "F.conv2d cuDNN", flops / t_tilec / 1e12, flops / t_torch / 1e12, "TFLOP", ratio, chosen(k)))


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
        rows.append((f"host per call: {name}", "plain k(a, b)", us, us_tilec, "us", us_tilec / us,
                     f"{us - us_tilec:+.2f} us"))
    # a raw cuLaunchKernel of the same cubin with the same (already encoded) parameters
    from cuda.bindings import driver as cu
    from tilec.runtime import host
    prepared = k._prepared[host.torch_call_key((a, b))]     # this call's launch (not an older one's)
    fn, ptrs = k._loaded[prepared.device].function, prepared.keep[0]
    stream = torch.cuda.current_stream().cuda_stream
    us_raw = host_time_per_call(lambda: cu.cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 32768, stream,
                                                          ctypes.addressof(ptrs), 0))
    rows.append(("host time per call: raw cuLaunchKernel", "cuda.bindings", us_tilec, us_raw, "us", us_raw / us_tilec))
    # gemm.tile at 256^3: the tuned kernel (its key looked up per call) and a stream-K launch
    # (its workspace looked up per call) against the plain kernel of the same consts
    x = torch.randn(256, 256, device="cuda").half()
    y, z = torch.randn_like(x), torch.empty_like(x)
    tuned = tilec.compile(str(GEMM))
    tuned(x, y, z)
    plain = tilec.compile(str(GEMM), tune=False, **tuned.best_config)
    us_plain = host_time_per_call(lambda: plain(x, y, z))
    us_tuned = host_time_per_call(lambda: tuned(x, y, z))
    rows.append(("host per call: gemm.tile tuned, 256^3", "its pick, untuned", us_tuned, us_plain, "us",
                 us_plain / us_tuned, f"{us_tuned - us_plain:+.2f} us"))
    pe = dict(BM=128, BN=128, STAGES=3, PRODUCER=1, PERSISTENT=1)
    persistent = tilec.compile(str(GEMM), tune=False, **pe)
    stream_k = tilec.compile(str(GEMM), tune=False, STREAM_K=1, **pe)
    us_pe = host_time_per_call(lambda: persistent(x, y, z))
    us_sk = host_time_per_call(lambda: stream_k(x, y, z))
    rows.append(("host per call: gemm stream-K, 256^3", "persistent", us_sk, us_pe, "us", us_pe / us_sk,
                 f"{us_sk - us_pe:+.2f} us"))
    _export_host(rows)
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


def _export_host(rows):
    """The exported C++ launcher (tilec export, benchmarks/export_host.cc) against
    cuMemcpyDtoDAsync of the same bytes from the same C++ program: host time per call.
    Needs g++ and cuda.h (tests/host_toolchain.py finds them); skipped without."""
    import subprocess
    sys.path.insert(0, str(ROOT / "tests"))
    from host_toolchain import CUDA_INCLUDE, CXX, libcuda_link_args
    from tilec.codegen import export
    if CXX is None or CUDA_INCLUDE is None:
        print("host: no g++ or cuda.h, so no exported-launcher row", file=sys.stderr)
        return
    with tempfile.TemporaryDirectory() as work:
        export.export(str(ROOT / "examples/copy2d.tile"), work)
        for label, flags in (("", []), (", -DTILEC_UNCHECKED_POINTERS", ["-DTILEC_UNCHECKED_POINTERS"])):
            exe = Path(work) / "export_host"
            subprocess.run([CXX, "-std=c++17", "-O2", *flags, f"-I{work}", f"-I{CUDA_INCLUDE}",
                            str(ROOT / "benchmarks/export_host.cc"), str(Path(work) / "copy2d.cc"),
                            *libcuda_link_args(), "-o", str(exe)], check=True, capture_output=True, timeout=600)
            out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=300).stdout
            rounds = [tuple(map(float, line.split())) for line in out.splitlines()]
            us_export = statistics.median(t for t, _ in rounds)
            us_memcpy = statistics.median(m for _, m in rounds)
            rows.append((f"host per call: exported C++ launcher{label}, copy2d 64x128", "cuMemcpyDtoDAsync",
                         us_export, us_memcpy, "us", us_memcpy / us_export,
                         " / ".join(f"{t:.2f}" for t, _ in rounds)))


def bench_compile(rows):
    """Cold compiles (a fresh disk cache: lowering + NVRTC) and the warm start of
    the same kernel from the disk cache (no NVRTC), in this process."""
    with fresh_disk_cache():
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


BENCHES = (bench_compile, bench_copy, bench_copy_prehopper, bench_ragged, bench_scale, bench_rowsum, bench_softmax,
           bench_attention, bench_im2col,
           bench_gemm, bench_gemm_small, bench_gemm_decode, bench_persistent, bench_autotune, bench_gemm_f8,
           bench_gemm_tf32, bench_gemm_i8, bench_gemm_f8_blockscaled, bench_conv2d, bench_conv2d_patch,
           bench_host)


def merge(runs) -> dict:
    """The rows of every run, matched by (name, peer), in first-seen order:
    {(name, peer): one summary dict}. tilec, peer: the medians over the runs;
    ratio: the median over the runs of the per-run (median) ratios, lo-hi their
    range (of the tilec column for rows without a ratio); rounds: the last run's
    Ratio (its rounds' range); n: in how many runs the row appeared."""
    seen = {}
    for rows in runs:
        for row in rows:
            row = tuple(row) + ("",) * (7 - len(row))
            seen.setdefault(row[:2], []).append(row)
    out = {}
    for key, rs in seen.items():
        ratios = [r[5] for r in rs if r[5] is not None]
        spread = ratios or [r[2] for r in rs]
        configs = list(dict.fromkeys(r[6] for r in rs if r[6]))
        out[key] = dict(name=key[0], peer=key[1], mine=statistics.median(r[2] for r in rs),
                        theirs=statistics.median(r[3] for r in rs), unit=rs[-1][4],
                        ratio=statistics.median(ratios) if ratios else None, lo=min(spread), hi=max(spread),
                        rounds=next((r[5] for r in reversed(rs) if isinstance(r[5], Ratio)), None),
                        config=" | ".join(configs), n=len(rs))
    return out


def print_table(merged, nruns):
    print(f"\npeer/tilec: peer time / tilec time (> 1: tilec faster), the median over {nruns} run(s) of each "
          "run's median over its rounds;\nruns: lowest-highest of those per-run medians (rows without a ratio: of "
          "the tilec column); rounds: lowest-highest\nround ratio of the last run; tilec, peer: medians over the "
          "runs; config: the consts tilec ran with (a tuned kernel's choice)\n")
    print(f"{'benchmark':50s} {'peer':16s} {'tilec':>10s} {'peer':>10s} {'unit':5s} {'peer/tilec':>10s} "
          f"{'runs':>11s} {'rounds':>11s}  config")
    for m in merged.values():
        ratio = f"{m['ratio']:10.3f}" if m["ratio"] is not None else f"{'-':>10s}"
        fmt = "{:.3f}" if m["ratio"] is not None else "{:.2f}"
        runs = f"{fmt.format(m['lo'])}-{fmt.format(m['hi'])}" if m["n"] > 1 else "-"
        rounds = f"{m['rounds'].lo:.3f}-{m['rounds'].hi:.3f}" if m["rounds"] is not None else "-"
        config = m["config"] + (f" [in {m['n']} of {nruns} runs]" if m["n"] < nruns else "")
        print(f"{m['name']:50s} {m['peer']:16s} {m['mine']:10.2f} {m['theirs']:10.2f} {m['unit']:5s} {ratio} "
              f"{runs:>11s} {rounds:>11s}  {config}")


def targets(merged, selected) -> list:
    """Issue 13's targets for the selected benchmarks: (what, bound, summary or
    None, note)."""
    out = []
    if "gemm" in selected:
        for dt in GEMM_DTYPES:
            for n in GEMM_SIZES:
                out.append((f"gemm {dt} {n}^3 vs cuBLAS", 1.0, merged.get((f"gemm {dt} {n}^3", "torch.matmul")), ""))
                out.append((f"gemm {dt} {n}^3 vs Triton", 1.1, merged.get((f"gemm {dt} {n}^3", "triton autotuned")),
                            ""))
            m, n, k = GEMM_RAGGED
            out.append((f"gemm {dt} {m}x{n}x{k} vs cuBLAS", 0.95,
                        merged.get((f"gemm {dt} {m}x{n}x{k} (B, C views)", "torch.matmul")), ""))
    if "conv2d" in selected:
        out.append(("conv2d 3x3 geomean vs cuDNN", 1.0, merged.get((CONV_GEOMEAN, "F.conv2d cuDNN")), ""))
        layers = [m for m in (merged.get((conv_name(*layer), "F.conv2d cuDNN")) for layer in CONV_3X3)
                  if m is not None and m["ratio"] is not None]
        worst = min(layers, key=lambda m: m["ratio"], default=None)
        note = "" if worst is None else worst["name"][len("conv2d "):]
        if len(layers) < len(CONV_3X3):
            worst, note = None, f"only {len(layers)} of {len(CONV_3X3)} layers measured"
        out.append(("conv2d 3x3 lowest layer vs cuDNN", 0.9, worst, note))
        for layer in CONV_1X1:
            name = conv_name(*layer)
            out.append((f"{name} vs cuDNN", 0.9, merged.get((name, "F.conv2d cuDNN")), ""))
    return out


def print_targets(merged, selected, nruns):
    lines = targets(merged, selected)
    if not lines:
        return
    print(f"\ntargets (issue 13): the median over {nruns} run(s) of the per-run median ratio and the runs' range "
          "(one run: its rounds' range); PASS when the median meets the bound")
    passed = 0
    for what, bound, m, note in lines:
        if m is None or m["ratio"] is None:
            print(f"  {what:42s} >= {bound:.2f}  {'not measured':>28s}  MISS  {note}")
            continue
        ok = m["ratio"] >= bound
        passed += ok
        if ok and m["lo"] < bound:
            note = (note + "; " if note else "") + "lowest run below"
        spread = f"runs {m['lo']:.3f}-{m['hi']:.3f}" if m["n"] > 1 else \
            f"rounds {m['rounds'].lo:.3f}-{m['rounds'].hi:.3f}" if m["rounds"] is not None else "one run"
        ratio = f"{m['ratio']:6.3f}"
        if (float(ratio) >= bound) != ok:       # 0.9996 would print as 1.000 beside MISS: one more digit
            ratio = f"{m['ratio']:6.4f}"
        print(f"  {what:42s} >= {bound:.2f}  {ratio} ({spread})  {'PASS' if ok else 'MISS'}  {note}")
    print(f"targets: {passed} of {len(lines)} PASS")


def main():
    import argparse
    names = [b.__name__[len("bench_"):] for b in BENCHES]
    parser = argparse.ArgumentParser(description="tilec next to its peers; prints a table of ratios.")
    parser.add_argument("benchmarks", nargs="*", help=f"which to run (default: all): {' '.join(names)}")
    parser.add_argument("--runs", type=int, default=1,
                        help="run the selected benchmarks this many times in one process; the table gives the "
                             "median over runs and their range (default 1)")
    args = parser.parse_args()
    unknown = set(args.benchmarks) - set(names)
    if unknown:
        sys.exit(f"unknown benchmark {sorted(unknown)}; choose from {' '.join(names)}")
    if args.runs < 1:
        sys.exit("--runs takes a positive number")
    selected = [n for n in names if not args.benchmarks or n in args.benchmarks]
    runs, start = [], time.perf_counter()
    for i in range(args.runs):
        rows = []
        for b in BENCHES:
            if b.__name__[len("bench_"):] not in selected:
                continue
            try:
                b(rows)
            except Exception as e:  # keep the table: one failing line must not hide the others
                rows.append((b.__name__, f"FAILED: {e}", 0, 0, "", None))
        runs.append(rows)
        print(f"run {i + 1} of {args.runs} done, {time.perf_counter() - start:.0f} s since the start",
              file=sys.stderr, flush=True)
    merged = merge(runs)
    print_table(merged, args.runs)
    print_targets(merged, selected, args.runs)


if __name__ == "__main__":
    main()
