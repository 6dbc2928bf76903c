"""GPU: reduce on the device equals tests/test_reduce.py's numpy references bit for
bit (float sums in the CUDA's order, integer sums wrapped, maxima and minima exact) and the
interpreter; every output is a guarded view (tests/guard.py) whose padding must
be intact. Marked gpu: `python -m pytest -m gpu tests/test_gpu_reduce.py`."""
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tilec
from guard import guarded
from test_reduce import (ACC_REDUCES, DTYPES, EXAMPLES, LOCAL_SPREADS, ROW_MAXIMA_CASES, acc_reduce_inputs,
                         acc_reduce_source, assert_reduced, gemm_with_row_maxima, row_maxima_case, M, N, NAN_ROWS,
                         SIZES, SWIZZLED, falling_back, make_input, nan_expectation, nan_input, no_fallback,
                         output_shape, reduce_case, reduce_source, reference, SOFTMAX, rowsum_reference,
                         run_interpreted, same_bits, softmax_reference)

pytestmark = pytest.mark.gpu


def to_cuda(x):
    """A numpy input as a contiguous torch tensor on the GPU (bf16 through f32: exact)."""
    import torch
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).cuda()
    return torch.from_numpy(np.ascontiguousarray(x)).cuda()


def run_gpu(src, inputs, outputs, fallback_ok=False, kernel=None):
    """`inputs`: numpy arrays; `outputs`: (shape, tilec dtype). Returns the outputs as
    numpy arrays after checking that nothing around them was written. `kernel`:
    src compiled already (a tuned one, to read its choice after the call)."""
    import torch
    k = kernel or tilec.compile(src)
    outs = [guarded(shape, dt) for shape, dt in outputs]
    with (falling_back() if fallback_ok else no_fallback()):
        k(*[to_cuda(x) for x in inputs], *[o.view for o in outs])
    torch.cuda.synchronize()
    for o in outs:
        o.check()
    return [o.view.cpu().numpy() for o in outs]


@pytest.mark.parametrize("space", ["shared", "local"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dt, adt", DTYPES, ids=lambda v: v)
def test_reduce_on_the_gpu(dt, adt, op, axis, space):
    x = make_input((M, N), dt, np.random.default_rng(zlib.crc32(f"{dt} {adt} {op} {axis}".encode())))
    src = reduce_source(dt, adt, axis, op, space)
    shape = output_shape(x.shape, axis)
    got, = run_gpu(src, [x], [(shape, adt)])
    assert same_bits(got, reference(x, dt, adt, axis, op, space=space))
    assert same_bits(got, run_interpreted(src, x, shape, adt))


@pytest.mark.parametrize("space", ["local", "shared"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_nans_are_skipped_and_plus_zero_is_above_minus_zero_on_the_gpu(op, space):
    x = nan_input()
    src = reduce_source("f32", "f32", 1, op, space)
    shape = output_shape(x.shape, 1)
    got, = run_gpu(src, [x], [(shape, "f32")])
    assert same_bits(got[0, :NAN_ROWS], nan_expectation(x, op)), got[0, :NAN_ROWS]
    assert same_bits(got, run_interpreted(src, x, shape, "f32"))


@pytest.mark.parametrize("space, want", [("local", 2.0 ** 24), ("shared", 2.0 ** 24 + 48)])
def test_a_shared_result_sums_in_lanes_on_the_gpu(space, want):
    """test_reduce's rows of 2^24 and 63 ones: the shuffles combine the 4 lanes' sums
    in the order the interpreter does."""
    x = np.ones((M, N), np.float32)
    x[:, ::64] = 2.0 ** 24
    src = reduce_source("f32", "f32", 1, "sum", space)
    got, = run_gpu(src, [x], [(output_shape(x.shape, 1), "f32")])
    assert got[0, 0] == want and got[1, 40] == want
    assert same_bits(got, run_interpreted(src, x, output_shape(x.shape, 1), "f32"))


@pytest.mark.parametrize("spread", LOCAL_SPREADS)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("dt, adt", [("f32", "f32"), ("f16", "f32"), ("f64", "f64"), ("i8", "i32")], ids=str)
@pytest.mark.parametrize("space", ["shared", "local"])
def test_reduce_of_a_local_tile_on_the_gpu(spread, axis, op, dt, adt, space):
    """test_reduce's local tiles in each of their four spreads: the shuffles by lanes
    (by N threads for a column), the warps' slots and the results against the
    reference of §5's layout and the interpreter, bit for bit."""
    bm, bn, threads = LOCAL_SPREADS[spread]
    if space == "shared" and (bm if axis == 1 else bn) * SIZES[adt] % 16:
        pytest.skip("a shared result goes out by TMA: a 16-byte box")
    x = make_input((bm + 16, 2 * bn), dt, np.random.default_rng(zlib.crc32(f"{spread} {axis} {op} {dt}".encode())))
    src = reduce_source(dt, adt, axis, op, space, bm, bn, threads, pre=True, trips=2, from_local=True)
    shape = output_shape(x.shape, axis, bm, bn)
    got, = run_gpu(src, [x], [(shape, adt)])
    assert same_bits(got, reference(x, dt, adt, axis, op, bm, bn, space, threads, pre=True, from_local=True))
    assert same_bits(got, run_interpreted(src, x, shape, adt))


@pytest.mark.parametrize("layout, axis", ACC_REDUCES)
@pytest.mark.parametrize("op", ["max", "sum"])
@pytest.mark.parametrize("tile, space", [("acc", "shared"), ("d", "shared"), ("d", "local")])
def test_reduce_of_the_accumulator_on_the_gpu(layout, axis, op, tile, space):
    """The accumulator's fragments reduced on the device (quads' shuffles, lanes 4 apart
    for columns, warpgroups' slots) against the interpreter bit for bit: the operands
    are small integers, so acc is exact; d = acc * 0.3 + 0.1 (one fused multiply-add)
    is not, so its sums show the order of the additions."""
    a, b, c_shape, y_shape = acc_reduce_inputs(layout, axis, zlib.crc32(f"{layout} {axis} {op} gpu".encode()))
    src = acc_reduce_source(layout, axis, op, tile, space)
    c, y = run_gpu(src, [a, b], [(c_shape, "f32"), (y_shape, "f32")], fallback_ok=True)
    k = tilec.compile(src, backend="interpret")
    ci, yi = guarded(c_shape, np.float32, like="numpy"), guarded(y_shape, np.float32, like="numpy")
    with falling_back():
        k(a, b, ci.view, yi.view)
    assert same_bits(c, ci.view)
    assert same_bits(y, yi.view), np.argwhere(y != yi.view)[:5]
    assert_reduced(y, a, b, layout, axis, op, tile)


@pytest.mark.parametrize("name", ROW_MAXIMA_CASES)
def test_row_maxima_in_gemm_epilogues_on_the_gpu(name):
    """test_reduce's gemm.tile with row maxima in its epilogue, on the device: exact."""
    consts, a, b, c_want, want = row_maxima_case(name, 8)
    src = gemm_with_row_maxima()
    c, r = run_gpu(src, [a, b], [(c_want.shape, "f16"), (want.shape, "f32")], fallback_ok=True,
                   kernel=tilec.compile(src, tune=False, **consts))
    np.testing.assert_array_equal(c, c_want)
    np.testing.assert_array_equal(r, want)


def test_a_local_tile_sums_in_its_lanes_on_the_gpu():
    """test_reduce's rows of 2^24 and 255 ones held two elements a thread: 2^24 + 254."""
    x = np.ones((4, 256), np.float32)
    x[:, 0] = 2.0 ** 24
    src = reduce_source("f32", "f32", 1, "sum", "local", 4, 256, 128, from_local=True)
    got, = run_gpu(src, [x], [(output_shape(x.shape, 1, 4, 256), "f32")])
    assert (got == 2.0 ** 24 + 254).all(), got


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(reduce_case(), st.integers(0, 2**32 - 1))
def test_reduce_any_tile_and_block_on_the_gpu(case, data_seed):
    """test_reduce's random tiles, thread counts, dtypes, axes, ops, result spaces and
    local sources:
    the GPU (shuffles and all) against the reference and the interpreter, bit for bit."""
    dt, adt, axis, op, space, bm, bn, threads, m, n, pre, trips, from_local = case
    x = make_input((m, n), dt, np.random.default_rng(data_seed))
    src = reduce_source(dt, adt, axis, op, space, bm, bn, threads, pre, trips, from_local)
    shape = output_shape(x.shape, axis, bm, bn)
    got, = run_gpu(src, [x], [(shape, adt)])
    assert same_bits(got, reference(x, dt, adt, axis, op, bm, bn, space, threads, pre, from_local)), (case, src)
    assert same_bits(got, run_interpreted(src, x, shape, adt))


def test_integer_sums_wrap_on_the_gpu():
    x = np.full((M, N), 2**31 - 1, np.int32)
    got, = run_gpu(reduce_source("i32", "i32", 1, "sum", "local"), [x], [(output_shape(x.shape, 1), "i32")])
    assert got[0, 0] == np.uint32((64 * (2**31 - 1)) % 2**32).astype(np.int32)
    assert same_bits(got, reference(x, "i32", "i32", 1, "sum"))


@pytest.mark.parametrize("axis", [0, 1])
def test_fallback_variant_on_the_gpu(axis):
    """Rows of 133 floats: TMA cannot describe X, the thread-copy variant runs."""
    x = make_input((70, 133), "f32", np.random.default_rng(5))
    got, = run_gpu(reduce_source("f32", "f32", axis, "sum", "local"), [x], [(output_shape(x.shape, axis), "f32")],
                   fallback_ok=True)
    assert same_bits(got, reference(x, "f32", "f32", axis, "sum"))


def test_more_results_than_threads_on_the_gpu():
    x = make_input((300, 64), "f32", np.random.default_rng(6))
    got, = run_gpu(reduce_source("f32", "f32", 1, "max", "local", bm=256, bn=32), [x],
                   [(output_shape(x.shape, 1, 256, 32), "f32")])
    assert same_bits(got, reference(x, "f32", "f32", 1, "max", 256, 32))


def test_reduce_of_a_swizzled_gemm_operand_on_the_gpu():
    rng = np.random.default_rng(7)
    a, b = make_input((100, 64), "f16", rng), make_input((64, 72), "f16", rng)
    c, r = run_gpu(SWIZZLED, [a, b], [((100, 72), "f32"), ((2, 100), "f32")])
    assert same_bits(r, np.stack([reference(a, "f16", "f32", 1, "sum", 64, 64, "shared")[0]] * 2))
    np.testing.assert_allclose(c, a.astype(np.float32) @ b.astype(np.float32), rtol=2e-3, atol=2e-2)


@pytest.mark.parametrize("shape", [(300, 200), (1, 4), (129, 64), (4097, 1000), (77, 301)])
def test_rowsum_example_on_the_gpu(shape):
    """Against numpy (sums within float rounding, maxima exact) and the interpreter
    running the candidate the tune chose (bit for bit: the lanes, and so the order of
    the sums, follow the consts); 301 columns run the thread-copy variant."""
    x = (np.random.default_rng(8).standard_normal(shape) - 4).astype(np.float32)
    src = EXAMPLES / "rowsum.tile"
    tuned = tilec.compile(src)
    sums, maxes = run_gpu(src, [x], [(shape[:1], "f32"), (shape[:1], "f32")], fallback_ok=shape[1] % 4 != 0,
                          kernel=tuned)
    want_sum, want_max = rowsum_reference(x)
    np.testing.assert_allclose(sums, want_sum, rtol=1e-4, atol=1e-3)
    assert np.array_equal(maxes, want_max)
    k = tilec.compile(src, backend="interpret", **tuned.best_config)
    cs, cm = guarded(shape[:1], np.float32, like="numpy"), guarded(shape[:1], np.float32, like="numpy")
    with falling_back():
        k(x, cs.view, cm.view)
    assert same_bits(sums, cs.view) and same_bits(maxes, cm.view)


@pytest.mark.parametrize("shape", [(300, 200), (7, 1), (129, 4096), (33, 20000), (4096, 1000)])
def test_softmax_program_on_the_gpu(shape):
    """tests/softmax.tile tuned: against torch.softmax (f32 math, f16 out) within f16
    rounding, against numpy in f64, and bit for bit against the interpreter running
    the candidate the tune chose; the output guarded."""
    import torch
    x = (np.random.default_rng(shape[1]).standard_normal(shape) * 4).astype(np.float16)
    tuned = tilec.compile(SOFTMAX)
    y, = run_gpu(SOFTMAX, [x], [(shape, "f16")], fallback_ok=shape[1] % 8 != 0, kernel=tuned)
    want = torch.softmax(torch.from_numpy(x).cuda().float(), -1).half().cpu().numpy()
    np.testing.assert_allclose(y.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=1e-5)
    np.testing.assert_allclose(y.astype(np.float64), softmax_reference(x), rtol=2e-3, atol=1e-5)
    k = tilec.compile(SOFTMAX, backend="interpret", **tuned.best_config)
    c = guarded(shape, np.float16, like="numpy")
    with falling_back():
        k(x, c.view)
    c.check()
    bad = y.view(np.uint16) != c.view.view(np.uint16)
    # exp may differ from the GPU's expf in the last bit (language guide §17): rarely an f16 output
    assert bad.mean() < 1e-3, (int(bad.sum()), bad.size)
    np.testing.assert_allclose(y.astype(np.float32), c.view.astype(np.float32), rtol=1e-3, atol=1e-7)
