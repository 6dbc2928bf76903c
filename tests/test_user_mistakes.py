"""Programs a user gets wrong that tilec once accepted (an audit of session 48):
each is now an error at the user's line, or a launch error naming the
expression, never a Python traceback, an NVRTC error or a silent wrong answer.
Pure CPU: the front end, the passes, and the interpreter for launches."""
import subprocess
import sys

import numpy as np
import pytest

import tilec
from tilec import LaunchError, SemanticError, TilecError
from tilec.compiler import lower
from tilec.errors import Source

from conftest import ROOT


def error_of(text):
    with pytest.raises(TilecError) as info:
        lower(Source("t.tile", text))
    return str(info.value)


# ---------------------------------------------------------------- names

SHADOW = """\
kernel k(A: f32[M, N], B: f32[M, N]) {{
    let R = M * 2;
    grid (bx) = (1);
    threads 128;
    shared s: f32[16, 16];
    {loop}
        s[{i}, j] = R;
    }}
    copy(s, B[0, 0]);
}}
"""


@pytest.mark.parametrize("loop, i", [
    ("for M in range(1) { parallel (i, j) in (16, 16) {", "i"),
    ("parallel (M, j) in (16, 16) {", "M"),
])
def test_a_loop_variable_may_not_hide_a_shape_symbol(loop, i):
    """`let R = M * 2` read inside `for M in ...` took the loop's M: B was 0, not 32."""
    text = SHADOW.format(loop=loop, i=i)
    if loop.startswith("for"):
        text = text.replace("        s[M, j] = R;\n    }", "        s[i, j] = R;\n    } }")
        text = text.replace("s[i, j] = R;\n    }\n", "s[i, j] = R;\n    } }\n")
    err = error_of(text)
    assert err.startswith("t.tile:6:5: error: 'M' is already declared (as a shape symbol)\n"), err


# ---------------------------------------------------------------- races in a parallel body

PARALLEL = """\
kernel k(A: f32[M, N], B: f32[M, N]) {{
    grid (bx) = (1);
    threads 128;
    shared s: f32[4, 64];
    shared t: f32[4, 64];
    copy(A[0, 0], s);
    parallel (i, j) in (4, 64) {{ {body} }}
    copy(s, B[0, 0]);
}}
"""


def test_a_read_of_what_another_iteration_writes_is_an_error():
    """Threads run iterations at once: s[0, 0] + 1.0 read by every iteration while
    iteration (0, 0) writes it gave A[0, 0] + 1 in the interpreter and a race on the GPU."""
    assert error_of(PARALLEL.format(body="s[i, j] = s[0, 0] + 1.0;")) == """\
t.tile:7:44: error: iterations of this parallel race on shared tile 's': iteration (i = 0, j = 1) reads s[0, 0] \
(here s[0, 0]), which iteration (i = 0, j = 0) writes; iterations run at once on different threads, so the result \
would depend on their timing
    parallel (i, j) in (4, 64) { s[i, j] = s[0, 0] + 1.0; }
                                           ^~~~~~~
note: read only elements that the same iteration writes, or write the values into another tile and read them \
in a second parallel (a block barrier goes between the two)"""


@pytest.mark.parametrize("body, what", [
    ("s[0, j] = f32(i);", "iteration (i = 1, j = 0) writes s[0, 0] (here s[0, j]), which iteration (i = 0, j = 0) "
                          "writes"),
    ("s[i, j] = s[i, (j + 1) % 64] * 2.0;", "iteration (i = 0, j = 0) reads s[0, 1] (here s[i, (j + 1) % 64]), "
                                            "which iteration (i = 0, j = 1) writes"),
    ("t[i, j] = s[i, j]; s[i, 63 - j] = t[i, j];", "iteration (i = 0, j = 0) reads s[0, 0] (here s[i, j]), which "
                                                   "iteration (i = 0, j = 63) writes"),
    ("if j < 32 { s[i, j + 32] = 1.0; } else { s[i, j] = s[i, j] + 1.0; }",
     "iteration (i = 0, j = 32) writes s[0, 32] (here s[i, j]), which iteration (i = 0, j = 0) writes"),
    ("s[i, j] = select(j > 0, s[i, j - 1], 0.0);", "iteration (i = 0, j = 1) reads s[0, 0] (here s[i, j - 1]), "
                                                    "which iteration (i = 0, j = 0) writes"),
])
def test_races_are_found_lane_by_lane(body, what):
    err = error_of(PARALLEL.format(body=body))
    assert f"error: iterations of this parallel race on shared tile 's': {what}" in err, err


@pytest.mark.parametrize("body", [
    "s[i, j] = s[i, j] * 2.0 + 1.0;",                           # each iteration its own element
    "t[i, j] = s[i, (j + 1) % 64] + s[(i + 3) % 4, j];",        # neighbours of another tile
    "if i == 0 { s[0, j] = s[0, j] + t[1, j]; }",               # one row, written by one i
    "if j % 2 == 0 { s[i, j + 1] = s[i, j]; }",                 # even iterations write odd elements nobody reads
    "s[i, j] = s[i, j] + t[i32(s[i, j]) % 4, j];",              # an index read from an element: not checked
])
def test_iterations_that_keep_apart_are_accepted(body):
    lower(Source("t.tile", PARALLEL.format(body=body)))


def test_a_condition_the_lanes_cannot_decide_leaves_its_accesses_unchecked():
    """rowsum.tile's `if k * BN + j >= N { x[i, j] = x[i, 0]; }` never writes x[i, 0]
    (k < cdiv(N, BN)), which a check that took the condition as true would refuse."""
    text = PARALLEL.format(body="if j >= N - 64 { s[i, j] = s[i, 0]; }")
    lower(Source("t.tile", text))
    tilec.compile("examples/rowsum.tile", backend="interpret")


# ---------------------------------------------------------------- values that are not numbers

@pytest.mark.parametrize("line, col, caret", [
    ("fill(s, (1.0, 2.0));", 13, "^~~~~~~~~~"),
    ("parallel (i, j) in (16, 16) { s[i, j] = f32((1, 2)); }", 49, "^~~~~~"),
    ("copy(A[(0, 1), 0], s);", 12, "^~~~~~"),
])
def test_a_tuple_is_not_a_value(line, col, caret):
    """These reached codegen: TypeError: cannot print TupleExpr(...)."""
    err = error_of(f"""\
kernel k(A: f32[M, N]) {{
    grid (bx) = (1);
    threads 128;
    shared s: f32[16, 16];
    {line}
}}
""")
    assert err == f"""\
t.tile:5:{col}: error: a tuple is not a value here: a parenthesised list only gives an im2col keyword one value \
per dimension (kernel = (3, 3))
    {line}
{" " * (col - 1)}{caret}"""


def test_an_im2col_keyword_still_takes_a_tuple():
    tilec.compile("examples/conv2d.tile", tune=False, backend="interpret")


@pytest.mark.parametrize("let, name, what, col", [
    ("let X = A;", "A", "a tensor", 13),
    ("let X = s;", "s", "a tile", 13),
    ("let X = 2 * A;", "A", "a tensor", 17),
])
def test_a_let_names_a_number_or_a_view(let, name, what, col):
    """`let X = A; copy(X[0, 0], s);` was AttributeError: 'NoneType' object has no attribute 'tensor'."""
    err = error_of(f"""\
kernel k(A: f32[M, N]) {{
    grid (bx) = (1);
    threads 128;
    shared s: f32[16, 64];
    {let}
    copy(X[0, 0], s);
}}
""")
    assert err.startswith(f"t.tile:5:{col}: error: let 'X' reads '{name}', {what}: a let names a number (an integer "
                          f"or float expression) or an im2col view (let Xc = im2col(X, ...)); use '{name}' by its "
                          "own name\n"), err


# ---------------------------------------------------------------- sizes past what the kernel holds

def test_a_region_coordinate_past_32_bits_is_an_error():
    """4294967296 was emitted as a TMA coordinate, an int: it read row 0."""
    assert error_of("""\
kernel k(A: f32[M, N]) {
    grid (by) = (1);
    threads 128;
    shared s: f32[16, 64];
    copy(A[by * 16 + 4294967296, 0], s);
}
""") == """\
t.tile:5:22: error: the region's coordinate 0 (by * 16 + 4294967296) holds 4294967296, outside a 32-bit int: \
kernels index each dimension with 32-bit ints (TMA coordinates are), and a shape symbol is at most 2147483647
    copy(A[by * 16 + 4294967296, 0], s);
                     ^~~~~~~~~~"""


def _sum(terms):
    return f"""\
kernel k(A: f32[M, N], B: f32[M, N]) {{
    grid (bx) = (1);
    threads 128;
    shared s: f32[16, 64];
    shared t: f32[16, 64];
    copy(A[0, 0], s);
    parallel (i, j) in (16, 64) {{ t[i, j] = {" + ".join(f"s[i, j] * {n}.5" for n in range(terms))}; }}
    copy(t, B[0, 0]);
}}
"""


def test_a_long_expression_compiles_and_a_longer_one_is_an_error():
    """A sum of 300 terms was a RecursionError traceback (codegen's recursion)."""
    tilec.compile(_sum(140), arch="sm_90a")                       # NVRTC and all
    with pytest.raises(SemanticError, match=r"^<string>:7:\d+: error: the program nests deeper than tilec takes "
                                            r"\(160 levels of expressions and blocks\)"):
        tilec.compile(_sum(300), arch="sm_90a")
    with pytest.raises(SemanticError, match="nests deeper than tilec takes"):
        tilec.compile(_sum(1).replace("s[i, j] * 0.5", "-" * 2000 + "s[i, j]"), arch="sm_90a")


# ---------------------------------------------------------------- launches

def test_a_host_expression_that_divides_by_zero_is_a_launch_error():
    """cdiv(M, n) with n = 0 in the grid was a ZeroDivisionError from the host wrapper."""
    k = tilec.compile("""\
kernel k(A: f32[M, N], n: i32) {
    grid (a) = (cdiv(M, n));
    threads 128;
}
""", backend="interpret")
    with pytest.raises(LaunchError, match=r"^error: kernel k: a host expression divides by zero for these "
                                          r"arguments: `tl_grid = \(tl_rt.cdiv\(M, n\), 1, 1\)` in its host wrapper "
                                          r"\(k.host_source line \d+\); the grid, the declared dims and the requires "
                                          r"are computed from the arguments' shapes and scalars$"):
        k(np.zeros((4, 4), np.float32), 0)


def test_a_tune_conditions_division_by_zero_points_into_the_file(tmp_path):
    """It said `where=:1:1`, as if the condition were tilec.compile's where= argument."""
    f = tmp_path / "t.tile"
    f.write_text("""\
kernel k(A: f32[M, N]) {
    const BN = 64, Z = 0;
    tune BN in (64, 128) where BN / Z > 1;
    grid (bx) = (1);
    threads 128;
}
""")
    p = subprocess.run([sys.executable, "-m", "tilec", "check", str(f)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and p.stderr.startswith(f"{f}:3:32: error: division by zero in a constant expression\n"), \
        p.stderr


def test_a_pipelined_loop_around_another_says_so():
    with pytest.warns(tilec.PipelineWarning, match=r"t.tile:6:5: this pipelined loop \(stages = 2\) runs as "
                                                   r"a plain loop: its body does not start with a TMA load, and it "
                                                   r"holds another pipelined loop \(line 7\)"):
        lower(Source("t.tile", """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (a) = (1);
    threads 128;
    shared s: f32[16, 16];
    shared t: f32[16, 16];
    for j in pipelined(3, stages = 2) {
        for i in pipelined(5, stages = 3) {
            copy(A[i * 16, j * 16], s);
            parallel (x, y) in (16, 16) { t[x, y] = t[x, y] + s[x, y]; }
        }
    }
    copy(t, B[0, 0]);
}
"""))


# ---------------------------------------------------------------- declarations that made no sense

@pytest.mark.parametrize("text, message", [
    ("kernel k(A: f32[-5, N]) {\n    grid (a) = (1);\n    threads 128;\n}\n",
     "t.tile:1:17: error: dim 0 of tensor 'A' is -5: a dimension is an integer >= 0 (a shape symbol, or an integer "
     "expression of consts and symbols)"),
    ("kernel k(A: f32[2.5, N]) {\n    grid (a) = (1);\n    threads 128;\n}\n",
     "t.tile:1:17: error: dim 0 of tensor 'A' is 2.5: a dimension is an integer >= 0"),
    # true and false are the literals 1 and 0 (gemm's flags), not names: a symbol named so was a dim of 0
    ("kernel k(A: f32[M, false]) {\n    grid (a) = (1);\n    threads 128;\n}\n",
     "t.tile:1:20: error: dim 1 is false, a boolean literal: a dimension is an integer (a shape symbol, or an "
     "integer expression of consts and symbols)"),
    ("kernel k(A: f32[M, N]) {\n    grid (a) = (1);\n    threads 128;\n    shared s: f32[true, 64];\n}\n",
     "t.tile:4:19: error: dim 0 is true, a boolean literal"),
    ("kernel k(A: f32[M, N]) {\n    grid (a) = (-1);\n    threads 128;\n}\n",
     "t.tile:2:17: error: a grid size of -1: a grid has 0 or more blocks a dimension"),
    ("kernel k(A: f32[M, N]) {\n    const f16 = 1;\n    grid (a) = (1);\n    threads 128;\n}\n",
     "t.tile:2:11: error: 'f16' is a dtype (it converts a value: f16(x)); choose another name"),
    ("kernel k(A: f32[M, N]) {\n    let Q = QQQ + 1;\n    grid (a) = (1);\n    threads 128;\n}\n",
     "t.tile:2:13: error: unknown name 'QQQ'"),
    ("kernel k(A: f32[M, N]) {\n    grid (bx) = (X);\n    let X = M;\n    threads 128;\n}\n",
     "t.tile:2:18: error: 'X' is used before its let statement (line 3): a let is known from its statement on"),
    ("kernel k(A: f32[M, N]) {\n    let X = X + 1;\n    grid (a) = (1);\n    threads 128;\n}\n",
     "t.tile:2:13: error: 'X' is used before its let statement (line 2)"),
])
def test_declarations_that_make_no_sense(text, message):
    assert error_of(text).startswith(message)


def test_gemm_flags_are_true_or_false():
    text = (ROOT / "examples/gemm.tile").read_text().replace("gemm(a, b, acc);", "gemm(a, b, acc, transpose_a = 2);")
    assert "transpose_a must be true or false" in error_of(text)


def test_an_index_from_a_let_is_shown_where_it_is_used():
    """The caret stood under `16 + i` in the let, not under the read that goes out of the tile."""
    err = error_of("""\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 64];
    shared t: f32[64, 64];
    copy(A[0, 0], s);
    parallel (i, j) in (64, 64) {
        let r = 16 + i;
        t[i, j] = s[r, j];
    }
    copy(t, B[0, 0]);
}
""")
    assert err.startswith("t.tile:9:19: error: this read of s[16 + i, j] goes past dimension 0"), err


def test_invisible_characters(tmp_path):
    """A NUL was `unexpected character ' '`; a UTF-8 byte order mark at the start was refused."""
    assert error_of("kernel k(A: f32[M, N]) {\n    grid (a) = \x00(1);\n}\n").startswith(
        "t.tile:2:16: error: unexpected character U+0000")
    f = tmp_path / "bom.tile"
    f.write_bytes("\ufeff".encode() + (ROOT / "examples/copy2d.tile").read_bytes())
    tilec.compile(str(f), arch="sm_90a")


# ---------------------------------------------------------------- arguments at launch

def _scale():
    return tilec.compile("examples/scale.tile", backend="interpret")


def test_big_endian_arrays_are_refused():
    """'>f4' is named float32 too: its bytes were read (and written) swapped, silently."""
    x = np.arange(40 * 64, dtype=">f4").reshape(40, 64)
    with pytest.raises(LaunchError, match=r"^error: argument X: its elements are in the other byte order \(numpy "
                                          r"dtype '>f4'\), which the kernel would read and write swapped: pass "
                                          r"X.astype\(X.dtype.newbyteorder\('='\)\)$"):
        _scale()(x, np.zeros((40, 64), np.float32), 1.0)
    y = np.zeros((40, 64), np.float32)
    _scale()(x.astype(x.dtype.newbyteorder("=")), y, 1.0)
    assert np.array_equal(y, np.arange(40 * 64, dtype=np.float32).reshape(40, 64) + 1)


def test_scalars_outside_their_type_are_refused():
    """2**31 for an i32 became -2^31 in the kernel, after `require n >= 1` had passed on 2**31."""
    k = tilec.compile("""\
kernel k(X: f32[M], Y: f32[M], n: i32, b: u8, a: f32) {
    require n >= 1;
    grid (bx) = (cdiv(M, 64));
    threads 64;
    shared s: f32[64];
    copy(X[bx * 64], s);
    parallel (i) in (64) { s[i] = s[i] * a + f32(n) + f32(b); }
    copy(s, Y[bx * 64]);
}
""", backend="interpret")
    x, y = np.ones(64, np.float32), np.zeros(64, np.float32)
    for args, message in [((2**31, 0, 1.0), r"argument n: 2147483648 is outside i32 \(-2147483648 .. 2147483647\)"),
                          ((1, -1, 1.0), r"argument b: -1 is outside u8 \(0 .. 255\)"),
                          ((1, 256, 1.0), r"argument b: 256 is outside u8 \(0 .. 255\)"),
                          ((1, 0, 1e300), r"argument a: 1e\+300 is past f32's largest finite value"),
                          ((1, 0, 10**400), r"argument a: 1000000.* is past f32's largest finite value")]:
        with pytest.raises(LaunchError, match=message):
            k(x, y, *args)
    k(x, y, 2**31 - 1, 255, float("inf"))          # the edges, and an infinity asked for
    assert (y == np.inf).all()
    k(x, y, 3, 4, 3.4028234e38)
    assert np.allclose(y, 3.4028234e38)


def test_a_wrong_number_of_arguments_names_the_kernels_parameters():
    """The GPU kernel said `launch() takes 4 positional arguments but 5 were given`."""
    k = tilec.compile("examples/scale.tile", arch="sm_90a")
    with pytest.raises(TypeError, match=r"^kernel scale takes 3 arguments \(X, Y, alpha\), got 4$"):
        k._run(None, (1, 2, 3, 4))


def test_a_refused_launch_frees_the_device_copies_of_numpy_arguments(monkeypatch):
    """The GPU path copies numpy arguments to the device before it checks the rest;
    a LaunchError after that left the copies allocated (a loop over bad inputs ran the
    GPU out of memory). Driver calls stood in, on the CPU."""
    from cuda.bindings import driver as cu
    from tilec.runtime import driver, host
    ok = cu.CUresult.CUDA_SUCCESS
    live = {}
    monkeypatch.setattr(driver, "make_current", lambda dev: None)
    monkeypatch.setattr(cu, "cuMemAlloc", lambda n: (ok, live.setdefault(0x10000 + 4096 * len(live), n) and
                                                     0x10000 + 4096 * (len(live) - 1)))
    monkeypatch.setattr(cu, "cuMemcpyHtoD", lambda p, h, n: (ok,))
    monkeypatch.setattr(cu, "cuMemFree", lambda p: (live.pop(p), (ok,))[1])
    k = tilec.compile("examples/scale.tile", arch="sm_90a")
    x = np.ones((40, 64), np.float32)
    for y in (np.zeros((40, 64), np.float64), np.zeros((40, 10), np.float32)):
        with pytest.raises(LaunchError):
            k._run(host.Call("scale", None, None, k._writes), (x, y, 1.0))
        assert live == {}, "device copies left allocated"
    # a 0-d array where a tensor goes: its rank is 0 (np.ascontiguousarray had made it 1-d: "rank 1")
    with pytest.raises(LaunchError, match=r"^error: argument X: rank 0 does not match the declared rank 2$"):
        k._run(host.Call("scale", None, None, k._writes), (np.float32(1), x, 1.0))
    assert live == {}


def test_a_one_element_array_for_a_scalar_says_item():
    x = np.ones((40, 64), np.float32)
    with pytest.raises(LaunchError, match=r"^error: argument alpha: expected a number for f32, got ndarray \(a 0-d "
                                          r"array of one element: pass alpha.item\(\)\)$"):
        _scale()(x, np.zeros_like(x), np.array(2.0, np.float32))


def test_the_fallback_warning_follows_pythons_filters_at_the_callers_line():
    """tilec kept its own once-per-kernel set: under simplefilter("error") the first
    call raised and the second ran the thread-copy variant silently; the warning named
    a line of tilec, not the caller's."""
    import warnings
    k = tilec.compile("examples/copy2d.tile", backend="interpret")
    a = np.arange(300 * 7, dtype=np.float32).reshape(300, 7)
    b = np.zeros_like(a)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        for _ in range(2):
            with pytest.raises(tilec.TmaFallbackWarning):
                k(a, b)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", tilec.TmaFallbackWarning)
        k(a, b)
        k(a, b)
    assert [w.filename for w in seen] == [__file__] * 2
    assert np.array_equal(a, b)


def test_an_f64_scalar_past_doubles_says_the_largest_double():
    k = tilec.compile("""\
kernel k(X: f64[M], a: f64) {
    grid (bx) = (cdiv(M, 64));
    threads 64;
    shared s: f64[64];
    copy(X[bx * 64], s);
    parallel (i) in (64) { s[i] = s[i] * a; }
    copy(s, X[bx * 64]);
}
""", backend="interpret")
    with pytest.raises(LaunchError, match=r"argument a: 1000000\d* is past f64's largest finite value "
                                          r"\(1.79769e\+308\)"):
        k(np.ones(64), 10**400)
