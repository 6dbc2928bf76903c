"""The CPU interpreter (tilec.compile(..., backend="interpret")) against independent
numpy references: exact for data movement (TMA tiled and im2col loads, clipped
stores, thread copies) and integer math, a tolerance only for float math."""
import contextlib
import itertools
import math
import random
import warnings
import zlib
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tilec
from tilec.compiler import lower
from tilec.ir import nodes as ir
from tilec.passes import PASS_NAMES
from tilec.runtime import interpret
from tilec.runtime.interpret import blocks, numbers

from guard import guarded

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def interp(src, **consts):
    return tilec.compile(src, backend="interpret", **consts)


def output(shape, dtype):
    """An output: `.view`, a numpy array inside a buffer of the sentinel (padding
    on every side; the view holds the sentinel too); `.check()` after the run
    asserts nothing outside the view was written (tests/guard.py)."""
    return guarded(shape, dtype, like="numpy")


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def rand(shape, dt, rng):
    if dt in ("i8", "i32"):
        return rng.integers(-100, 100, shape).astype({"i8": np.int8, "i32": np.int32}[dt])
    x = rng.standard_normal(shape).astype(np.float32)
    if dt == "bf16":
        return x.astype(pytest.importorskip("ml_dtypes").bfloat16)
    return x.astype({"f16": np.float16, "f32": np.float32, "f64": np.float64}[dt])


@contextlib.contextmanager
def no_fallback():
    """TMA paths must run as TMA: a fallback warning is an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        yield


# ---------------------------------------------------------------- the interface

def test_compile_returns_an_interpreted_kernel_with_the_ir():
    k = interp(EXAMPLES / "copy2d.tile")
    assert isinstance(k, interpret.InterpretedKernel)
    assert k.name == "copy2d" and k.consts == {"BM": 64, "BN": 128}
    assert k.ir().split() == list(PASS_NAMES)
    assert "tma.load.tile s <- A[by * 64, bx * 128]" in k.ir("plan-smem")
    assert "tma_load_2d(" in k.cuda_source
    assert "thread.copy A[" in k.fallback.ir("plan-smem")


def test_env_var_makes_the_interpreter_the_default(monkeypatch):
    monkeypatch.setenv("TILEC_INTERPRET", "1")
    assert isinstance(tilec.compile(str(EXAMPLES / "copy2d.tile")), interpret.InterpretedKernel)


def test_the_readme_autotune_snippet_runs_unchanged_on_the_interpreter(monkeypatch):
    """README's autotune snippet with TILEC_INTERPRET=1 (language.md §17: GPU scripts
    run unchanged): best_config is the first candidate, which is what runs, and
    tune_report() says nothing was timed."""
    monkeypatch.setenv("TILEC_INTERPRET", "1")
    monkeypatch.chdir(EXAMPLES.parent)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 64)).astype(np.float16)
    b = rng.standard_normal((64, 256)).astype(np.float16)
    c = np.zeros((128, 256), np.float16)
    k = tilec.compile("examples/gemm.tile", tune={"BN": (128, 256), "STAGES": (3, 4)}, key=("M", "N", "K"))
    k(a, b, c)
    assert k.best_config == {"BN": 128, "STAGES": 3} and k.consts["BN"] == 128 and k.consts["STAGES"] == 3
    assert k.tune_report() == (
        "autotune gemm: not tuned (the interpret backend does not time):\n"
        "  BN=128 STAGES=3: chosen untimed (backend=\"interpret\" does not time: the first candidate the "
        "compiler accepts)\n")
    np.testing.assert_allclose(c.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=2e-2,
                               atol=2e-2)


def test_interpreted_best_config_of_a_tune_statement_a_refused_candidate_and_no_tuning():
    k = interp(EXAMPLES / "gemm.tile")          # the statement's declared values run
    assert k.best_config == {n: k.consts[n] for n in ("BM", "BN", "STAGES", "PRODUCER", "PERSISTENT", "STREAM_K",
                                                       "BK")}
    assert "the tune statement's declared values" in k.tune_report()
    assert "BM" not in interp(EXAMPLES / "gemm.tile", BM=64).best_config        # a given const leaves the space
    k = tilec.compile(str(EXAMPLES / "copy2d.tile"), backend="interpret", tune={"BN": (4096, 128)})
    assert k.best_config == {"BN": 128} and k.consts["BN"] == 128
    report = k.tune_report()
    assert "BN=4096: refused: " in report and "TMA boxes are at most 256" in report and \
        report.endswith("BN=128: chosen untimed (backend=\"interpret\" does not time: the first candidate the "
                        "compiler accepts)\n")
    plain = interp(EXAMPLES / "copy2d.tile")
    assert plain.best_config == {} and plain is not k
    assert plain.tune_report() == "copy2d: not tuned (no tune= and no tune statement, or tune=False)\n"
    assert interp(EXAMPLES / "gemm.tile", tune=False).best_config == {}


def test_an_interpreted_kernel_is_no_torch_op():
    k = interp(EXAMPLES / "copy2d.tile")
    with pytest.raises(tilec.TilecError, match="kernel copy2d runs on the interpret backend .*, which has no torch "
                                               "operator: call the kernel itself"):
        k.as_torch_op()


def test_unknown_backend_is_an_error():
    with pytest.raises(tilec.TilecError, match="unknown backend 'metal'"):
        tilec.compile(str(EXAMPLES / "copy2d.tile"), backend="metal")


# ---------------------------------------------------------------- examples

def test_copy2d_example():
    k = interp(EXAMPLES / "copy2d.tile")
    rng = np.random.default_rng(0)
    for shape in [(1, 4), (1000, 1000), (777, 1000), (64, 128), (65, 132)]:
        a = rng.standard_normal(shape, dtype=np.float32)
        b = output(shape, np.float32)
        with no_fallback():
            k(a, b.view)
        assert same_bits(a, b.view), shape
        b.check()
        b2 = output(shape, np.float32)
        k.fallback(a, b2.view)
        assert same_bits(a, b2.view), shape
        b2.check()


def test_copy2d_example_falls_back_like_the_gpu():
    """Rows of 7 floats (28 bytes) break TMA's stride rule: the thread-copy variant
    runs with the GPU path's warning, or the rule is raised."""
    a = np.arange(300 * 7, dtype=np.float32).reshape(300, 7)
    b = output(a.shape, a.dtype)
    with pytest.warns(tilec.TmaFallbackWarning, match="argument A: row stride 28 bytes is not a multiple of 16"):
        interp(EXAMPLES / "copy2d.tile")(a, b.view)
    assert np.array_equal(a, b.view)
    b.check()
    k = tilec.compile(EXAMPLES / "copy2d.tile", backend="interpret", fallback=False)
    with pytest.raises(tilec.TmaRuleError, match="row stride 28 bytes"):
        k(a, b.view)


def fma_reference(x, alpha, c):
    """x * alpha + c rounded once to f32, as the contracted CUDA computes it: for
    these operands the double result is exact, so one rounding to float follows."""
    exact = x.astype(np.float64) * np.float64(np.float32(alpha)) + np.float64(c)
    return exact.astype(np.float32)


def test_scale_example():
    k = interp(EXAMPLES / "scale.tile")
    rng = np.random.default_rng(1)
    for shape in [(1, 4), (333, 1000), (64, 256)]:
        x = rng.standard_normal(shape, dtype=np.float32)
        y = output(shape, np.float32)
        with no_fallback():
            k(x, y.view, 0.75)
        np.testing.assert_allclose(y.view, x * np.float32(0.75) + np.float32(1.0), rtol=1e-6, atol=1e-6)
        # one rounding, as the fused multiply-add: within half an ulp of the exact value
        assert np.array_equal(y.view, fma_reference(x, 0.75, 1.0))
        y.check()


def im2col_reference(x, K, S, P, D):
    """The [N * prod(O), prod(K) * C] matrix by numpy slicing over taps of a padded input
    (a copy of tests/test_gpu_im2col.py's reference)."""
    n, *sp, c = x.shape
    K, S, P, D = ((v,) * len(sp) if isinstance(v, int) else v for v in (K, S, P, D))
    outs = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(sp, K, S, P, D)]
    if min(outs) <= 0:
        return np.zeros((0, math.prod(K) * c), x.dtype)
    xp = np.pad(x, [(0, 0)] + [(p, p) for p in P] + [(0, 0)])
    cols = []
    for tap in itertools.product(*[range(k) for k in K]):
        sl = tuple([slice(None)] + [slice(t * d, t * d + s * (o - 1) + 1, s) for t, d, s, o in zip(tap, D, S, outs)]
                   + [slice(None)])
        cols.append(xp[sl].reshape(n * math.prod(outs), c))
    return np.concatenate(cols, axis=1)


def test_im2col_example():
    k = interp(EXAMPLES / "im2col.tile")
    rng = np.random.default_rng(2)
    for shape in [(2, 14, 14, 64), (3, 5, 7, 128), (1, 1, 1, 64)]:
        x = rng.standard_normal(shape).astype(np.float16)
        want = im2col_reference(x, 3, 1, 1, 1)
        y = output(want.shape, np.float16)
        with no_fallback():
            k(x, y.view)
        assert same_bits(y.view, want), shape
        y.check()
        y2 = output(want.shape, np.float16)
        k.fallback(x, y2.view)
        assert same_bits(y2.view, want), shape
        y2.check()


@pytest.mark.parametrize("name", ["gemm", "gemm_128x256"])
def test_gemm_examples(name):
    """The pipelined wgmma gemms (TMA ring of swizzled tiles): f32 sums, f16 result."""
    path = EXAMPLES / f"{name}.tile"
    if not path.exists():
        pytest.skip(f"{name}.tile is not in this checkout")
    k = interp(path)
    rng = np.random.default_rng(3)
    for m, n, kk in [(256, 256, 256), (200, 136, 328), (64, 8, 40)]:
        a = rng.standard_normal((m, kk)).astype(np.float16)
        b = rng.standard_normal((kk, n)).astype(np.float16)
        c = output((m, n), np.float16)
        with no_fallback():
            k(a, b, c.view)
        want = a.astype(np.float32) @ b.astype(np.float32)
        np.testing.assert_allclose(c.view.astype(np.float32), want, rtol=2e-3, atol=2e-2 * math.sqrt(kk) / 16)
        c.check()


GEMM_NT = """
kernel gemm_nt(A: {dt}[M, K], B: {dt}[N, K], C: f32[M, N]) {{
    const BM = 128, BN = 64, BK = 64;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared a: {dt}[BM, BK];
    shared b: {dt}[BN, BK];
    local acc: f32[BM, BN];
    fill(acc, 0);
    for k in pipelined(cdiv(K, BK), stages = {stages}) {{
        copy(A[by * BM, k * BK], a);
        copy(B[bx * BN, k * BK], b);
        gemm(a, b, acc, transpose_b = true);
    }}
    copy(acc, C[by * BM, bx * BN]);
}}"""


@pytest.mark.parametrize("dt, stages", [("f16", 1), ("bf16", 4)])
def test_gemm_with_transposed_b(dt, stages):
    k = interp(GEMM_NT.format(dt=dt, stages=stages))
    rng = np.random.default_rng(22)
    a, b = rand((130, 200), dt, rng), rand((72, 200), dt, rng)
    c = output((130, 72), np.float32)
    with no_fallback():
        k(a, b, c.view)
    want = a.astype(np.float32) @ b.astype(np.float32).T
    np.testing.assert_allclose(c.view, want, rtol=1e-5, atol=1e-4)
    c.check()


def test_gemm_epilogue_needs_aligned_rows_of_c():
    """The epilogue's TMA store needs C's rows 16-byte aligned (70 f32 are 280
    bytes): the kernel then runs its thread-copy variant, with a warning."""
    k = interp(GEMM_NT.format(dt="f16", stages=2))
    rng = np.random.default_rng(23)
    a, b = rand((130, 200), "f16", rng), rand((70, 200), "f16", rng)
    c = output((130, 70), np.float32)
    with pytest.warns(tilec.TmaFallbackWarning, match="argument C: row stride 280 bytes"):
        k(a, b, c.view)
    want = a.astype(np.float32) @ b.astype(np.float32).T
    np.testing.assert_allclose(c.view, want, rtol=1e-5, atol=1e-4)
    c.check()


@pytest.mark.parametrize("case", [(2, 9, 7, 64, 128, 3, 1, 1, 1), (1, 5, 5, 128, 64, 3, 1, 1, 1),
                                  (2, 15, 9, 64, 128, 3, 2, 0, 1), (2, 12, 12, 64, 64, 3, 1, 2, 2),
                                  (2, 9, 9, 64, 200, 1, 1, 0, 1)],
                         ids=lambda c: "n{}-{}x{}-c{}-f{}-k{}-s{}-p{}-d{}".format(*c))
def test_conv2d_example(case, **consts):
    """Implicit GEMM: TMA im2col loads into swizzled tiles of a pipelined ring, wgmma."""
    n, h, w, c, f, k, s, p, d = case
    kern = interp(EXAMPLES / "conv2d.tile", KH=k, KW=k, S=s, P=p, D=d, **consts)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((n, h, w, c)).astype(np.float16)
    wt = (rng.standard_normal((k * k * c, f)) / math.sqrt(k * k * c)).astype(np.float16)
    want = im2col_reference(x, k, s, p, d).astype(np.float32) @ wt.astype(np.float32)
    y = output((want.shape[0], f), np.float16)
    with no_fallback():
        kern(x, wt, y.view)
    np.testing.assert_allclose(y.view.astype(np.float32), want, rtol=2e-3, atol=3e-3)
    y.check()


@pytest.mark.parametrize("case, bk", [((2, 9, 7, 64, 128, 3, 1, 1, 1), 128), ((2, 9, 7, 64, 64, 3, 1, 1, 1), 48),
                                      ((1, 5, 5, 32, 64, 3, 2, 1, 1), 96)],
                         ids=lambda c: "n{}-{}x{}-c{}-f{}-k{}-s{}-p{}-d{}".format(*c) if isinstance(c, tuple) else f"bk{c}")
def test_conv2d_example_k_tiles_of_several_chunks(case, bk):
    """K tiles of two 128-byte chunks (BK = 128) or of three 32- or 64-byte chunks
    (BK = 48, 96), one im2col load each, the chunks of a BK = 48 tile in two taps."""
    test_conv2d_example(case, BK=bk)


# ---------------------------------------------------------------- copies of every rank and dtype

ELSIZE = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i32": 4}
TILE_OUTER = {1: (), 2: (4,), 3: (2, 3), 4: (2, 2, 3), 5: (1, 2, 2, 3)}
SHAPE_OUTER = {1: (), 2: (13,), 3: (5, 7), 4: (3, 5, 7), 5: (2, 3, 4, 5)}


def copy_source(rank, dt):
    """A copy kernel of any rank: x and y tiles over the last two dims, the outer
    dims folded into bz; tiles that do not divide the shape."""
    width = 64 // ELSIZE[dt]
    tile = TILE_OUTER[rank] + (width,)
    dims = [f"D{d}" for d in range(rank)]
    counts = [f"cdiv({d}, {t})" for d, t in zip(dims, tile)]
    grid = [counts[-1]] + ([counts[-2]] if rank >= 2 else [])
    origin = [None] * rank
    origin[-1] = f"bx * {tile[-1]}"
    if rank >= 2:
        origin[-2] = f"by * {tile[-2]}"
    folded = list(range(rank - 2))
    names = ["bx", "by", "bz"][:len(grid)]
    if folded:
        grid.append(" * ".join(counts[d] for d in folded))
        names.append("bz")
        for d in folded:
            inner = " * ".join(counts[e] for e in folded if e > d) or "1"
            origin[d] = f"(bz / ({inner}) % {counts[d]}) * {tile[d]}"
    return f"""
kernel copy{rank}(A: {dt}[{', '.join(dims)}], B: {dt}[{', '.join(dims)}]) {{
    grid ({', '.join(names)}) = ({', '.join(grid)});
    threads 128;
    shared s: {dt}[{', '.join(map(str, tile))}];
    copy(A[{', '.join(origin)}], s);
    copy(s, B[{', '.join(origin)}]);
}}"""


def copy_shape(rank, dt, aligned=True):
    width = 64 // ELSIZE[dt]
    inner = 3 * width + (16 // ELSIZE[dt] if aligned else 1)    # ragged; rows 16-byte aligned or not
    return SHAPE_OUTER[rank] + (inner,)


@pytest.mark.parametrize("dt", sorted(ELSIZE))
@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_copy_of_rank_and_dtype(rank, dt):
    k = interp(copy_source(rank, dt))
    rng = np.random.default_rng(rank)
    a = rand(copy_shape(rank, dt), dt, rng)
    b = output(a.shape, a.dtype)
    with no_fallback():
        k(a, b.view)
    assert same_bits(a, b.view)
    b.check()
    b2 = output(a.shape, a.dtype)
    k.fallback(a, b2.view)
    assert same_bits(a, b2.view)
    b2.check()


@pytest.mark.parametrize("dt", ["f16", "f64", "i8"])
@pytest.mark.parametrize("rank", [2, 5])
def test_copy_with_unaligned_rows_falls_back(rank, dt):
    k = interp(copy_source(rank, dt))
    a = rand(copy_shape(rank, dt, aligned=False), dt, np.random.default_rng(7))
    b = output(a.shape, a.dtype)
    with pytest.warns(tilec.TmaFallbackWarning, match="is not a multiple of 16"):
        k(a, b.view)
    assert same_bits(a, b.view)
    b.check()


def test_copy_of_a_strided_numpy_view():
    k = interp(EXAMPLES / "copy2d.tile")
    big = np.random.default_rng(8).standard_normal((300, 520), dtype=np.float32)
    a = big[10:290:2, 16:500]
    b = guarded(a.shape, np.float32, like="numpy", pad=[5, (40, 76)], fill=0)     # out[5:145, 40:524] of a [150, 600]
    k(a, b.view)
    assert np.array_equal(a, b.view)
    b.check()


def test_an_expanded_output_is_refused_an_expanded_input_is_read():
    """A written tensor whose dim has stride 0 (np.broadcast_to made writable, torch's
    expand) has elements at one address: its writes would race, so the launch refuses it
    (as torch does); the same view as an input is read as it is."""
    k = interp(EXAMPLES / "copy2d.tile")
    a = np.arange(64 * 128, dtype=np.float32).reshape(64, 128)
    row = np.full(128, -1.0, np.float32)
    b = np.lib.stride_tricks.as_strided(row, (64, 128), (0, 4), writeable=True)
    with pytest.raises(tilec.LaunchError, match=r"^error: argument B: dim 0 has stride 0, so its 64 elements share "
                       r"one address \(an expanded or broadcast view\); the kernel writes B, and its writes there "
                       r"would race: pass a tensor whose elements are distinct$"):
        k(a, b)
    assert (row == -1).all()
    out = guarded(a.shape, np.float32, like="numpy")
    k(np.broadcast_to(a[3], a.shape), out.view)
    assert (out.view == a[3]).all()
    out.check()
    empty = np.lib.stride_tricks.as_strided(row, (0, 128), (0, 4), writeable=True)     # no element: nothing races
    k(np.zeros((0, 128), np.float32), empty)


def test_a_read_only_output_is_refused_a_read_only_input_is_read():
    """numpy's read-only mark is kept: a written array with flags.writeable False raises
    before anything runs (on the GPU tilec would copy the kernel's result into it);
    np.broadcast_to's read-only view as an input is read."""
    k = interp(EXAMPLES / "scale.tile")
    x = np.arange(32 * 64, dtype=np.float32).reshape(32, 64)
    y = np.full_like(x, -1.0)
    y.flags.writeable = False
    with pytest.raises(tilec.LaunchError, match=r"^error: argument Y: the numpy array is read-only \(its "
                       r"flags.writeable is False\), and kernel scale writes it: pass a writable one$"):
        k(x, y, 2.0)
    assert (y == -1).all()
    x.flags.writeable = False
    out = guarded(x.shape, np.float32, like="numpy")
    k(x, out.view, 2.0)
    assert np.array_equal(out.view, x * 2 + 1)
    out.check()


def test_arguments_that_share_memory():
    """A written tensor shares memory with no other argument, but for one case: the same
    view as a tensor the kernel reads only where it then writes it (scale in place). A
    gemm writing into A, two outputs in one buffer, overlapping slices and a written
    view whose elements overlap are refused, nothing written; column halves of one
    buffer share no element and run."""
    scale = interp(EXAMPLES / "scale.tile")
    x = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
    want = x * 2 + 1
    scale(x, x, 2.0)
    assert np.array_equal(x, want)
    buf = np.arange(96 * 256, dtype=np.float32).reshape(96, 256)
    before = buf.copy()
    with pytest.raises(tilec.LaunchError, match=r"^error: arguments X and Y share memory but are not the same view; "
                       r"the kernel writes Y, so its writes would race with the reads of X: pass tensors that do "
                       r"not overlap$"):
        scale(buf[:64], buf[32:], 2.0)
    halves = guarded((64, 512), np.float32, like="numpy", fill=0)
    scale(halves.view[:, :256], halves.view[:, 256:], 2.0)
    assert (halves.view[:, 256:] == 1).all() and (halves.view[:, :256] == 0).all()
    halves.check()
    overlapping = np.lib.stride_tricks.as_strided(buf, (64, 256), (512, 4), writeable=True)
    with pytest.raises(tilec.LaunchError, match=r"^error: argument Y: some of its elements share memory \(shape "
                       r"\(64, 256\), strides \(512, 4\) bytes, elements of 4 bytes\)"):
        scale(x, overlapping, 2.0)
    gemm = interp(EXAMPLES / "gemm_128x256.tile")
    a = np.ones((256, 256), np.float16)
    with pytest.raises(tilec.LaunchError, match=r"^error: arguments A and C are one tensor \(the same memory, shape "
                       r"and strides\), but kernel gemm_128x256 cannot run in place: it reads A \(line 12\) and "
                       r"writes C \(line 16\) in different tiles, so a block may overwrite elements of A that another "
                       r"block, or a later step, still reads: pass a separate C$"):
        gemm(a, a.copy(), a)
    rowsum = interp(EXAMPLES / "rowsum.tile")
    out = np.zeros(256, np.float32)
    with pytest.raises(tilec.LaunchError, match=r"^error: arguments RowSum and RowMax are one tensor \(the same "
                       r"memory, shape and strides\), and the kernel writes both: their writes would race: pass "
                       r"separate tensors$"):
        rowsum(np.ones((128, 64), np.float32), out[:128], out[:128])
    with pytest.raises(tilec.LaunchError, match=r"^error: arguments RowSum and RowMax share memory but are not the "
                       r"same view; the kernel writes RowSum, so its writes would race with the writes of RowMax"):
        rowsum(np.ones((128, 64), np.float32), out[:128], out[1:129])
    assert np.array_equal(buf, before) and (out == 0).all() and (a == 1).all()
    center = interp(ROOT / "tests" / "center.tile")      # two passes: read in one loop, written in the next
    x = np.random.default_rng(1).standard_normal((200, 300)).astype(np.float32)
    want = x - x.max(axis=1, keepdims=True)
    for last_first in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(blocks, "LAST_BLOCK_FIRST", last_first)
            y = guarded(x.shape, np.float32, like="numpy", fill=x)
            center(y.view, y.view)
        assert np.array_equal(y.view, want)
        y.check()
    swapped = interp(""" kernel swapped(X: f32[M, N], Y: f32[M, N]) {
        const BM = 64, BN = 64;
        grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
        threads 128;
        shared s: f32[BM, BN];
        copy(X[by * BM, bx * BN], s);
        copy(s, Y[BM * by, 0 + BN * bx]);
    }""")       # one tile written in another form: compared in linear form, so in place
    assert dict(swapped.kernel_ir.in_place) == {("Y", "X"): None}
    x = np.arange(100 * 72, dtype=np.float32).reshape(100, 72)
    y = x.copy()
    swapped(y, y)
    assert np.array_equal(y, x)
    fills = interp(""" kernel fills(A: f32[M, N], B: f32[M, N]) {
        const BM = 64, BN = 64;
        grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
        threads 128;
        shared s: f32[BM, BN];
        fill(s, 1.0);
        copy(s, A[by * BM, bx * BN]);
        copy(s, B[by * BM, bx * BN]);
    }""")     # every tensor written: no in-place pair, one buffer for both refused
    out = np.zeros((64, 128), np.float32)
    fills(out[:, :64], out[:, 64:])
    assert (out == 1).all()
    with pytest.raises(tilec.LaunchError, match=r"^error: arguments A and B are one tensor \(the same memory, shape "
                       r"and strides\), and the kernel writes both"):
        fills(out[:, :64], out[:, :64])


SHIFT = """
kernel shift(A: {dt}[M, N], B: {dt}[M, N]) {{
    const BM = 16, BN = {bn}, LY = {ly}, LX = {lx}, SY = {sy}, SX = {sx};
    grid (bx, by) = (cdiv(N, BN) + 1, cdiv(M, BM) + 1);
    threads 128;
    shared s: {dt}[BM, BN];
    copy(A[by * BM + LY, bx * BN + LX], s);
    copy(s, B[by * BM + SY, bx * BN + SX]);
}}"""


def shift_reference(a, b, bm, bn, ly, lx, sy, sx):
    """Block (bx, by) copies A's box at (by*BM + LY, bx*BN + LX), zero outside A,
    to B's box at (by*BM + SY, bx*BN + SX), dropping what is outside B."""
    m, n = a.shape
    gy, gx = -(-m // bm) + 1, -(-n // bn) + 1
    pad = max(abs(ly), abs(lx), abs(sy), abs(sx)) + max(bm, bn)
    ae = np.zeros((m + 2 * pad + gy * bm, n + 2 * pad + gx * bn), a.dtype)
    ae[pad:pad + m, pad:pad + n] = a
    be = np.zeros_like(ae)
    be[pad:pad + m, pad:pad + n] = b
    for by in range(gy):
        for bx in range(gx):
            tile = ae[pad + by * bm + ly:pad + by * bm + ly + bm, pad + bx * bn + lx:pad + bx * bn + lx + bn]
            dst = (slice(pad + by * bm + sy, pad + by * bm + sy + bm), slice(pad + bx * bn + sx, pad + bx * bn + sx + bn))
            be[dst] = tile
    return be[pad:pad + m, pad:pad + n]


@pytest.mark.parametrize("dt", ["f32", "f16", "i8"])
@pytest.mark.parametrize("shift", [(-5, -2, 0, 0), (3, 2, 0, 0), (0, 0, -7, -4), (0, 0, 9, 6), (-17, -8, 4, 2),
                                   (-40, 0, 0, -16)], ids=lambda v: "_".join(map(str, v)))
def test_tma_clips_at_every_edge(dt, shift):
    """Loads and stores partly (or wholly) outside the tensor on every side,
    negative coordinates included: zero fill on load, writes dropped on store.
    Column shifts are in 16-byte units (TMA's alignment rule)."""
    ly, lxu, sy, sxu = shift
    per16 = 16 // ELSIZE[dt]
    bn, lx, sx = 8 * per16, lxu * per16, sxu * per16
    k = interp(SHIFT.format(dt=dt, bn=bn, ly=ly, lx=lx, sy=sy, sx=sx))
    a = rand((37, 5 * bn + per16), dt, np.random.default_rng(9))
    b = output(a.shape, a.dtype)
    want = shift_reference(a, b.view.copy(), 16, bn, ly, lx, sy, sx)
    with no_fallback():
        k(a, b.view)
    assert same_bits(b.view, want)
    b.check()
    b2 = output(a.shape, a.dtype)
    k.fallback(a, b2.view)
    assert same_bits(b2.view, want)
    b2.check()


def test_copy_of_a_row_segment_into_a_lower_rank_tile():
    src = """
    kernel rows(A: f32[M, N], B: f32[M, N]) {
        grid (bx, by) = (cdiv(N, 256), M);
        threads 128;
        shared r: f32[256];
        copy(A[by, bx * 256], r);
        copy(r, B[by, bx * 256]);
    }"""
    a = np.random.default_rng(10).standard_normal((5, 600), dtype=np.float32)
    b = output(a.shape, np.float32)
    with no_fallback():
        interp(src)(a, b.view)
    assert same_bits(a, b.view)
    b.check()


# ---------------------------------------------------------------- im2col: a matrix of cases

SPATIAL = {1: ("W",), 2: ("H", "W"), 3: ("Dd", "H", "W")}


def im2col_source(spatial, dt, channels="C", body=""):
    dims = SPATIAL[spatial]
    ks = [f"K{d}" for d in dims]
    outs = [f"(({d} + 2 * P - DIL * ({k} - 1) - 1) / S + 1)" for d, k in zip(dims, ks)]
    kernel = ks[0] if spatial == 1 else "(" + ", ".join(ks) + ")"
    return f"""
kernel im2col{spatial}(X: {dt}[N, {', '.join(dims)}, {channels}], Y: {dt}[NP, {' * '.join(ks)} * {channels}]) {{
    const {', '.join(f'{k} = 3' for k in ks)}, S = 1, P = 1, DIL = 1;
    const BM = 128, BK = 64;
    require NP == N * {' * '.join(f'max(0, {o})' for o in outs)};
    grid (bx, by) = (cdiv({' * '.join(ks)} * {channels}, BK), cdiv(NP, BM));
    threads 128;
    let Xc = im2col(X, kernel = {kernel}, stride = S, pad = P, dilation = DIL);
    shared t: {dt}[BM, BK];
    copy(Xc[by * BM, bx * BK], t);{body}
    copy(t, Y[by * BM, bx * BK]);
}}"""


def run_im2col(spatial, dt, n, size, c, k, s, p, d, bm=128, fallback_variant=False):
    sizes = (size,) * spatial if isinstance(size, int) else size
    bk = min(c, 64)
    consts = dict(S=s, P=p, DIL=d, BM=bm, BK=bk, **{f"K{dd}": k for dd in SPATIAL[spatial]})
    kern = interp(im2col_source(spatial, dt), **consts)
    x = rand((n, *sizes, c), dt, np.random.default_rng(zlib.crc32(repr((spatial, dt, n, size, c, k)).encode())))
    want = im2col_reference(x, k, s, p, d)
    y = output(want.shape, want.dtype)
    if fallback_variant:
        kern.fallback(x, y.view)
    else:
        with no_fallback():
            kern(x, y.view)
    assert same_bits(y.view, want)
    y.check()


def im2col_cases():
    rng = random.Random(1234)
    out = []
    for _ in range(28):
        spatial = rng.choice([1, 2, 2, 3])
        dt, c = rng.choice([("f16", 8), ("f16", 16), ("f16", 64), ("f32", 4), ("f32", 8)])
        n = rng.choice([1, 2, 3])
        size = rng.choice([1, 4, 7, 9]) if spatial < 3 else rng.choice([1, 4, 5])
        k = rng.choice([1, 2, 3, 5, 7]) if spatial < 3 else rng.choice([1, 2, 3])
        s, p, d = rng.choice([1, 2, 3]), rng.choice([0, 1, 2, 3]), rng.choice([1, 2])
        out.append((spatial, dt, n, size, c, k, s, p, d))
    out += [(2, "f16", 2, 14, 64, 3, 1, 1, 1), (2, "f16", 3, 7, 16, 7, 1, 0, 1),     # one output pixel per image
            (2, "f16", 3, 5, 16, 7, 1, 0, 1),                                         # no output pixel
            (2, "f16", 2, (5, 11), 16, 3, 2, 1, 1), (2, "f32", 2, (13, 6), 4, 5, 3, 2, 2),   # OH != OW != W
            (1, "f16", 3, 100, 16, 3, 1, 1, 1), (1, "f16", 2, 31, 64, 5, 2, 3, 2),
            (3, "f16", 2, (3, 5, 6), 16, 3, 1, 1, 1), (3, "f32", 1, 5, 8, 3, 2, 0, 2)]
    return out


@pytest.mark.parametrize("case", im2col_cases(),
                         ids=lambda c: "r{}-{}-n{}-s{}-c{}-k{}-st{}-p{}-d{}".format(c[0] + 2, *c[1:]))
def test_im2col_matrix(case):
    run_im2col(*case)


@pytest.mark.parametrize("case", im2col_cases()[::4],
                         ids=lambda c: "r{}-{}-n{}-s{}-c{}-k{}-st{}-p{}-d{}".format(c[0] + 2, *c[1:]))
def test_im2col_matrix_thread_copy_variant(case):
    run_im2col(*case, fallback_variant=True)


def test_im2col_bm_64_rows_cross_images():
    run_im2col(2, "f16", 3, 5, 64, 3, 1, 1, 1, bm=64)


def test_im2col_channels_not_a_multiple_of_bk_fall_back():
    kern = interp(im2col_source(2, "f16"), BK=8)
    x = rand((2, 9, 9, 3), "f16", np.random.default_rng(11))     # 3 channels: 6-byte pixels
    want = im2col_reference(x, 3, 1, 1, 1)
    y = output(want.shape, np.float16)
    with pytest.warns(tilec.TmaFallbackWarning, match="3 channels is not a multiple of the 8 channels of one im2col load"):
        kern(x, y.view)
    assert same_bits(y.view, want)
    y.check()


# ---------------------------------------------------------------- loops, ifs, local tiles, element math

LOOP_IF = """
kernel clamp(X: f32[M, N], Y: f32[M, N], n: i32) {
    const BM = 16, BN = 64;
    grid (bx) = (cdiv(N, BN));
    threads 128;
    shared s: f32[BM, BN];
    for t in range(cdiv(M, BM)) {
        copy(X[t * BM, bx * BN], s);
        if t < n {
            parallel (i, j) in (BM, BN) {
                s[i, j] = s[i, j] + 1.0;
            }
        } else {
            fill(s, 0);
        }
        copy(s, Y[t * BM, bx * BN]);
    }
}"""


@pytest.mark.parametrize("n", [0, 3, 100])
def test_loop_with_an_if(n):
    k = interp(LOOP_IF)
    x = np.random.default_rng(12).standard_normal((100, 136), dtype=np.float32)
    want = np.where(np.arange(100)[:, None] < 16 * n, x + np.float32(1), np.float32(0))
    for run in (k, k.fallback):
        y = output(x.shape, np.float32)
        with no_fallback():
            run(x, y.view, n)
        assert same_bits(y.view, want)
        y.check()


def test_local_tile_accumulates_over_a_loop():
    src = """
    kernel rowsum(A: f32[M, K], B: f32[M, 128]) {
        grid (by) = (cdiv(M, 64));
        threads 128;
        shared a: f32[64, 128];
        local acc: f32[64, 128];
        fill(acc, 0);
        for k in pipelined(cdiv(K, 128), stages = 3) {
            copy(A[by * 64, k * 128], a);
            parallel (i, j) in (64, 128) {
                acc[i, j] = acc[i, j] + a[i, j];
            }
        }
        copy(acc, B[by * 64, 0]);
    }"""
    a = np.random.default_rng(13).integers(-8, 8, (100, 500)).astype(np.float32)
    want = np.zeros((100, 128), np.float32)
    for k0 in range(0, 500, 128):
        part = a[:, k0:k0 + 128]
        want[:, :part.shape[1]] += part
    b = output(want.shape, np.float32)
    k = interp(src)
    with no_fallback():
        k(a, b.view)
    assert same_bits(b.view, want)             # small integers: float sums are exact
    b.check()


# f16 in, f32 math in registers (a local tile), f16 out (also run on the GPU by test_gpu_copy.py)
SCALE16 = """
    kernel scale16(X: f16[M, N], Y: f16[M, N], alpha: f32) {
        const BM = 16, BN = 128;
        grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
        threads 128;
        shared s: f16[BM, BN];
        local r: f32[BM, BN];
        copy(X[by * BM, bx * BN], s);
        copy(s, r);
        parallel (i, j) in (BM, BN) {
            r[i, j] = r[i, j] * alpha - 2.0;
        }
        copy(r, Y[by * BM, bx * BN]);
    }"""


def test_f16_through_a_local_tile():
    src = SCALE16
    x = rand((100, 304), "f16", np.random.default_rng(14))
    y = output(x.shape, np.float16)
    with no_fallback():
        interp(src)(x, y.view, 1.5)
    # x * 1.5 is exact in float, so the fused multiply-add is one rounding to float, then f16
    assert same_bits(y.view, (x.astype(np.float32) * np.float32(1.5) - np.float32(2.0)).astype(np.float16))
    y.check()


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_half_precision_math_in_float(dt):
    src = f"""
    kernel h(X: {dt}[M, N], Y: {dt}[M, N]) {{
        grid (bx, by) = (cdiv(N, 64), cdiv(M, 8));
        threads 128;
        shared s: {dt}[8, 64];
        copy(X[by * 8, bx * 64], s);
        parallel (i, j) in (8, 64) {{
            s[i, j] = s[i, j] * 2.0 + 0.25;
        }}
        copy(s, Y[by * 8, bx * 64]);
    }}"""
    x = rand((20, 136), dt, np.random.default_rng(15))
    y = output(x.shape, x.dtype)
    with no_fallback():
        interp(src)(x, y.view)
    # float(x) * 2 is exact: one float rounding, then one rounding to the half type
    want = (x.astype(np.float32) * np.float32(2.0) + np.float32(0.25)).astype(x.dtype)
    assert same_bits(y.view, want)
    y.check()


def c_div(a, b):
    return np.trunc(a / b).astype(a.dtype)


def test_integer_math_is_cpp():
    """Truncating / and %, min, abs, casts, comparisons: C++, not Python."""
    src = """
    kernel ints(X: i32[M, N], Y: i32[M, N], Z: f32[M, N]) {
        const BM = 8, BN = 32;
        grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
        threads 128;
        shared s: i32[BM, BN];
        shared t: i32[BM, BN];
        local z: f32[BM, BN];
        copy(X[by * BM, bx * BN], s);
        parallel (i, j) in (BM, BN) {
            t[i, j] = s[i, j] / 7 + s[i, j] % 7 * 1000 + min(i, j) - abs(s[i, j]) / 100 + (s[i, j] < -3);
            z[i, j] = s[i, j] / 2 + f32(s[i, j]) / 4.0;
        }
        copy(t, Y[by * BM, bx * BN]);
        copy(z, Z[by * BM, bx * BN]);
    }"""
    x = np.random.default_rng(16).integers(-1000, 1000, (20, 68)).astype(np.int32)
    y, z = output(x.shape, np.int32), output(x.shape, np.float32)
    with no_fallback():
        interp(src)(x, y.view, z.view)
    y.check()
    z.check()
    q = c_div(x, np.int32(7))
    ii, jj = np.indices(x.shape)
    want = q + (x - q * 7) * 1000 + np.minimum(ii % 8, jj % 32) - c_div(np.abs(x), np.int32(100)) + (x < -3)
    assert same_bits(y.view, want.astype(np.int32))
    assert same_bits(z.view, c_div(x, np.int32(2)).astype(np.float32) + x.astype(np.float32) / np.float32(4))


def test_per_element_if_transposed_reads_and_casts():
    """`if` inside a body, a tile read at other indices (codegen flattens them),
    f16 rounding by a cast, float -> int conversions."""
    src = """
    kernel tr(X: f16[M, N], Y: f16[M, N], Q: i32[M, N]) {
        const B = 64;
        grid (bx, by) = (cdiv(N, B), cdiv(M, B));
        threads 128;
        shared s: f16[B, B];
        shared t: f16[B, B];
        shared q: i32[B, B];
        copy(X[by * B - 16, bx * B - 64], s);
        parallel (i, j) in (B, B) {
            if s[j, i] > 0.5 {
                t[i, j] = f16(s[j, i] * 3.0) + 0.5;
            } else {
                t[i, j] = -s[j, i];
            }
            q[i, j] = i32(s[i, j] * 10.0);
        }
        copy(t, Y[by * B, bx * B]);
        copy(q, Q[by * B, bx * B]);
    }"""
    x = rand((130, 200), "f16", np.random.default_rng(17))
    y, q = output(x.shape, np.float16), output(x.shape, np.int32)
    with no_fallback():
        interp(src)(x, y.view, q.view)
    y.check()
    q.check()
    m, n = x.shape
    xe = np.zeros((3 * 64 + 16, 4 * 64 + 64), np.float16)
    xe[16:16 + m, 64:64 + n] = x                # the loads' origin is (-16, -64) from the block's
    want_t = np.zeros((3 * 64, 4 * 64), np.float16)
    want_q = np.zeros((3 * 64, 4 * 64), np.int32)
    for by, bx in itertools.product(range(3), range(4)):
        tile = xe[by * 64:by * 64 + 64, bx * 64:bx * 64 + 64].astype(np.float32)
        big = (tile.T * np.float32(3)).astype(np.float16).astype(np.float32) + np.float32(0.5)
        want_t[by * 64:by * 64 + 64, bx * 64:bx * 64 + 64] = np.where(tile.T > 0.5, big, -tile.T).astype(np.float16)
        want_q[by * 64:by * 64 + 64, bx * 64:bx * 64 + 64] = np.trunc(tile * np.float32(10)).astype(np.int32)
    assert same_bits(y.view, want_t[:m, :n])
    assert same_bits(q.view, want_q[:m, :n])


def test_float_functions_with_a_tolerance():
    src = """
    kernel f(X: f32[M, N], Y: f32[M, N]) {
        grid (bx, by) = (cdiv(N, 64), cdiv(M, 16));
        threads 128;
        shared s: f32[16, 64];
        copy(X[by * 16, bx * 64], s);
        parallel (i, j) in (16, 64) {
            s[i, j] = exp(s[i, j]) + sqrt(abs(s[i, j])) * rsqrt(s[i, j] * s[i, j] + 1.0) - log(2.0 + s[i, j] * s[i, j]);
        }
        copy(s, Y[by * 16, bx * 64]);
    }"""
    x = np.random.default_rng(18).standard_normal((40, 200), dtype=np.float32)
    y = output(x.shape, np.float32)
    with no_fallback():
        interp(src)(x, y.view)
    xd = x.astype(np.float64)
    want = np.exp(xd) + np.sqrt(np.abs(xd)) / np.sqrt(xd * xd + 1) - np.log(2 + xd * xd)
    np.testing.assert_allclose(y.view, want, rtol=1e-5, atol=1e-5)
    y.check()


EXP2_SRC = """
kernel e(X: f32[N], Y: f32[N], Z: f64[N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    shared x: f32[128];
    shared d: f64[128];
    copy(X[bx * 128], x);
    parallel (i) in (128) {
        d[i] = exp2(f64(x[i]));
        x[i] = exp2(x[i]);
    }
    copy(x, Y[bx * 128]);
    copy(d, Z[bx * 128]);
}"""
# around the smallest normal float's exponent, -126, and the ends of the range
EXP2_ARGS = np.array([-125.0, -125.5, -126.0, -126.001, -126.5, -127.0, -140.0, -149.0, -150.0, -1e30, -np.inf,
                      np.nan, 0.0, 1e-40, -1e-40, 0.5, 1.0, 10.25, 127.0, 127.99, 128.0, np.inf], dtype=np.float32)


def test_exp2_of_floats_flushes_results_below_2_to_the_minus_126():
    """language.md §13: a float exp2 gives 0 where 2^x < 2^-126 (ex2.approx.ftz on the GPU);
    with f64 involved it is a double's exp2 and keeps the subnormals."""
    y, z = output(EXP2_ARGS.shape, np.float32), output(EXP2_ARGS.shape, np.float64)
    interp(EXP2_SRC)(EXP2_ARGS.copy(), y.view, z.view)
    y.check()
    z.check()
    want = np.exp2(EXP2_ARGS.astype(np.float64))
    assert np.array_equal(np.asarray(z.view), want, equal_nan=True)
    small = want < 2.0 ** -126
    assert small.sum() == 8 and np.all(np.asarray(y.view)[small] == 0)     # -126.001 and below
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(np.asarray(y.view)[~small], np.exp2(EXP2_ARGS)[~small])   # numpy's f32 exp2
    assert np.asarray(y.view)[2] == np.float32(2.0 ** -126)


MIN_MAX_SRC = """
kernel mm(A: f32[N], B: f32[N], Y: f32[4, N], Z: f64[4, N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    shared a: f32[128];
    shared b: f32[128];
    shared y: f32[4, 128];
    shared z: f64[4, 128];
    copy(A[bx * 128], a);
    copy(B[bx * 128], b);
    parallel (i) in (128) {
        y[0, i] = max(a[i], b[i]);
        y[1, i] = min(a[i], b[i]);
        y[2, i] = max(a[i], 0);             // an int beside a float: in float
        y[3, i] = min(b[i], f16(a[i]));
        z[0, i] = max(f64(a[i]), f64(b[i]));
        z[1, i] = min(f64(a[i]), f64(b[i]));
        z[2, i] = max(f64(a[i]), b[i]);
        z[3, i] = min(a[i], f64(b[i]));
    }
    copy(y, Y[0, bx * 128]);
    copy(z, Z[0, bx * 128]);
}"""
# every pair of NaN, infinities, signed zeros, a subnormal and ordinary values, in both orders
_MIN_MAX_VALUES = np.array([np.nan, -np.inf, -1.5, -0.0, 0.0, 1e-40, 2.0, np.inf], dtype=np.float32)
MIN_MAX_A, MIN_MAX_B = (v.ravel().copy() for v in np.meshgrid(_MIN_MAX_VALUES, _MIN_MAX_VALUES))


def min_max_expected(a, b, op):
    """IEEE 754-2019 minimumNumber / maximumNumber, written out: a NaN gives the other
    operand, two NaNs the canonical NaN (f32; doubles: b, as the H200 gives), -0 < +0."""
    out = []
    for x, y in zip(a.tolist(), b.tolist()):
        if math.isnan(x) and math.isnan(y):
            out.append(y)
        elif math.isnan(x) or math.isnan(y):
            out.append(y if math.isnan(x) else x)
        else:
            key = lambda v: (v, math.copysign(1.0, v))     # -0 before +0
            out.append((max if op == "max" else min)(x, y, key=key))
    return np.array(out, a.dtype)


def test_min_and_max_of_floats_are_ieee_minimum_and_maximum_number():
    """language.md §13: min and max of floats are fminf / fmaxf (f64: fmin / fmax), as
    the GPU computes them; of a float and an int, in float; f16 operands read as float."""
    n = MIN_MAX_A.size
    y, z = output((4, n), np.float32), output((4, n), np.float64)
    interp(MIN_MAX_SRC)(MIN_MAX_A.copy(), MIN_MAX_B.copy(), y.view, z.view)
    y.check()
    z.check()
    y, z = np.asarray(y.view), np.asarray(z.view)
    a64, b64 = MIN_MAX_A.astype(np.float64), MIN_MAX_B.astype(np.float64)
    h = MIN_MAX_A.astype(np.float16).astype(np.float32)
    canonical = np.uint32(0x7FFFFFFF).view(np.float32)
    for got, want in ((y[0], min_max_expected(MIN_MAX_A, MIN_MAX_B, "max")),
                      (y[1], min_max_expected(MIN_MAX_A, MIN_MAX_B, "min")),
                      (y[2], min_max_expected(MIN_MAX_A, np.zeros_like(MIN_MAX_A), "max")),
                      (y[3], min_max_expected(MIN_MAX_B, h, "min")),
                      (z[0], min_max_expected(a64, b64, "max")),
                      (z[1], min_max_expected(a64, b64, "min")),
                      (z[2], min_max_expected(a64, b64, "max")),
                      (z[3], min_max_expected(a64, b64, "min"))):
        if want.dtype == np.float32:
            want = np.where(np.isnan(want), canonical, want)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (got, want)
    assert y[0][(MIN_MAX_A == 0) & (MIN_MAX_B == 0)].tolist() == [0.0] * 4
    assert np.signbit(y[1][(MIN_MAX_A == 0) & (MIN_MAX_B == 0)]).tolist() == [True, True, True, False]


def test_thread_copies_convert_dtypes():
    """shared f16 -> local f32 -> global f64 / i32, shared -> shared: codegen's casts."""
    src = """
    kernel conv(X: f16[M, N], Y: f64[M, N], Z: i32[M, N], W: f16[M, N]) {
        grid (bx, by) = (cdiv(N, 64), cdiv(M, 16));
        threads 128;
        shared s: f16[16, 64];
        shared w: f16[16, 64];
        local r: f32[16, 64];
        copy(X[by * 16, bx * 64], s);
        copy(s, r);
        parallel (i, j) in (16, 64) {
            r[i, j] = r[i, j] * 100.0;
        }
        copy(r, Y[by * 16, bx * 64]);
        copy(r, Z[by * 16, bx * 64]);
        copy(s, w);
        copy(w, W[by * 16, bx * 64]);
    }"""
    x = rand((30, 72), "f16", np.random.default_rng(19))
    k = interp(src)
    for run in (k, k.fallback):
        y, z, w = output(x.shape, np.float64), output(x.shape, np.int32), output(x.shape, np.float16)
        run(x, y.view, z.view, w.view)
        r = x.astype(np.float32) * np.float32(100)
        assert same_bits(y.view, r.astype(np.float64))
        assert same_bits(z.view, np.trunc(r).astype(np.int32))
        assert same_bits(w.view, x)
        for g in (y, z, w):
            g.check()


# ---------------------------------------------------------------- launch checks, as on the GPU

def test_launch_errors_are_the_gpu_paths():
    k = interp(EXAMPLES / "copy2d.tile")
    a = np.zeros((64, 128), np.float32)
    with pytest.raises(tilec.LaunchError, match=r"argument B: dtype f16 does not match the declared f32"):
        k(a, a.astype(np.float16))
    with pytest.raises(tilec.LaunchError, match=r"argument B: dim 0 is 65 but M = 64 \(from A dim 0\)"):
        k(a, np.zeros((65, 128), np.float32))
    with pytest.raises(tilec.LaunchError, match=r"argument B: rank 1 does not match the declared rank 2"):
        k(a, np.zeros(128, np.float32))
    with pytest.raises(tilec.LaunchError, match=r"argument alpha: expected a number for f32, got str"):
        interp(EXAMPLES / "scale.tile")(a, a, "x")
    im = interp(EXAMPLES / "im2col.tile")
    with pytest.raises(tilec.LaunchError, match=r"argument Y: dim 1 is 288 but the declaration says 9 \* C = 576"):
        im(np.zeros((2, 8, 8, 64), np.float16), np.zeros((128, 288), np.float16))
    with pytest.raises(tilec.LaunchError, match=r"require NP == N \* OH \* OW failed \(H = 8, N = 2, NP = 100, W = 8\)"):
        im(np.zeros((2, 8, 8, 64), np.float16), np.zeros((100, 576), np.float16))


def test_an_empty_grid_runs_nothing():
    b = output((0, 128), np.float32)
    interp(EXAMPLES / "copy2d.tile")(np.zeros((0, 128), np.float32), b.view)
    b.check()


def test_a_wrong_expect_tx_is_a_hang(monkeypatch):
    """With the test hook's 16 extra bytes (check-barriers is skipped for it) the
    interpreter finds the wait that would never complete."""
    monkeypatch.setenv("TILEC_TEST_EXPECT_TX_SKEW", "16")
    k = interp(EXAMPLES / "copy2d.tile")
    a = np.zeros((64, 128), np.float32)
    with pytest.raises(interpret.InterpretError, match=r"would hang: block \(0, 0, 0\) waits on mbarrier bar0 "
                                                       r"with parity 0.*expect-tx is 32784 bytes but its TMA loads "
                                                       r"bring 32768") as info:
        k(a, a.copy())
    assert info.value.span.line == 9


def test_a_misaligned_tma_coordinate_is_a_fault():
    """IR with an innermost coordinate of 1 f32 (4 bytes): the GPU would fault."""
    k = lower(str(EXAMPLES / "copy2d.tile")).kernel

    def shift(s):
        if isinstance(s, ir.TmaLoad):
            return replace(s, coords=(s.coords[0], ir.BinOp("+", s.coords[1], ir.Int(1))))
        if isinstance(s, ir.OneThread):
            return replace(s, body=tuple(shift(x) for x in s.body))
        return s
    bad = replace(k, body=tuple(shift(s) for s in k.body))
    a = np.zeros((64, 128), np.float32)
    with pytest.raises(interpret.InterpretError, match="innermost coordinate 1 .4 bytes. is not 16-byte aligned"):
        interpret.run(bad, (a, a.copy()), (1, 1, 1))


def test_torch_cpu_tensors_are_written_in_place():
    torch = pytest.importorskip("torch")
    k = interp(EXAMPLES / "copy2d.tile")
    a = torch.randn(100, 300)
    b = guarded((100, 300), torch.float32, device="cpu", fill=0)
    with no_fallback():                           # the guarded view keeps TMA's layout rules
        k(a, b.view)
    assert torch.equal(a, b.view)
    b.check()
    x = torch.randn(20, 136).to(torch.bfloat16)
    y = guarded(x.shape, x.dtype, device="cpu", fill=0)
    with no_fallback():
        interp(copy_source(2, "bf16"))(x, y.view)
    assert torch.equal(x, y.view)
    y.check()


def test_sparse_torch_tensors_are_refused():
    torch = pytest.importorskip("torch")
    k = interp(EXAMPLES / "copy2d.tile")
    b = guarded((100, 300), torch.float32, device="cpu", fill=0)
    with pytest.raises(tilec.LaunchError, match=r"argument A: a sparse_coo tensor, where tilec takes dense"):
        k(torch.randn(100, 300).to_sparse(), b.view)
    b.check()
    assert (b.view == 0).all()


# ---------------------------------------------------------------- the arithmetic helpers

def exact_round(value: Fraction, dtype):
    f = dtype.type(float(value))
    with np.errstate(over="ignore"):
        cands = [c for c in (np.nextafter(f, dtype.type(-np.inf)), f, np.nextafter(f, dtype.type(np.inf)))
                 if np.isfinite(c)]
    bits = np.uint32 if dtype == np.float32 else np.uint64
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - value), int(np.array(c).view(bits)) & 1))


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float64)])
def test_fused_multiply_add_is_rounded_once(dtype):
    rng = np.random.default_rng(20)
    a, b = rng.standard_normal(3000).astype(dtype), rng.standard_normal(3000).astype(dtype)
    c = (-(a.astype(np.float64) * b)).astype(dtype)            # near-cancellation: the hard cases
    c[::2] = rng.standard_normal(1500).astype(dtype)
    got = numbers._fma(a, b, c, dtype)
    for i in range(0, 3000, 5):
        want = exact_round(Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i])), dtype)
        assert got[i] == want, (a[i], b[i], c[i])


def exact_round_or_overflow(value: Fraction):
    """value rounded to double, to nearest even; an infinity from 2^1024 - 2^970 on (IEEE's overflow)."""
    if abs(value) >= 2 ** 1024 - 2 ** 970:
        return np.float64(np.inf if value > 0 else -np.inf)
    return exact_round(value, np.dtype(np.float64))


HUGE = st.one_of(st.floats(2.0 ** 990, 1.7976931348623157e308), st.floats(-1.7976931348623157e308, -(2.0 ** 990)))
ANY = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.one_of(st.tuples(HUGE, ANY, ANY), st.tuples(ANY, HUGE, ANY), st.tuples(HUGE, HUGE, HUGE),
                          st.tuples(ANY, ANY, ANY)), min_size=1, max_size=6))
def test_fused_multiply_add_of_huge_doubles(triples):
    """Veltkamp's split overflows from 2^996: those lanes are rounded from the exact value
    too (the random programs found 1.0 * -1.86e302 + log(2) computed as NaN), and a sum
    past the largest double is its infinity."""
    a, b, c = (np.array(x, np.float64) for x in zip(*triples))
    got = numbers._fma(a, b, c, np.dtype(np.float64))
    for i in range(len(triples)):
        want = exact_round_or_overflow(Fraction(a[i]) * Fraction(b[i]) + Fraction(c[i]))
        assert got[i] == want or (got[i] == 0 and want == 0), (a[i], b[i], c[i], got[i], want)
    one = numbers._fma(np.float64(1.0), np.float64(-1.857630806390522e+302), np.float64(0.6931471805599453),
                       np.dtype(np.float64))
    assert one == np.float64(-1.857630806390522e+302)


def ieee_fma(a: float, b: float, c: float) -> float:
    """fma(a, b, c) in double as IEEE 754 defines it, from the exact value: rounded once
    (a result under the smallest subnormal is a zero of its sign); an exact zero is -0 only
    where the zero product and c are both -0, else +0."""
    v = Fraction(a) * Fraction(b) + Fraction(c)
    if v != 0:
        return float(exact_round_or_overflow(v)) if abs(v) >= 2 ** -1075 else (-0.0 if v < 0 else 0.0)
    product_negative = (math.copysign(1, a) * math.copysign(1, b)) < 0
    return -0.0 if (a == 0 or b == 0) and product_negative and math.copysign(1, c) < 0 else 0.0


SMALL = st.one_of(st.sampled_from([0.0, -0.0]), st.floats(1e-300, 1e-150), st.floats(-1e-150, -1e-300),
                  st.floats(-4.0, 4.0), st.sampled_from([5e-324, -5e-324, 2.2250738585072014e-308]))


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.tuples(SMALL, SMALL, SMALL), min_size=1, max_size=8))
def test_fused_multiply_add_signed_zeros_and_tiny_products(triples):
    """The sign of a zero result (fma(x, 0, -0) is -0: the CPU run of the CUDA,
    test_cpu_float_exprs, found the interpreter's +0) and products under 2^-900,
    where Dekker's error terms underflow: bit for bit IEEE's fma."""
    a, b, c = (np.array(x, np.float64) for x in zip(*triples))
    got = numbers._fma(a, b, c, np.dtype(np.float64))
    for i in range(len(triples)):
        want = ieee_fma(float(a[i]), float(b[i]), float(c[i]))
        assert np.array(got[i]).view(np.uint64) == np.array(want).view(np.uint64), (a[i], b[i], c[i], got[i], want)


def test_float_literals_round_from_their_decimal_text():
    for text in ["0.1", "1e-05", "3.4028235e+38", "0.3", "16777217.0", "1.0000000596046448"]:
        v = float(text)
        assert numbers._f32_literal(v) == exact_round(Fraction(text), np.dtype(np.float32))


def test_bf16_and_fp8_conversions():
    ml = pytest.importorskip("ml_dtypes")
    x = np.random.default_rng(21).standard_normal(20000).astype(np.float32) * 300
    x[:4] = [0.0, -0.0, np.inf, -np.inf]
    bits = interpret.encode(x, ir.DTYPES["bf16"])
    assert np.array_equal(bits, x.astype(ml.bfloat16).view(np.uint16))
    assert np.array_equal(interpret.decode(bits, ir.DTYPES["bf16"]), x.astype(ml.bfloat16).astype(np.float32))
    for name, ml_type in [("f8e4m3", ml.float8_e4m3fn), ("f8e5m2", ml.float8_e5m2)]:
        finite = x[np.isfinite(x) & (np.abs(x) < float(ml.finfo(ml_type).max))]
        got = interpret.encode(finite, ir.DTYPES[name])
        assert np.array_equal(got, finite.astype(ml_type).view(np.uint8)), name
        assert np.array_equal(interpret.decode(got, ir.DTYPES[name]), finite.astype(ml_type).astype(np.float32))


# ---------------------------------------------------------------- K tiles spanning filter taps

DOUBLE = """
    parallel (i, j) in (BM, BK) {
        t[i, j] = t[i, j] * 2.0 + j;      // j: where a layout mix-up shows
    }"""

TAP_CASES = [  # (spatial, dt, C, BK, kernel, stride, pad, dilation, input size)
    (2, "f16", 8, 64, 3, 1, 1, 1, 9), (2, "f16", 16, 64, 3, 2, 1, 1, 14), (2, "f16", 32, 64, 5, 1, 2, 2, 11),
    (2, "f16", 16, 32, 7, 3, 3, 1, 17), (1, "f16", 8, 64, 3, 1, 0, 1, 40), (3, "f16", 16, 64, 3, 1, 1, 1, 5),
    (2, "f32", 4, 32, 3, 1, 1, 1, 9), (2, "f32", 8, 64, 3, 2, 0, 2, 13), (2, "bf16", 8, 16, 1, 1, 0, 1, 6)]


def tap_case_id(c):
    return "r{}-{}-c{}-bk{}-k{}-s{}-p{}-d{}-h{}".format(c[0] + 2, *c[1:])


@pytest.mark.parametrize("case", TAP_CASES, ids=tap_case_id)
@pytest.mark.parametrize("body", ["", DOUBLE], ids=["tma-store", "parallel"])
def test_im2col_tile_spanning_filter_taps(case, body):
    """C fixed in the declaration and smaller than BK: the K tile holds BK / C taps,
    one TMA im2col load each, in a tile of C-wide column chunks that threads read
    and TMA stores write back chunk by chunk."""
    spatial, dt, c, bk, k, s, p, d, size = case
    consts = dict(S=s, P=p, DIL=d, BM=64, BK=bk, **{f"K{dd}": k for dd in SPATIAL[spatial]})
    src = im2col_source(spatial, dt, channels=str(c), body=body)
    kern = interp(src, **consts)
    loads = [x for x in ir.walk_stmts(kern.kernel_ir.body) if isinstance(x, ir.TmaLoad)]
    assert len(loads) == bk // c
    assert {x.bytes for x in loads} == {64 * c * {"f16": 2, "bf16": 2, "f32": 4}[dt]}
    x = rand((2, *(size,) * spatial, c), dt, np.random.default_rng(c * 1000 + k))
    want = im2col_reference(x, k, s, p, d)
    if body:
        cols = np.arange(want.shape[1]) % bk
        want = (want.astype(np.float32) * 2 + cols).astype(want.dtype)
    y = output(want.shape, want.dtype)
    with no_fallback():
        kern(x, y.view)
    assert same_bits(y.view, want)
    y.check()


@pytest.mark.parametrize("dt, stages", [("f8e4m3", 3), ("f8e5m2", 1)])
def test_f8_gemm(dt, stages):
    """8-bit float operands (wgmma k32, both K-major), f32 sums: the example's
    program with either 8-bit format; exact f32 products of the f8 values."""
    ml = pytest.importorskip("ml_dtypes")
    npdt = {"f8e4m3": ml.float8_e4m3fn, "f8e5m2": ml.float8_e5m2}[dt]
    src = (EXAMPLES / "gemm_f8.tile").read_text().replace("f8e4m3", dt)
    k = interp(src, STAGES=stages)
    rng = np.random.default_rng(31)
    for m, n, kk in [(256, 256, 256), (130, 200, 384), (64, 8, 128)]:
        a = rng.standard_normal((m, kk)).astype(npdt)
        b = rng.standard_normal((n, kk)).astype(npdt)
        c = output((m, n), np.float16)
        with no_fallback():
            k(a, b, c.view)
        want = a.astype(np.float32) @ b.astype(np.float32).T
        np.testing.assert_allclose(c.view.astype(np.float32), want, rtol=2e-3, atol=2e-2 * math.sqrt(kk) / 16)
        c.check()


def test_conversions_to_integers_saturate_floats_and_wrap_integers():
    """tilec's conversion to an integer: a float truncates toward zero and saturates
    (NaN -> 0), an integer wraps to the width (C++'s; an i32 local copied into an i8
    tensor does not go through float), sqrt of an f32 scalar in an f64 context is in
    double. The GPU must agree: tests/test_gpu_interpret.py runs the same kernel."""
    from test_gpu_interpret import CONVERSIONS
    a = np.array([0.0, 1.5, -1.5, 300.7, -300.7, 1e10, -1e10, float("nan"), 0.1234, -2.5], np.float32)
    y, z, w, d = np.zeros(10, np.int8), np.zeros(10, np.int32), np.zeros(10, np.int8), np.zeros(10)
    tilec.compile(CONVERSIONS, backend="interpret")(a, y, z, w, d, 0.001)
    assert y.tolist() == [0, 1, -1, 127, -128, 127, -128, 0, 0, -2]
    assert z.tolist() == [0, 1500, -1500, 300700, -300700, 2**31 - 1, -2**31, 0, 123, -2500]
    assert w.tolist() == [0, -36, 36, -100, 100, -1, 0, 0, 123, 60]
    assert d[1] == np.sqrt(np.float64(np.float32(0.001))) + 1.5


# A uniform select takes only one arm, but its type is both arms' (C++'s `c ? float :
# double` is a double): found by the random programs on the CPU (seed 7, session 28),
# where `select(true, b_f32, 0.1) * (f32(j) - alpha)` in an f64 statement was computed
# in float by the interpreter and in double by the generated CUDA.
UNIFORM_SELECT = """
kernel sel(X: f32[N], D: f64[N], Y: f64[N], alpha: f32, n: i32) {
    grid (bx) = (cdiv(N, 32));
    threads 32;
    local x: f32[32];
    local d: f64[32];
    local y: f64[32];
    copy(X[bx * 32], x);
    copy(D[bx * 32], d);
    parallel (i) in (32) {
        y[i] = select(n > 0, x[i], d[i]) * (x[i] - alpha);
    }
    copy(y, Y[bx * 32]);
}
"""


@pytest.mark.parametrize("n", [1, 0])
def test_a_uniform_select_has_the_type_of_both_arms(n):
    rng = np.random.default_rng(11)
    x = rng.standard_normal(64).astype(np.float32)
    d = rng.standard_normal(64)
    y = guarded((64,), np.float64, like="numpy")
    alpha = np.float32(0.3)
    interp(UNIFORM_SELECT)(x, d, y.view, alpha, n)
    y.check()
    diff = (x - alpha).astype(np.float64)               # float - float, then widened: exact in double
    taken = x.astype(np.float64) if n > 0 else d
    assert np.array_equal(y.view, taken * diff)          # double * double of f32 values: exact
    if n > 0:
        assert not np.array_equal(y.view, (x * (x - alpha)).astype(np.float64))   # not the float product
