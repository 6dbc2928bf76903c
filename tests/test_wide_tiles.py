"""Tiles with a dimension over TMA's 256 elements a box: plan-tma moves them as
several boxes of one tensor map, each a contiguous block of the tile (the
innermost dimension over 256 in pieces of at most 256, the dimensions inside it
whole, one box per index outside it). The IR, the refusals, and the interpreter
against numpy (ragged edges, a rotating loop). tests/test_gpu_wide_tiles.py runs
them on the GPU, with torch views whose margins hold a sentinel, and a store
whose rows end mid-granule (its StoreTail after the boxes)."""
import re
import warnings

import numpy as np
import pytest

import tilec
from tilec.compiler import lower

from conftest import ROOT
from guard import guarded
from test_rotate import check_rowsum

# B = 2 * A through a shared tile of TILE (rank 2 or 3), loaded and stored by TMA
TWICE = """
kernel twice(A: f32[{dims}], B: f32[{dims}]) {{
    grid (bx, by) = (cdiv({inner}, {bn}), cdiv({outer}, {bm}));
    threads 128;
    shared s: f32[{tile}];
    copy(A[{origin}], s);
    parallel ({vars}) in ({tile}) {{
        s[{vars}] = s[{vars}] * 2.0;
    }}
    copy(s, B[{origin}]);
}}
"""


def twice(tile):
    """TWICE over a tensor of the tile's rank: blocks tile the last two dims (a
    leading third dim, if any, is loaded whole from 0)."""
    rank = len(tile)
    dims = ["P", "M", "N"][3 - rank:]
    origin = ["0", f"by * {tile[-2]}", f"bx * {tile[-1]}"][3 - rank:]
    vars_ = ["h", "i", "j"][3 - rank:]
    return TWICE.format(dims=", ".join(dims), inner="N", outer="M", bm=tile[-2], bn=tile[-1],
                        tile=", ".join(map(str, tile)), origin=", ".join(origin), vars=", ".join(vars_))


def ir_after(src, stage="insert-barriers"):
    from tilec.ir.printer import kernel as show
    return show(lower(src).stages[stage])


# ---------------------------------------------------------------- the boxes

@pytest.mark.parametrize("tile, box, boxes", [
    ((4, 1024), "[1, 256]", 16),
    ((1, 2048), "[1, 256]", 8),
    ((512, 32), "[256, 32]", 2),
    ((300, 16), "[150, 16]", 2),
    ((2, 640), "[1, 160]", 8),            # 160: the largest width of at most 256 dividing 640
    ((3, 512, 16), "[1, 256, 16]", 6),
    ((8, 64), "[8, 64]", 1),              # within the limit: one box, as always
])
def test_a_long_dimension_is_cut_into_boxes(tile, box, boxes):
    text = ir_after(twice(tile))
    assert re.search(rf"tensormap tmap_A: tiled A box {re.escape(box)}", text)
    loads = re.findall(r"tma\.load\.tile (s(?:\+\d+)?) <- A\[(.*?)\] map tmap_A bar bar0 bytes (\d+)", text)
    assert len(loads) == boxes
    nbytes = 4 * int(np.prod(tile))
    assert sum(int(b) for _, _, b in loads) == nbytes
    assert f"mbarrier.arrive.expect_tx bar0, {nbytes} bytes" in text
    # each box at its row-major place in the tile: offsets a box's bytes apart
    offsets = [int(t.partition("+")[2] or 0) for t, _, _ in loads]
    assert offsets == [i * nbytes // boxes for i in range(boxes)]
    # the store's boxes: one bulk group
    stores = text[text.index("tma.store.tile"):]
    assert stores.count("tma.store.tile") == boxes
    assert stores.count("cp.async.bulk.commit_group") == 1


def test_the_coordinates_of_each_box():
    text = ir_after(twice((2, 512)))
    coords = re.findall(r"tma\.load\.tile s(?:\+\d+)? <- A\[(.*?)\]", text)
    assert coords == ["by * 2, bx * 512", "by * 2, bx * 512 + 256", "by * 2 + 1, bx * 512",
                      "by * 2 + 1, bx * 512 + 256"]


@pytest.mark.parametrize("tile, why", [
    ((64, 1024), "this tile would take 256 boxes (tilec splits a copy into at most 64)"),
    ((2, 514), "no box width of at most 256 elements and a multiple of 16 bytes divides 514"),
])
def test_tiles_that_cannot_be_cut_are_refused(tile, why):
    with pytest.raises(tilec.SemanticError, match=re.escape(why)):
        lower(twice(tile))


def test_rowsum_of_wide_rows_compiles_with_an_empty_log():
    k = tilec.compile(str(ROOT / "examples/rowsum.tile"), arch="sm_90a", BM=1, BN=2048, THREADS=256)
    assert k.compile_log == "" and "tl_x_stage1" in k.cuda_source


# ---------------------------------------------------------------- the interpreter

SHAPES = {
    (4, 1024): [(9, 2000), (4, 1024), (1, 100)],
    (512, 32): [(700, 40), (512, 32), (3, 8)],
    (2, 640): [(5, 1300)],
    (3, 512, 16): [(3, 600, 20), (2, 512, 16)],
}


@pytest.mark.parametrize("tile, shape", [(t, s) for t, shapes in SHAPES.items() for s in shapes])
def test_wide_and_tall_tiles_in_the_interpreter(tile, shape):
    a = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    b = guarded(shape, np.float32, like="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(twice(tile), backend="interpret")(a, b.view)
    b.check()
    if len(shape) == 3 and shape[0] > tile[0]:
        assert np.array_equal(b.view[:tile[0]], 2 * a[:tile[0]])
    else:
        assert np.array_equal(b.view, 2 * a)


@pytest.mark.parametrize("shape", [(3, 5000), (1, 2048), (2, 4096), (5, 100)])
def test_rowsum_of_wide_rows_in_the_interpreter(shape):
    check_rowsum(tilec.compile(str(ROOT / "examples/rowsum.tile"), backend="interpret", BM=1, BN=2048, THREADS=256),
                 shape)
