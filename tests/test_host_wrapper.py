"""The generated host wrapper: one launch path for the GPU and the interpreter,
and host expressions with Python's meaning of the tile expression."""
import numpy as np
import pytest

import tilec
from tilec.errors import LaunchError

REQUIRE = """
kernel same_side(A: f32[M, N], B: f32[M, N]) {
    require (M < 64) == (N < 64);
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared s: f32[8, 32];
    copy(A[by * 8, bx * 32], s);
    copy(s, B[by * 8, bx * 32]);
}
"""


def test_a_comparison_of_comparisons_is_not_a_python_chain():
    """`(M < 64) == (N < 64)` must not print as Python's chained `M < 64 == N < 64`."""
    k = tilec.compile(REQUIRE, backend="interpret")
    assert "tl_call.require((M < 64) == (N < 64), " in k.host_source
    a = np.arange(100 * 100, dtype=np.float32).reshape(100, 100)
    b = np.zeros_like(a)
    k(a, b)                                  # both sides False: the require holds
    assert np.array_equal(a, b)
    with pytest.raises(LaunchError, match=r"require \(M < 64\) == \(N < 64\) failed \(M = 100, N = 10\)"):
        k(a[:, :10].copy(), b[:, :10].copy())


def test_the_interpreter_runs_the_kernels_own_host_wrapper():
    src = REQUIRE.replace("    require (M < 64) == (N < 64);\n", "")
    interpreted = tilec.compile(src, backend="interpret")
    assert interpreted.host_source.splitlines()[1:] == \
        tilec.compile(src, arch="sm_90a").host_source.splitlines()[1:]


def test_an_empty_operand_runs_the_thread_copy_variant():
    """K = 0 leaves A and B empty (no tensor map can describe them) while C is not:
    C = A @ B is zeros, so the call runs the thread-copy variant, as for any other TMA
    rule (it raised a LaunchError before), into C's guarded view; fallback=False says the rule."""
    from guard import guarded
    from tilec.runtime.tensormap import TmaRuleError
    k = tilec.compile("examples/gemm.tile", backend="interpret", BM=64, BN=64, STAGES=3)
    c = guarded((70, 50), "f16", like="numpy")
    c.view[...] = 5
    a, b = np.zeros((70, 0), np.float16), np.zeros((0, 50), np.float16)
    with pytest.warns(tilec.TmaFallbackWarning, match=r"argument A: it is empty \(shape \[70, 0\]\)"):
        k(a, b, c.view)
    assert not c.view.any()
    c.check()
    strict = tilec.compile("examples/gemm.tile", backend="interpret", fallback=False, BM=64, BN=64, STAGES=3)
    with pytest.raises(TmaRuleError, match="a TMA tensor map cannot describe an empty tensor"):
        strict(a, b, c.view)


def test_numpy_scalars_are_numbers_and_an_f64_condition_compares_in_double():
    """np.float32 / np.int32 scalars are accepted as the numbers they are (an f32
    argument given as np.float32 was refused: 'expected a number for f32, got float32');
    bools are not. `if x > 0.1` with x f64 compares with the double 0.1 (0.1f is
    0.100000001490116, so x = 0.1000000001 took the other branch), y f32 with 0.1f."""
    from conftest import ROOT
    k = tilec.compile(str(ROOT / "tests" / "filecheck" / "f64_condition.tile"), backend="interpret")
    a, b = np.zeros(64), np.zeros(64)
    for x, y, want in ((0.1000000001, np.float32(0.0), 1.0), (np.float64(0.05), np.float32(0.2), 2.0),
                       (0.1, np.float32(0.1), 0.0)):
        k(a, b, x, y)
        assert (b == want).all(), (x, y, b[:3])
    with pytest.raises(LaunchError, match="argument x: expected a number for f64, got bool"):
        k(a, b, np.bool_(True), 0.0)
    shift = tilec.compile("""
kernel shift(A: i32[N], B: i32[N], n: i32) {
    grid (bx) = (cdiv(N, 64));
    threads 64;
    shared s: i32[64];
    copy(A[bx * 64], s);
    parallel (i) in (64) {
        s[i] = s[i] + n;
    }
    copy(s, B[bx * 64]);
}
""", backend="interpret")
    src, dst = np.arange(100, dtype=np.int32), np.zeros(100, np.int32)
    shift(src, dst, np.int32(7))
    assert (dst == src + 7).all()
    with pytest.raises(LaunchError, match="argument n: expected an integer for i32, got float32"):
        shift(src, dst, np.float32(7))


@pytest.mark.parametrize("example, written", [("copy2d", ((1, "B"),)), ("scale", ((1, "Y"),)),
                                              ("gemm_128x256", ((2, "C"),)), ("rowsum", ((1, "RowSum"), (2, "RowMax")))])
def test_written_params_are_the_wrappers_parameters_its_writes_name(example, written):
    """What host.mark_written checks and bumps on every call (the autograd rule, GPU-tested
    in test_torch_op.py): the positions of the written tensors among the call's arguments."""
    from conftest import ROOT
    k = tilec.compile(ROOT / "examples" / f"{example}.tile", arch="sm_90a", tune=False)    # rowsum tunes
    assert k._written_params == written
    assert tuple(n for _, n in written) == tuple(k._writes)
