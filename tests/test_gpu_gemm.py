"""GPU: gemm on wgmma equals torch.matmul (marked gpu). C is a view inside a
sentinel-filled buffer (tests/guard.py): nothing around it may be written."""
import pytest

import tilec
from conftest import ROOT
from guard import guarded

pytestmark = pytest.mark.gpu

GEMM_T = """
kernel gemm_t(A: {dt}[M, K], B: {dt}[N, K], C: {dt}[M, N]) {{
    const BM = 128, BN = 128, BK = 64;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 256;
    shared a: {dt}[BM, BK];
    shared b: {dt}[BN, BK];
    local acc: f32[BM, BN];
    fill(acc, 0);
    for k in range(cdiv(K, BK)) {{
        copy(A[by * BM, k * BK], a);
        copy(B[bx * BN, k * BK], b);
        gemm(a, b, acc, transpose_b = true);
    }}
    copy(acc, C[by * BM, bx * BN]);
}}
"""


def torch_dt(dt):
    import torch
    return {"f16": torch.float16, "bf16": torch.bfloat16}[dt]


def check(c, a, b_kn):
    """c (a guarded output) holds a @ b_kn within the dtype's tolerance, and
    nothing around it was written."""
    import torch
    want = (a.float() @ b_kn.float())
    got = c.view.float()
    err = (got - want).norm() / want.norm().clamp_min(1e-6)
    assert torch.isfinite(got).all()
    assert err < (2e-3 if c.view.dtype == torch.float16 else 1e-2), f"relative error {err:.2e}"
    c.check()


SIZES = [(64, 64, 64), (127, 128, 1000), (128, 127, 64), (1000, 1000, 1000), (256, 384, 4096), (64, 1000, 127),
         (4096, 1000, 128), (127, 4096, 64), (1000, 64, 4096), (4096, 4096, 1000)]


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_example_equals_matmul(dt, mnk):
    import torch
    m, n, k = mnk
    src = (ROOT / "examples/gemm.tile").read_text().replace("f16", dt)
    kern = tilec.compile(src, tune=False)         # its declared consts (tests/test_autotune.py: every candidate)
    a = torch.randn(m, k, device="cuda").to(torch_dt(dt))
    b = torch.randn(k, n, device="cuda").to(torch_dt(dt))
    c = guarded((m, n), dt, fill=float("nan"))
    if (k * 2) % 16 or (n * 2) % 16:
        pytest.skip("rows not 16-byte aligned: the thread-copy variant has its own test")
    kern(a, b, c.view)
    torch.cuda.synchronize()
    check(c, a, b)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("mnk", [(128, 128, 64), (1000, 1000, 1000), (64, 4096, 128), (127, 1000, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gemm_transposed_b(dt, mnk):
    import torch
    m, n, k = mnk
    kern = tilec.compile(GEMM_T.format(dt=dt))
    a = torch.randn(m, k, device="cuda").to(torch_dt(dt))
    bt = torch.randn(n, k, device="cuda").to(torch_dt(dt))
    c = guarded((m, n), dt, fill=float("nan"))
    kern(a, bt, c.view)
    torch.cuda.synchronize()
    check(c, a, bt.t())


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("mnk", [(128, 128, 64), (128, 128, 128), (256, 256, 192), (1000, 1000, 1000), (4096, 4096, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
def test_pipelined_stages(stages, mnk):
    """Trip counts below, at and above the stage count; ragged K tails."""
    import torch
    m, n, k = mnk
    kern = tilec.compile(ROOT / "examples/gemm.tile", tune=False, STAGES=stages)
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(k, n, device="cuda").half()
    c = guarded((m, n), "f16", fill=float("nan"))
    kern(a, b, c.view)
    torch.cuda.synchronize()
    check(c, a, b)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("size", [64, 127, 128, 1000, 4096])
def test_gemm_square_sizes(dt, size):
    import torch
    kern = tilec.compile((ROOT / "examples/gemm.tile").read_text().replace("f16", dt), tune=False)
    a = torch.randn(size, size, device="cuda").to(torch_dt(dt))
    b = torch.randn(size, size, device="cuda").to(torch_dt(dt))
    c = guarded((size, size), dt, fill=float("nan"))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.TmaFallbackWarning)   # 127: rows not 16-byte aligned
        kern(a, b, c.view)
    torch.cuda.synchronize()
    check(c, a, b)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("mnk", [(128, 256, 64), (1000, 1000, 1000), (4096, 4096, 4096), (300, 2000, 520)],
                         ids=lambda s: "x".join(map(str, s)))
def test_tuned_gemm_example(dt, mnk):
    import torch
    m, n, k = mnk
    kern = tilec.compile((ROOT / "examples/gemm_128x256.tile").read_text().replace("f16", dt))
    a = torch.randn(m, k, device="cuda").to(torch_dt(dt))
    b = torch.randn(k, n, device="cuda").to(torch_dt(dt))
    c = guarded((m, n), dt, fill=float("nan"))
    kern(a, b, c.view)
    torch.cuda.synchronize()
    check(c, a, b)


@pytest.mark.parametrize("dt", ["f8e4m3", "f8e5m2"])
@pytest.mark.parametrize("mnk", [(128, 256, 128), (1000, 1000, 1024), (4096, 4096, 4096), (127, 72, 384)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("bm", [128, 16], ids=["bm128", "bm16"])
def test_f8_gemm(dt, mnk, bm):
    """examples/gemm_f8.tile (e4m3, and the same program in e5m2) against the f32
    product of the same 8-bit values; with 16-row tiles too (swapped: acc^T = b^T @ a^T,
    m64n16k32 on B's rows)."""
    import torch
    m, n, k = mnk
    tdt = {"f8e4m3": torch.float8_e4m3fn, "f8e5m2": torch.float8_e5m2}[dt]
    kern = tilec.compile((ROOT / "examples/gemm_f8.tile").read_text().replace("f8e4m3", dt), fallback=False,
                         BM=bm)
    a = torch.randn(m, k, device="cuda").to(tdt)
    bt = torch.randn(n, k, device="cuda").to(tdt)
    c = guarded((m, n), "f16", fill=float("nan"))
    kern(a, bt, c.view)
    torch.cuda.synchronize()
    check(c, a, bt.t())


@pytest.mark.parametrize("mnk", [(128, 256, 128), (1000, 1000, 1024), (4096, 4096, 4096), (200, 72, 384)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("consts", [{}, dict(BM=128, BN=64, STAGES=4), dict(BM=192, STAGES=2)],
                         ids=["tuned", "bm128-bn64-s4", "bm192-s2"])
def test_f8_blockscaled_gemm(mnk, consts):
    """examples/gemm_f8_blockscaled.tile (tuned, and fixed configs) against float64, and
    against torch._scaled_mm with the same blockwise scales (1x128 on A's and B's rows)
    where it takes the shape (multiples of 16)."""
    import torch
    m, n, k = mnk
    kb = -(-k // 128)
    kern = tilec.compile(ROOT / "examples/gemm_f8_blockscaled.tile", fallback=False, **consts)
    a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    bt = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    sa = torch.rand(kb, m, device="cuda") + 0.5
    sb = torch.rand(kb, n, device="cuda") + 0.5
    c = guarded((m, n), "f16", fill=float("nan"))
    kern(a, bt, sa, sb, c.view)
    torch.cuda.synchronize()
    c.check()
    want = sum((a[:, j * 128:(j + 1) * 128].double() @ bt[:, j * 128:(j + 1) * 128].double().t())
               * sa[j].double()[:, None] * sb[j].double()[None, :] for j in range(kb))
    scale = want.abs().max().item()
    assert (c.view.double() - want).abs().max().item() <= 2e-3 * scale
    if m % 16 == n % 16 == k % 16 == 0:     # (torch._scaled_mm takes no other shapes)
        peer = torch._scaled_mm(a, bt.t(), sa.t(), sb, out_dtype=torch.float16)
        assert (c.view.double() - peer.double()).abs().max().item() <= 2e-3 * scale


EPILOGUE = """
kernel gemm_epilogue(A: f16[M, K], B: f16[K, N], C: f32[M, N]) {
    const BM = 16, BN = 128, BK = 64, STAGES = 4, PRODUCER = 1, PERSISTENT = 1, STREAM_K = 1;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM)), persistent = PERSISTENT, stream_k = STREAM_K;
    threads 2 * max(BM, 64);
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    local acc: f32[BM, BN];
    fill(acc, 0);
    for k in pipelined(cdiv(K, BK), stages = STAGES, producer = PRODUCER) {
        copy(A[by * BM, k * BK], a);
        copy(B[k * BK, bx * BN], b);
        gemm(a, b, acc);
    }
    parallel (i, j) in (BM, BN) {
        acc[i, j] = acc[i, j] + (by * BM + i) * 0.5 - (bx * BN + j) * 0.25;
    }
    copy(acc, C[by * BM, bx * BN]);
}
"""


@pytest.mark.parametrize("consts", [dict(BM=16), dict(BM=16, STREAM_K=0), dict(BM=8, BN=64, PRODUCER=0),
                                    dict(BM=32, PERSISTENT=0, STREAM_K=0), dict(BM=64)],
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("mnk", [(13, 1000, 2008), (40, 4104, 4096), (1, 64, 64)], ids=lambda s: "x".join(map(str, s)))
def test_swapped_tile_epilogue_sees_each_element_at_its_place(consts, mnk):
    """Tiles of fewer than 64 rows run swapped (acc^T = b^T @ a^T): a parallel body
    that adds each element's row and column to it, then a copy out, must see
    element (i, j) where the program puts it (a transposed mapping would add the
    wrong row and column), on stream-K's partial sums too; into a guarded f32 view."""
    import torch
    m, n, k = mnk
    kern = tilec.compile(EPILOGUE, fallback=False, **consts)
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(k, n, device="cuda").half()
    c = guarded((m, n), "f32", fill=float("nan"))
    kern(a, b, c.view)
    torch.cuda.synchronize()
    rows = torch.arange(m, device="cuda").float()[:, None]
    cols = torch.arange(n, device="cuda").float()[None, :]
    want = a.float() @ b.float() + rows * 0.5 - cols * 0.25
    err = ((c.view - want).norm() / want.norm()).item()
    assert torch.isfinite(c.view).all() and err < 1e-4, f"relative error {err:.2e}"
    c.check()


@pytest.mark.parametrize("bm", [16, 128], ids=["swapped", "bm128"])
@pytest.mark.parametrize("ot", ["f32", "f16"])
@pytest.mark.parametrize("mnk", [(40, 200, 136), (1000, 1032, 520)], ids=lambda s: "x".join(map(str, s)))
def test_a_local_beside_the_accumulator(bm, ot, mnk):
    """tests/gemm_shapes.py's BESIDE: `out[i, j] = acc[i, j] * 2 + row - column / 2`, `out`
    in acc's fragment layout, then copied out (f32: thread stores; f16: the staged TMA
    store); into a guarded view."""
    import torch
    from gemm_shapes import BESIDE
    m, n, k = mnk
    kern = tilec.compile(BESIDE.format(bm=bm, ot=ot), fallback=False)
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(k, n, device="cuda").half()
    c = guarded((m, n), ot, fill=float("nan"))
    kern(a, b, c.view)
    torch.cuda.synchronize()
    rows = torch.arange(m, device="cuda").float()[:, None]
    cols = torch.arange(n, device="cuda").float()[None, :]
    want = 2 * (a.float() @ b.float()) + rows - 0.5 * cols
    err = ((c.view.float() - want).norm() / want.norm()).item()
    assert torch.isfinite(c.view.float()).all() and err < (2e-3 if ot == "f16" else 1e-5), f"relative error {err:.2e}"
    c.check()


@pytest.mark.parametrize("cfg", [dict(PRODUCER=1, PERSISTENT=1, STREAM_K=1), dict(PRODUCER=0, PERSISTENT=1, STREAM_K=1),
                                 dict(PRODUCER=1, PERSISTENT=1, STREAM_K=0), dict(PRODUCER=0, PERSISTENT=0, STREAM_K=0),
                                 {}], ids=["pr-pe-sk", "pe-sk", "pr-pe", "plain", "tuned"])
def test_gpu_an_empty_k_writes_zeros_through_the_thread_copy_variant(cfg):
    """K = 0: A and B are empty, which no tensor map describes; the call runs the
    thread-copy variant and C (a guarded view) is zeros, nothing around it written.
    Stream-K kernels wrote nothing here (their units split no K steps), and the tuner
    picked one of them as the fastest; "tuned" lets gemm.tile's tune statement choose."""
    import warnings
    import torch
    k = tilec.compile(str(ROOT / "examples" / "gemm.tile"), BM=128, BN=128, STAGES=3, **cfg)
    a = torch.empty(300, 0, device="cuda", dtype=torch.float16)
    b = torch.empty(0, 196, device="cuda", dtype=torch.float16)
    c = guarded((300, 196), "f16", fill=5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.TmaFallbackWarning)
        k(a, b, c.view)
    torch.cuda.synchronize()
    assert not c.view.any()
    c.check()
