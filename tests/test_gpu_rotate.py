"""GPU: rotating pipelines (tests/test_rotate.py's kernels) on the device, bit for bit
against the numpy reference and the interpreter, outputs in guarded views; the
rowsum example (which rotates) against torch. Marked gpu:
`python -m pytest -m gpu tests/test_gpu_rotate.py`."""
import warnings

import numpy as np
import pytest

import tilec
from guard import guarded
from test_hoist_loads import operands, run, source
from test_rotate import (COUNTED, RMW, SCALED, counted_operands, counted_reference, ksum, ksum_reference, nested,
                         scaled_operands, scaled_reference, shared_tile, shared_tile_reference, tails_reference,
                         twice)
from test_random_programs import _torch
from conftest import ROOT

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("stages", [None, 2, 3, 4])
@pytest.mark.parametrize("trips", [1, 2, 3, 4, 5, 9, 40])
def test_every_iteration_sees_its_own_tile_on_the_gpu(stages, trips):
    import torch
    rng = np.random.default_rng(trips * 10 + (stages or 0))
    a = rng.standard_normal((trips, 20, 72)).astype(np.float32)
    k = tilec.compile(ksum(stages))
    y = guarded((20, 72), "f32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        k(torch.from_numpy(a).cuda(), y.view)
    torch.cuda.synchronize()
    y.check()
    got = y.view.cpu().numpy()
    assert np.array_equal(got, ksum_reference(a))
    interpreted = np.zeros((20, 72), np.float32)
    tilec.compile(ksum(stages), backend="interpret")(a, interpreted)
    assert np.array_equal(got, interpreted)


@pytest.mark.parametrize("out", ["y", "a"])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("trips", [1, 3, 8])
def test_a_store_in_the_rotating_body_on_the_gpu(out, stages, trips):
    """Y[k] = 2 * A[k], stored from another tile or from the rotating copy itself
    (whose refill must wait until the store has read it)."""
    import torch
    a = np.random.default_rng(trips).standard_normal((trips, 20, 72)).astype(np.float32)
    y = guarded((trips, 20, 72), "f32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(twice(stages, out))(torch.from_numpy(a).cuda(), y.view)
    torch.cuda.synchronize()
    y.check()
    assert np.array_equal(y.view.cpu().numpy(), a * 2)


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("trips, rows", [(1, 2), (4, 5), (7, 8), (9, 6), (30, 31)])
def test_a_nested_rotation_keeps_every_phase_on_the_gpu(stages, trips, rows):
    """Trip r of the outer loop runs K - r iterations, so each copy's barrier
    completes a different count of phases per trip (its phase register carries it)."""
    import torch
    a = np.random.default_rng(trips * 10 + rows).standard_normal((trips, 20, 72)).astype(np.float32)
    y = guarded((rows, 20, 72), "f32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(nested(stages))(torch.from_numpy(a).cuda(), y.view)
    torch.cuda.synchronize()
    y.check()
    assert np.array_equal(y.view.cpu().numpy(), tails_reference(a, rows))


@pytest.mark.parametrize("first, second", [(2, 3), (3, 2), (4, 2), (None, 3), (3, None)])
@pytest.mark.parametrize("trips", [1, 2, 3, 8, 40])
def test_loops_that_share_a_tile_on_the_gpu(first, second, trips):
    """Two loops load the same tile (each iteration all of it first): both rotate
    over its copies, and each iteration sees its own tile, bit for bit."""
    import torch
    a = np.random.default_rng(trips).standard_normal((trips, 20, 72)).astype(np.float32)
    y = guarded((20, 72), "f32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        k = tilec.compile(shared_tile(first, second))
        k(torch.from_numpy(a).cuda(), y.view)
    torch.cuda.synchronize()
    y.check()
    assert "tl_a_stage1" in k.cuda_source
    assert np.array_equal(y.view.cpu().numpy(), shared_tile_reference(a))


def test_a_loop_in_place_tile_by_tile_on_the_gpu():
    """A[k] *= 2 tile by tile still rotates (tests/test_gpu_rereads.py runs the loop
    that reads what an earlier iteration stored, which must not)."""
    import torch
    a0 = torch.randn(40, 64, 256, device="cuda")
    a = guarded((40, 64, 256), "f32", fill=a0)
    tilec.compile(RMW)(a.view)
    torch.cuda.synchronize()
    a.check()
    assert torch.equal(a.view, a0 * 2)


def check_rowsum_on_the_gpu(k, shape):
    """Rowsum kernel `k` (it rotates) on a random [M, N] against torch: sums within
    float rounding, maxima exact, no TMA fallback, outputs guarded."""
    import torch
    assert "tl_x_stage1" in k.cuda_source
    x = torch.randn(*shape, device="cuda") - 4
    sums, maxes = guarded(shape[:1], "f32"), guarded(shape[:1], "f32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        k(x, sums.view, maxes.view)
    torch.cuda.synchronize()
    sums.check()
    maxes.check()
    torch.testing.assert_close(sums.view.double(), x.double().sum(1), rtol=1e-4, atol=1e-2)
    assert torch.equal(maxes.view, x.amax(1))


@pytest.mark.parametrize("shape", [(4096, 4096), (1024, 16384), (300, 1000), (7, 256), (5, 4)])
def test_rowsum_example_rotating_on_the_gpu(shape):
    check_rowsum_on_the_gpu(tilec.compile(str(ROOT / "examples/rowsum.tile")), shape)


@pytest.mark.parametrize("names", [
    ["t from acc", "load a", "acc += a"],                                   # moves, rotates
    ["load a", "acc += a", "t from acc", "load b", "acc += b", "store c"],  # the second load moves
    ["t from acc", "load a", "c from a", "store c", "load b", "acc += b"],  # one moves, one cannot
    ["fill a", "store c", "load a", "acc += a", "load b", "acc += b"],       # nothing moves: plain
])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("trips", [1, 4, 9])
def test_a_hoisted_body_on_the_gpu(names, stages, trips):
    """hoist-loads' bodies (tests/test_hoist_loads.py) pipelined on the device, 3 x 3
    blocks with ragged edges, bit for bit against the same body as a `range` loop in
    the interpreter."""
    a, b = operands(trips, trips * 10 + stages, shape=(20, 72))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.PipelineWarning)
        want = run(source(names, "range(K)"), a, b)
        got = run(source(names, f"pipelined(K, stages = {stages})"), a, b, backend="gpu")
    for w, g in zip(want, got):
        assert np.array_equal(w.view(np.uint32), g.view(np.uint32)), names


@pytest.mark.parametrize("bm, stages", [(64, 2), (128, 3), (64, 4), (128, 4)])
@pytest.mark.parametrize("shape", [(128, 128, 384), (200, 136, 304), (72, 8, 720), (1000, 520, 2000)])
def test_a_rotating_gemm_body_on_the_gpu(bm, stages, shape):
    """A block-scaled fp8 gemm: each K block's gemm, then threads scale and add its
    partial sums, while the next blocks' loads are in flight."""
    import torch
    m, n, kdim = shape
    ops = scaled_operands(m, n, kdim, seed=kdim)
    c = guarded((m, n), "f16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        k = tilec.compile(SCALED, BM=bm, STAGES=stages)
        k(*[_torch(x, "f8e4m3" if x.dtype.itemsize == 1 else "f32").cuda() for x in ops], c.view)
    torch.cuda.synchronize()
    c.check()
    assert "tl_a_stage1" in k.cuda_source
    want = scaled_reference(*ops)
    np.testing.assert_allclose(c.view.cpu().numpy().astype(np.float64), want, rtol=3e-3,
                               atol=3e-3 * np.abs(want).max())


@pytest.mark.parametrize("shape", [(64, 64, 64), (100, 72, 320), (300, 200, 1000)])
def test_a_rotating_gemm_body_reads_its_operand_on_the_gpu(shape):
    import torch
    m, n, kdim = shape
    a, b = counted_operands(m, n, kdim)
    c, r = guarded((m, n), "f32"), guarded((m,), "f32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(COUNTED)(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), c.view, r.view)
    torch.cuda.synchronize()
    c.check()
    r.check()
    want_c, want_r = counted_reference(a, b)
    np.testing.assert_allclose(c.view.cpu().numpy(), want_c, rtol=1e-3, atol=1e-3 * np.abs(want_c).max())
    assert np.array_equal(r.view.cpu().numpy(), want_r)
