"""`grid (...) = (...), persistent = 1` (make-persistent): the same kernel as one
block per tile, launched as the blocks the GPU holds at once, each looping over
tiles. The IR after the pass, the CUDA, errors with their line, and the
interpreter (3 resident blocks) against numpy with guarded outputs: tile counts
below, at and above the resident blocks, grids of 1 to 3 dims, a pipelined ring
with and without a producer warpgroup carrying its phases across tiles."""
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as hs

import tilec
from conftest import ROOT
from gemm_shapes import check_gemm_against_numpy
from guard import guarded
from tilec.runtime import interpret

GEMM = re.sub(r"\n\s*tune [^;]*;", "\n", (ROOT / "examples/gemm.tile").read_text())
assert "persistent = PERSISTENT" in GEMM

COPY3 = """
kernel copy3(A: f32[D, M, N], B: f32[D, M, N]) {
    const P = 1;
    grid (bx, by, bz) = (cdiv(N, 64), cdiv(M, 8), cdiv(D, 4)), persistent = P;
    threads 128;
    shared s: f32[4, 8, 64];
    copy(A[bz * 4, by * 8, bx * 64], s);
    parallel (i, j, l) in (4, 8, 64) {
        s[i, j, l] = s[i, j, l] + (bz * 100 + by * 10 + bx) * 1000.0;
    }
    copy(s, B[bz * 4, by * 8, bx * 64]);
}
"""


def error(src, **consts):
    with pytest.raises(tilec.TilecError) as e:
        tilec.compile(src, arch="sm_90a", **consts)
    return str(e.value)


def test_the_body_loops_over_tiles_in_one_block_per_tile_order():
    k = tilec.compile(GEMM, arch="sm_90a", PERSISTENT=1, PRODUCER=0)
    text = k.ir("make-persistent")
    assert "grid (tl_block) = (cdiv(N, BN) * cdiv(M, BM)), persistent = 1" in text.replace("128", "BM") \
        or "grid (tl_block) = (cdiv(N, 128) * cdiv(M, 128)), persistent = 1" in text
    assert "for tl_tile in range(cdiv(cdiv(N, 128) * cdiv(M, 128) - tl_block, tl_blocks)) {  // line 5" in text
    assert "A[(tl_block + tl_tile * tl_blocks) / cdiv(N, 128) * 128, k * 64]" in text
    assert "B[k * 64, (tl_block + tl_tile * tl_blocks) % cdiv(N, 128) * 128]" in text
    cuda = k.cuda_source
    assert "const int tl_block = blockIdx.x;" in cuda and "const int tl_blocks = gridDim.x;" in cuda
    # the tile count is a product of two sizes: 64-bit
    assert "tl_cdiv(static_cast<long long>(tl_cdiv(N, 128)) * tl_cdiv(M, 128) - tl_block, tl_blocks)" in cuda
    assert "persistent=True" in k.host_source
    assert k.compile_log == "" and k.fallback.compile_log == ""


def test_persistent_zero_is_the_one_block_per_tile_kernel():
    plain = GEMM.replace(", persistent = PERSISTENT", "")
    assert tilec.compile(GEMM, PERSISTENT=0).cuda_source.split("\n", 1)[1] == \
        tilec.compile(plain).cuda_source.split("\n", 1)[1]


@pytest.mark.parametrize("value, message", [
    ("2", "persistent must be a compile-time 0 (a block per tile) or 1"),
    ("N", "persistent must be a compile-time 0 (a block per tile) or 1"),
])
def test_persistent_must_be_a_compile_time_flag(value, message):
    src = COPY3.replace("persistent = P", f"persistent = {value}")
    msg = error(src)
    assert message in msg and ":4:" in msg


def test_grid_options_are_checked_with_their_line():
    msg = error(COPY3.replace("persistent = P", "persistant = 1"))
    assert "<string>:4:64: error: grid takes the options persistent = 0 or 1 and stream_k = 0 or 1, not " \
           "'persistant'" in msg
    msg = error(COPY3.replace("persistent = P", "persistent = P, persistent = 0"))
    assert ":4:" in msg and "persistent is given twice" in msg


def _copy3(d, m, n):
    k = tilec.compile(COPY3, backend="interpret")
    a = np.arange(d * m * n, dtype=np.float32).reshape(d, m, n)
    b = guarded((d, m, n), "f32", like="numpy")
    k(a, b.view)
    b.check()
    bz, by, bx = np.meshgrid(np.arange(d) // 4, np.arange(m) // 8, np.arange(n) // 64, indexing="ij")
    np.testing.assert_array_equal(b.view, a + (bz * 100 + by * 10 + bx) * 1000.0)


@pytest.mark.filterwarnings("ignore::tilec.TmaFallbackWarning")
@pytest.mark.parametrize("shape", [(1, 8, 64), (4, 8, 128), (5, 17, 130), (12, 30, 200)])
def test_three_dim_grid_interpreted(shape):
    """1 tile (fewer than the resident blocks) to 3 x 4 x 4 = 48 tiles over 3 blocks,
    each tile's (bx, by, bz) recovered from its number (130 and 200 columns: rows
    TMA cannot describe, so the thread-copy variant, persistent too)."""
    assert interpret.INTERPRETED_RESIDENT_BLOCKS == 3
    _copy3(*shape)


@settings(max_examples=12, deadline=None)
@given(tiles_m=hs.integers(1, 3), tiles_n=hs.integers(1, 3), ksteps=hs.integers(1, 6), stages=hs.integers(1, 4),
       producer=hs.integers(0, 1), ragged=hs.booleans())
def test_persistent_gemm_interpreted_equals_numpy(tiles_m, tiles_n, ksteps, stages, producer, ragged):
    """1 to 9 tiles over 3 blocks: a block runs 0 to 3 tiles; the ring (and with a
    producer, both roles) carries its phases from tile to tile."""
    k = tilec.compile(GEMM, backend="interpret", BM=128, BN=128, STAGES=stages, PRODUCER=producer, PERSISTENT=1)
    check_gemm_against_numpy(k, tiles_m * 128 - (8 if ragged else 0), tiles_n * 128 - (8 if ragged else 0),
                             ksteps * 64)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::tilec.TmaFallbackWarning")
@pytest.mark.parametrize("shape", [(1, 8, 64), (5, 17, 130), (64, 64, 1000), (300, 64, 640)])
def test_three_dim_grid_on_the_gpu(shape):
    """Up to 5 x 8 x 75 = 3000 tiles over the GPU's resident blocks."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    k = tilec.compile(COPY3)
    d, m, n = shape
    a = torch.arange(d * m * n, dtype=torch.float32, device="cuda").reshape(d, m, n)
    b = guarded((d, m, n), "f32")
    k(a, b.view)
    torch.cuda.synchronize()
    b.check()
    bz, by, bx = torch.meshgrid(torch.arange(d, device="cuda") // 4, torch.arange(m, device="cuda") // 8,
                                torch.arange(n, device="cuda") // 64, indexing="ij")
    assert torch.equal(b.view, a + (bz * 100 + by * 10 + bx).float() * 1000.0)
