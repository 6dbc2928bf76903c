"""GPU: the CPU interpreter and the CUDA kernel agree bit for bit on the same
inputs, outputs poisoned alike: guarded views (tests/guard.py) on the GPU and on
the CPU, whose padding neither may write (marked gpu). Data movement, integer math and
float math, fused multiply-adds included, are exact; gemm sums
(wgmma's order of accumulation) are compared with a tolerance."""
import math

import pytest

import tilec
from guard import guarded
from test_interpret import (ELSIZE, EXAMPLES, LOOP_IF, ROOT, SHIFT, copy_shape, copy_source, im2col_cases,
                            im2col_source, SPATIAL)

try:                                        # bounded: every case is small; with pytest-timeout, hard-bounded
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
except ImportError:
    pytestmark = pytest.mark.gpu

TORCH_DT = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "i8": "int8", "i32": "int32"}


def tensor(shape, dt, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    if dt in ("i8", "i32"):
        return torch.randint(-100, 100, shape, generator=g).to(getattr(torch, TORCH_DT[dt]))
    return torch.randn(*shape, generator=g).to(getattr(torch, TORCH_DT[dt]))


def run_both(src, inputs, outputs, scalars=(), fallback_variant=False, **consts):
    """`inputs`: CPU torch tensors; `outputs`: (shape, torch dtype), guarded views
    on either side. Checks that neither run wrote around its outputs and returns
    [(gpu result, interpreter result)] for every output, both on the CPU."""
    import torch
    gpu = tilec.compile(src, tune=False, **consts)      # a tune statement's declared consts, as the interpreter
    cpu = tilec.compile(src, backend="interpret", **consts)
    if fallback_variant:
        gpu, cpu = gpu.fallback, cpu.fallback
    g_out = [guarded(s, d, device="cuda") for s, d in outputs]
    c_out = [guarded(s, d, device="cpu") for s, d in outputs]
    gpu(*[x.cuda() for x in inputs], *[g.view for g in g_out], *scalars)
    torch.cuda.synchronize()
    cpu(*[x.clone() for x in inputs], *[c.view for c in c_out], *scalars)
    for out in g_out + c_out:
        out.check()
    return [(g.view.cpu(), c.view) for g, c in zip(g_out, c_out)]


def assert_same_bits(pairs):
    import torch
    for g, c in pairs:
        assert g.shape == c.shape
        gb, cb = g.contiguous().view(torch.uint8), c.contiguous().view(torch.uint8)
        if not torch.equal(gb, cb):
            bad = (g.contiguous().view(-1).view(torch.uint8) != c.contiguous().view(-1).view(torch.uint8))
            raise AssertionError(f"{int(bad.sum())} bytes differ between the GPU and the interpreter")


# ---------------------------------------------------------------- examples

@pytest.mark.parametrize("shape", [(1, 4), (777, 1000), (64, 128)])
def test_copy2d_example(shape):
    a = tensor(shape, "f32", 1)
    assert_same_bits(run_both(str(EXAMPLES / "copy2d.tile"), [a], [(shape, a.dtype)]))


@pytest.mark.parametrize("alpha", [0.75, 1 / 3])
def test_scale_example(alpha):
    """s * alpha + 1.0 is one fused multiply-add on the GPU; the interpreter rounds once too."""
    x = tensor((333, 1000), "f32", 2)
    assert_same_bits(run_both(str(EXAMPLES / "scale.tile"), [x], [(x.shape, x.dtype)], scalars=(alpha,)))


FUSED_WHERE_WRITTEN = """
kernel fused(X: f32[M, N], Y: f32[M, N], alpha: f32, beta: f32) {
    grid (bx, by) = (cdiv(N, 128), cdiv(M, 4));
    threads 128;
    shared x: f32[4, 128];
    local t: f32[4, 128];
    local r: f32[4, 128];
    copy(X[by * 4, bx * 128], x);
    parallel (i, j) in (4, 128) {
        t[i, j] = x[i, j] * x[i, 127 - j];
        r[i, j] = select(alpha < 0.0, x[i, 127 - j] * x[i, 127 - j], alpha) - (x[i, j] + x[i, j]) * beta;
        r[i, j] = r[i, j] + t[i, j];
    }
    copy(r, Y[by * 4, bx * 128]);
}
"""


@pytest.mark.parametrize("alpha", [-1.0, 0.5])
def test_fused_only_where_the_source_says(alpha):
    """A random program (seed 20270103, session 30, on the H200) differed from the
    interpreter in one element: NVRTC's own contraction split the select and
    fused its arm's product (x * x) where the model fused the other one. Now the
    kernel spells out its one fused multiply-add per `a * b ± c` and NVRTC
    (--fmad=false) fuses nothing else: not the select's arm, not t's product
    into the next statement's sum. Both choices cancel in `x^2 - 2x * beta`,
    so a differently placed rounding shows."""
    x = tensor((333, 1000), "f32", 8)
    assert_same_bits(run_both(FUSED_WHERE_WRITTEN, [x], [(x.shape, x.dtype)], scalars=(alpha, 0.5)))


@pytest.mark.parametrize("shape", [(2, 14, 14, 64), (3, 5, 7, 128)])
def test_im2col_example(shape):
    x = tensor(shape, "f16", 3)
    rows = shape[0] * shape[1] * shape[2]
    assert_same_bits(run_both(str(EXAMPLES / "im2col.tile"), [x], [((rows, 9 * shape[3]), x.dtype)]))


@pytest.mark.parametrize("name", ["gemm", "conv2d"])
def test_gemm_examples_agree_within_accumulation_order(name):
    import torch
    if name == "gemm":
        a, b = tensor((200, 328), "f16", 4), tensor((328, 136), "f16", 5)
        pairs = run_both(str(EXAMPLES / "gemm.tile"), [a, b], [((200, 136), a.dtype)])
    else:
        x, wt = tensor((2, 9, 7, 64), "f16", 6), (tensor((576, 128), "f32", 7) / 24).half()
        pairs = run_both(str(EXAMPLES / "conv2d.tile"), [x, wt], [((126, 128), x.dtype)])
    for g, c in pairs:
        assert torch.isfinite(g.float()).all()
        torch.testing.assert_close(g.float(), c.float(), rtol=2e-3, atol=2e-2)


def test_a_tile_threads_wrote_before_a_loop_that_only_reads_it():
    """tests/filecheck/barrier_before_loop.tile: the block barrier and proxy fence that
    make the threads' writes of w visible to the gemm come once, before the loop (200
    rows: two blocks of two trips, the last one ragged)."""
    import torch
    x, w = tensor((200, 64), "f16", 13), tensor((64, 64), "f16", 14)
    src = str(ROOT / "tests" / "filecheck" / "barrier_before_loop.tile")
    (g, c), = run_both(src, [x, w], [((200, 64), x.dtype)])
    want = (x.float() @ (w.float() * 2)).half()
    torch.testing.assert_close(g.float(), want.float(), rtol=2e-3, atol=2e-2)
    torch.testing.assert_close(c.float(), want.float(), rtol=2e-3, atol=2e-2)


# ---------------------------------------------------------------- a sample of the copy and im2col matrices

COPY_SAMPLE = [(1, "f32"), (1, "i8"), (2, "bf16"), (2, "f64"), (3, "f16"), (3, "i32"), (4, "i8"), (4, "f32"),
               (5, "bf16"), (5, "f64")]


@pytest.mark.parametrize("rank, dt", COPY_SAMPLE)
def test_copy_of_rank_and_dtype(rank, dt):
    a = tensor(copy_shape(rank, dt), dt, rank)
    assert_same_bits(run_both(copy_source(rank, dt), [a], [(a.shape, a.dtype)]))
    assert_same_bits(run_both(copy_source(rank, dt), [a], [(a.shape, a.dtype)], fallback_variant=True))


@pytest.mark.parametrize("dt", ["f32", "i8"])
@pytest.mark.parametrize("shift", [(-5, -2, 0, 0), (0, 0, 9, 6), (-17, -8, 4, 2)], ids=lambda v: "_".join(map(str, v)))
def test_tma_clipping(dt, shift):
    ly, lxu, sy, sxu = shift
    per16 = 16 // ELSIZE[dt]
    src = SHIFT.format(dt=dt, bn=8 * per16, ly=ly, lx=lxu * per16, sy=sy, sx=sxu * per16)
    a = tensor((37, 40 * per16 + per16), dt, 8)
    assert_same_bits(run_both(src, [a], [(a.shape, a.dtype)]))


@pytest.mark.parametrize("case", im2col_cases()[::3], ids=lambda c: "r{}-{}-n{}-s{}-c{}-k{}-st{}-p{}-d{}".format(
    c[0] + 2, *c[1:]))
def test_im2col_matrix(case):
    spatial, dt, n, size, c, k, s, p, d = case
    sizes = (size,) * spatial if isinstance(size, int) else size
    outs = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i in sizes]
    rows = n * math.prod(max(0, o) for o in outs)
    consts = dict(S=s, P=p, DIL=d, BK=min(c, 64), **{f"K{dd}": k for dd in SPATIAL[spatial]})
    x = tensor((n, *sizes, c), dt, 9)
    out = [((rows, k ** spatial * c), x.dtype)]
    assert_same_bits(run_both(im2col_source(spatial, dt), [x], out, **consts))


# ---------------------------------------------------------------- element math

def test_loop_if_kernel():
    x = tensor((100, 136), "f32", 10)
    assert_same_bits(run_both(LOOP_IF, [x], [(x.shape, x.dtype)], scalars=(3,)))


REVERSED_INDICES = """
kernel flip(A: f32[M, N, L], Y: f32[M, N, L]) {
    grid (bx, by) = (cdiv(L, 16), cdiv(M, 4));
    threads 128;
    shared a: f32[4, 2, 16];
    shared o: f32[4, 2, 16];
    local r: f32[4, 2, 16];
    copy(A[by * 4, 0, bx * 16], a);
    copy(A[by * 4, 0, bx * 16], r);
    parallel (i, j, l) in (4, 2, 16) {
        o[i, j, l] = a[3 - i, 1 - j, 15 - l] * 2.0 + a[(i + 1) % 4, j / 2, (l + 1) % 16] - r[i, j, l];
    }
    copy(o, Y[by * 4, 0, bx * 16]);
}"""


@pytest.mark.parametrize("fallback_variant", [False, True])
def test_tile_indices_that_a_stride_multiplies(fallback_variant):
    """a[3 - i, 1 - j, 15 - l] reads element (3 - i) * 32 + (1 - j) * 16 + 15 - l: the
    CUDA printed 3 - i * 32 + ..., a wrong element of every reversed row (session 22's
    random-program hunts), while the interpreter was right."""
    x = tensor((9, 2, 40), "f32", 12)
    assert_same_bits(run_both(REVERSED_INDICES, [x], [(x.shape, x.dtype)], fallback_variant=fallback_variant))


def test_float_and_integer_element_math():
    """Contracted multiply-adds, f16 and bf16 rounding, casts, truncating / and %."""
    src = """
    kernel m(X: f32[M, N], H: f16[M, N], B: bf16[M, N], I: i32[M, N], alpha: f32) {
        grid (bx, by) = (cdiv(N, 64), cdiv(M, 16));
        threads 128;
        shared x: f32[16, 64];
        shared h: f16[16, 64];
        shared b: bf16[16, 64];
        shared q: i32[16, 64];
        copy(X[by * 16, bx * 64], x);
        parallel (i, j) in (16, 64) {
            h[i, j] = x[i, j] * alpha + x[i, j] * x[i, j];
            b[i, j] = f16(x[i, j] * 3.0) - x[i, j] / alpha;
            q[i, j] = i32(x[i, j] * 1000.0) / 7 + i32(x[i, j] * 1000.0) % 7 - min(i, j);
            if x[i, j] < 0.0 {
                x[i, j] = 2.0 - x[i, j] * alpha;
            }
        }
        copy(h, H[by * 16, bx * 64]);
        copy(b, B[by * 16, bx * 64]);
        copy(q, I[by * 16, bx * 64]);
        copy(x, X[by * 16, bx * 64]);
    }"""
    import torch
    x = tensor((40, 200), "f32", 11)
    outs = [((40, 200), torch.float16), ((40, 200), torch.bfloat16), ((40, 200), torch.int32)]
    gpu = tilec.compile(src)
    cpu = tilec.compile(src, backend="interpret")
    xg, xc = guarded(x.shape, x.dtype, device="cuda", fill=x), guarded(x.shape, x.dtype, device="cpu", fill=x)
    g_out = [guarded(s, d, device="cuda") for s, d in outs]
    c_out = [guarded(s, d, device="cpu") for s, d in outs]
    gpu(xg.view, *[g.view for g in g_out], 0.3)
    torch.cuda.synchronize()
    cpu(xc.view, *[c.view for c in c_out], 0.3)
    for out in [xg, xc, *g_out, *c_out]:
        out.check()
    assert_same_bits([(g.view.cpu(), c.view) for g, c in zip(g_out + [xg], c_out + [xc])])


def test_exp2_flushes_alike():
    """A float exp2 (ex2.approx.ftz) is 0 on the GPU exactly where the interpreter says
    (results below 2^-126), within 2 units in the last place elsewhere (the hardware's
    approximation); the f64 exp2 keeps its subnormals."""
    import numpy as np
    import torch
    from test_interpret import EXP2_ARGS, EXP2_SRC
    x = torch.from_numpy(np.tile(EXP2_ARGS, 6))           # two blocks, the second one ragged
    (yg, yc), (zg, zc) = run_both(EXP2_SRC, [x], [(x.shape, torch.float32), (x.shape, torch.float64)])
    assert torch.equal(yg == 0, yc == 0) and torch.equal(yg.isnan(), yc.isnan())
    assert int((yc == 0).sum()) == 6 * 8
    finite = (yc != 0) & yc.isfinite()
    rel = ((yg[finite].double() - yc[finite].double()) / yc[finite].double()).abs()
    assert float(rel.max()) <= 2 * 2.0 ** -23
    assert torch.equal(yg.isinf(), yc.isinf())
    assert zg[6].item() == zc[6].item() == 2.0 ** -140      # a subnormal float, kept as a double


def test_min_and_max_of_floats_alike():
    """fminf / fmaxf (one FMNMX) and fmin / fmax on the GPU give the interpreter's bits
    for every pair of NaN, infinities, signed zeros, a subnormal and ordinary values
    (test_interpret: IEEE 754-2019 minimumNumber / maximumNumber, the canonical NaN)."""
    import torch
    from test_interpret import MIN_MAX_A, MIN_MAX_B, MIN_MAX_SRC
    a, b = torch.from_numpy(MIN_MAX_A), torch.from_numpy(MIN_MAX_B)
    n = a.numel()
    assert_same_bits(run_both(MIN_MAX_SRC, [a, b], [((4, n), torch.float32), ((4, n), torch.float64)]))


def test_thread_copies_with_conversions():
    src = """
    kernel conv(X: f16[M, N], Y: f32[M, N], Z: i32[M, N]) {
        grid (bx, by) = (cdiv(N, 64), cdiv(M, 16));
        threads 128;
        shared s: f16[16, 64];
        local r: f32[16, 64];
        copy(X[by * 16, bx * 64], s);
        copy(s, r);
        parallel (i, j) in (16, 64) {
            r[i, j] = r[i, j] * 100.0 - 0.1;
        }
        copy(r, Y[by * 16, bx * 64]);
        copy(r, Z[by * 16, bx * 64]);
    }"""
    import torch
    x = tensor((30, 72), "f16", 12)
    outs = [(x.shape, torch.float32), (x.shape, torch.int32)]
    assert_same_bits(run_both(src, [x], outs))
    assert_same_bits(run_both(src, [x], outs, fallback_variant=True))



CONVERSIONS = """
kernel cv(A: f32[N], Y: i8[N], Z: i32[N], W: i8[N], D: f64[N], alpha: f32) {
    grid (bx) = (cdiv(N, 64));
    threads 64;
    shared a: f32[64];
    local r: f32[64];
    local q: i32[64];
    local d: f64[64];
    shared o: i8[64];
    copy(A[bx * 64], a);
    copy(a, r);
    parallel (i) in (64) {
        q[i] = i32(r[i] * 1000.0);
        o[i] = i32(r[i] * 1000.0);
        d[i] = sqrt(alpha) + r[i];
    }
    copy(r, Y[bx * 64]);
    copy(q, Z[bx * 64]);
    copy(q, W[bx * 64]);
    copy(d, D[bx * 64]);
}
"""


def test_conversions_to_integers_and_f64_math():
    """Float -> integer truncates and saturates (NaN -> 0), where C++ leaves it undefined
    and the GPU wrapped (random-program test, session 22): r = 300.7 into an i8 is 127,
    not 44; an i32 into an i8 wraps (1620 -> 84); sqrt of an f32 scalar in an f64
    context is the double sqrt (the GPU took CUDA's float overload)."""
    import torch
    a = torch.tensor([0.0, 1.5, -1.5, 300.7, -300.7, 1e10, -1e10, float("nan"), 0.1234, -2.5] * 10)
    outs = [((100,), torch.int8), ((100,), torch.int32), ((100,), torch.int8), ((100,), torch.float64)]
    gpu, cpu = tilec.compile(CONVERSIONS), tilec.compile(CONVERSIONS, backend="interpret")
    g_out = [guarded(s, d, device="cuda") for s, d in outs]
    c_out = [guarded(s, d, device="cpu") for s, d in outs]
    gpu(a.cuda(), *[g.view for g in g_out], 0.001)
    torch.cuda.synchronize()
    cpu(a.clone(), *[c.view for c in c_out], 0.001)
    for out in g_out + c_out:
        out.check()
    assert_same_bits([(g.view.cpu(), c.view) for g, c in zip(g_out, c_out)])
    assert c_out[0].view[:8].tolist() == [0, 1, -1, 127, -128, 127, -128, 0]
