"""GPU: tiles with a dimension over 256 elements, moved as several TMA boxes
(tests/test_wide_tiles.py's kernels), bit for bit against torch and the
interpreter, outputs in guarded views (a sentinel margin around each). Marked
gpu: `python -m pytest -m gpu tests/test_gpu_wide_tiles.py`."""
import warnings

import numpy as np
import pytest

import tilec
from guard import guarded
from test_wide_tiles import SHAPES, twice
from test_gpu_rotate import check_rowsum_on_the_gpu
from conftest import ROOT

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tile, shape", [(t, s) for t, shapes in SHAPES.items() for s in shapes] +
                         [((4, 1024), (6, 1001)), ((2, 640), (3, 1283)), ((512, 32), (1000, 33))])
def test_wide_and_tall_tiles_on_the_gpu(tile, shape):
    """The last cases have rows that end mid-granule: A is a guarded view too (a
    row pitch TMA can describe), and B's store ends at the last whole granule, its
    StoreTail writing the rest."""
    import torch
    a = torch.randn(*shape, device="cuda")
    src = guarded(shape, "f32", fill=a)
    b = guarded(shape, "f32")
    k = tilec.compile(twice(tile))
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        k(src.view, b.view)
    torch.cuda.synchronize()
    b.check()
    src.check()
    got, want = b.view.cpu().numpy(), 2 * a.cpu().numpy()
    if len(shape) == 3 and shape[0] > tile[0]:
        got, want = got[:tile[0]], want[:tile[0]]
    assert np.array_equal(got, want)
    interpreted = np.zeros(shape, np.float32)
    tilec.compile(twice(tile), backend="interpret")(a.cpu().numpy(), interpreted)
    assert np.array_equal(b.view.cpu().numpy(), interpreted)


@pytest.mark.parametrize("shape", [(256, 65536), (3, 5000), (1, 2048), (7, 100)])
def test_rowsum_of_wide_rows_on_the_gpu(shape):
    check_rowsum_on_the_gpu(tilec.compile(str(ROOT / "examples/rowsum.tile"), BM=1, BN=2048, THREADS=256), shape)
