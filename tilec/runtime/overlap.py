"""Do two strided views share a byte, and do a view's own elements? Exact, in
bytes, for any strides (negative, zero, interleaved); the exported C++ launcher
(templates/export.cc.j2) does the same steps, with the same limit.

A view is (pointer, shape, byte strides, element size). Its elements, as a set
of bytes, are runs: the innermost dims whose strides chain without a gap make
one contiguous run, the other dims step it. Two views share a byte when their
byte ranges meet, the strides' gcd lets their elements line up, and two runs
meet; the runs are enumerated only inside the window where the ranges meet,
at most LIMIT of them per view (beyond that the answer is None: not known)."""
from __future__ import annotations

from math import gcd

LIMIT = 1 << 22         # runs enumerated per view, at most


class View:
    """A view's elements: `base` (its lowest element's address), `dims` as (extent,
    stride > 0) sorted by stride, without extent-1 and stride-0 dims (they add no
    bytes), `run` (the bytes of one contiguous run: the element, or the innermost
    dims that chain into one), and its byte range [lo, hi)."""

    def __init__(self, ptr, shape, strides, itemsize):
        self.empty = 0 in shape
        base, dims, span = ptr, [], 0
        for n, s in zip(shape, strides):
            if n > 1 and s:
                if s < 0:
                    s = -s
                    base -= (n - 1) * s
                dims.append((s, n))
                span += (n - 1) * s
        dims.sort()
        run, i = itemsize, 0
        while i < len(dims) and dims[i][0] == run:
            run *= dims[i][1]
            i += 1
        self.dims = [(n, s) for s, n in dims]
        self.base, self.run, self.outer, self.itemsize = base, run, self.dims[i:], itemsize
        self.lo, self.hi = base, base + span + itemsize

    def runs(self, lo, hi):
        """The starts of the runs that can meet [lo, hi), sorted; None past LIMIT."""
        import numpy as np      # only here: most launches never get this far
        if not self.outer:
            return np.array([self.base], dtype=np.int64)
        *inner, (n, s) = self.outer
        inner_span = sum((m - 1) * t for m, t in inner) + self.run
        first = max(0, (lo - self.base - inner_span) // s + 1)     # the first step whose block reaches past lo
        last = min(n - 1, (hi - 1 - self.base) // s)
        count = max(0, last - first + 1)
        for m, _ in inner:
            count *= m
        if count > LIMIT:
            return None
        starts = self.base + np.arange(first, last + 1, dtype=np.int64) * s
        for m, t in reversed(inner):
            starts = np.add.outer(starts, np.arange(m, dtype=np.int64) * t).ravel()
        return np.sort(starts)


def share_memory(a: View, b: View):
    """True if views `a` and `b` share a byte, False if not, None if not known (too many runs)."""
    if a.empty or b.empty or a.hi <= b.lo or b.hi <= a.lo:
        return False
    g = 0
    for _, s in a.dims + b.dims:
        g = gcd(g, s)
    if g:
        d = (b.base - a.base) % g      # b's elements start d bytes (mod g) after a's
        if d >= a.itemsize and g - d >= b.itemsize:
            return False
    lo, hi = max(a.lo, b.lo), min(a.hi, b.hi)
    ra, rb = a.runs(lo, hi), b.runs(lo, hi)
    if ra is None or rb is None:
        return None
    if not len(ra) or not len(rb):
        return False
    import numpy as np
    # the last run of a starting before each run of b ends: does it (or one before it) reach into that run?
    reach = np.maximum.accumulate(ra + a.run)
    i = np.searchsorted(ra, rb + b.run, side="left") - 1
    hit = (i >= 0) & (reach[np.maximum(i, 0)] > rb)
    return bool(hit.any())


def byte_range(ptr, shape, strides, itemsize):
    """[lo, hi): the bytes a view's elements lie in (None for an empty view), without
    building a View: the launch's first test, enough for arguments far apart."""
    lo, hi = ptr, ptr + itemsize
    for n, s in zip(shape, strides):
        if n == 0:
            return None
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi


def nested(shape, strides, itemsize) -> bool:
    """Does each stride step past everything the smaller ones span (the dims of a
    dense tensor, sliced, transposed or reversed)? Then no two elements share a byte."""
    span = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):    # innermost first: a row-major view needs no sort
        if n > 1 and s:
            if abs(s) < span:
                break
            span += (n - 1) * abs(s)
    else:
        return True
    span = itemsize
    for s, n in sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1 and s):
        if s < span:
            return False
        span += (n - 1) * s
    return True


def distinct(v: View):
    """True if no two elements of `v` share a byte, False if two do, None if not known.
    Dims of stride 0 are left to the caller (rt.check_distinct names them)."""
    if v.empty or nested([n for n, _ in v.dims], [s for _, s in v.dims], v.itemsize):
        return True
    starts = v.runs(v.lo, v.hi)
    if starts is None:
        return None
    return bool(len(starts) < 2 or (starts[1:] >= starts[:-1] + v.run).all())
