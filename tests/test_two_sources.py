"""One gemm operand tile filled by two K loops from different sources: two im2col
views (two convolutions summed into one accumulator, as a residual branch of
another channel count is) or a view and a plain tensor. Where the views' filter
taps need the same swizzle this runs (the interpreter and the GPU against numpy,
outputs in sentinel-filled buffers); where they need different ones it is an error
naming both (tests/test_im2col_rules.py)."""
import numpy as np
import pytest

import tilec

from guard import guarded

SRC = """kernel two(X: f16[N, H, W, C1], Z: SECOND, Wt: f16[9 * C1, F], Vt: f16[9 * C2, F], Y: f32[NP, F]) {
    const C1 = 16, C2 = 16, BM = 64, BN = 64, BK = 64, S1 = 2, S2 = 2;
    require NP == N * H * W;
    let Xc = im2col(X, kernel = (3, 3), pad = (1, 1));
    VIEW
    grid (bx, by) = (cdiv(F, BN), cdiv(NP, BM));
    threads 128;
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    local acc: f32[BM, BN];
    fill(acc, 0);
    for k in pipelined(cdiv(9 * C1, BK), stages = S1) {
        copy(Xc[by * BM, k * BK], a);
        copy(Wt[k * BK, bx * BN], b);
        gemm(a, b, acc);
    }
    for k in pipelined(cdiv(9 * C2, BK), stages = S2) {
        copy(SOURCE[by * BM, k * BK], a);
        copy(Vt[k * BK, bx * BN], b);
        gemm(a, b, acc);
    }
    copy(acc, Y[by * BM, bx * BN]);
}
"""
VIEWS = (SRC.replace("SECOND", "f16[N, H, W, C2]").replace("VIEW", "let Zc = im2col(Z, kernel = (3, 3), pad = (1, 1));")
         .replace("SOURCE", "Zc"))
PLAIN = SRC.replace("SECOND", "f16[NP, 9 * C2]").replace("    VIEW\n", "").replace("SOURCE", "Z")
CASES = {"two views": (VIEWS, dict(S1=2, S2=3)), "two views, fewer stages second": (VIEWS, dict(S1=4, S2=1)),
         "a view and a tensor": (PLAIN, dict(S1=3, S2=2)), "32 channels": (VIEWS, dict(C1=32, C2=32, S1=2, S2=2))}
SIZES = [(2, 5, 6, 64), (3, 7, 9, 136)]


def im2col(x):
    n, h, w, c = x.shape
    p = np.zeros((n, h + 2, w + 2, c))
    p[:, 1:-1, 1:-1] = x
    return np.concatenate([p[:, dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)], axis=-1) \
        .reshape(n * h * w, 9 * c)


def problem(case, n, h, w, f, like):
    """The inputs (small integers: every sum is exact), a guarded output and the
    expected result."""
    src, consts = CASES[case]
    c1, c2 = consts.get("C1", 16), consts.get("C2", 16)
    rng = np.random.default_rng(n * h * w + f)
    x = rng.integers(-2, 3, (n, h, w, c1)).astype(np.float16)
    z = rng.integers(-2, 3, (n, h, w, c2) if src is VIEWS else (n * h * w, 9 * c2)).astype(np.float16)
    wt, vt = (rng.integers(-2, 3, (9 * c, f)).astype(np.float16) for c in (c1, c2))
    want = im2col(x) @ wt.astype(np.float64) + (im2col(z) if src is VIEWS else z.astype(np.float64)) @ vt
    args = [x, z, wt, vt]
    if like == "torch":
        import torch
        args = [torch.from_numpy(a).cuda() for a in args]
    return args, guarded((n * h * w, f), "f32", like=like), want


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("size", SIZES[:1])
def test_in_the_interpreter(case, size):
    src, consts = CASES[case]
    args, y, want = problem(case, *size, "numpy")
    tilec.compile(src, backend="interpret", fallback=False, **consts)(*args, y.view)
    y.check()
    assert np.array_equal(y.view.astype(np.float64), want)


@pytest.mark.parametrize("case", CASES)
def test_compiles_to_a_cubin(case):
    src, consts = CASES[case]
    k = tilec.compile(src, arch="sm_90a", **consts)
    assert k.cubin[:4] == b"\x7fELF" and k.compile_log == ""


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("size", SIZES)
def test_on_the_gpu(case, size):
    import torch
    src, consts = CASES[case]
    args, y, want = problem(case, *size, "torch")
    tilec.compile(src, fallback=False, **consts)(*args, y.view)
    torch.cuda.synchronize()
    y.check()
    assert np.array_equal(y.view.cpu().numpy().astype(np.float64), want)
