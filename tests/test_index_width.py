"""Integer width in device code: shape symbols are 32-bit ints (as TMA coordinates
are), a product of two sizes is computed in 64 bits, cdiv is exact for any sign
and cannot overflow near 2^31, and a symbol over 2^31-1 is a launch error, not a
wrapped index. The interpreter follows the same rules; the GPU tests run the
same kernels on the device (guarded outputs)."""
import re

import numpy as np
import pytest

import tilec
from conftest import ROOT
from guard import guarded
from tilec.runtime import host

AREA = """
kernel area(A: i64[M], B: i64[N], O: i64[2]) {
    grid (b) = (1);
    threads 32;
    shared o: i64[2];
    parallel (i) in (2) {
        o[i] = M * N + cdiv(M, 7) * cdiv(N, 5) * i;
    }
    copy(o, O[0]);
}
"""

CDIV = """
kernel ceil_div(O: i32[64], d: i32) {
    grid (b) = (1);
    threads 64;
    shared o: i32[64];
    parallel (i) in (64) {
        o[i] = cdiv(i - 32, d);
    }
    copy(o, O[0]);
}
"""

M, N = 50_000, 60_001          # M * N = 3 000 050 000 > 2^31


def area_expected():
    return np.array([M * N, M * N + -(-M // 7) * -(-N // 5)], np.int64)


def cdiv_expected(d):
    return np.array([-(-(i - 32) // d) for i in range(64)], np.int32)


def test_symbols_are_ints_and_products_of_sizes_are_64_bit():
    cuda = tilec.compile(AREA).cuda_source
    assert "const int M," in cuda and "const int N)" in cuda
    assert "static_cast<long long>(M) * N + static_cast<long long>(tl_cdiv(M, 7)) * tl_cdiv(N, 5) * i" in cuda
    # a size times a block index or a const stays 32-bit
    gemm = tilec.compile(str(ROOT / "examples/gemm.tile")).cuda_source
    assert "const int K," in gemm and "static_cast<long long>" not in re.sub(r"(?s)\{  // C's columns.*", "", gemm)


def test_cdiv_is_exact_without_overflow():
    cuda = tilec.compile(CDIV).cuda_source
    assert "auto tl_cdiv(A a, B b) { return a / b + (a % b > 0); }" in cuda


def test_the_host_wrapper_passes_symbols_through_their_check():
    k = tilec.compile(str(ROOT / "examples/gemm.tile"))
    assert 'rt.symbol("K", K)' in k.host_source
    assert host.symbol("K", 2**31 - 1).value == 2**31 - 1
    with pytest.raises(tilec.LaunchError, match=r"shape symbol K = 2147483648 is over 2\^31-1: kernels index "
                                                r"each dimension with 32-bit ints"):
        host.symbol("K", 2**31)


def test_interpreter_refuses_a_dimension_over_2_31_like_the_gpu():
    """The interpreter binds symbols through the same check (a 2^31-element view of one
    float, stride 0: no memory), so its launch error is the GPU's, not numpy's overflow."""
    k = tilec.compile(AREA, backend="interpret")
    big = np.lib.stride_tricks.as_strided(np.zeros(1, np.int64), (2**31,), (0,))
    out = guarded((2,), "i64", like="numpy")
    with pytest.raises(tilec.LaunchError, match=r"shape symbol M = 2147483648 is over 2\^31-1"):
        k(big, np.zeros(N, np.int64), out.view)
    out.check()


def test_interpreter_multiplies_sizes_in_64_bits():
    k = tilec.compile(AREA, backend="interpret")
    out = guarded((2,), "i64", like="numpy")
    k(np.zeros(M, np.int64), np.zeros(N, np.int64), out.view)
    out.check()
    assert np.array_equal(out.view, area_expected())


@pytest.mark.parametrize("d", [1, 3, 7, 64])
def test_interpreter_cdiv_rounds_up_for_any_sign(d):
    k = tilec.compile(CDIV, backend="interpret")
    out = guarded((64,), "i32", like="numpy")
    k(out.view, d)
    out.check()
    assert np.array_equal(out.view, cdiv_expected(d))


@pytest.mark.gpu
def test_gpu_multiplies_sizes_in_64_bits_and_cdiv_rounds_up():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    k = tilec.compile(AREA)
    out = guarded((2,), "i64")
    k(torch.zeros(M, dtype=torch.int64, device="cuda"), torch.zeros(N, dtype=torch.int64, device="cuda"), out.view)
    torch.cuda.synchronize()
    out.check()
    assert np.array_equal(out.view.cpu().numpy(), area_expected())
    k = tilec.compile(CDIV)
    for d in (1, 3, 7, 64):
        out = guarded((64,), "i32")
        k(out.view, d)
        torch.cuda.synchronize()
        out.check()
        assert np.array_equal(out.view.cpu().numpy(), cdiv_expected(d))
