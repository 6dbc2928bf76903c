"""reduce(s, acc, axis = 0 | 1, op = sum | max | min): the interpreter against independent
numpy references (bit for bit: float sums are taken in the order the CUDA takes
them, one thread walking its row or column from the first element), the
barriers its effects rule alone gets it, and the CUDA through NVRTC with an
empty log. tests/test_gpu_reduce.py runs the same kernels on the GPU."""
import contextlib
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import tilec
from tilec.compiler import lower
from tilec.ir import effects
from tilec.ir import nodes as ir

from guard import guarded
from conftest import ROOT

EXAMPLES = ROOT / "examples"

REDUCE = """
kernel red(X: {dt}[M, N], Y: {adt}[{ydims}]) {{
    const BM = {bm}, BN = {bn};
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared s: {dt}[BM, BN];
    {space} r: {adt}[{ext}];
    copy(X[by * BM, bx * BN], s);
    reduce(s, r, axis = {axis}, op = {op});
    copy(r, Y[{origin}]);
}}
"""
# (source dtype, result dtype): floats in float (f64 in double), f16 / bf16 rounded
# on the way out, integer sums wrapping, an i8 sum widened to i32
DTYPES = [("f32", "f32"), ("f16", "f32"), ("f16", "f16"), ("bf16", "f32"), ("f64", "f64"), ("i32", "i32"),
          ("i8", "i32")]
FLOATS = ("f16", "bf16", "f32", "f64")
NP = {"f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8", "i32": "int32", "bf16": "bfloat16"}
# ragged against 32 x 64 tiles in both dims; rows of 16-byte multiples in X and Y (TMA both ways)
M, N = 72, 144


def reduce_source(dt, adt, axis, op, space, bm=32, bn=64, threads=128, pre=False, trips=0, from_local=False):
    """A kernel whose block (bx, by) reduces its [bm, bn] tile of X into Y: row
    results at Y[bx, by * bm ...] (axis 1), column results at Y[by, bx * bn ...].
    `pre`: a parallel rewrites the tile before the reduce (floats negated, integers
    halved as C++ divides); `trips` > 0: load, reduce and store `trips` times in a
    loop (each trip's load over the tile the last reduce read, its reduce over the
    result the last TMA store may still be reading). `from_local`: a parallel
    copies the tile (rewritten as `pre` says) into a local tile `e`, and the
    reduce reads that."""
    ydims, ext, origin = (("NB, M", "BM", "bx, by * BM") if axis == 1 else ("MB, N", "BN", "by, bx * BN"))
    src = REDUCE.format(dt=dt, adt=adt, axis=axis, op=op, space=space, bm=bm, bn=bn, ydims=ydims, ext=ext,
                        origin=origin).replace("threads 128;", f"threads {threads};")
    change = ("-s[i, j]" if dt in FLOATS else "s[i, j] / 2") if pre else "s[i, j]"
    if from_local:
        src = src.replace("    reduce(s,", f"    parallel (i, j) in (BM, BN) {{\n        e[i, j] = {change};\n    }}\n"
                                          "    reduce(e,")
        src = src.replace(f"    {space} r:", f"    local e: {dt}[BM, BN];\n    {space} r:")
    elif pre:
        src = src.replace("    reduce(", f"    parallel (i, j) in (BM, BN) {{\n        s[i, j] = {change};\n    }}\n"
                                         "    reduce(")
    if trips:
        head, rest = src.split("    copy(X", 1)
        body, tail = rest.rsplit("}", 1)
        src = head + f"    for t in range({trips}) {{\n" + "".join(
            "    " + line + "\n" for line in ("    copy(X" + body).rstrip("\n").split("\n")) + "    }\n}" + tail
    return src


def np_dtype(dt):
    if dt == "bf16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(NP[dt])


def make_input(shape, dt, rng):
    """Integers over the whole i32 range (sums wrap), small ones for i8; normal floats."""
    if dt == "i32":
        return rng.integers(-2**31, 2**31, shape).astype(np.int32)
    if dt == "i8":
        return rng.integers(-128, 128, shape).astype(np.int8)
    return rng.standard_normal(shape).astype(np.float32).astype(np_dtype(dt))


def output_shape(x_shape, axis, bm=32, bn=64):
    m, n = x_shape
    return (-(-n // bn), m) if axis == 1 else (-(-m // bm), n)


def lanes_of(space, axis, bm=32, bn=64, threads=128):
    """Threads per result (docs/language.md, reduce): a power of two <= threads over
    results, <= the elements walked; 1 for a local result."""
    results, walk = (bm, bn) if axis == 1 else (bn, bm)
    if space != "shared":
        return 1
    return max(g for g in (1 << i for i in range(11)) if g == 1 or (g <= threads // results and g <= walk))


def local_holders(axis, bm, bn, threads):
    """For a local [bm, bn] tile (element (i, j) on thread (i * bn + j) % threads,
    docs/language.md §5), each result's lanes grouped by warp: [result][warp] ->
    the positions k along the reduced axis that each of the warp's holding threads
    has, threads in increasing order, positions in increasing order."""
    results, walk = (bm, bn) if axis == 1 else (bn, bm)
    out = []
    for r in range(results):
        held = {}
        for k in range(walk):
            i, j = (r, k) if axis == 1 else (k, r)
            held.setdefault((i * bn + j) % threads, []).append(k)
        warps = {}
        for t in sorted(held):
            warps.setdefault(t // 32, []).append(held[t])
        out.append([warps[w] for w in sorted(warps)])
    return out


def local_spreads_evenly(bm, bn, threads):
    """docs/language.md's rule for reducing a local tile: rows of bn elements lie
    evenly on the threads (bn a multiple of threads, or a divisor of threads that
    divides 32 or is a multiple of 32, with bm * bn a multiple of threads)."""
    return bn % threads == 0 or (threads % bn == 0 and (32 % bn == 0 or bn % 32 == 0) and bm * bn % threads == 0)


def halves(part, add):
    """A warp's lanes combined as the shuffles do: lane g takes lane g + h's, h = n / 2 ... 1."""
    assert len(part) & (len(part) - 1) == 0, len(part)
    while len(part) > 1:
        h = len(part) // 2
        part = [add(part[i], part[i + h]) for i in range(h)]
    return part[0]


def reference(x, dt, adt, axis, op, bm=32, bn=64, space="local", threads=128, pre=False,
              from_local=False):
    """What the kernel computes, from numpy alone: X zero-padded to whole tiles (TMA's
    fill past the edges), each tile reduced along `axis`; float sums accumulated in
    the CUDA's order in float, or double with an f64 side (np.add.accumulate runs left
    to right: lane g of lanes_of(...) over elements g, g + lanes, ..., then each
    warp's lanes' sums added in halves, lane g + h's into lane g, then the warps' sums
    in order); integer sums exact (Python ints),
    then wrapped to the result type; maxima and minima exact. `pre`: the tile
    rewritten first as reduce_source's parallel does. Returns the output array,
    clipped to its shape."""
    m, n = x.shape
    mb, nb = -(-m // bm), -(-n // bn)
    if dt in FLOATS:
        acc_t = np.float64 if "f64" in (dt, adt) else np.float32
        xp = np.zeros((mb * bm, nb * bn), acc_t)
        xp[:m, :n] = x.astype(np.float32).astype(acc_t) if dt == "bf16" else x.astype(acc_t)
    else:
        xp = np.zeros((mb * bm, nb * bn), np.int64)
        xp[:m, :n] = x
    if pre:                                             # reduce_source's parallel, over the padding too
        xp = -xp if dt in FLOATS else np.where(xp < 0, -(-xp // 2), xp // 2)
    tiles = xp.reshape(mb, bm, nb, bn)                  # [by, i, bx, j]
    if axis == 1:
        lanes = tiles.transpose(2, 0, 1, 3).reshape(nb, mb * bm, bn)      # [bx, row, j]
    else:
        lanes = tiles.transpose(0, 2, 3, 1).reshape(mb, nb * bn, bm)      # [by, column, i]
    if op in ("max", "min"):
        out = lanes.max(axis=-1) if op == "max" else lanes.min(axis=-1)
    elif dt in FLOATS and from_local:             # each lane's elements where the tile holds them
        per_tile = lanes.reshape(lanes.shape[0], -1, bm if axis == 1 else bn, lanes.shape[-1])   # [.., tile, r, k]
        out = np.stack([np.add.accumulate(np.stack([
            halves([np.add.accumulate(per_tile[..., r, ks], axis=-1)[..., -1] for ks in warp], np.add)
            for warp in warps]), axis=0)[-1] for r, warps in enumerate(local_holders(axis, bm, bn, threads))],
            axis=-1).reshape(lanes.shape[:2])
    elif dt in FLOATS:
        g = lanes_of(space, axis, bm, bn, threads)
        parts = [np.add.accumulate(lanes[..., i::g], axis=-1)[..., -1] for i in range(g)]
        warps = [halves(parts[w:w + 32], np.add) for w in range(0, g, 32)]     # each warp's lanes in halves
        out = np.add.accumulate(np.stack(warps), axis=0)[-1]     # then the warps in order
    else:
        out = np.array([[sum(int(v) for v in lane) % 2**64 for lane in row] for row in lanes], np.uint64)
    out = out[:, :m] if axis == 1 else out[:, :n]
    if adt == "bf16" or adt == "f16":
        return out.astype(np.float32).astype(np_dtype(adt))
    return out.astype(np_dtype(adt))


def same_bits(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@contextlib.contextmanager
def no_fallback():
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        yield


@contextlib.contextmanager
def falling_back():
    """An argument TMA cannot describe: the thread-copy variant runs (its warning comes
    once per kernel name and reason, so it is not asserted here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.TmaFallbackWarning)
        yield


def run_interpreted(src, x, out_shape, adt, fallback=False):
    k = tilec.compile(src, backend="interpret")
    y = guarded(out_shape, np_dtype(adt), like="numpy")
    if fallback:
        k.fallback(x, y.view)
    else:
        with no_fallback():
            k(x, y.view)
    y.check()
    return y.view


# ---------------------------------------------------------------- the interpreter against numpy

@pytest.mark.parametrize("space", ["shared", "local"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dt, adt", DTYPES, ids=lambda v: v)
def test_reduce_matches_numpy(dt, adt, op, axis, space):
    x = make_input((M, N), dt, np.random.default_rng(zlib.crc32(f"{dt} {adt} {op} {axis}".encode())))
    got = run_interpreted(reduce_source(dt, adt, axis, op, space), x, output_shape(x.shape, axis), adt)
    assert same_bits(got, reference(x, dt, adt, axis, op, space=space))


SIZES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i32": 4}


@st.composite
def reduce_case(draw):
    """(dt, adt, axis, op, space, bm, bn, threads, M, N, pre, trips, from_local): a tile and a block size
    TMA and the language take (16-byte inner boxes, at most 256 elements a box
    dim, 48 KiB of tile), a shared result's box a 16-byte multiple too; M and N
    ragged against the tile, their rows whole 16-byte granules; reduce_source's
    `pre` and `trips` (the barriers a parallel and a loop around it need), and
    `from_local` where the language takes it."""
    dt, adt = draw(st.sampled_from(DTYPES))
    axis, op, space = draw(st.sampled_from([0, 1])), draw(st.sampled_from(["sum", "max", "min"])), \
        draw(st.sampled_from(["shared", "local"]))
    threads = draw(st.sampled_from([32, 64, 128, 256, 512]))
    per = 16 // SIZES[dt]
    bn = draw(st.sampled_from([per * i for i in (1, 2, 3, 4, 8, 16) if per * i <= 256]))
    bm = draw(st.sampled_from([b for b in (1, 2, 3, 4, 8, 16, 24, 32, 48, 64, 100, 128, 256)
                               if b * bn * SIZES[dt] <= 48 * 1024]))
    if draw(st.integers(0, 3)) == 0:                  # few rows, many threads: lanes over several warps
        threads, axis, space = draw(st.sampled_from([256, 512])), 1, "shared"
        bn = draw(st.sampled_from([b for b in (64, 128, 256) if b % per == 0]))
        bm = draw(st.sampled_from([16 // SIZES[adt], 32 // SIZES[adt]]))     # a 16-byte box of results
    ext = bm if axis == 1 else bn
    if space == "shared" and ext * SIZES[adt] % 16:
        space = "local"                               # a shared result goes out by TMA: 16-byte boxes
    quantum = 16                                      # rows of X and Y in whole granules for every dtype
    m = draw(st.integers(1, 3 * bm // quantum + 2)) * quantum
    n = draw(st.integers(1, 3 * bn // quantum + 2)) * quantum
    # the tile reduced from a local copy where its rows lie evenly on the threads (and it takes few registers)
    from_local = local_spreads_evenly(bm, bn, threads) and bm * bn <= 64 * threads and draw(st.booleans())
    return (dt, adt, axis, op, space, bm, bn, threads, m, n, draw(st.booleans()), draw(st.sampled_from([0, 0, 1, 2])),
            from_local)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(reduce_case(), st.integers(0, 2**32 - 1))
def test_reduce_any_tile_and_block_matches_numpy(case, data_seed):
    """Any tile shape, thread count, dtype pair, axis, op and result space: the
    interpreter against the reference, bit for bit (the lanes rule included)."""
    dt, adt, axis, op, space, bm, bn, threads, m, n, pre, trips, from_local = case
    x = make_input((m, n), dt, np.random.default_rng(data_seed))
    src = reduce_source(dt, adt, axis, op, space, bm, bn, threads, pre, trips, from_local)
    got = run_interpreted(src, x, output_shape(x.shape, axis, bm, bn), adt)
    assert same_bits(got, reference(x, dt, adt, axis, op, bm, bn, space, threads, pre, from_local)), (case, src)


@pytest.mark.parametrize("space, want", [("local", 2.0 ** 24), ("shared", 2.0 ** 24 + 48)])
def test_a_shared_result_sums_in_lanes(space, want):
    """Rows of 2^24 then 63 ones: one thread walking the row loses every 1 (2^24 + 1
    rounds back to 2^24). A shared result's row is split over 4 lanes (128 threads,
    32 results): lane 0 still loses its 15 ones, lanes 1-3 sum 16 each, and the
    halves give 2^24 + 16 + 32."""
    assert lanes_of(space, 1) == (4 if space == "shared" else 1)
    x = np.ones((M, N), np.float32)
    x[:, ::64] = 2.0 ** 24
    got = run_interpreted(reduce_source("f32", "f32", 1, "sum", space), x, output_shape(x.shape, 1), "f32")
    assert got[0, 0] == want and got[1, 40] == want
    assert same_bits(got, reference(x, "f32", "f32", 1, "sum", space=space))


def test_integer_sums_wrap_like_the_result_type():
    """i32 values near the top of the range: the exact sum overflows, the result
    wraps modulo 2^32 (an unsigned 64-bit accumulator, then the conversion)."""
    x = np.full((M, N), 2**31 - 1, np.int32)
    got = run_interpreted(reduce_source("i32", "i32", 1, "sum", "local"), x, output_shape(x.shape, 1), "i32")
    full = (64 * (2**31 - 1)) % 2**32                       # 64 columns of a full tile
    assert got[0, 0] == np.uint32(full).astype(np.int32)
    assert got[2, 0] == np.uint32((16 * (2**31 - 1)) % 2**32).astype(np.int32)    # 16 columns of the last tile


def test_max_of_a_tile_row_includes_the_zeros_past_the_edge():
    """Past N, TMA reads zeros, and they take part (the example masks them)."""
    x = -np.ones((M, N), np.float32)
    got = run_interpreted(reduce_source("f32", "f32", 1, "max", "shared"), x, output_shape(x.shape, 1), "f32")
    assert (got[:2] == -1).all() and (got[2] == 0).all()


NAN_ROWS = 6


def nan_input():
    """Rows 0-5 of a [M, N] f32 input with NaNs and zeros placed for max and min: row 0
    no NaN, row 1 one at its first element, row 2 at its third, row 3 at every element,
    row 4 at its first and with a larger and a smaller element after it, row 5 -0 and
    +0 in turn; other rows plain."""
    x = np.arange(M * N, dtype=np.float32).reshape(M, N) % 7 - 3
    x[1, 0] = x[2, 2] = x[4, 0] = np.nan
    x[3, :] = np.nan
    x[4, 5], x[4, 6] = 100.0, -100.0
    x[5, :] = np.where(np.arange(N) % 2 == 0, np.float32(-0.0), np.float32(0.0))
    return x


def nan_expectation(x, op):
    """Row results of the first column tile (64 elements), as fmaxf / fminf combine
    them (IEEE 754-2019 maximumNumber / minimumNumber, so any order gives these bits):
    NaNs are skipped, a row of NaNs gives the canonical NaN (0x7fffffff), and +0 is
    the maximum of a row of zeros holding one, -0 the minimum of one holding that."""
    tile = x[:NAN_ROWS, :64]
    skip = np.float32(-np.inf if op == "max" else np.inf)
    plain = getattr(np.where(np.isnan(tile), skip, tile), op)(axis=1)
    zero = np.float32(0.0) if op == "max" else np.float32(-0.0)
    has = ((tile == 0) & (np.signbit(tile) == np.signbit(zero))).any(axis=1)
    plain = np.where((plain == 0) & has, zero, plain)
    return np.where(np.isnan(tile).all(axis=1), np.uint32(0x7FFFFFFF).view(np.float32), plain)


@pytest.mark.parametrize("space", ["local", "shared"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_nans_are_skipped_and_plus_zero_is_above_minus_zero(op, space):
    x = nan_input()
    got = run_interpreted(reduce_source("f32", "f32", 1, op, space), x, output_shape(x.shape, 1), "f32")
    assert same_bits(got[0, :NAN_ROWS], nan_expectation(x, op)), got[0, :NAN_ROWS]


@pytest.mark.parametrize("axis", [0, 1])
def test_fallback_variant(axis):
    """Rows of 133 floats are not 16-byte multiples: the thread-copy variant, same results."""
    x = make_input((70, 133), "f32", np.random.default_rng(5))
    src = reduce_source("f32", "f32", axis, "sum", "local")
    k = tilec.compile(src, backend="interpret")
    y = guarded(output_shape(x.shape, axis), np.float32, like="numpy")
    with falling_back():
        k(x, y.view)
    y.check()
    assert same_bits(y.view, reference(x, "f32", "f32", axis, "sum"))
    assert same_bits(run_interpreted(src, x, output_shape(x.shape, axis), "f32", fallback=True),
                     reference(x, "f32", "f32", axis, "sum"))


def test_more_results_than_threads():
    """256 rows, 128 threads: each thread reduces two rows (register slots 0 and 1)."""
    x = make_input((300, 64), "f32", np.random.default_rng(6))
    src = reduce_source("f32", "f32", 1, "max", "local", bm=256, bn=32)
    got = run_interpreted(src, x, output_shape(x.shape, 1, 256, 32), "f32")
    assert same_bits(got, reference(x, "f32", "f32", 1, "max", 256, 32))


# a local tile's four ways of lying on the threads (docs/language.md, reduce): (bm, bn, threads)
LOCAL_SPREADS = {
    "rows-on-all-threads": (4, 256, 128),      # a row on every thread, 2 elements each; a column on one thread
    "rows-on-warps": (4, 64, 128),             # a row on 2 warps, one element a thread; a column on 2 warps
    "rows-on-a-warp": (4, 32, 64),             # a row on a warp; a column on 2 warps, 2 elements a thread
    "rows-in-a-warp": (16, 16, 128),           # a row on 16 lanes of a warp; a column on 8 threads, 2 a warp
}


@pytest.mark.parametrize("spread", LOCAL_SPREADS)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dt, adt", [("f32", "f32"), ("f16", "f32"), ("f64", "f64"), ("i8", "i32")], ids=str)
@pytest.mark.parametrize("space", ["shared", "local"])
def test_reduce_of_a_local_tile_matches_numpy(spread, axis, op, dt, adt, space):
    """A local tile reduced where its elements are: each lane (a thread holding part of the
    row or column) walks its elements in order, the lanes of a warp combine in halves,
    then the warps in order; the reference derives the lanes from §5's layout alone."""
    bm, bn, threads = LOCAL_SPREADS[spread]
    if space == "shared" and (bm if axis == 1 else bn) * SIZES[adt] % 16:
        pytest.skip("a shared result goes out by TMA: a 16-byte box")
    x = make_input((bm + 16, 2 * bn), dt, np.random.default_rng(zlib.crc32(f"{spread} {axis} {op} {dt}".encode())))
    src = reduce_source(dt, adt, axis, op, space, bm, bn, threads, pre=True, from_local=True)
    got = run_interpreted(src, x, output_shape(x.shape, axis, bm, bn), adt)
    assert same_bits(got, reference(x, dt, adt, axis, op, bm, bn, space, threads, pre=True, from_local=True))


def test_a_local_tile_sums_in_its_lanes():
    """Rows of 2^24 then 255 ones, 128 threads: each thread holds two elements of a row
    (columns t and t + 128) and adds them first, so lane 0 keeps 2^24 (its 1 rounds
    away) and every other lane has 2; the halves and the 4 warps give 2^24 + 254, where
    one thread walking the row gives 2^24 and the shared tile's 4 lanes 2^24 + 192."""
    x = np.ones((4, 256), np.float32)
    x[:, 0] = 2.0 ** 24
    for from_local, want in ((True, 2.0 ** 24 + 254), (False, 2.0 ** 24)):
        src = reduce_source("f32", "f32", 1, "sum", "local", 4, 256, 128, from_local=from_local)
        got = run_interpreted(src, x, output_shape(x.shape, 1, 4, 256), "f32")
        assert (got == want).all(), (from_local, got)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.sampled_from([1, 2, 3, 4, 8, 12, 16, 24, 64]), st.sampled_from([1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128,
                                                                            256, 384, 512, 640]),
       st.sampled_from([32, 64, 96, 128, 256, 384, 512]), st.sampled_from([0, 1]))
def test_which_local_tiles_reduce(bm, bn, threads, axis):
    """A local tile reduces exactly where its rows lie evenly on the threads (the rule
    the docs state); elsewhere the error names the tile at its argument."""
    assume(bm * bn <= 255 * threads)                    # a thread's registers (another error)
    src = f"""kernel k(Y: f32[N]) {{
    grid (bx) = (1);
    threads {threads};
    local e: f32[{bm}, {bn}];
    local r: f32[{bn if axis == 0 else bm}];
    fill(e, 1.0);
    reduce(e, r, axis = {axis}, op = sum);
    copy(r, Y[0]);
}}"""
    if local_spreads_evenly(bm, bn, threads):
        assert f"reduce e -> r, axis {axis}, op sum" in tilec.compile(src, backend="interpret").ir("plan-smem")
    else:
        with pytest.raises(tilec.TilecError, match=r"^<string>:7:12: error: reduce cannot read the local tile 'e'"):
            tilec.compile(src, backend="interpret")


ACC_REDUCE = """
kernel accred(A: f16[M, K], B: f16[K, N], C: f32[M, N], Y: f32[{ydims}]) {{
    const BM = {bm}, BN = {bn};
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads {threads};
    shared a: f16[BM, 64];
    shared b: f16[64, BN];
    local acc: f32[BM, BN];
    local d: f32[BM, BN];
    {space} r: f32[{ext}];
    fill(acc, 0.0);
    for k in range(cdiv(K, 64)) {{
        copy(A[by * BM, k * 64], a);
        copy(B[k * 64, bx * BN], b);
        gemm(a, b, acc);
    }}
    parallel (i, j) in (BM, BN) {{
        d[i, j] = acc[i, j] * 0.3 + 0.1;      // beside acc: its layout; one fused multiply-add
    }}
    reduce({tile}, r, axis = {axis}, op = {op});
    copy(acc, C[by * BM, bx * BN]);
    copy(r, Y[{origin}]);
}}
"""
# accumulator layouts (bm, bn, threads): one warpgroup; two over M; two over N (64 rows); three over M;
# two m64 tiles a warpgroup; a swapped gemm (16 rows: fragments of acc^T); split unevenly over N (40
# columns: 24 + 16 over two warpgroups, 16 + 16 + 8 over three; the last one's registers past N hold none);
# rows padded to m64 tiles (neither side a multiple of 64: 32 rows of 64, 96 of 128 over two warpgroups, 40
# rows of 64 split unevenly over N; the registers past M hold none); N padded, swapped (8 rows: acc^T's 40 of
# 64 rows, 200 of 256 over two warpgroups)
ACC_LAYOUTS = {"wg1": (64, 128, 128), "wg2-rows": (128, 128, 256), "wg2-cols": (64, 128, 256),
               "wg3": (192, 64, 384), "mt2": (256, 64, 256), "swapped": (16, 128, 128),
               "uneven2": (64, 40, 256), "uneven3": (64, 40, 384),
               "padded": (32, 72, 128), "padded2": (96, 136, 256), "padded-uneven": (40, 136, 256),
               "swapped-padded": (8, 40, 128), "swapped-padded2": (8, 200, 256),
               "swapped-padded-uneven": (40, 40, 256)}
ACC_REDUCES = [(layout, axis) for layout in ACC_LAYOUTS for axis in (0, 1)]


def acc_reduce_source(layout, axis, op, tile="acc", space="shared"):
    bm, bn, threads = ACC_LAYOUTS[layout]
    ydims, ext, origin = ("NB, M", "BM", "bx, by * BM") if axis == 1 else ("MB, N", "BN", "by, bx * BN")
    return ACC_REDUCE.format(bm=bm, bn=bn, threads=threads, ydims=ydims, ext=ext, origin=origin, space=space,
                             tile=tile, axis=axis, op=op)


def acc_reduce_inputs(layout, axis, seed):
    """Small-integer operands (every product and sum exact, as on the GPU), A a few rows
    and B a few columns past whole tiles; the output's shape."""
    bm, bn, _ = ACC_LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    m, n, k = 2 * bm + 8, 2 * bn + 8, 136
    a = rng.integers(-3, 4, (m, k)).astype(np.float16)
    b = rng.integers(-3, 4, (k, n)).astype(np.float16)
    y_shape = (-(-n // bn), m) if axis == 1 else (-(-m // bm), n)
    return a, b, (m, n), y_shape


def acc_reduce_reference(a, b, layout, axis, op, tile, magnitude=False):
    """numpy: the product (exact), d = fl(acc * 0.3 + 0.1) with one rounding (a fused
    multiply-add, in f64 then rounded: exact for these magnitudes), padded as the
    tiles are (acc 0, d 0.1 past the edges), reduced per tile; sums in float64 and
    rounded once (the kernel's order differs: compare sums with a tolerance); `magnitude`:
    the sums of the terms' magnitudes (what bounds that tolerance)."""
    bm, bn, _ = ACC_LAYOUTS[layout]
    prod = a.astype(np.float64) @ b.astype(np.float64)
    m, n = prod.shape
    mp, np_ = -(-m // bm) * bm, -(-n // bn) * bn
    full = np.zeros((mp, np_))
    full[:m, :n] = prod
    if tile == "d":
        full = (full * np.float64(np.float32(0.3)) + np.float64(np.float32(0.1))).astype(np.float32).astype(np.float64)
    if magnitude:
        full = np.abs(full)
    if axis == 1:
        t = full.reshape(mp, np_ // bn, bn)
        out = (t.max(-1) if op == "max" else t.sum(-1)).T[:, :m]
    else:
        t = full.reshape(mp // bm, bm, np_)
        out = (t.max(1) if op == "max" else t.sum(1))[:, :n]
    return out.astype(np.float32)


@pytest.mark.parametrize("layout, axis", ACC_REDUCES)
@pytest.mark.parametrize("op", ["max", "sum"])
@pytest.mark.parametrize("tile, space", [("acc", "shared"), ("d", "shared"), ("acc", "local")])
def test_reduce_of_the_accumulator_matches_numpy(layout, axis, op, tile, space):
    """The accumulator (and a tile beside it, in its layout) reduced in its fragments, in
    every layout a gemm gives it: exact maxima; sums within a few float32 roundings."""
    a, b, c_shape, y_shape = acc_reduce_inputs(layout, axis, zlib.crc32(f"{layout} {axis} {op}".encode()))
    src = acc_reduce_source(layout, axis, op, tile, space)
    k = tilec.compile(src, backend="interpret")
    c, y = guarded(c_shape, np.float32, like="numpy"), guarded(y_shape, np.float32, like="numpy")
    with falling_back():                            # Y's rows need not be whole 16-byte granules
        k(a, b, c.view, y.view)
    c.check()
    y.check()
    assert_reduced(y.view, a, b, layout, axis, op, tile)


def assert_reduced(y, a, b, layout, axis, op, tile):
    """y against acc_reduce_reference: exact for maxima and the integer acc; sums of d,
    whose f32 additions run in another order, within ~16 roundings of the terms'
    magnitudes (a term dropped or added twice is at least 0.1 off)."""
    want = acc_reduce_reference(a, b, layout, axis, op, tile)
    if op == "max" or tile == "acc":                # integers: every order gives the same bits
        np.testing.assert_array_equal(y, want)
    else:
        mag = acc_reduce_reference(a, b, layout, axis, op, tile, magnitude=True)
        np.testing.assert_array_less(np.abs(y - want), 1e-6 * mag + 1e-5)


def gemm_with_row_maxima():
    """examples/gemm.tile whose epilogue also writes each row's maximum of its tile:
    R[bx, row] (the accumulator reduced in its fragments, after the store of C)."""
    src = (EXAMPLES / "gemm.tile").read_text()
    for old, new in (("kernel gemm(A: f16[M, K], B: f16[K, N], C: f16[M, N]) {",
                      "kernel gemm(A: f16[M, K], B: f16[K, N], C: f16[M, N], R: f32[NB, M]) {"),
                     ("    local acc: f32[BM, BN];\n", "    local acc: f32[BM, BN];\n    shared rowmax: f32[BM];\n"),
                     ("    copy(acc, C[by * BM, bx * BN]);    // converts f32 -> f16\n",
                      "    copy(acc, C[by * BM, bx * BN]);    // converts f32 -> f16\n"
                      "    reduce(acc, rowmax, axis = 1, op = max);\n    copy(rowmax, R[bx, by * BM]);\n")):
        assert src.count(old) == 1, old
        src = src.replace(old, new)
    return src


# gemm.tile's schedules with an epilogue: plain, persistent, stream-K (a tile's K split over blocks, the
# finisher adding the partial sums before the epilogue), swapped (16 rows: acc^T)
ROW_MAXIMA_CASES = {"plain": (dict(BM=128, BN=128, PERSISTENT=0), (300, 520, 200)),
                    "persistent": (dict(BM=128, BN=256, PERSISTENT=1), (300, 520, 200)),
                    "stream-k": (dict(BM=128, BN=128, PERSISTENT=1, STREAM_K=1), (300, 520, 2048)),
                    "swapped": (dict(BM=16, BN=128, PERSISTENT=0), (40, 300, 136))}


def row_maxima_case(name, seed):
    consts, (m, n, k) = ROW_MAXIMA_CASES[name]
    rng = np.random.default_rng(seed)
    a = rng.integers(-3, 4, (m, k)).astype(np.float16)
    b = rng.integers(-3, 4, (k, n)).astype(np.float16)
    bm, bn = consts["BM"], consts["BN"]
    prod = a.astype(np.float64) @ b.astype(np.float64)
    padded = np.zeros((-(-m // bm) * bm, -(-n // bn) * bn))
    padded[:m, :n] = prod
    want = padded.reshape(padded.shape[0], -1, bn).max(-1).T[:, :m].astype(np.float32)
    return consts, a, b, prod.astype(np.float16), want


@pytest.mark.parametrize("name", ROW_MAXIMA_CASES)
def test_row_maxima_in_gemm_epilogues(name):
    """The reduce runs where the epilogue does: after stream-K's finisher has added the
    partial tiles, in the swapped layout, in a persistent loop over tiles."""
    consts, a, b, c_want, want = row_maxima_case(name, 7)
    k = tilec.compile(gemm_with_row_maxima(), backend="interpret", tune=False, **consts)
    c, r = guarded(c_want.shape, np.float16, like="numpy"), guarded(want.shape, np.float32, like="numpy")
    with falling_back():
        k(a, b, c.view, r.view)
    c.check()
    r.check()
    np.testing.assert_array_equal(c.view, c_want)
    np.testing.assert_array_equal(r.view, want)


def test_reduce_of_the_accumulator_follows_its_fragments():
    """ir.fragment_element against wgmma's m64nNk16 D-fragment layout as PTX's ISA
    states it (warp w of the warpgroup, lane l, register r: row 16 w + l / 4 + 8 (r / 2
    % 2), column 8 (r / 4) + 2 (l % 4) + r % 2), for one warpgroup's 64 x 128 tile;
    and the lanes a row reduce walks: a quad's 4 threads, each its columns in order."""
    lowered = lower(acc_reduce_source("wg1", 1, "sum"), arch="sm_90a").kernel
    acc = lowered.buffer("acc")
    for t in range(128):
        w, lane = t // 32, t % 32
        for r in range(64):
            assert ir.fragment_element(acc, 128, t, r) == (16 * w + lane // 4 + 8 * (r // 2 % 2),
                                                            8 * (r // 4) + 2 * (lane % 4) + r % 2)
    red = next(s for s in ir.walk_stmts(lowered.body) if isinstance(s, ir.Reduce))
    lanes = ir.reduce_lanes(lowered, red)
    assert lanes[9] == [[tuple(c for c in range(128) if c % 8 // 2 == q) for q in range(4)]]


SWIZZLED = """
kernel gr(A: f16[M, K], B: f16[K, N], C: f32[M, N], R: f32[NB, M]) {
    grid (bx, by) = (cdiv(N, 64), cdiv(M, 64));
    threads 128;
    shared a: f16[64, 64];
    shared b: f16[64, 64];
    local acc: f32[64, 64];
    shared r: f32[64];
    fill(acc, 0.0);
    copy(A[by * 64, 0], a);
    copy(B[0, bx * 64], b);
    gemm(a, b, acc);
    reduce(a, r, axis = 1, op = sum);
    copy(acc, C[by * 64, bx * 64]);
    copy(r, R[bx, by * 64]);
}
"""


def test_reduce_of_a_swizzled_gemm_operand():
    """A gemm operand is 128-byte swizzled (layout sw128): reduce reads it through
    codegen's tl_sw128, and the interpreter through the bytes TMA swizzled."""
    lw = lower(SWIZZLED)
    assert lw.kernel.buffer("a").layout == "sw128"
    assert "tl_sw128(tl_i0, tl_k, 64, 64)" in tilec.compile(SWIZZLED, backend="interpret").cuda_source
    rng = np.random.default_rng(7)
    a = make_input((100, 64), "f16", rng)
    b = make_input((64, 72), "f16", rng)
    c = guarded((100, 72), np.float32, like="numpy")
    r = guarded((2, 100), np.float32, like="numpy")
    with no_fallback():
        tilec.compile(SWIZZLED, backend="interpret")(a, b, c.view, r.view)
    c.check()
    r.check()
    assert same_bits(r.view, np.stack([reference(a, "f16", "f32", 1, "sum", 64, 64, "shared")[0]] * 2))


# ---------------------------------------------------------------- the example

def rowsum_reference(x):
    return x.astype(np.float64).sum(axis=1), x.max(axis=1)


@pytest.mark.parametrize("shape", [(300, 200), (1, 4), (129, 64), (70, 1000)])
def test_rowsum_example(shape):
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(shape) - 4).astype(np.float32)     # negative rows: zeros past N would show
    k = tilec.compile(EXAMPLES / "rowsum.tile", backend="interpret")
    sums, maxes = guarded(shape[:1], np.float32, like="numpy"), guarded(shape[:1], np.float32, like="numpy")
    with no_fallback():
        k(x, sums.view, maxes.view)
    sums.check()
    maxes.check()
    want_sum, want_max = rowsum_reference(x)
    np.testing.assert_allclose(sums.view, want_sum, rtol=1e-4, atol=1e-3)
    assert np.array_equal(maxes.view, want_max)


def test_rowsum_example_fallback():
    x = (np.random.default_rng(9).standard_normal((77, 301)) - 4).astype(np.float32)
    sums, maxes = guarded((77,), np.float32, like="numpy"), guarded((77,), np.float32, like="numpy")
    with falling_back():
        tilec.compile(EXAMPLES / "rowsum.tile", backend="interpret")(x, sums.view, maxes.view)
    sums.check()
    maxes.check()
    want_sum, want_max = rowsum_reference(x)
    np.testing.assert_allclose(sums.view, want_sum, rtol=1e-4, atol=1e-3)
    assert np.array_equal(maxes.view, want_max)


SOFTMAX = ROOT / "tests" / "softmax.tile"


def softmax_reference(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("shape, consts", [((10, 1000), {}), ((5, 3000), dict(BN=256)), ((3, 1), {}),
                                           ((9, 600), dict(BM=8, BN=128, THREADS=128)), ((2, 5000), dict(BM=1)),
                                           ((5, 700), dict(BM=2, BN=1024, THREADS=32))])
def test_softmax_program(shape, consts):
    """tests/softmax.tile (a running maximum and rescaled sum over column tiles, then
    a second pass): against numpy within f16 rounding, rows that span several tiles
    and a partial last one included; then in place (Y is X: the second pass writes
    each tile where it reads it)."""
    x = (np.random.default_rng(shape[1]).standard_normal(shape) * 4).astype(np.float16)
    k = tilec.compile(SOFTMAX, backend="interpret", **consts)
    y = guarded(shape, np.float16, like="numpy")
    tma = no_fallback if shape[1] % 8 == 0 else falling_back        # rows of 16-byte multiples: TMA
    with tma():
        k(x, y.view)
    y.check()
    want = softmax_reference(x)
    np.testing.assert_allclose(y.view.astype(np.float64), want, rtol=2e-3, atol=1e-5)
    np.testing.assert_allclose(y.view.astype(np.float64).sum(axis=1), 1.0, rtol=2e-3)
    z = guarded(shape, np.float16, like="numpy", fill=x)
    with tma():
        k(z.view, z.view)
    z.check()
    assert np.array_equal(z.view, y.view)


# ---------------------------------------------------------------- effects and barriers

HAZARDS = """
kernel h(X: f32[M, N], Y: f32[NB, M]) {
    grid (bx, by) = (cdiv(N, 64), cdiv(M, 32));
    threads 128;
    shared s: f32[32, 64];
    shared r: f32[32];
    copy(X[by * 32, bx * 64], s);
    reduce(s, r, axis = 1, op = sum);
    parallel (i, j) in (32, 64) {
        s[i, j] = s[i, j] + 1.0;
    }
    reduce(s, r, axis = 1, op = max);
    copy(r, Y[bx, by * 32]);
}
"""


def test_effects_of_reduce():
    k = lower(HAZARDS).kernel
    red = [s for s in k.body if isinstance(s, ir.Reduce)]
    assert [(s.axis, s.op) for s in red] == [(1, "sum"), (1, "max")]
    assert effects.of(k, red[0]) == effects.Effects(frozenset({"s"}), frozenset({"r"}))
    assert effects.shared_accesses(k, red[0]) == ({"s"}, {"r"})


def test_barriers_around_reduce_come_from_its_effects():
    """After a TMA load, the mbarrier wait; after a parallel that wrote s, a block
    barrier; before the TMA store of its shared result, a proxy fence and a block
    barrier (insert-barriers has no rule of its own for reduce)."""
    body = lower(HAZARDS).kernel.body
    at = [i for i, s in enumerate(body) if isinstance(s, ir.Reduce)]
    assert isinstance(body[at[0] - 1], ir.MbarrierWait)
    assert isinstance(body[at[1] - 1], ir.SyncThreads) and isinstance(body[at[1] - 2], ir.Parallel)
    assert [type(s) for s in body[at[1] + 1:at[1] + 4]] == [ir.ProxyFence, ir.SyncThreads, ir.OneThread]
    assert isinstance(body[at[1] + 3].body[0], ir.TmaStore) and body[at[1] + 3].body[0].buffer == "r"


def test_check_barriers_catches_a_missing_barrier_before_reduce():
    """check-barriers reads reduce's effects too: without the proxy fence and block
    barrier between reduce's writes of r and the TMA store of r, it refuses the kernel."""
    from dataclasses import replace
    from tilec.passes import Options, check_barriers
    k = lower(HAZARDS).stages["insert-barriers"]
    body = list(k.body)
    i = next(i for i, s in enumerate(body) if isinstance(s, ir.Reduce) and s.op == "max")
    fence = i + 1
    assert isinstance(body[fence], ir.ProxyFence)
    del body[fence:fence + 2]                           # the fence and barrier before the TMA store of r
    with pytest.raises(check_barriers.BarrierBug, match="TMA store of 'r', which threads wrote"):
        check_barriers.run(replace(k, body=tuple(body)), Options())


# ---------------------------------------------------------------- NVRTC

@pytest.mark.parametrize("dt, adt, axis, op, space", [
    ("f32", "f32", 1, "sum", "shared"), ("f16", "f16", 0, "max", "local"), ("bf16", "f32", 1, "sum", "local"),
    ("f64", "f64", 0, "sum", "shared"), ("i8", "i32", 1, "sum", "local"), ("i32", "i32", 0, "max", "shared"),
    ("f16", "f32", 1, "min", "local"), ("i8", "i8", 0, "min", "shared"),
])
def test_cuda_compiles_with_an_empty_log(dt, adt, axis, op, space):
    k = tilec.compile(reduce_source(dt, adt, axis, op, space), arch="sm_90a")
    assert k.compile_log == "" and k.fallback.compile_log == ""
    assert "tl_acc" in k.cuda_source


@pytest.mark.parametrize("spread", LOCAL_SPREADS)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dt, adt, op, space", [("f16", "f32", "sum", "shared"), ("i8", "i32", "max", "local")])
def test_local_source_compiles_with_an_empty_log(spread, axis, dt, adt, op, space):
    bm, bn, threads = LOCAL_SPREADS[spread]
    k = tilec.compile(reduce_source(dt, adt, axis, op, space, bm, bn, threads, from_local=True), arch="sm_90a")
    assert k.compile_log == "" and k.fallback.compile_log == ""


def test_swizzled_source_compiles_with_an_empty_log():
    k = tilec.compile(SWIZZLED, arch="sm_90a")
    assert k.compile_log == "" and k.fallback.compile_log == ""


@pytest.mark.parametrize("layout, axis", [c for c in ACC_REDUCES if c[0].startswith(("padded", "uneven"))])
@pytest.mark.parametrize("tile, space", [("acc", "shared"), ("d", "shared"), ("acc", "local")])
def test_reduce_of_padding_registers_compiles_cleanly(layout, axis, tile, space):
    """Accumulators whose fragments hold registers past the tile (rows padded to m64
    tiles, columns past an uneven split) reduced in them: NVRTC's log is empty (no
    wgmma serialized by a guard) and a padded tile's rows reduce into slots of
    its padded rows (their values unread), so its guards stay off the shuffles."""
    k = tilec.compile(acc_reduce_source(layout, axis, "sum", tile, space), arch="sm_90a")
    assert k.compile_log == "", k.compile_log
    assert "wgmma.mma_async" in k.ptx

