"""GPU: every wgmma tile shape plan-gemm takes (tests/gemm_shapes.py) equals
torch.matmul: warpgroups over M or N, 128-, 64- and 32-byte swizzled operand
rows (16-byte rows, not swizzled, for 8 or 24 M/N-major columns a warpgroup),
M-major a and K-major b, tiles of fewer than 64 rows (swapped: acc^T = b^T @ a^T; or, N no multiple
of 64 either, N padded to m64 tiles and swapped, or M padded where N's last m64 tile would be 8 rows);
f32 outputs (fragment stores) and f16/bf16 outputs (the swizzled staging tile and TMA stores), ragged
and aligned sizes, each output a view inside a sentinel-filled buffer (tests/guard.py)."""
import pytest

import tilec
from gemm_shapes import DEEP, UNEVEN, UNEVEN_SPLITS, case_id, cases, source, uneven_operands
from guard import guarded

pytestmark = pytest.mark.gpu

CASES = list(cases())
TORCH = {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}


def run_case(case, dt, ct, m, n, k):
    import torch
    (bm, bn, bk, th), ta, tb = case
    kern = tilec.compile(source(bm, bn, bk, th, ta, tb, dt=dt, ct=ct, stages=3), fallback=False)
    tdt = getattr(torch, TORCH[dt])
    a = torch.randn((k, m) if ta else (m, k), device="cuda").to(tdt)
    b = torch.randn((n, k) if tb else (k, n), device="cuda").to(tdt)
    c = guarded((m, n), ct, fill=float("nan"))
    kern(a, b, c.view)
    torch.cuda.synchronize()
    want = (a.t() if ta else a).float() @ (b.t() if tb else b).float()
    got = c.view.float()
    assert torch.isfinite(got).all()
    err = ((got - want).norm() / want.norm()).item()
    assert err < {"f32": 1e-4, "f16": 2e-3, "bf16": 1e-2}[ct], f"relative error {err:.2e}"
    c.check()


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("ct", ["f32", "f16"])
@pytest.mark.parametrize("size", [(1000, 1032, 520), (512, 768, 1024)], ids=lambda s: "x".join(map(str, s)))
def test_shape_equals_matmul(case, ct, size):
    run_case(case, "f16", ct, *size)


@pytest.mark.parametrize("case", [c for c in CASES if c[1] or c[2]], ids=case_id)
def test_shape_bf16(case):
    run_case(case, "bf16", "bf16", 1000, 1032, 520)


@pytest.mark.parametrize("ta", [False, True], ids=["a", "ta"])
@pytest.mark.parametrize("shape", DEEP, ids=lambda s: "x".join(map(str, s)))
def test_a_k_tile_over_256_rows_equals_matmul(shape, ta):
    """b's swizzled chunks in two boxes, the second at the pattern's period (256 or 512 bytes)."""
    run_case((shape, ta, False), "f16", "f32", 1000, 1032, 1000)


@pytest.mark.parametrize("bm, bn, threads", UNEVEN_SPLITS)
def test_an_uneven_split_reads_and_writes_memory_only_inside_n(bm, bn, threads):
    """tests/gemm_shapes.py's UNEVEN on the device: exact (small integers), nothing written
    outside C (its guard), whatever the registers past N (or past M, padded) hold."""
    import numpy as np
    import torch
    a, b, bias, want = uneven_operands(bm, bn)
    kern = tilec.compile(UNEVEN.format(bm=bm, bn=bn, threads=threads), fallback=False)
    c = guarded(want.shape, "f32", fill=float("nan"))
    kern(*(torch.from_numpy(x).cuda() for x in (a, b, bias)), c.view)
    torch.cuda.synchronize()
    c.check()
    np.testing.assert_array_equal(c.view.cpu().numpy(), want)
