"""f16 and bf16 scalar arguments in element expressions (found by session 42's
fuzzing: `y[i, j] = n` with an f16 `n` into a bf16 tile, `select(c, n, 2.0)`, `abs(n)`
and `fill(y, n)` of another 16-bit or 8-bit type were NVRTC errors, since the scalar
was f16_t where the expression wanted a float). A scalar is now read as float, as a
tile element of its type is. NVRTC on the CPU; the interpreter and the GPU against
numpy."""
import ml_dtypes
import numpy as np
import pytest

import tilec

from guard import guarded

SRC = """kernel halves(X: f32[M, 16], Y: f16[M, 16], Z: bf16[M, 16], W: f32[M, 16], V: f8e4m3[M, 16], h: f16, g: bf16) {
    grid (by) = (cdiv(M, 16));
    threads 128;
    shared x: f32[16, 16];
    shared y: f16[16, 16];
    shared z: bf16[16, 16];
    shared w: f32[16, 16];
    shared v: f8e4m3[16, 16];
    copy(X[by * 16, 0], x);
    fill(v, h);
    parallel (i, j) in (16, 16) {
        y[i, j] = g;
        z[i, j] = select(j < 8, h, x[i, j]);
        w[i, j] = abs(g) + max(h, x[i, j]) + min(g, 2.0) * h;
    }
    copy(y, Y[by * 16, 0]);
    copy(z, Z[by * 16, 0]);
    copy(w, W[by * 16, 0]);
    copy(v, V[by * 16, 0]);
}
"""
H, G = np.float16(1.5), ml_dtypes.bfloat16(-2.75)


def reference(x):
    h, g = np.float32(H), np.float32(G)
    j = np.arange(16)[None, :]
    z = np.where(j < 8, h, x).astype(ml_dtypes.bfloat16)
    w = (np.abs(g) + np.fmax(h, x) + np.minimum(g, np.float32(2.0)) * h).astype(np.float32)
    return (np.full(x.shape, g, np.float16), z, w, np.full(x.shape, h, ml_dtypes.float8_e4m3fn))


def test_they_compile_through_nvrtc():
    k = tilec.compile(SRC)
    assert k.cubin[:4] == b"\x7fELF" and k.compile_log == ""
    assert "float(h)" in k.cuda_source and "float(g)" in k.cuda_source


def outputs(m, like):
    return [guarded((m, 16), dt, like=like) for dt in ("f16", "bf16", "f32", "f8e4m3")]


@pytest.mark.parametrize("m", [16, 37])
def test_in_the_interpreter(m):
    x = np.random.default_rng(m).standard_normal((m, 16)).astype(np.float32)
    outs = outputs(m, "numpy")
    tilec.compile(SRC, backend="interpret")(x, *(o.view for o in outs), H, G)
    for o, want in zip(outs, reference(x)):
        o.check()
        assert np.array_equal(o.view.astype(np.float32), want.astype(np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 37, 1000])
def test_on_the_gpu(m):
    import torch
    x = np.random.default_rng(m).standard_normal((m, 16)).astype(np.float32)
    outs = outputs(m, "torch")
    tilec.compile(SRC)(torch.from_numpy(x).cuda(), *(o.view for o in outs), H, G)
    torch.cuda.synchronize()
    for o, want in zip(outs, reference(x)):
        o.check()
        assert np.array_equal(o.view.float().cpu().numpy(), want.astype(np.float32))
