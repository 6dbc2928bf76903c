"""A gemm operand in 16-byte chunks, not swizzled (layout sw16: wgmma's interleaved
layout), filled by TMA im2col loads of 8 channels a filter tap and scaled by the
threads in between (tests/filecheck/gemm_unswizzled_taps.tile, whose CUDA the
filecheck test pins): the interpreter and the GPU against numpy, the output in a
sentinel-filled buffer."""
import numpy as np
import pytest

import tilec
from conftest import ROOT
from guard import guarded
from test_two_sources import im2col

SRC = (ROOT / "tests/filecheck/gemm_unswizzled_taps.tile").read_text()
SIZES = [(2, 5, 6, 64), (3, 7, 9, 136)]


def problem(n, h, w, f, like):
    rng = np.random.default_rng(n * h * w + f)
    x = rng.integers(-2, 3, (n, h, w, 8)).astype(np.float16)
    wt = rng.integers(-2, 3, (72, f)).astype(np.float16)
    want = 0.5 * (im2col(x) @ wt.astype(np.float64))
    args = [x, wt]
    if like == "torch":
        import torch
        args = [torch.from_numpy(a).cuda() for a in args]
    return args, guarded((n * h * w, f), "f32", like=like), want


def test_in_the_interpreter():
    args, y, want = problem(*SIZES[0], "numpy")
    tilec.compile(SRC, backend="interpret", fallback=False)(*args, y.view, 0.5)
    y.check()
    assert np.array_equal(y.view.astype(np.float64), want)


@pytest.mark.gpu
@pytest.mark.parametrize("size", SIZES)
def test_on_the_gpu(size):
    import torch
    args, y, want = problem(*size, "torch")
    tilec.compile(SRC, fallback=False)(*args, y.view, 0.5)
    torch.cuda.synchronize()
    y.check()
    assert np.array_equal(y.view.cpu().numpy().astype(np.float64), want)
