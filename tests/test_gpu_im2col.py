"""GPU: TMA im2col loads materialise the implicit-GEMM matrix exactly (marked gpu).
Every output is a view inside a sentinel-filled buffer (tests/guard.py) whose
padding must be intact after the run."""
import itertools
import math
import random
import warnings

import numpy as np
import pytest

import tilec
from conftest import ROOT
from guard import guarded
from test_interpret import DOUBLE, TAP_CASES, im2col_reference, im2col_source, tap_case_id

pytestmark = pytest.mark.gpu

SPATIAL = {1: ("W",), 2: ("H", "W"), 3: ("Dd", "H", "W")}


def source(spatial, dt):
    dims = SPATIAL[spatial]
    ks = [f"K{d}" for d in dims]
    outs = [f"(({d} + 2 * P - DIL * ({k} - 1) - 1) / S + 1)" for d, k in zip(dims, ks)]
    kernel = ks[0] if spatial == 1 else "(" + ", ".join(ks) + ")"
    return f"""
kernel im2col{spatial}(X: {dt}[N, {', '.join(dims)}, C], Y: {dt}[NP, {' * '.join(ks)} * C]) {{
    const {', '.join(f'{k} = 3' for k in ks)}, S = 1, P = 1, DIL = 1;
    const BM = 128, BK = 64;
    require NP == N * {' * '.join(f'max(0, {o})' for o in outs)};
    grid (bx, by) = (cdiv({' * '.join(ks)} * C, BK), cdiv(NP, BM));
    threads 128;
    let Xc = im2col(X, kernel = {kernel}, stride = S, pad = P, dilation = DIL);
    shared t: {dt}[BM, BK];
    copy(Xc[by * BM, bx * BK], t);
    copy(t, Y[by * BM, bx * BK]);
}}"""


def reference(x, K, S, P, D):
    """The [N * prod(O), prod(K) * C] matrix: rows walk the output pixels (last dim
    fastest), columns the filter taps then channels; padding reads zero."""
    n, *sp, c = x.shape
    outs = [(i + 2 * P - D * (k - 1) - 1) // S + 1 for i, k in zip(sp, K)]
    if min(outs) <= 0:
        return np.zeros((0, math.prod(K) * c), x.dtype)
    xp = np.pad(x, [(0, 0)] + [(P, P)] * len(sp) + [(0, 0)])
    cols = []
    for tap in itertools.product(*[range(k) for k in K]):
        sl = tuple([slice(None)] + [slice(t * D, t * D + S * (o - 1) + 1, S) for t, o in zip(tap, outs)]
                   + [slice(None)])
        cols.append(xp[sl].reshape(n * math.prod(outs), c))
    return np.concatenate(cols, axis=1)


def run_case(spatial, dt, n, size, c, k, s, p, d, bm=128):
    import torch
    torch_dt = {"f16": torch.float16, "f32": torch.float32}[dt]
    sp = (size,) * spatial
    K = (k,) * spatial
    bk = min(c, 64)
    consts = dict(S=s, P=p, DIL=d, BM=bm, BK=bk, **{f"K{dd}": k for dd in SPATIAL[spatial]})
    kern = tilec.compile(source(spatial, dt), **consts)
    x = torch.randn(n, *sp, c, device="cuda").to(torch_dt)
    want = reference(x.cpu().numpy(), K, s, p, d)
    y = guarded(want.shape, dt, fill=float("nan"))
    if y.view.numel() == 0 and want.shape[0] == 0:
        kern(x, y.view)   # an empty output launches nothing
        y.check()
        return
    kern(x, y.view)
    torch.cuda.synchronize()
    y.check()
    got = y.view.cpu().numpy()
    assert got.shape == want.shape
    bad = np.argwhere(~(got == want))
    assert bad.size == 0, f"{len(bad)} wrong elements, first at {bad[:3].tolist()}"


def cases():
    rng = random.Random(1234)
    out = []
    for _ in range(70):
        dt, c = rng.choice([("f16", 8), ("f16", 16), ("f16", 64), ("f16", 256), ("f32", 4), ("f32", 64)])
        n = rng.choice([1, 3, 8])
        size = rng.choice([1, 7, 14, 31, 56])
        k = rng.choice([1, 3, 5, 7])
        s = rng.choice([1, 2, 3])
        p = rng.choice([0, 1, 2, 3])
        d = rng.choice([1, 2])
        if n * size * size * c > 8 * 56 * 56 * 64:
            n = 1
        out.append((2, dt, n, size, c, k, s, p, d))
    # the ResNet-50 layer, one-pixel and empty outputs, rows crossing images, conv1d and conv3d
    out += [(2, "f16", 2, 56, 64, 3, 1, 1, 1), (2, "f16", 3, 7, 16, 7, 1, 0, 1), (2, "f16", 3, 5, 16, 7, 1, 0, 1),
            (2, "f16", 3, 3, 8, 3, 1, 0, 1), (2, "f16", 8, 14, 64, 3, 2, 1, 1), (2, "f32", 3, 31, 4, 5, 3, 2, 2),
            (1, "f16", 3, 100, 16, 3, 1, 1, 1), (1, "f16", 2, 31, 64, 5, 2, 2, 2), (1, "f32", 1, 7, 4, 7, 1, 3, 1),
            (3, "f16", 2, 7, 16, 3, 1, 1, 1), (3, "f16", 1, 9, 8, 3, 2, 0, 2), (3, "f32", 2, 5, 4, 3, 1, 1, 1)]
    return out


@pytest.mark.parametrize("case", cases(), ids=lambda c: "r{}-{}-n{}-s{}-c{}-k{}-st{}-p{}-d{}".format(c[0] + 2, *c[1:]))
def test_im2col_matrix_equals_reference(case):
    run_case(*case)


def test_im2col_bm_64():
    run_case(2, "f16", 3, 14, 64, 3, 1, 1, 1, bm=64)


def test_im2col_channels_not_16_byte_aligned_falls_back():
    """f16 with C = 3: a pixel's channels are 6 bytes, TMA cannot load them; the
    thread-copy variant gives the right matrix, with a warning."""
    import torch
    kern = tilec.compile(source(2, "f16"), BK=8)
    x = torch.randn(2, 9, 9, 3, device="cuda").half()
    want = reference(x.cpu().numpy(), (3, 3), 1, 1, 1)
    y = guarded(want.shape, "f16", align=False, fill=0)     # 27 f16 (54-byte) rows: Y is no TMA tensor either
    with pytest.warns(tilec.errors.TmaFallbackWarning, match="C|channels"):
        kern(x, y.view)
    torch.cuda.synchronize()
    assert np.array_equal(y.view.cpu().numpy(), want)
    y.check()


def test_im2col_channels_error_without_fallback():
    import torch
    kern = tilec.compile(source(2, "f16"), BK=8, fallback=False)
    x = torch.randn(2, 9, 9, 3, device="cuda").half()
    y = torch.zeros(2 * 81, 27, device="cuda", dtype=torch.float16)
    with pytest.raises(tilec.LaunchError, match="argument X: 3 channels is not a multiple of the 8 channels of one im2col load"):
        kern(x, y)


def test_im2col_example_file():
    import torch
    kern = tilec.compile(ROOT / "examples/im2col.tile")
    x = torch.randn(2, 14, 14, 64, device="cuda").half()
    want = reference(x.cpu().numpy(), (3, 3), 1, 1, 1)
    y = guarded(want.shape, "f16", fill=float("nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kern(x, y.view)
    torch.cuda.synchronize()
    assert np.array_equal(y.view.cpu().numpy(), want)
    y.check()


@pytest.mark.parametrize("case", TAP_CASES, ids=tap_case_id)
@pytest.mark.parametrize("body", ["", DOUBLE], ids=["tma-store", "parallel"])
def test_im2col_tile_spanning_filter_taps(case, body):
    """C fixed in the declaration, C < BK: BK / C TMA im2col loads per K tile into
    C-wide column chunks, read by threads and stored back chunk by chunk."""
    import torch
    spatial, dt, c, bk, k, s, p, d, size = case
    consts = dict(S=s, P=p, DIL=d, BM=64, BK=bk, **{f"K{dd}": k for dd in SPATIAL[spatial]})
    kern = tilec.compile(im2col_source(spatial, dt, channels=str(c), body=body), fallback=False, **consts)
    assert kern.compile_log == ""
    torch_dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dt]
    x = torch.randn(2, *(size,) * spatial, c, device="cuda").to(torch_dt)
    want = im2col_reference(x.float().cpu().numpy(), k, s, p, d)
    if body:
        want = want * 2 + np.arange(want.shape[1]) % bk
    y = guarded(want.shape, dt, fill=float("nan"))
    kern(x, y.view)
    torch.cuda.synchronize()
    expect = torch.from_numpy(np.ascontiguousarray(want, np.float32)).to(torch_dt)
    assert torch.equal(y.view.cpu(), expect)
    y.check()
