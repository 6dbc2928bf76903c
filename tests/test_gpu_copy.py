"""GPU: copies and elementwise kernels against torch (marked gpu; run with a timeout).
Every output is a view inside a sentinel-filled buffer (tests/guard.py) whose
padding must be intact after the run."""
import warnings

import numpy as np
import pytest

import tilec
from conftest import ROOT
from guard import guarded

pytestmark = pytest.mark.gpu

DTYPES = ["f16", "bf16", "f32", "i8", "f64"]
SHAPES = [(1, 1), (1000, 1000), (4097, 129), (3, 70000)]

COPY2D = """
kernel copy2d(A: {dt}[M, N], B: {dt}[M, N]) {{
    const BM = 64, BN = {bn};
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared s: {dt}[BM, BN];
    copy(A[by * BM, bx * BN], s);
    copy(s, B[by * BM, bx * BN]);
}}
"""
# 128-element rows for every dtype (f64: 64 so the tile stays at 32 KB)
BN = {"f16": 128, "bf16": 128, "f32": 128, "i8": 128, "f64": 64}


def torch_dtype(dt):
    import torch
    return {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "i8": torch.int8,
            "f64": torch.float64, "u8": torch.uint8, "i32": torch.int32}[dt]


def rand(shape, dt):
    import torch
    if dt in ("i8", "u8", "i32"):
        return torch.randint(-100 if dt != "u8" else 0, 100, shape, device="cuda").to(torch_dtype(dt))
    return torch.randn(*shape, device="cuda").to(torch_dtype(dt))


@pytest.mark.parametrize("layout", ["contiguous", "padded"])
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_copy2d_equals_input(dt, shape, layout):
    """A contiguous A whose rows are not 16-byte aligned runs the thread-copy
    variant; a padded A (a view with aligned rows) lets TMA copy ragged rows too."""
    import torch
    k = tilec.compile(COPY2D.format(dt=dt, bn=BN[dt]))
    a = rand(shape, dt)
    if layout == "padded":
        a = guarded(shape, dt, fill=a).view
    b = guarded(shape, dt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.errors.TmaFallbackWarning)
        k(a, b.view)
    torch.cuda.synchronize()
    assert torch.equal(a, b.view)
    b.check()


def test_copy2d_example_file():
    import torch
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    a = rand((777, 1000), "f32")
    b = guarded(a.shape, a.dtype)
    k(a, b.view)
    torch.cuda.synchronize()
    assert torch.equal(a, b.view)
    b.check()


RANKED = {
    1: ("A: f32[N], B: f32[N]", "grid (bx) = (cdiv(N, 256));", "f32[256]", "[bx * 256]", (100003,)),
    3: ("A: f32[D, M, N], B: f32[D, M, N]", "grid (bx, by, bz) = (cdiv(N, 64), cdiv(M, 8), cdiv(D, 4));",
        "f32[4, 8, 64]", "[bz * 4, by * 8, bx * 64]", (9, 17, 200)),
    4: ("A: f16[P, D, M, N], B: f16[P, D, M, N]",
        "grid (bx, by, bz) = (cdiv(N, 64), cdiv(M, 8), P * cdiv(D, 2));",
        "f16[1, 2, 8, 64]", "[bz / cdiv(D, 2), (bz % cdiv(D, 2)) * 2, by * 8, bx * 64]", (3, 5, 17, 72)),
    5: ("A: bf16[Q, P, D, M, N], B: bf16[Q, P, D, M, N]",
        "grid (bx, by, bz) = (cdiv(N, 32), cdiv(M, 4), Q * P * D);",
        "bf16[1, 1, 1, 4, 32]", "[bz / (P * D), (bz / D) % P, bz % D, by * 4, bx * 32]", (2, 3, 4, 9, 40)),
}


@pytest.mark.parametrize("rank", sorted(RANKED))
def test_copy_of_rank(rank):
    import torch
    params, grid, tile, origin, shape = RANKED[rank]
    src = f"""kernel copy{rank}({params}) {{
        {grid}
        threads 128;
        shared s: {tile};
        copy(A{origin}, s);
        copy(s, B{origin});
    }}"""
    k = tilec.compile(src)
    dt = params.split(":")[1].split("[")[0].strip()
    a = rand(shape, dt)
    b = guarded(shape, dt)
    k(a, b.view)
    torch.cuda.synchronize()
    assert torch.equal(a, b.view)
    b.check()


def test_copy_of_a_strided_view():
    """A sliced torch view: 16-byte aligned start and row stride, not contiguous."""
    import torch
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    big = rand((1200, 1040), "f32")
    a = big[100:1100, 16:1016]
    assert not a.is_contiguous()
    b = guarded(a.shape, "f32", pad=[50, (32, 68)], fill=0)     # [50:1050, 32:1032] of a [1100, 1100] buffer
    k(a, b.view)
    torch.cuda.synchronize()
    assert torch.equal(a, b.view)
    b.check()


def test_illegal_stride_raises_named_error_before_launch():
    import torch
    k = tilec.compile(ROOT / "examples/copy2d.tile", fallback=False)
    a = rand((64, 130), "f32")[:, :7]     # row stride 520 bytes
    b = guarded((64, 7), "f32", fill=0)
    with pytest.raises(tilec.LaunchError, match=r"argument A: row stride 520 bytes is not a multiple of 16"):
        k(a, b.view)
    torch.cuda.synchronize()
    assert b.view.abs().sum() == 0
    b.check()


def test_illegal_stride_falls_back_with_a_warning():
    import torch
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    a = rand((300, 130), "f32")[:, :7]
    b = guarded((300, 7), "f32", align=False, fill=0)     # B is no TMA tensor either: its start is unaligned
    with pytest.warns(tilec.errors.TmaFallbackWarning, match="row stride 520 bytes"):
        k(a, b.view)
    torch.cuda.synchronize()
    assert torch.equal(a, b.view)
    b.check()


def test_launch_errors_name_the_argument():
    import torch
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    a = rand((64, 128), "f32")
    with pytest.raises(tilec.LaunchError, match=r"argument B: dtype f16 does not match the declared f32"):
        k(a, a.half())
    with pytest.raises(tilec.LaunchError, match=r"argument B: dim 0 is 65 but M = 64"):
        k(a, torch.zeros(65, 128, device="cuda"))
    with pytest.raises(tilec.LaunchError, match=r"argument A: a tensor on the CPU was passed"):
        k(a.cpu(), a)


def test_numpy_arguments_are_copied_in_and_out():
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    a = np.random.default_rng(1).standard_normal((300, 500), dtype=np.float32)
    b = guarded(a.shape, a.dtype, like="numpy", fill=0)
    k(a, b.view)
    assert np.array_equal(a, b.view)
    b.check()


@pytest.mark.parametrize("shape", [(1, 1), (333, 1000), (64, 256), (1000, 4096)])
def test_scale_equals_torch(shape):
    import torch
    k = tilec.compile(ROOT / "examples/scale.tile")
    x = rand(shape, "f32")
    y = guarded(shape, "f32")
    k(x, y.view, 0.75)
    torch.cuda.synchronize()
    torch.testing.assert_close(y.view, x * 0.75 + 1.0, rtol=1e-6, atol=1e-6)
    y.check()


def test_scale_f16_through_a_local_tile():
    """f16 in, f32 math in registers (a local tile), f16 out."""
    import torch
    from test_interpret import SCALE16
    k = tilec.compile(SCALE16)
    x = rand((100, 300), "f16")
    y = guarded(x.shape, x.dtype)
    k(x, y.view, 1.5)
    torch.cuda.synchronize()
    torch.testing.assert_close(y.view, (x.float() * 1.5 - 2.0).half(), rtol=0, atol=0)
    y.check()


def test_copy_in_a_loop_reuses_one_barrier():
    """One block walks all row tiles: the barrier's phase flips every trip."""
    import torch
    src = """
    kernel colcopy(A: f32[M, N], B: f32[M, N]) {
        grid (bx) = (cdiv(N, 128));
        threads 128;
        shared s: f32[32, 128];
        for r in range(cdiv(M, 32)) {
            copy(A[r * 32, bx * 128], s);
            parallel (i, j) in (32, 128) {
                s[i, j] = s[i, j] + 1.0;
            }
            copy(s, B[r * 32, bx * 128]);
        }
    }"""
    k = tilec.compile(src)
    a = rand((1000, 300), "f32")
    b = guarded(a.shape, a.dtype)
    k(a, b.view)
    torch.cuda.synchronize()
    torch.testing.assert_close(b.view, a + 1)
    b.check()


@pytest.mark.parametrize("rows, cols, stages, smem", [(96, 128, None, 49152), (32, 128, 3, 49152),
                                                     (128, 64, 3, 98304), (226, 256, None, 231424)],
                         ids=["one tile", "rotating", "over", "the most"])
def test_48_kib_of_tiles_and_their_barriers_launch(rows, cols, stages, smem):
    """Exactly 48 KiB of dynamic shared memory (one f32[96, 128] tile, or three
    copies of a rotating f32[32, 128] one) beside the mbarriers' static bytes is
    over the default limit, so the launch must ask for it (it once failed with
    CUDA_ERROR_INVALID_VALUE); 96 KiB, well over it; and 231424 bytes, the most a
    Hopper block has (232448) beside an mbarrier, which the driver counts as 1024
    bytes of static shared memory."""
    import torch
    loop = "range(1)" if stages is None else f"pipelined(cdiv(M, {rows}), stages = {stages})"
    src = f"""
    kernel tiles(A: f32[M, N], B: f32[M, N]) {{
        grid (bx) = (cdiv(N, {cols}));
        threads 128;
        shared s: f32[{rows}, {cols}];
        for r in {loop} {{
            copy(A[r * {rows}, bx * {cols}], s);
            copy(s, B[r * {rows}, bx * {cols}]);
        }}
    }}"""
    k = tilec.compile(src)
    assert f"dynamic_smem {smem} bytes" in k.ir("plan-smem")
    a = rand((rows if stages is None else 1000, 300), "f32")
    b = guarded(a.shape, a.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k(a, b.view)
    torch.cuda.synchronize()
    assert torch.equal(b.view, a)
    b.check()


def test_replayed_launch_follows_new_data_and_new_pointers():
    """The second call with the same tensors replays the prepared launch; new
    tensors (new pointers or shapes) get their own."""
    import torch
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    for shape in [(100, 256), (100, 256), (64, 128), (100, 256)]:
        a = rand(shape, "f32")
        b = guarded(shape, "f32")
        k(a, b.view)
        k(a, b.view)
        torch.cuda.synchronize()
        assert torch.equal(a, b.view)
        b.check()
    a = rand((100, 256), "f32")
    b = guarded(a.shape, a.dtype)
    k(a, b.view)
    a.add_(1.0)
    k(a, b.view)                  # same pointers, new contents
    torch.cuda.synchronize()
    assert torch.equal(a, b.view)
    b.check()


def test_launch_on_a_side_stream():
    import torch
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    a = rand((2048, 2048), "f32")
    b = guarded(a.shape, a.dtype)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())     # a and b's sentinel are written on the default stream
    with torch.cuda.stream(s):
        k(a, b.view)
        k(a, b.view)
    s.synchronize()
    assert torch.equal(a, b.view)
    b.check()


def assert_copies_exactly(k, a):
    """k(a, b) into a guarded b poisoned with -1 gives b == a and nothing written
    around b; then frees b (gigabytes)."""
    import torch
    b = guarded(a.shape, a.dtype, fill=-1.0)
    k(a, b.view)
    torch.cuda.synchronize()
    assert torch.equal(a, b.view)
    b.check()
    del b
    torch.cuda.empty_cache()


def test_copy_of_5_gib():
    """Over 4 GiB (1.34e9 f32 elements): TMA coordinates stay small, nothing overflows."""
    import torch
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    a = torch.zeros(40960, 32768, device="cuda")           # 5 GiB of f32, 1.34e9 elements
    a.view(-1)[:: 1 << 20].copy_(torch.arange(a.numel() >> 20, device="cuda", dtype=torch.float32))
    a[-1].fill_(7.0)
    assert_copies_exactly(k, a)


def test_tma_copy_over_2_pow_31_elements():
    """2.15e9 f16 elements (4.3 GB) through TMA: the host's element counts and
    byte strides are 64-bit, coordinates stay in int32."""
    import torch
    k = tilec.compile((ROOT / "examples/copy2d.tile").read_text().replace("f32", "f16"), fallback=False)
    rows, cols = (1 << 16) + 64, 32768                     # 2^31 + 2^21 elements
    a = torch.zeros(rows, cols, device="cuda", dtype=torch.float16)
    a[:, 0] = (torch.arange(rows, device="cuda") % 2048).half()
    a[-1] = (torch.arange(cols, device="cuda") % 2048).half()
    assert_copies_exactly(k, a)


def test_fallback_copy_over_2_pow_31_elements():
    """The thread-copy variant indexes with 64-bit math (rows not 16-byte aligned)."""
    import torch
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    rows, cols = (1 << 16) + 3, 32771                      # 2.15e9 elements, 8.6 GB each
    a = torch.zeros(rows, cols, device="cuda")
    a[:, 0] = torch.arange(rows, device="cuda", dtype=torch.float32)
    a[-1] = torch.arange(cols, device="cuda", dtype=torch.float32)
    b = guarded(a.shape, a.dtype, fill=-1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.errors.TmaFallbackWarning)
        k(a, b.view)
    torch.cuda.synchronize()
    assert torch.equal(a[:, 0], b.view[:, 0]) and torch.equal(a[-1], b.view[-1])
    assert torch.equal(a, b.view)
    b.check()
    del a, b
    torch.cuda.empty_cache()


def test_expanded_views_and_negative_strides():
    """torch's expand(): read as it is where the kernel reads it (TMA takes a stride of 0),
    refused with the reason where the kernel writes it (its writes would race), nothing
    written; cupy views with a negative stride (cuda.core reads them as unsigned): the
    thread-copy variant runs, and the message names the stride as it is."""
    import torch
    cp = pytest.importorskip("cupy")
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    row = torch.arange(130, device="cuda", dtype=torch.float32)[None, :]
    out = guarded((64, 130), "f32", fill=float("nan"))
    k(row.expand(64, 130), out.view)
    torch.cuda.synchronize()
    assert torch.equal(out.view, row.expand(64, 130))
    out.check()
    target = guarded((1, 130), "f32", fill=-1.0)
    with pytest.raises(tilec.LaunchError, match="argument B: dim 0 has stride 0, so its 64 elements share one "
                                                "address"):
        k(torch.ones(64, 130, device="cuda"), target.view.expand(64, 130))
    torch.cuda.synchronize()
    assert (target.view == -1).all()
    target.check()
    a = cp.arange(64 * 128, dtype=cp.float32).reshape(64, 128)
    b = guarded(a.shape, "f32", like="cupy", fill=float("nan"))
    with pytest.warns(tilec.TmaFallbackWarning, match="argument A: dim 0 stride -512 bytes is outside TMA's"):
        k(a[::-1], b.view)
    cp.cuda.get_current_stream().synchronize()
    assert bool((b.view == a[::-1]).all())
    b.check()
    rev = guarded(a.shape, "f32", like="cupy", fill=float("nan"))       # written reversed, inside its margin
    with pytest.warns(tilec.TmaFallbackWarning, match=f"argument B: dim 0 stride -{rev.view.strides[0]} bytes"):
        k(a, rev.view[::-1])
    cp.cuda.get_current_stream().synchronize()
    assert bool((rev.view[::-1] == a).all())
    rev.check()


def test_cupy_arguments():
    """cupy arrays through __cuda_array_interface__ / DLPack (cuda.core's StridedMemoryView)."""
    cp = pytest.importorskip("cupy")
    k = tilec.compile(ROOT / "examples/copy2d.tile")
    a = cp.random.standard_normal((300, 520), dtype=cp.float32)
    b = guarded(a.shape, "f32", like="cupy", fill=float("nan"))
    k(a, b.view)
    cp.cuda.get_current_stream().synchronize()
    assert bool((a == b.view).all())
    b.check()
    sliced = guarded(a.shape, "f32", like="cupy", pad=[1, (16, 64)], fill=0)     # [1:301, 16:536] of [302, 600]
    k(a, sliced.view)
    cp.cuda.get_current_stream().synchronize()
    assert bool((a == sliced.view).all())
    sliced.check()


class _DLPackOnly:
    """An array known only by DLPack (as JAX's are)."""
    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kw):
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class _InterfaceOnly:
    """An array known only by __cuda_array_interface__ (as numba's are), read-only if asked."""
    def __init__(self, t, readonly=False):
        self.__cuda_array_interface__ = dict(t.__cuda_array_interface__)
        self.__cuda_array_interface__["data"] = (t.data_ptr(), readonly)
        self.__cuda_array_interface__["version"] = 3        # torch says 2; cuda.core reads 3 and later
        self.t = t


def test_dlpack_and_cuda_array_interface_producers():
    """design.md §4: anything with DLPack or __cuda_array_interface__ (cuda.core's
    StridedMemoryView reads both): inputs and outputs (padded views, so strides travel),
    and a producer's read-only mark kept: a read-only output raises, nothing written."""
    import torch
    k = tilec.compile(ROOT / "examples/scale.tile")
    x = torch.randn(300, 520, device="cuda")
    for wrap_in, wrap_out in ((_DLPackOnly, _InterfaceOnly), (_InterfaceOnly, _DLPackOnly)):
        y = guarded(x.shape, "f32", fill=float("nan"))
        k(wrap_in(x), wrap_out(y.view), 2.0)
        torch.cuda.synchronize()
        assert torch.equal(y.view, x * 2.0 + 1.0)       # x * 2 is exact: one rounding either way
        y.check()
    y = guarded(x.shape, "f32", fill=-1.0)
    with pytest.raises(tilec.LaunchError, match=r"argument Y: the _InterfaceOnly is read-only \(its producer "
                                                r"exports it read-only\), and kernel scale writes it"):
        k(x, _InterfaceOnly(y.view, readonly=True), 2.0)
    k(_InterfaceOnly(x, readonly=True), y.view, 2.0)        # read-only input: read
    torch.cuda.synchronize()
    assert torch.equal(y.view, x * 2.0 + 1.0)
    y.check()
    host_out = np.full((300, 520), -1.0, np.float32)
    host_out.flags.writeable = False
    with pytest.raises(tilec.LaunchError, match=r"argument Y: the numpy array is read-only"):
        k(x, host_out, 2.0)
    assert (host_out == -1).all()


def test_sparse_and_nested_tensors_are_refused():
    """A sparse or nested torch tensor has no elements at data_ptr() and stride(): refused
    with a tilec error naming it, on the first call and after a replay of dense arguments,
    nothing written."""
    import torch
    k = tilec.compile(ROOT / "examples/scale.tile")
    x = torch.randn(300, 520, device="cuda")
    y = guarded(x.shape, "f32", fill=-1.0)
    sparse = x.to_sparse()
    nested = torch.nested.nested_tensor([x[:100], x[:200]], layout=torch.jagged)
    for attempt in range(2):
        for bad, kind in ((sparse, "sparse_coo"), (x.to_sparse_csr(), "sparse_csr"), (nested, "nested")):
            with pytest.raises(tilec.LaunchError, match=rf"argument X: a {kind} tensor, where tilec takes dense "
                                                        r"\(strided\) tensors: pass a dense one \(X.to_dense\(\)"):
                k(bad, y.view, 2.0)
        torch.cuda.synchronize()
        y.check()
        assert (y.view == -1).all()
        k(x, y.view, 2.0)       # dense arguments: a replay is prepared, and the next round goes past it
        torch.cuda.synchronize()
        assert torch.equal(y.view, x * 2.0 + 1.0)
        y.view.fill_(-1.0)
    y.check()


def test_arguments_that_share_memory():
    """On the GPU, with more tiles than the GPU holds at once (blocks of later waves read
    what earlier ones wrote, were the kernel not in place): scale in place equals torch,
    on one wave and on a persistent grid, inside its guard; a gemm writing into A, a
    written view over part of the input and a written view whose elements overlap are
    refused with the reason, nothing written; column halves of one buffer run. tests/center.tile
    (each row less its maximum: read in one loop, written in the next) runs in place too."""
    import torch
    scale = tilec.compile(ROOT / "examples/scale.tile")
    persistent = tilec.compile((ROOT / "examples/scale.tile").read_text().replace(
        "cdiv(M, BM));", "cdiv(M, BM)), persistent = 1;"))
    for k in (scale, persistent):
        x = guarded((4096, 2048), "f32", fill=float("nan"))
        x.view.copy_(torch.randn(4096, 2048, device="cuda"))
        want = x.view * 0.5 + 1.0
        k(x.view, x.view, 0.5)
        torch.cuda.synchronize()
        assert torch.equal(x.view, want)
        x.check()
    center = tilec.compile(ROOT / "tests/center.tile")        # two passes, the second writing where it reads
    x = guarded((16384, 1000), "f32", fill=float("nan"))
    x.view.copy_(torch.randn(16384, 1000, device="cuda"))
    want = x.view - x.view.max(dim=1, keepdim=True).values
    center(x.view, x.view)
    torch.cuda.synchronize()
    assert torch.equal(x.view, want)
    x.check()
    buf = guarded((4096 + 64, 2048), "f32", fill=float("nan"))
    buf.view.copy_(torch.randn(4096 + 64, 2048, device="cuda"))
    before = buf.view.clone()
    with pytest.raises(tilec.LaunchError, match="arguments X and Y share memory but are not the same view; the "
                                                "kernel writes Y, so its writes would race with the reads of X"):
        scale(buf.view[:4096], buf.view[64:], 0.5)
    overlapping = buf.view.as_strided((4096, 2048), (1024, 1))
    with pytest.raises(tilec.LaunchError, match=r"argument Y: some of its elements share memory \(shape \(4096, "
                                                r"2048\), strides \(4096, 4\) bytes"):
        scale(before[:4096], overlapping, 0.5)
    halves = guarded((4096, 4096), "f32", fill=0.0)
    scale(before[:4096], halves.view[:, 2048:], 0.5)
    torch.cuda.synchronize()
    assert torch.equal(halves.view[:, 2048:], before[:4096] * 0.5 + 1.0) and (halves.view[:, :2048] == 0).all()
    halves.check()
    gemm = tilec.compile(ROOT / "examples/gemm_128x256.tile")
    a = guarded((1024, 1024), "f16", fill=1.0)
    with pytest.raises(tilec.LaunchError, match=r"arguments A and C are one tensor \(the same memory, shape and "
                                                r"strides\), but kernel gemm_128x256 cannot run in place: it reads A"):
        gemm(a.view, torch.ones(1024, 1024, device="cuda", dtype=torch.float16), a.view)
    torch.cuda.synchronize()
    assert torch.equal(buf.view, before) and (a.view == 1).all()
    buf.check()
    a.check()
