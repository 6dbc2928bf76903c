"""A gemm operand in 16-byte chunks, not swizzled (layout sw16: wgmma's interleaved
layout), filled by TMA im2col loads of 8 channels a filter tap and scaled by the
threads in between (tests/filecheck/gemm_unswizzled_taps.tile, whose CUDA the
filecheck test pins): the interpreter and the GPU against numpy, the output in a
sentinel-filled buffer."""
import numpy as np
import pytest

from conftest import ROOT
from guard import guarded
from test_two_sources import im2col, on, run_exactly

SRC = (ROOT / "tests/filecheck/gemm_unswizzled_taps.tile").read_text()
SIZES = [(2, 5, 6, 64), (3, 7, 9, 136)]


def problem(n, h, w, f, like):
    rng = np.random.default_rng(n * h * w + f)
    x = rng.integers(-2, 3, (n, h, w, 8)).astype(np.float16)
    wt = rng.integers(-2, 3, (72, f)).astype(np.float16)
    want = 0.5 * (im2col(x) @ wt.astype(np.float64))
    return on(like, [x, wt]), [guarded((n * h * w, f), "f32", like=like)], [want], (0.5,)


F8 = """kernel eight_bit(X: f8e4m3[N, H, W, 16], Wt: f8e4m3[F, 9 * 16], Y: f32[NP, F]) {
    require NP == N * H * W;
    let Xc = im2col(X, kernel = (3, 3), pad = (1, 1));
    grid (bx, by) = (cdiv(F, 64), cdiv(NP, 64));
    threads 128;
    shared a: f8e4m3[64, 128];
    shared b: f8e4m3[64, 128];
    local acc: f32[64, 64];
    fill(acc, 0);
    for k in pipelined(cdiv(9 * 16, 128), stages = 2) {
        copy(Xc[by * 64, k * 128], a);
        copy(Wt[bx * 64, k * 128], b);
        gemm(a, b, acc, transpose_b = true);
    }
    copy(acc, Y[by * 64, bx * 64]);
}
"""


def f8_problem(n, h, w, f, like):
    """16 f8e4m3 channels a tap (16 bytes): 'a' in 16-byte chunks, a K step of 32 bytes two of them."""
    import ml_dtypes
    rng = np.random.default_rng(n * h * w + f)
    x = rng.integers(-2, 3, (n, h, w, 16)).astype(ml_dtypes.float8_e4m3fn)
    wt = rng.integers(-2, 3, (f, 144)).astype(ml_dtypes.float8_e4m3fn)
    want = im2col(x.astype(np.float64)) @ wt.astype(np.float64).T
    args = [x, wt]
    if like == "torch":
        import torch
        args = [torch.from_numpy(a.view(np.uint8)).cuda().view(torch.float8_e4m3fn) for a in args]
    return args, [guarded((n * h * w, f), "f32", like=like)], [want], ()


KERNELS = {"f16, 8 channels, scaled": (SRC, problem), "f8e4m3, 16 channels": (F8, f8_problem)}


@pytest.mark.parametrize("kernel", KERNELS)
def test_in_the_interpreter(kernel):
    from tilec.compiler import lower
    src, make = KERNELS[kernel]
    assert lower(src).stages["plan-tma"].buffer("a").layout == "sw16"
    run_exactly(src, "numpy", *make(*SIZES[0], "numpy"))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("size", SIZES)
def test_on_the_gpu(kernel, size):
    src, make = KERNELS[kernel]
    run_exactly(src, "torch", *make(*size, "torch"))
