"""tests/guard.py finds every write outside a guarded view, and its views keep
the layouts TMA needs (or, with align=False, break them)."""
import numpy as np
import pytest

from guard import DTYPES, guarded

SHAPES = [(7,), (5, 129), (2, 3, 7), (1, 1), (300, 7), (3, 5, 17, 72)]


def libraries():
    out = ["numpy"]
    try:
        import torch  # noqa: F401
        out.append("torch")
    except ImportError:
        pass
    return out


def start_and_pitch(g):
    if g.lib == "torch":
        size = g.view.element_size()
        return g.view.data_ptr() - g.buffer.data_ptr(), g.view.stride(0) * size
    return g.view.ctypes.data - g.buffer.ctypes.data, g.view.strides[0]


@pytest.mark.parametrize("like", libraries())
@pytest.mark.parametrize("dt", sorted(DTYPES))
def test_writes_outside_are_found_and_inside_are_not(like, dt):
    if like == "numpy" and dt in ("bf16", "f8e4m3", "f8e5m2"):
        pytest.importorskip("ml_dtypes")
    for shape in SHAPES:
        for align in (True, False):
            g = guarded(shape, dt, like=like, device="cpu", align=align)
            g.check()
            start, pitch = start_and_pitch(g)
            assert (start % 16 == 0) == align, (shape, align, start)
            assert not align or len(shape) == 1 or pitch % 16 == 0
            last = tuple(b + n - 1 for (b, _), n in zip(g.pad, shape))
            g.buffer[last] = 0                                  # inside
            g.check()
            g.buffer[last[:-1] + (last[-1] + 1,)] = 0           # one past the row's end
            g.buffer[(0,) * len(shape)] = 0                     # the buffer's first element
            with pytest.raises(AssertionError, match=r"^2 padding element\(s\) around the .* first at \(indices "
                                                     r"relative to the view\) \[-\d.*\] = 0"):
                g.check()
            assert g.overwritten()[1][1] == tuple(n - 1 for n in shape[:-1]) + (shape[-1],)


def test_granule_overrun_lands_in_the_padding():
    """copy2d into a [4097, 129] f32 view: a TMA store also writes up to the next
    16-byte boundary, elements 129..131 of every row."""
    g = guarded((4097, 129), "f32", like="numpy", fill=1.0)
    assert g.pad[-1][1] >= 3 and g.view.strides[0] % 16 == 0
    g.buffer[g.pad[0][0]:g.pad[0][0] + 4097, g.pad[1][0] + 129:g.pad[1][0] + 132] = 0
    count, first = g.overwritten()
    assert count == 4097 * 3 and first[:3] == [(0, 129), (0, 130), (0, 131)]


def test_fill_and_explicit_padding():
    g = guarded((140, 484), np.float32, like="numpy", pad=[5, (40, 76)], fill=np.arange(484, dtype=np.float32))
    assert g.buffer.shape == (150, 600) and g.pad == ((5, 5), (40, 76))
    assert np.array_equal(g.view[3], np.arange(484)) and g.buffer[0, 0] == -7777
    assert guarded((4, 4), "i32", like="numpy", sentinel=-1).buffer[0, 0] == -1
    assert guarded((0, 128), "f32", like="numpy").view.shape == (0, 128)
