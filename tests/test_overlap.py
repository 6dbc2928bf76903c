"""tilec/runtime/overlap.py against brute force: the bytes of every element of two
strided views (any strides: negative, zero, interleaved, steps inside one another),
and the runtime checks built on it (rt.check_distinct, Call.check_overlaps)."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tilec
from tilec.runtime import host as rt
from tilec.runtime import overlap
from tilec.runtime.overlap import View, distinct, share_memory


def element_bytes(ptr, shape, strides, size):
    """The bytes of each element, one set per element."""
    return [set(range(a, a + size)) for a in
            (ptr + sum(i * s for i, s in zip(index, strides)) for index in itertools.product(*map(range, shape)))]


@st.composite
def views(draw, base=0):
    size = draw(st.sampled_from([1, 2, 4, 8]))
    rank = draw(st.integers(0, 3))
    shape = [draw(st.integers(0, 5)) for _ in range(rank)]
    strides = [draw(st.sampled_from([0, 1, 2, 3, 4, 5, 8, 12, 16, 24, -4, -8, -12])) * draw(st.sampled_from([1, size]))
               for _ in range(rank)]
    return base + draw(st.integers(0, 80)), shape, strides, size


@settings(max_examples=3000, deadline=None)
@given(views(), views())
def test_share_memory_is_exact(a, b):
    bytes_a = set().union(*element_bytes(*a))
    bytes_b = set().union(*element_bytes(*b))
    assert share_memory(View(*a), View(*b)) == bool(bytes_a & bytes_b)
    assert share_memory(View(*b), View(*a)) == bool(bytes_a & bytes_b)


@settings(max_examples=3000, deadline=None)
@given(views())
def test_distinct_is_exact(a):
    ptr, shape, strides, size = a
    if 0 not in shape:      # stride-0 dims are check_distinct's to name: distinct judges the rest
        shape = [1 if s == 0 else n for n, s in zip(shape, strides)]
    elements = element_bytes(ptr, shape, strides, size)
    assert distinct(View(*a)) == (sum(map(len, elements)) == len(set().union(*elements)))


def test_big_views_are_checked_in_their_window():
    """Two halves of a buffer's columns, and its even and odd columns: no shared byte, known
    without enumerating 2^26 elements; a view of 2^24 single elements inside another's
    range with its gcd lined up is past the limit, and said so (None)."""
    n = 8192
    left = View(0, (n, n // 2), (4 * n, 4), 4)
    right = View(4 * (n // 2), (n, n // 2), (4 * n, 4), 4)
    even, odd = View(0, (n, n // 2), (4 * n, 8), 4), View(4, (n, n // 2), (4 * n, 8), 4)
    assert share_memory(left, right) is False and share_memory(even, odd) is False
    assert share_memory(left, View(4 * n * 100 + 4 * (n // 2 - 1), (2,), (4,), 4)) is True
    assert share_memory(View(0, (1 << 12, 1 << 12), (8 << 12, 8), 4), View(2, (1 << 12, 1 << 12), (8 << 12, 8), 4)) \
        is None
    assert distinct(View(0, (1 << 12, 1 << 12), (4, 4 << 12), 4)) is True       # a transpose: nested
    assert distinct(View(0, (1 << 12, 1 << 11), (16, 8), 4)) is None
    assert distinct(View(0, (1 << 12, 1 << 11), (16, 4), 4)) is False      # 4096 runs of 8 KB, 16 bytes apart
    assert overlap.LIMIT == 1 << 22


def test_check_distinct_names_what_overlaps():
    with pytest.raises(tilec.LaunchError, match=r"^error: argument Y: some of its elements share memory \(shape "
                       r"\(64, 256\), strides \(512, 4\) bytes, elements of 4 bytes\); the kernel writes Y, and its "
                       r"writes there would race: pass a tensor whose elements are distinct$"):
        rt.check_distinct("Y", (64, 256), (512, 4), 4)
    with pytest.raises(tilec.LaunchError, match=r"^error: argument Y: its strides interleave its dims too finely "
                       r"for tilec to check that no two elements share memory \(more than 4194304 runs\)"):
        rt.check_distinct("Y", (1 << 12, 1 << 11), (16, 8), 4)
    rt.check_distinct("Y", (64, 256), (-1024, 4), 4)        # reversed rows: distinct
    rt.check_distinct("Y", (3, 2), (8, 12), 4)              # interleaved, yet distinct: 0 8 16 / 12 20 28
    rt.check_distinct("Y", (0, 256), (0, 0), 4)             # empty


def test_numpy_element_bytes_agree_with_views():
    """The brute force above, on numpy's own idea of a view's memory: np.shares_memory."""
    rng = np.random.default_rng(3)
    buf = np.zeros(4096, np.uint8)
    for _ in range(300):
        def view():
            size = int(rng.choice([1, 2, 4]))
            shape = tuple(int(x) for x in rng.integers(1, 6, size=2))
            strides = tuple(int(x) * size for x in rng.choice([1, 2, 3, 7, -2, -5], size=2))
            lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
            start = int(rng.integers(-lo, 1000))
            arr = np.lib.stride_tricks.as_strided(buf[start:].view(np.dtype(f"u{size}")) if start % size == 0 else
                                                  buf[start - start % size:].view(np.dtype(f"u{size}")), shape, strides)
            return arr
        x, y = view(), view()
        got = share_memory(View(x.__array_interface__["data"][0], x.shape, x.strides, x.itemsize),
                           View(y.__array_interface__["data"][0], y.shape, y.strides, y.itemsize))
        assert got == np.shares_memory(x, y, max_work=None)
