"""No kernel writes outside the tensors it was given. A tiled TMA store writes
whole 16-byte granules of a row (tma-reference.md §6), so a store into a tensor
whose rows end mid-granule must stop its map at the last whole granule and let
threads write the rest (a StoreTail). Property tests over ranks 1-5, every
dtype, ragged extents, offset and padded views and tile shapes, for copies,
`parallel` results, im2col tiles and the gemm epilogue: every output is a view
inside a sentinel-filled buffer (tests/guard.py) whose padding must be intact.

On the CPU the interpreter runs the TMA variant's IR on numpy views as they are
(`interpret.run`: it models granule clipping and raises at the store's line if a
map would write past a row); on the GPU the same programs run through the public
launch path on torch views (TMA where the rules allow, else the thread-copy
variant)."""
import warnings
import zlib
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilec
from guard import DTYPES, guarded
from tilec.errors import DeviceError
from tilec.ir import nodes as ir
from tilec.runtime import interpret
from conftest import ROOT
from test_interpret import im2col_reference

BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
CPU = settings(max_examples=60, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
GPU = settings(max_examples=120, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def copy_source(rank, dt, t0, t1, op):
    """A kernel that loads a [t0, t1] tile (rank 1: [t1]) of A and stores it (after
    `op`, 'copy' or 'parallel') at the same place of B; the grid's z walks the dims
    outside the tile's."""
    dims = [f"D{d}" for d in range(rank)]
    tile = [t1] if rank == 1 else [t0, t1]
    grid = [f"cdiv(D{rank - 1}, {t1})"] + ([f"cdiv(D{rank - 2}, {t0})"] if rank > 1 else [])
    coords = [f"b0 * {t1}"] + ([f"b1 * {t0}"] if rank > 1 else [])
    if rank > 2:
        outer = dims[:rank - 2]
        grid.append(" * ".join(outer))
        for d in range(rank - 3, -1, -1):
            inner = " * ".join(outer[d + 1:])
            coords.append(f"b2 / ({inner})" + (f" % {outer[d]}" if d else "") if inner else f"b2 % {outer[d]}"
                          if d else "b2")
    coords = ", ".join(reversed(coords))
    shape = ", ".join(dims)
    lanes = ["i", "j"][-len(tile):]
    if op == "parallel":
        two, one = ("2.0", "1.0") if ir.DTYPES[dt].is_float else ("2", "1")
        at = ", ".join(lanes)
        body = (f"    parallel ({at}) in ({', '.join(map(str, tile))}) {{\n"
                f"        s[{at}] = s[{at}] * {two} + {one};\n    }}\n")
    else:
        body = ""
    return (f"kernel tails(A: {dt}[{shape}], B: {dt}[{shape}]) {{\n"
            f"    grid ({', '.join(f'b{i}' for i in range(len(grid)))}) = ({', '.join(grid)});\n"
            f"    threads 128;\n"
            f"    shared s: {dt}[{', '.join(map(str, tile))}];\n"
            f"    copy(A[{coords}], s);\n{body}"
            f"    copy(s, B[{coords}]);\n}}\n")


@st.composite
def copy_cases(draw, ops=("copy", "parallel")):
    rank = draw(st.integers(1, 5))
    dt = draw(st.sampled_from(sorted(DTYPES)))
    op = draw(st.sampled_from(ops)) if not dt.startswith("f8") else "copy"
    es = DTYPES[dt][0]
    per = 16 // es
    t1 = per * draw(st.integers(1, max(1, min(256, 512 // es) // per)))
    t0 = draw(st.integers(1, 16)) if rank > 1 else 1
    inner = draw(st.one_of(st.integers(1, 3 * t1), st.integers(1, 4).map(lambda g: g * per)))
    outer = [draw(st.integers(1, 3)) for _ in range(rank - 2)] + ([draw(st.integers(1, 2 * t0 + 1))] if rank > 1 else [])
    pads = [(draw(st.integers(0, 2)), draw(st.integers(1, 2))) for _ in outer] + \
        [(per * draw(st.integers(0, 2)), draw(st.integers(1, 2 * per)))]
    return rank, dt, t0, t1, op, tuple(outer) + (inner,), pads


def bits_of(a):
    return np.ascontiguousarray(a).view(BITS[a.dtype.itemsize])


def source_array(shape, dt, rng, small):
    """Random elements of `dt` (small non-negative integers when `small`, so that
    `* 2 + 1` is exact in every type)."""
    g = guarded(shape, dt, like="numpy", pad=0)
    a = g.view
    if small:
        a[...] = rng.integers(0, 50, shape).astype(np.float64).astype(a.dtype)
    else:
        bits = rng.integers(0, 256, shape + (a.dtype.itemsize,), dtype=np.uint8)
        if dt.startswith("f") or dt == "bf16":      # no NaN bit patterns (they would compare unequal as values)
            a.view(np.uint8).reshape(bits.shape)[...] = bits
            a[~np.isfinite(a.astype(np.float64))] = 0
        else:
            a.view(np.uint8).reshape(bits.shape)[...] = bits
    return a


def expected(a, op):
    if op == "parallel":
        return (a.astype(np.float64) * 2 + 1).astype(a.dtype)
    return a


def run_copy_case(case, run):
    rank, dt, t0, t1, op, shape, pads = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    a = source_array(shape, dt, rng, small=op == "parallel")
    out = guarded(shape, dt, like="numpy", pad=pads)
    src = copy_source(rank, dt, t0, t1, op)
    run(src, a, out)
    out.check()
    assert np.array_equal(bits_of(out.view), bits_of(expected(a, op))), src


# ---------------------------------------------------------------- the interpreter (CPU, CI)

def run_interpreted(src, *args):
    """The TMA variant's IR, run on numpy views as they are (strided, offset)."""
    interpret.run(tilec.compile(src, backend="interpret").kernel_ir, list(args))


@CPU
@given(copy_cases())
def test_copies_and_parallel_results_write_only_their_views(case):
    run_copy_case(case, lambda src, a, out: run_interpreted(src, a, out.view))


def test_the_interpreter_catches_a_store_map_that_ends_mid_granule():
    """A regression that encoded a store map with the tensor's own extent would
    write past every row that ends mid-granule: the interpreter says so, at the line."""
    k = tilec.compile(copy_source(2, "f32", 8, 32, "copy"), backend="interpret").kernel_ir
    bad = replace(k, tensor_maps=tuple(replace(t, inner_rounded=False) for t in k.tensor_maps))
    a = np.ones((8, 33), np.float32)
    out = guarded((8, 33), "f32", like="numpy")
    with pytest.raises(DeviceError, match=r"<string>:6:5: error: TMA store into 'B' writes columns 33 \.\. 35, "
                                          r"past its rows of 33 elements"):
        interpret.run(bad, [a, out.view])


def test_a_literal_inner_extent_of_whole_granules_keeps_the_plain_store():
    k = tilec.compile("kernel k(A: f16[M, 72], B: f16[M, 72]) {\n grid (bx) = (cdiv(M, 16));\n threads 128;\n"
                      " shared s: f16[16, 72];\n copy(A[bx * 16, 0], s);\n copy(s, B[bx * 16, 0]);\n}\n",
                      backend="interpret")
    assert "store.tail" not in k.ir("lower-copies")
    assert not any(t.inner_rounded for t in k.kernel_ir.tensor_maps)


def test_rows_shorter_than_a_granule_run_the_thread_copy_variant():
    k = tilec.compile(copy_source(1, "f32", 1, 4, "copy"), backend="interpret")
    a = np.arange(3, dtype=np.float32)
    out = guarded((3,), "f32", like="numpy")
    with pytest.warns(tilec.TmaFallbackWarning, match="argument B: its rows are 3 x 4 bytes, less than the "
                                                      "16-byte granule a TMA store writes"):
        k(a, out.view)
    out.check()
    assert np.array_equal(out.view, a)


IM2COL = """
kernel im2col_cols(X: f16[N, H, W, C], Y: f16[NP, KC]) {{
    const KH = {k}, KW = {k}, S = {s}, P = {p}, D = 1;
    const BM = {bm}, BK = {bk};
    let OH = (H + 2 * P - D * (KH - 1) - 1) / S + 1;
    let OW = (W + 2 * P - D * (KW - 1) - 1) / S + 1;
    require NP == N * OH * OW;
    grid (bx, by) = (cdiv(KC, BK), cdiv(NP, BM));
    threads 128;
    let Xc = im2col(X, kernel = (KH, KW), stride = S, pad = P, dilation = D);
    shared t: f16[BM, BK];
    copy(Xc[by * BM, bx * BK], t);
    copy(t, Y[by * BM, bx * BK]);
}}
"""


@st.composite
def im2col_cases(draw):
    k, s = draw(st.sampled_from([(1, 1), (3, 1), (3, 2)]))
    p = draw(st.integers(0, k // 2))
    bk = draw(st.sampled_from([8, 16, 32]))
    c = bk * draw(st.integers(1, 2))
    n, h, w = draw(st.integers(1, 2)), draw(st.integers(1, 9)), draw(st.integers(1, 9))
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    if oh <= 0 or ow <= 0:
        oh = ow = 0
    kc = draw(st.integers(1, k * k * c))                # the first KC columns of the matrix: any width
    bm = draw(st.sampled_from([16, 32, 64]))
    return k, s, p, bm, bk, (n, h, w, c), kc, n * oh * ow


def run_im2col_case(case, run, like):
    k, s, p, bm, bk, xshape, kc, npix = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rng.standard_normal(xshape).astype(np.float16)
    ref = im2col_reference(x, k, s, p, 1)[:, :kc]
    y = guarded((npix, kc), "f16", like=like)
    run(IM2COL.format(k=k, s=s, p=p, bm=bm, bk=bk), x, y)
    y.check()
    got = y.view if like == "numpy" else y.view.cpu().numpy()
    assert np.array_equal(got, ref)


@CPU
@given(im2col_cases())
def test_im2col_tiles_write_only_their_views(case):
    if case[-1] == 0:
        return
    run_im2col_case(case, lambda src, x, y: run_interpreted(src, x, y.view), "numpy")


@settings(CPU, max_examples=12)
@given(st.tuples(st.integers(1, 140), st.integers(1, 140), st.integers(1, 70)))
def test_the_gemm_epilogue_writes_only_its_view(mnk):
    """C = A @ B into a [M, N] view: the epilogue's TMA stores go through the
    swizzled staging tile and its store tail."""
    m, n, k = mnk
    rng = np.random.default_rng(m * 10007 + n * 101 + k)
    a = guarded((m, k), "f16", like="numpy", fill=rng.standard_normal((m, k)).astype(np.float16))
    b = guarded((k, n), "f16", like="numpy", fill=rng.standard_normal((k, n)).astype(np.float16))
    c = guarded((m, n), "f16", like="numpy")
    run_interpreted(str(ROOT / "examples" / "gemm.tile"), a.view, b.view, c.view)
    c.check()
    ref = a.view.astype(np.float32) @ b.view.astype(np.float32)
    np.testing.assert_allclose(c.view.astype(np.float32), ref, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------- the GPU

SIGNED = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def on_gpu(a, dt, pad=0, align=True):
    """numpy array `a` (bits of `dt`) as a guarded torch view on the GPU."""
    import torch
    g = guarded(a.shape, dt, like="torch", pad=pad, align=align)
    bits = torch.from_numpy(np.ascontiguousarray(a).view(SIGNED[a.dtype.itemsize]))
    g.view.view(getattr(torch, SIGNED[a.dtype.itemsize].__name__)).copy_(bits.cuda())
    return g


def gpu_bits(t):
    import torch
    return t.view(getattr(torch, SIGNED[t.element_size()].__name__)).cpu().numpy().view(BITS[t.element_size()])


def launch(src, *args):
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.TmaFallbackWarning)   # views off the 16-byte grid
        tilec.compile(src, tune=False)(*args)      # a tune statement's declared consts (test_autotune: the rest)
    torch.cuda.synchronize()


@pytest.mark.gpu
@settings(GPU)
@given(copy_cases(), st.sampled_from([True, True, True, False]))
def test_gpu_copies_and_parallel_results_write_only_their_views(case, align):
    rank, dt, t0, t1, op, shape, pads = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    a = source_array(shape, dt, rng, small=op == "parallel")
    src = copy_source(rank, dt, t0, t1, op)
    a_gpu = on_gpu(a, dt, pad=[(1, 1)] * (rank - 1) + [(0, 5)], align=align)
    out = guarded(shape, dt, like="torch", pad=pads, align=align)
    launch(src, a_gpu.view, out.view)
    out.check()
    a_gpu.check()
    assert np.array_equal(gpu_bits(out.view), bits_of(expected(a, op))), src


@pytest.mark.gpu
@settings(GPU, max_examples=60)
@given(im2col_cases())
def test_gpu_im2col_tiles_write_only_their_views(case):
    if case[-1] == 0:
        return
    run_im2col_case(case, lambda src, x, y: launch(src, on_gpu(x, "f16").view, y.view), "torch")


@pytest.mark.gpu
@settings(GPU, max_examples=40)
@given(st.tuples(st.integers(1, 600), st.integers(1, 600), st.integers(1, 300)), st.sampled_from(["f16", "bf16"]))
def test_gpu_gemm_epilogue_writes_only_its_view(mnk, dt):
    a, b, c = gpu_gemm_operands(mnk, dt)
    src = (ROOT / "examples" / "gemm.tile").read_text().replace("f16", dt)
    launch(src, a.view, b.view, c.view)
    check_gpu_gemm(a, b, c)


def gpu_gemm_operands(mnk, dt):
    """Guarded A [M, K] and B [K, N] of seeded random values and a guarded C, on the GPU."""
    import torch
    m, n, k = mnk
    gen = torch.Generator(device="cuda").manual_seed(m * 10007 + n * 101 + k)
    tdt = getattr(torch, DTYPES[dt][1])
    a = guarded((m, k), dt, like="torch")
    b = guarded((k, n), dt, like="torch")
    a.view.copy_(torch.randn(m, k, device="cuda", generator=gen).to(tdt))
    b.view.copy_(torch.randn(k, n, device="cuda", generator=gen).to(tdt))
    return a, b, guarded((m, n), dt, like="torch")


def check_gpu_gemm(a, b, c):
    import torch
    c.check()
    torch.testing.assert_close(c.view.float(), a.view.float() @ b.view.float(), rtol=2e-2, atol=5e-2)


CHUNKED = dict(BM=128, STAGES=4, PRODUCER=1, PERSISTENT=1)     # with BN: the epilogue in 64-column chunks


def chunked_gemm(dt, bn, backend="cuda"):
    """examples/gemm.tile persistent with a producer: its epilogue stages the
    accumulator in 64-column chunks through two tiles, each chunk with its own
    TMA store and store tail."""
    src = (ROOT / "examples" / "gemm.tile").read_text().replace("f16", dt)
    k = tilec.compile(src, backend=backend, BN=bn, **CHUNKED)
    assert "shared tl_acc_out1: " in k.ir("lower-copies")
    return k


@settings(CPU, max_examples=25)
@given(st.tuples(st.integers(1, 300), st.integers(1, 600), st.integers(1, 200)), st.sampled_from([128, 256]))
def test_chunked_epilogue_writes_only_its_view(mnk, bn):
    """Any M, N, K over 3 interpreted blocks: the tail (N not a multiple of 8)
    lands in any chunk of a tile, and the tiles' chunks alternate buffers."""
    m, n, kk = mnk
    rng = np.random.default_rng(m * 7 + n * 3 + kk)
    a, b, c = guarded((m, kk), "f16", like="numpy"), guarded((kk, n), "f16", like="numpy"), \
        guarded((m, n), "f16", like="numpy")
    a.view[...] = rng.standard_normal((m, kk))
    b.view[...] = rng.standard_normal((kk, n))
    interpret.run(chunked_gemm("f16", bn, backend="interpret").kernel_ir, [a.view, b.view, c.view])
    c.check()
    np.testing.assert_allclose(c.view.astype(np.float32), a.view.astype(np.float32) @ b.view.astype(np.float32),
                               rtol=2e-2, atol=5e-2)


@pytest.mark.gpu
@settings(GPU, max_examples=40)
@given(st.tuples(st.integers(1, 600), st.integers(1, 1100), st.integers(1, 300)), st.sampled_from(["f16", "bf16"]),
       st.sampled_from([128, 256]))
def test_gpu_chunked_epilogue_writes_only_its_view(mnk, dt, bn):
    import torch
    a, b, c = gpu_gemm_operands(mnk, dt)
    chunked_gemm(dt, bn)(a.view, b.view, c.view)
    torch.cuda.synchronize()
    check_gpu_gemm(a, b, c)


@pytest.mark.gpu
@settings(GPU, max_examples=20)
@given(st.integers(1, 300), st.sampled_from([64, 128]), st.integers(1, 3), st.integers(3, 12))
def test_gpu_conv2d_epilogue_writes_only_its_view(f, c, n, hw):
    """examples/conv2d.tile with F output channels of any count: Y [N * OH * OW, F]."""
    import torch
    gen = torch.Generator(device="cuda").manual_seed(f * 1000 + c + n * 7 + hw)
    x = torch.randn(n, hw, hw, c, device="cuda", generator=gen).half()
    w = torch.randn(f, c, 3, 3, device="cuda", generator=gen).half()
    wt = guarded((9 * c, f), "f16", like="torch")
    wt.view.copy_(w.permute(2, 3, 1, 0).reshape(9 * c, f))      # (kh, kw, c) rows, F columns
    y = guarded((n * hw * hw, f), "f16", like="torch")
    launch(str(ROOT / "examples" / "conv2d.tile"), x, wt.view, y.view)
    y.check()
    ref = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2).float(), w.float(), padding=1)
    torch.testing.assert_close(y.view.float(), ref.permute(0, 2, 3, 1).reshape(-1, f), rtol=2e-2, atol=1e-1)


COLS = """
kernel taps(X: f16[N, H, W, 16], Y: f16[NP, KC]) {
    const BM = 64, BK = 64;
    require NP == N * H * W;
    grid (bx, by) = (cdiv(KC, BK), cdiv(NP, BM));
    threads 128;
    let Xc = im2col(X, kernel = (3, 3), stride = 1, pad = 1, dilation = 1);
    shared t: f16[BM, BK];
    copy(Xc[by * BM, bx * BK], t);
    copy(t, Y[by * BM, bx * BK]);
}
"""


@pytest.mark.parametrize("kc", [1, 7, 64, 65, 100, 143, 144])
def test_a_tile_of_several_taps_writes_only_its_view(kc):
    """A 'cols' tile (16-channel chunks, one TMA load per tap) stored chunk by
    chunk into a Y of any width: the store tail indexes the chunks too."""
    k = tilec.compile(COLS, backend="interpret")
    assert "layout cols" in k.ir("plan-tma") and "store.tail" in k.ir("plan-tma")
    x = np.random.default_rng(kc).standard_normal((2, 5, 6, 16)).astype(np.float16)
    y = guarded((2 * 5 * 6, kc), "f16", like="numpy")
    run_interpreted(COLS, x, y.view)
    y.check()
    assert np.array_equal(y.view, im2col_reference(x, 3, 1, 1, 1)[:, :kc])


@pytest.mark.gpu
@pytest.mark.parametrize("kc", [1, 7, 65, 143, 144])
def test_gpu_a_tile_of_several_taps_writes_only_its_view(kc):
    x = np.random.default_rng(kc).standard_normal((2, 5, 6, 16)).astype(np.float16)
    y = guarded((2 * 5 * 6, kc), "f16")
    launch(COLS, on_gpu(x, "f16").view, y.view)
    y.check()
    assert np.array_equal(y.view.cpu().numpy(), im2col_reference(x, 3, 1, 1, 1)[:, :kc])


# ---------------------------------------------------------------- stores at negative coordinates

SHIFTED_2D = """
kernel shifted(A: f32[M, N], B: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 64) + 1, cdiv(M, 8) + 1);
    threads 128;
    shared s: f32[8, 64];
    copy(A[by * 8 - 3, bx * 64 - 16], s);
    copy(s, B[by * 8 - 3, bx * 64 - 16]);
}
"""
SHIFTED_1D = """
kernel shifted1(A: f16[N], B: f16[N], n: i32) {
    grid (bx) = (cdiv(N, 128) + 1);
    threads 128;
    shared s: f16[128];
    copy(A[bx * 128 + 8 * n], s);
    copy(s, B[bx * 128 + 8 * n]);
}
"""


def test_a_store_whose_coordinate_may_be_negative_is_a_thread_copy():
    """A TMA store at a negative coordinate faults on the H100 (a load there reads
    zeros): a store whose coordinates are not proven non-negative (a difference, a
    scalar parameter) is a thread copy, which drops what lies outside; its load stays
    TMA. A store at bx * 64 + 16 stays a TMA store."""
    from tilec.compiler import lower
    from tilec.errors import Source
    for text in (SHIFTED_2D, SHIFTED_1D):
        body = list(ir.walk_stmts(lower(Source("s.tile", text), {}).kernel.body))
        assert any(isinstance(s, ir.TmaLoad) for s in body) and not any(isinstance(s, ir.TmaStore) for s in body)
        assert [s.dst.name for s in body if isinstance(s, ir.ThreadCopy)] == ["B"]
    kept = SHIFTED_2D.replace("copy(s, B[by * 8 - 3, bx * 64 - 16])", "copy(s, B[by * 8 + 3, bx * 64 + 16])")
    assert any(isinstance(s, ir.TmaStore) for s in ir.walk_stmts(lower(Source("s.tile", kept), {}).kernel.body))


def test_a_scalar_grid_extent_is_not_negative():
    """gemm_persistent.tile's epilogue stores at (pid + tl_t_iter * P) / ... (t, its range's value) with P a scalar
    parameter and the grid's extent: the launch refuses a negative grid, so P is
    never negative where the kernel runs, and the store stays TMA."""
    from tilec.compiler import lower
    from tilec.errors import LaunchError
    from tilec.runtime import host
    k = lower(tilec.compiler.load_source(str(ROOT / "examples/gemm_persistent.tile")), {}).kernel
    assert any(isinstance(s, ir.TmaStore) for s in ir.walk_stmts(k.body))
    with pytest.raises(LaunchError, match=r"grid \[-3, 1, 1\] has a negative extent"):
        host.check_grid((-3, 1, 1))


def shifted_cases():
    return [(SHIFTED_2D, "f32", (37, 200), ()), (SHIFTED_2D, "f32", (8, 64), ()),
            (SHIFTED_1D, "f16", (300,), (-2,)), (SHIFTED_1D, "f16", (129,), (-1,))]


@pytest.mark.parametrize("text, dt, shape, scalars", shifted_cases())
def test_shifted_stores_write_the_tensor_and_nothing_around_it(text, dt, shape, scalars):
    rng = np.random.default_rng(7)
    a = rng.standard_normal(shape).astype(DTYPES[dt][1])
    b = guarded(shape, dt, like="numpy")
    tilec.compile(text, backend="interpret")(a, b.view, *scalars)
    assert np.array_equal(b.view, a)
    b.check()


@pytest.mark.gpu
@pytest.mark.parametrize("text, dt, shape, scalars", shifted_cases())
def test_gpu_shifted_stores_write_the_tensor_and_nothing_around_it(text, dt, shape, scalars):
    import torch
    a = torch.randn(*shape, device="cuda").to(getattr(torch, DTYPES[dt][1]))
    b = guarded(shape, dt)
    tilec.compile(text)(a, b.view, *scalars)
    torch.cuda.synchronize()
    assert torch.equal(b.view, a)
    b.check()


# ---------------------------------------------------------------- one accumulator, two outputs

TWO_OUTPUTS = dict(plain=dict(BN=128, PRODUCER=0), producer=dict(BN=64, STAGES=4, PRODUCER=1, PERSISTENT=1),
                   chunked=dict(BN=256, STAGES=3, PRODUCER=1, PERSISTENT=1))


def two_outputs(dt, consts, backend):
    """examples/gemm.tile writing acc to C and to D: each copy gets its own staging
    tile(s) (the second was given the first's name, an IR verifier failure)."""
    src = (ROOT / "examples" / "gemm.tile").read_text().replace("f16", dt) \
        .replace(f"C: {dt}[M, N])", f"C: {dt}[M, N], D: {dt}[M, N])") \
        .replace("    copy(acc, C[by * BM, bx * BN]);", "    copy(acc, C[by * BM, bx * BN]);\n"
                 "    copy(acc, D[by * BM, bx * BN]);")
    return tilec.compile(src, backend=backend, tune=False, BM=128, **consts)


@pytest.mark.parametrize("variant", TWO_OUTPUTS)
def test_an_accumulator_copied_to_two_outputs_writes_both_and_only_them(variant):
    k = two_outputs("f16", TWO_OUTPUTS[variant], "interpret")
    staged = [line.split(":")[0].split()[-1] for line in k.ir("lower-copies").splitlines()
              if line.strip().startswith("shared tl_acc_out")]
    assert len(staged) == len(set(staged)) == (4 if variant == "chunked" else 2), staged
    m, n, kk = 200, 300, 70
    rng = np.random.default_rng(7)
    a, b = guarded((m, kk), "f16", like="numpy"), guarded((kk, n), "f16", like="numpy")
    c, d = guarded((m, n), "f16", like="numpy"), guarded((m, n), "f16", like="numpy")
    a.view[...] = rng.standard_normal((m, kk))
    b.view[...] = rng.standard_normal((kk, n))
    interpret.run(k.kernel_ir, [a.view, b.view, c.view, d.view])
    c.check()
    d.check()
    ref = a.view.astype(np.float32) @ b.view.astype(np.float32)
    np.testing.assert_allclose(c.view.astype(np.float32), ref, rtol=2e-2, atol=5e-2)
    assert np.array_equal(c.view, d.view)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", TWO_OUTPUTS)
@pytest.mark.parametrize("mnk", [(200, 300, 70), (1000, 1030, 256)])
def test_gpu_an_accumulator_copied_to_two_outputs(variant, mnk):
    import torch
    a, b, c = gpu_gemm_operands(mnk, "f16")
    d = guarded(c.view.shape, "f16", like="torch")
    two_outputs("f16", TWO_OUTPUTS[variant], "cuda")(a.view, b.view, c.view, d.view)
    torch.cuda.synchronize()
    check_gpu_gemm(a, b, c)
    d.check()
    assert torch.equal(c.view, d.view)
