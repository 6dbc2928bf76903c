"""`for v in range(start, stop, step)` (lower-ranges): the loop runs Python's range,
an empty range runs nothing, a step that is a scalar parameter is checked at launch
(`require st != 0`) and may be negative; on the interpreter against Python's range,
and on the GPU against the interpreter's answer (outputs guarded). Plus the errors
a user gets, and the IR the pass leaves."""
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tilec
from guard import guarded
from tilec import SemanticError
from tilec.compiler import lower
from tilec.errors import Source

# Tile i of A (64 floats) copied to tile i of B for every i of the range; tiles that
# reach past either end of the tensor are clipped by TMA, as any other tile is.
PICK = """\
kernel pick(A: f32[N], B: f32[N], lo: i32, hi: i32, st: i32) {{
    const BN = 64;
    grid (bx) = (1);
    threads 64;
    shared s: f32[BN];
    for i in range({range}) {{
        copy(A[i * BN], s);
        copy(s, B[i * BN]);
    }}
}}
"""


def compile_pick(bounds, backend="cuda"):
    return tilec.compile(PICK.format(range=bounds), backend=backend)


def expected(a, tiles):
    """B as the sentinel, with A's values at every element of the given tiles inside the tensor."""
    b = np.full_like(a, np.nan)
    for i in tiles:
        lo, hi = max(i * 64, 0), min(i * 64 + 64, a.size)
        if lo < hi:
            b[lo:hi] = a[lo:hi]
    return b


def run_pick(k, n, lo, hi, step, like="numpy"):
    a = np.arange(1, n + 1, dtype=np.float32)
    out = guarded((n,), "f32", like=like)
    args = (a, out.view, lo, hi, step)
    if like == "torch":
        import torch
        args = (torch.from_numpy(a).cuda(), out.view, lo, hi, step)
    k(*args)
    if like == "torch":
        import torch
        torch.cuda.synchronize()
    out.check()
    return a, np.asarray(out.view if like == "numpy" else out.view.cpu().numpy())


def assert_tiles(a, got, tiles):
    want = expected(a, tiles)
    written = ~np.isnan(want)
    assert np.array_equal(got[written], want[written])
    assert (got[~written] == np.float32(-7777.0)).all()        # the guard's sentinel, untouched


BOUNDS = [(0, 5, 1), (1, 5, 2), (4, -1, -1), (5, 0, -2), (3, 3, 1), (3, 1, 1), (1, 3, -1), (-2, 7, 3),
          (7, -3, -4), (0, 1, 5), (9, 0, -10)]


@pytest.mark.parametrize("lo, hi, step", BOUNDS)
def test_scalar_bounds_run_pythons_range_on_the_interpreter(lo, hi, step):
    k = compile_pick("lo, hi, st", backend="interpret")
    a, got = run_pick(k, 300, lo, hi, step)
    assert_tiles(a, got, range(lo, hi, step))


@pytest.mark.parametrize("bounds, tiles", [("1, hi, 2", range(1, 5, 2)), ("hi - 1, -1, -1", range(4, -1, -1)),
                                           ("lo, 4", range(2, 4)), ("lo, hi, 3", range(2, 5, 3)),
                                           ("hi, lo, -2", range(5, 2, -2)), ("lo, lo", range(0))])
def test_constant_steps_on_the_interpreter(bounds, tiles):
    k = compile_pick(bounds, backend="interpret")
    a, got = run_pick(k, 300, 2, 5, 0)      # st = 0 is not the loop's step here: no require
    assert_tiles(a, got, tiles)


@settings(max_examples=60, deadline=None, database=None)
@given(st.integers(-6, 10), st.integers(-6, 10), st.integers(-7, 7).filter(bool))
def test_any_scalar_range_on_the_interpreter(lo, hi, step):
    k = _interpreted_scalar_pick()
    a, got = run_pick(k, 5 * 64 - 17, lo, hi, step)
    assert_tiles(a, got, range(lo, hi, step))


_PICKS = {}


def _interpreted_scalar_pick():
    if "scalar" not in _PICKS:
        _PICKS["scalar"] = compile_pick("lo, hi, st", backend="interpret")
    return _PICKS["scalar"]


def test_a_scalar_step_of_zero_is_refused_at_launch():
    k = compile_pick("lo, hi, st", backend="interpret")
    out = guarded((300,), "f32", like="numpy")
    with pytest.raises(tilec.LaunchError, match=re.escape(
            "require st != 0 (the step of the range of loop 'i', line 6) failed (st = 0)")):
        k(np.ones(300, np.float32), out.view, 0, 5, 0)
    out.check()
    assert (out.view == np.float32(-7777.0)).all()


def test_lower_ranges_ir():
    k = compile_pick("1, hi, 2", backend="interpret")
    ir_text = k.ir("lower-ranges")
    assert "for tl_i_iter in range(max(0, cdiv(hi - 1, 2))) {" in ir_text
    assert "copy A[(1 + tl_i_iter * 2) * 64] -> s" in ir_text
    assert "for i in range(1, hi, 2) {" in k.ir("fold-consts")
    scalar = compile_pick("lo, hi, st", backend="interpret")
    assert "for tl_i_iter in range(select(st > 0, max(0, cdiv(hi - lo, st)), max(0, cdiv(lo - hi, -st)))) {" \
        in scalar.ir("lower-ranges")
    assert "\n  require st != 0\n" in scalar.ir("lower-ranges")


def error_of(text):
    with pytest.raises(SemanticError) as info:
        lower(Source("t.tile", text))
    return str(info.value)


@pytest.mark.parametrize("bounds, message", [
    ("0, hi, 0", """\
t.tile:6:27: error: range's step is 0: a loop needs a step that moves (Python's range refuses 0 too)
    for i in range(0, hi, 0) {
                          ^"""),
    ("0, hi, bx + 1", """\
t.tile:6:27: error: range's step must be known before the launch: a compile-time integer, or an expression of \
scalar parameters and shape symbols (the launch checks that it is not 0); 'bx' is a block index
    for i in range(0, hi, bx + 1) {
                          ^~"""),
    ("0, 1, 2, 3", """\
t.tile:6:14: error: range takes range(stop), range(start, stop) or range(start, stop, step)
    for i in range(0, 1, 2, 3) {
             ^~~~~"""),
    ("0.5, hi", """\
t.tile:6:20: error: a loop bound must be an integer expression
    for i in range(0.5, hi) {
                   ^~~"""),
])
def test_range_errors(bounds, message):
    assert error_of(PICK.format(range=bounds)) == message


@pytest.mark.gpu
@pytest.mark.parametrize("lo, hi, step", BOUNDS)
def test_scalar_bounds_on_the_gpu(lo, hi, step):
    pytest.importorskip("torch")
    k = compile_pick("lo, hi, st")
    a, got = run_pick(k, 300, lo, hi, step, like="torch")
    assert_tiles(a, got, range(lo, hi, step))


@pytest.mark.parametrize("m, st", [(300, 1), (300, 2), (300, -1), (129, 3), (64, 1), (1, -2)])
def test_nested_ranges_whose_inner_start_is_the_outer_variable(m, st):
    """tests/filecheck/range_step.tile on the interpreter: i from the last row tile down
    by 2, j from i on by the scalar st (a negative st runs nothing where i is the last
    tile and more below it): the rows of every tile j visited, copied."""
    from conftest import ROOT
    k = tilec.compile(ROOT / "tests/filecheck/range_step.tile", backend="interpret")
    a = np.arange(m * 200, dtype=np.float32).reshape(m, 200)
    out = guarded((m, 200), "f32", like="numpy")
    k(a, out.view, st)
    out.check()
    tiles = -(-m // 64)
    visited = {j for i in range(tiles - 1, -1, -2) for j in range(i, tiles, st)}
    rows = np.zeros(m, bool)
    for j in visited:
        rows[j * 64:j * 64 + 64] = True
    assert np.array_equal(out.view[rows], a[rows])
    assert (out.view[~rows] == np.float32(-7777.0)).all()


def test_the_verifier_catches_a_range_left_unlowered(monkeypatch):
    """Were lower-ranges to leave a loop's start or step, the passes after it would run
    the loop from 0: the IR verifier stops that as a tilec bug, naming the pass."""
    from tilec.ir.verify import VerifyError
    from tilec.passes import lower_ranges
    monkeypatch.setattr(lower_ranges, "run", lambda k, opts: k)
    with pytest.raises(VerifyError, match="IR verifier after lower-ranges: loop 'i' still has a range start or step"):
        lower(Source("t.tile", PICK.format(range="1, hi, 2")))
