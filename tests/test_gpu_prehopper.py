"""GPU: the lowering sm_80 / sm_86 / sm_89 get (no TMA, no mbarriers: every
global <-> shared copy a bounds-checked thread copy) run on the Hopper GPU and
checked against torch (marked gpu; run with a timeout).

A cubin for sm_80 does not run on an sm_90 GPU, so these run the same CUDA built
for sm_90a: the thread-copy variant of the sm_90a kernel (`k.fallback`, here built
on its own with `Kernel(source, consts, "sm_90a", tma=False)`, so that programs
only TMA would refuse run too), which
tests/test_arch.py::test_pre_hopper_lowering_is_the_thread_copy_variant shows is
line for line what sm_80 / sm_86 / sm_89 get (all but the header comment).
Every output is a view inside a sentinel-filled buffer (tests/guard.py) whose
padding must be intact after the run."""
import dataclasses

import numpy as np
import pytest

import tilec
from conftest import ROOT
from guard import guarded
from test_gpu_copy import BN, COPY2D, rand
from test_gpu_im2col import reference as im2col_reference
from test_gpu_im2col import source as im2col_source

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1), (777, 1000), (1000, 1000), (4097, 129), (3, 70000)]


def pre_hopper(src, **consts) -> tilec.Kernel:
    """`src` as sm_80 / sm_86 / sm_89 compile it, built for this GPU (what
    tilec.compile(src, arch="sm_90a", **consts).fallback is)."""
    from tilec.compiler import load_source
    from tilec.kernel import Kernel
    k = Kernel(load_source(src), consts, "sm_90a", fallback=False, tma=False)
    for word in ("cp.async.bulk", "mbarrier", "fence.proxy.async"):
        assert word not in k.ptx
    return k


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_copy2d_example(shape):
    import torch
    k = pre_hopper(str(ROOT / "examples" / "copy2d.tile"))
    a = rand(shape, "f32")
    b = guarded(shape, "f32")
    k(a, b.view)
    torch.cuda.synchronize()
    assert torch.equal(a, b.view)
    b.check()


@pytest.mark.parametrize("align", [True, False], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("dt", ["f16", "bf16", "f32", "i8", "f64"])
def test_copy2d_dtypes_and_views(dt, align):
    """Aligned views with 16-byte aligned row pitches take the 16-byte vector
    copies (333 columns: the last vector of a row crosses the tensor's end and
    goes element by element); views that start off the 16-byte grid, which TMA
    could not describe either, take the element copies."""
    import torch
    k = pre_hopper(COPY2D.format(dt=dt, bn=BN[dt]))
    assert "tl_v16" in k.cuda_source
    shape = (1000, 333)
    a = guarded(shape, dt, fill=rand(shape, dt), align=align).view
    b = guarded(shape, dt, align=align)
    k(a, b.view)
    torch.cuda.synchronize()
    assert torch.equal(a, b.view)
    b.check()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_scale_example(shape):
    import torch
    k = pre_hopper(str(ROOT / "examples" / "scale.tile"))
    x = rand(shape, "f32")
    y = guarded(shape, "f32")
    k(x, y.view, 2.0)
    torch.cuda.synchronize()
    assert torch.equal(y.view, x * 2 + 1)       # 2x is exact: one rounding either way
    y.check()


@pytest.mark.parametrize("n, size, c", [(2, 14, 64), (1, 5, 128), (3, 9, 192)])
def test_im2col_example(n, size, c):
    import torch
    k = pre_hopper(str(ROOT / "examples" / "im2col.tile"))
    x = torch.randn(n, size, size, c, device="cuda").to(torch.float16)
    want = im2col_reference(x.cpu().numpy(), (3, 3), 1, 1, 1)
    y = guarded(want.shape, "f16", fill=float("nan"))
    k(x, y.view)
    torch.cuda.synchronize()
    y.check()
    got = y.view.cpu().numpy()
    assert got.shape == want.shape
    bad = np.argwhere(~(got == want))
    assert bad.size == 0, f"{len(bad)} wrong elements, first at {bad[:3].tolist()}"


# spatial dims, dtype, images, size, channels, filter, stride, padding, dilation
# (3 f32 channels: 12 bytes a pixel, which a TMA im2col load cannot move; thread copies can)
IM2COL_CASES = [(1, "f32", 2, 31, 4, 5, 1, 2, 2), (2, "f16", 3, 7, 16, 3, 2, 1, 1), (2, "f16", 1, 5, 64, 7, 3, 3, 1),
                (3, "f16", 1, 7, 8, 3, 1, 1, 1), (2, "f32", 2, 12, 3, 3, 1, 0, 1)]


@pytest.mark.parametrize("case", IM2COL_CASES, ids=lambda c: "-".join(map(str, c)))
def test_im2col_strides_padding_dilation(case):
    import torch
    spatial, dt, n, size, c, kk, s, p, d = case
    dims = {1: ("W",), 2: ("H", "W"), 3: ("Dd", "H", "W")}[spatial]
    consts = dict(S=s, P=p, DIL=d, BM=128, BK=min(c, 64), **{f"K{dd}": kk for dd in dims})
    k = pre_hopper(im2col_source(spatial, dt), **consts)
    x = torch.randn(n, *(size,) * spatial, c, device="cuda").to({"f16": torch.float16, "f32": torch.float32}[dt])
    want = im2col_reference(x.cpu().numpy(), (kk,) * spatial, s, p, d)
    assert want.shape[0] > 0
    y = guarded(want.shape, dt, fill=float("nan"))
    k(x, y.view)
    torch.cuda.synchronize()
    y.check()
    got = y.view.cpu().numpy()
    bad = np.argwhere(~(got == want))
    assert bad.size == 0, f"{len(bad)} wrong elements, first at {bad[:3].tolist()}"


FP8_ROUNDTRIP = """
kernel roundtrip(A: f32[M, N], D: {dt}[M, N], C: {dt}[M, N], B: f32[M, N]) {{
    const BM = 32, BN = 64;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared a: f32[BM, BN];
    shared d: {dt}[BM, BN];
    shared s: {dt}[BM, BN];
    copy(A[by * BM, bx * BN], a);
    copy(D[by * BM, bx * BN], d);
    parallel (i, j) in (BM, BN) {{
        s[i, j] = a[i, j];
        a[i, j] = d[i, j];
    }}
    copy(s, C[by * BM, bx * BN]);
    copy(a, B[by * BM, bx * BN]);
}}
"""


@pytest.mark.parametrize("dt", ["f8e4m3", "f8e5m2"])
def test_software_fp8_conversions_match_the_hardware(monkeypatch, dt):
    """sm_80 / sm_86 have no fp8 cvt: their f8 types convert in software
    (primitives f8_soft). Built for this GPU with the software conversions
    (an sm_90a without fp8 cvt, a test-only patch of tilec.arch), they encode
    floats and decode all 256 codes bit for bit as the hardware cvt does."""
    import torch
    from tilec import arch as arch_info
    src = FP8_ROUNDTRIP.format(dt=dt)
    hw = pre_hopper(src)
    assert "cvt.rn.satfinite" in hw.cuda_source
    monkeypatch.setenv("TILEC_CACHE", "0")
    monkeypatch.setitem(arch_info.ARCHS, "sm_90a", dataclasses.replace(arch_info.ARCHS["sm_90a"], fp8_cvt=False))
    soft = pre_hopper(src)
    assert "This target has no fp8 cvt" in soft.cuda_source and "satfinite" not in soft.cuda_source
    monkeypatch.undo()

    tdt = {"f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2}[dt]
    values = torch.arange(256, dtype=torch.uint8, device="cuda").view(tdt).float()
    finite = torch.unique(values[torch.isfinite(values)].double())
    mids = ((finite[1:] + finite[:-1]) / 2).float()
    special = torch.tensor([0.0, -0.0, 1e6, -1e6, 3.4e38, 448, 449, 464, 465, 480, 57344, 61439, 61440, 65536,
                            1e-9, -1e-9, 2 ** -9, 2 ** -10, 3 * 2 ** -10, 2 ** -16, 2 ** -17, 3 * 2 ** -17],
                           device="cuda")
    parts = [mids, torch.nextafter(mids, torch.full_like(mids, float("inf"))),
             torch.nextafter(mids, torch.full_like(mids, float("-inf"))), finite.float(), special]
    parts += [torch.randn(20000, device="cuda") * 10.0 ** e for e in range(-6, 7)]
    flat = torch.cat(parts)
    M, N = 64, -(-flat.numel() // 64)
    a = torch.zeros(M * N, device="cuda")
    a[:flat.numel()] = flat
    a = a.view(M, N)
    d = torch.arange(M * N, device="cuda").remainder(256).to(torch.uint8).view(tdt).view(M, N)
    outs = []
    for k in (hw, soft):
        c, b = guarded((M, N), dt), guarded((M, N), "f32")
        k(a, d, c.view, b.view)
        torch.cuda.synchronize()
        c.check()
        b.check()
        outs.append((c.view.view(torch.uint8).clone(), b.view.clone()))
    (c_hw, b_hw), (c_soft, b_soft) = outs
    wrong = (c_hw != c_soft).nonzero()
    assert wrong.numel() == 0, [(a[i, j].item(), c_hw[i, j].item(), c_soft[i, j].item()) for i, j in wrong[:5].tolist()]
    nan = torch.isnan(b_hw)
    assert torch.equal(nan, torch.isnan(b_soft))
    assert torch.equal(b_hw[~nan].view(torch.int32), b_soft[~nan].view(torch.int32))   # -0.0 too
