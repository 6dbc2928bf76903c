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

# gemm.tile in the order a one-block-per-tile launch numbers its tiles (group = 1)
GEMM = re.sub(r"\n\s*tune [^;]*;", "\n", (ROOT / "examples/gemm.tile").read_text()).replace(", group = GROUP", "")
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
    assert "<string>:4:64: error: grid takes the options persistent = 0 or 1, stream_k = 0 or 1 and group = rows, " \
           "not 'persistant'" in msg
    msg = error(COPY3.replace("persistent = P", "persistent = P, persistent = 0"))
    assert ":4:" in msg and "persistent is given twice" in msg


def _copy3(d, m, n, group=1, persistent=1):
    k = tilec.compile(COPY3.replace("persistent = P", f"persistent = {persistent}, group = {group}"),
                      backend="interpret")
    a = np.arange(d * m * n, dtype=np.float32).reshape(d, m, n)
    b = guarded((d, m, n), "f32", like="numpy")
    k(a, b.view)
    b.check()
    bz, by, bx = np.meshgrid(np.arange(d) // 4, np.arange(m) // 8, np.arange(n) // 64, indexing="ij")
    np.testing.assert_array_equal(b.view, a + (bz * 100 + by * 10 + bx) * 1000.0)


def test_group_numbers_tiles_in_groups_of_rows():
    """group = G: tile t of a group of G rows of by (the last one may have fewer)
    is column t / rows, row t % rows of it, bound by lets at the top of each
    trip; without persistent the same lets take blockIdx.x."""
    for persistent, t in ((1, "tl_t"), (0, "tl_block")):
        src = GEMM.replace("persistent = PERSISTENT", f"persistent = {persistent}, group = 8")
        k = tilec.compile(src, arch="sm_90a", PRODUCER=1)
        text = k.ir("make-persistent")
        lets = ["let tl_t = tl_block + tl_tile * tl_blocks"] if persistent else []
        lets += [f"let tl_group_row = {t} / (8 * cdiv(N, 128)) * 8",
                 "let tl_group_rows = min(cdiv(M, 128) - tl_group_row, 8)",
                 f"let by = tl_group_row + {t} % (8 * cdiv(N, 128)) % tl_group_rows",
                 f"let bx = {t} % (8 * cdiv(N, 128)) / tl_group_rows", "fill acc, 0"]
        at = [text.index(x) for x in lets]
        assert at == sorted(at), text
        assert ", group = 8" in text.splitlines()[text.splitlines().index(
            next(x for x in text.splitlines() if x.strip().startswith("grid")))]
        assert "A[by * 128, k * 64]" in text and f"const int bx = {t} % (8 * tl_cdiv(N, 128)) / tl_group_rows;" \
            in k.cuda_source
        assert k.compile_log == ""
    assert "group" not in tilec.compile(GEMM, arch="sm_90a").ir("make-persistent")     # group = 1: as before


@pytest.mark.parametrize("value, message", [
    ("0", ":4:88: error: group must be a compile-time integer >= 1"),
    ("N", ":4:88: error: group must be a compile-time integer >= 1"),
])
def test_group_must_be_a_compile_time_count(value, message):
    assert message in error(COPY3.replace("persistent = P", f"persistent = P, group = {value}"))


def test_group_needs_rows():
    src = "kernel c(A: f32[N], B: f32[N]) {\n    grid (bx) = (cdiv(N, 64)), group = 4;\n    threads 64;\n" \
          "    shared s: f32[64];\n    copy(A[bx * 64], s);\n    copy(s, B[bx * 64]);\n}\n"
    assert "<string>:2:40: error: group = 4 numbers the tiles of 4 rows (the grid's second index) together: it " \
           "needs a grid of 2 or 3 dims" in error(src)


@pytest.mark.filterwarnings("ignore::tilec.TmaFallbackWarning")
@settings(max_examples=25, deadline=None)
@given(shape=hs.tuples(hs.integers(1, 9), hs.integers(1, 40), hs.integers(1, 300)), group=hs.integers(1, 7),
       persistent=hs.integers(0, 1))
def test_grouped_tiles_each_run_once(shape, group, persistent):
    """Every (bx, by, bz) of a 3-dim grid runs exactly once with any group, the
    last group short or not, persistent (3 resident blocks) or one block per tile."""
    _copy3(*shape, group=group, persistent=persistent)


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


def test_an_epilogue_whose_staging_tile_would_not_fit_stores_by_thread_copies():
    """96 x 128 tiles, 8 stages beside a producer on a persistent grid: the rings take
    196 KB, the staging tile of its own (the producer loads the next tile into them)
    24 KB more, past a block's 227 KB. The epilogue stores its fragments by thread
    copies instead (before: refused at tile a's line, counting bytes the program never
    asked for); the interpreter's product equals numpy's."""
    consts = dict(BM=96, BN=128, STAGES=8, PRODUCER=1, PERSISTENT=1)
    k = tilec.compile(GEMM, arch="sm_90a", **consts)
    assert k.compile_log == "", k.compile_log
    ir_text = k.ir("plan-smem")
    assert "tl_acc_out" not in ir_text and "thread.copy acc -> C[" in ir_text, ir_text
    check_gemm_against_numpy(tilec.compile(GEMM, backend="interpret", **consts), 2 * 96 - 8, 3 * 128 - 8, 4 * 64)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [184, 1000])
def test_an_epilogue_whose_staging_tile_would_not_fit_on_the_gpu(m):
    """The same 96 x 128, 8-stage producer kernel on a persistent grid (2 tiles of rows,
    or 11 over 8 columns of tiles: 88 over the resident blocks), against torch."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    k = tilec.compile(GEMM, fallback=False, BM=96, BN=128, STAGES=8, PRODUCER=1, PERSISTENT=1)
    a = torch.randn(m, 1000, device="cuda").half()
    b = torch.randn(1000, 1016, device="cuda").half()
    c = guarded((m, 1016), "f16", fill=float("nan"))
    k(a, b, c.view)
    torch.cuda.synchronize()
    want = a.float() @ b.float()
    assert ((c.view.float() - want).norm() / want.norm()).item() < 2e-3
    c.check()


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore::tilec.TmaFallbackWarning")
@pytest.mark.parametrize("shape", [(1, 8, 64), (5, 17, 130), (64, 64, 1000), (300, 64, 640)])
@pytest.mark.parametrize("persistent, group", [(1, 1), (1, 3), (0, 5)])
def test_three_dim_grid_on_the_gpu(shape, persistent, group):
    """Up to 5 x 8 x 75 = 3000 tiles over the GPU's resident blocks (or a block
    each), numbered in groups of rows or not."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    k = tilec.compile(COPY3.replace("persistent = P", f"persistent = {persistent}, group = {group}"))
    d, m, n = shape
    a = torch.arange(d * m * n, dtype=torch.float32, device="cuda").reshape(d, m, n)
    b = guarded((d, m, n), "f32")
    k(a, b.view)
    torch.cuda.synchronize()
    b.check()
    bz, by, bx = torch.meshgrid(torch.arange(d, device="cuda") // 4, torch.arange(m, device="cuda") // 8,
                                torch.arange(n, device="cuda") // 64, indexing="ij")
    assert torch.equal(b.view, a + (bz * 100 + by * 10 + bx).float() * 1000.0)


TABLE = """
kernel add_table(A: f32[M, 64], T: f32[8, 64], B: f32[M, 64]) {
    grid (by) = (cdiv(M, 8)), persistent = 1;
    threads 128;
    shared t: f32[8, 64];
    shared s: f32[8, 64];
    copy(T, t);
    copy(A[by * 8, 0], s);
    parallel (i, j) in (8, 64) {
        s[i, j] = s[i, j] + t[i, j];
    }
    copy(s, B[by * 8, 0]);
}
"""


def _hoisted(src) -> bool:
    """Whether the copy into t runs before the tile loop."""
    ir_text = tilec.compile(src, arch="sm_90a").ir("make-persistent")
    return ir_text.index("copy T") < ir_text.index("for tl_tile")


@pytest.mark.parametrize("change, hoisted", [
    ((), True),                                              # the same table for every tile: once a block
    (("copy(T, t);", "copy(T[by * 0, 0], t);"), False),      # a block index in the region
    (("s[i, j] = s[i, j] + t[i, j];", "s[i, j] = s[i, j] + t[i, j]; t[i, j] = 0.0;"), False),   # t written
    (("copy(s, B[by * 8, 0]);", "copy(s, B[by * 8, 0]); copy(s, T[0, 0]);"), False),           # T written
])
def test_a_copy_every_tile_would_repeat_runs_once_a_block(change, hoisted):
    src = TABLE.replace(*change) if change else TABLE
    assert _hoisted(src) == hoisted


@pytest.mark.parametrize("m", [8, 40, 72])
def test_a_table_loaded_once_a_block_is_added_to_every_tile(m):
    k = interpret.InterpretedKernel(TABLE, {})
    a = np.arange(m * 64, dtype=np.float32).reshape(m, 64)
    table = np.random.default_rng(m).standard_normal((8, 64)).astype(np.float32)
    b = guarded((m, 64), "f32", like="numpy")
    k(a, table, b.view)
    b.check()
    assert np.array_equal(b.view, a + np.tile(table, (m // 8, 1)))
