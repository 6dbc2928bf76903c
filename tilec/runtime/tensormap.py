"""cuTensorMapEncodeTiled with every rule checked first (../docs/tma-reference.md
§2), so a bad argument gets a named rule instead of CUDA_ERROR_INVALID_VALUE,
and a bounded cache of encoded maps keyed by everything that goes into one."""
from __future__ import annotations

import math

import threading
from collections import OrderedDict

from ..errors import LaunchError
from ..ir.nodes import DTYPES
from ..ir.tma import (CORNER_RANGE, MAX_BOX, MAX_CHANNELS_PER_PIXEL, MAX_ELEMENT_STRIDE, MAX_IM2COL_LOAD_BYTES,
                      MAX_PIXELS_PER_COLUMN, MAX_TILED_BOX_BYTES, SWIZZLE_SPAN)
from .driver import check


class TmaRuleError(LaunchError):
    """An argument breaks a TMA rule; the kernel's thread-copy variant can run instead.
    `fix`: shape symbols whose values, fixed at compile time, make the launch legal
    ({"C": 24}: the im2col loads of a program compiled for 24 channels fit the filter
    taps), or {} where none do."""

    def __init__(self, message: str, fix: dict | None = None):
        super().__init__(message)
        self.fix = dict(fix or {})


def tiled_problems(dtype_size, address, shape, strides, box, element_strides, swizzle="none"):
    """Every TMA rule a tiled map breaks, as messages (empty: legal).
    shape/strides/box/element_strides are outermost first, strides in elements."""
    rank = len(shape)
    out = []
    if not 1 <= rank <= 5:
        out.append(f"rank {rank} is outside TMA's 1..5")
        return out
    if address % 16:
        out.append(f"base address {address:#x} is not 16-byte aligned (TMA requires 16-byte aligned tensors)")
    for d, n in enumerate(shape):
        if not 1 <= n <= 2**32:
            out.append(f"dim {d} is {n}; TMA dims are 1 .. 2^32")
    if strides[-1] != 1 and shape[-1] != 1:
        out.append(f"innermost dim {rank - 1} has stride {strides[-1]} elements; TMA needs it contiguous (stride 1)")
    for d in range(rank - 1):
        b = strides[d] * dtype_size
        if b % 16:
            what = "row stride" if d == rank - 2 else f"dim {d} stride"
            out.append(f"{what} {b} bytes is not a multiple of 16 (TMA requires 16-byte aligned strides)")
        elif not 0 <= b < 2**40:
            out.append(f"dim {d} stride {b} bytes is outside TMA's 0 .. 2^40")
    for d, b in enumerate(box):
        if not 1 <= b <= MAX_BOX:
            out.append(f"box dim {d} is {b}; TMA boxes are 1 .. {MAX_BOX} per dim")
    box_bytes = math.prod(b // e for b, e in zip(box, element_strides) if e > 0) * dtype_size
    if box_bytes > MAX_TILED_BOX_BYTES and all(e > 0 for e in element_strides):
        out.append(f"the box brings {box_bytes} bytes; the driver encodes at most {MAX_TILED_BOX_BYTES} "
                   "(228 KiB, an SM's shared memory)")
    inner = box[-1] * dtype_size
    if inner % 16:
        out.append(f"the box's inner dimension is {inner} bytes; TMA needs a multiple of 16")
    span = SWIZZLE_SPAN[swizzle]
    if span is not None and inner > span:
        out.append(f"the box's inner dimension is {inner} bytes, more than the {swizzle} swizzle span")
    for d, e in enumerate(element_strides):
        if not 1 <= e <= MAX_ELEMENT_STRIDE:
            out.append(f"element stride {e} in dim {d} is outside TMA's 1 .. {MAX_ELEMENT_STRIDE}")
    return out


class TensorMapCache:
    """Encoded maps reused when the same pointer, shape, strides, dtype and box
    come again; least recently used first out."""

    def __init__(self, capacity: int = 1024):
        self.capacity = capacity
        self._maps = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        m = self._maps.get(key)      # a plain dict read is atomic; order is refreshed under the lock
        if m is not None:
            with self._lock:
                if key in self._maps:
                    self._maps.move_to_end(key)
        return m

    def put(self, key, value):
        with self._lock:
            self._maps[key] = value
            self._maps.move_to_end(key)
            while len(self._maps) > self.capacity:
                self._maps.popitem(last=False)


CACHE = TensorMapCache()


def _outermost_first(t):
    return tuple(reversed(t))


def check_tiled(arg, global_dim, box_dim, element_strides, swizzle):
    """Raise TmaRuleError naming every rule a tiled map of `arg` with these driver
    arguments (innermost first) would break; the launch and the CPU interpreter
    both ask, so they fall back exactly alike."""
    problems = tiled_problems(DTYPES[arg.dtype].size, arg.ptr, _outermost_first(global_dim), arg.tma_strides(),
                              _outermost_first(box_dim), _outermost_first(element_strides),
                              "none" if swizzle == "NONE" else swizzle)
    if problems:
        raise TmaRuleError(f"argument {arg.name}: " + "; ".join(problems))


def _enum(cu, kind, value):
    """The driver's CU_TENSOR_MAP_<kind>_<value> (a host wrapper passes the suffix)."""
    enum_type = {"DATA_TYPE": cu.CUtensorMapDataType, "INTERLEAVE": cu.CUtensorMapInterleave,
                 "SWIZZLE": cu.CUtensorMapSwizzle, "L2_PROMOTION": cu.CUtensorMapL2promotion,
                 "FLOAT_OOB_FILL": cu.CUtensorMapFloatOOBfill}[kind]
    return getattr(enum_type, f"CU_TENSOR_MAP_{kind}_{value}")


def encode_tiled(arg_name, data_type, rank, address, global_dim, global_strides, box_dim, element_strides,
                 interleave, swizzle, l2_promotion, oob_fill):
    """cuTensorMapEncodeTiled with these arguments (rules already checked), cached."""
    key = ("tiled", data_type, rank, address, global_dim, global_strides, box_dim, element_strides, interleave,
           swizzle, l2_promotion, oob_fill)
    m = CACHE.get(key)
    if m is None:
        from cuda.bindings import driver as cu
        m = check(cu.cuTensorMapEncodeTiled(
            _enum(cu, "DATA_TYPE", data_type), rank, address, [cu.cuuint64_t(n) for n in global_dim],
            [cu.cuuint64_t(n) for n in global_strides], [cu.cuuint32_t(b) for b in box_dim],
            [cu.cuuint32_t(e) for e in element_strides], _enum(cu, "INTERLEAVE", interleave),
            _enum(cu, "SWIZZLE", swizzle), _enum(cu, "L2_PROMOTION", l2_promotion),
            _enum(cu, "FLOAT_OOB_FILL", oob_fill)), f"argument {arg_name}: cuTensorMapEncodeTiled")
        CACHE.put(key, m)
    return m


def im2col_problems(dtype_size, address, shape, strides, lower, upper, channels_per_pixel, pixels_per_column,
                    element_strides):
    """Every rule an im2col map breaks (tma-reference.md §3), as messages.
    Tuples outermost first; corners per spatial dim; strides in elements."""
    rank = len(shape)
    if not 3 <= rank <= 5:
        return [f"rank {rank}: im2col needs a tensor of rank 3 .. 5"]
    out = tiled_problems(dtype_size, address, shape, strides, (1,) * (rank - 1) + (max(1, 16 // dtype_size),),
                         element_strides)
    lo, hi = CORNER_RANGE[rank]
    for c in tuple(lower) + tuple(upper):
        if not lo <= c <= hi:
            out.append(f"pixel-box corner {c} is outside [{lo}, {hi}] for a rank-{rank} tensor")
    if not 1 <= channels_per_pixel <= MAX_CHANNELS_PER_PIXEL:
        out.append(f"channelsPerPixel {channels_per_pixel} is outside 1 .. {MAX_CHANNELS_PER_PIXEL}")
    if (channels_per_pixel * dtype_size) % 16:
        out.append(f"channelsPerPixel {channels_per_pixel} x {dtype_size} bytes is not a multiple of 16")
    if not 1 <= pixels_per_column <= MAX_PIXELS_PER_COLUMN:
        out.append(f"pixelsPerColumn {pixels_per_column} is outside 1 .. {MAX_PIXELS_PER_COLUMN}")
    # Seen on the H100 (driver 580), not in the tables: one load is at most 128 KiB,
    # and each spatial dim's pixel box (dim - lower + upper) holds at least one pixel.
    load = pixels_per_column * channels_per_pixel * dtype_size
    if load > MAX_IM2COL_LOAD_BYTES:
        out.append(f"one load of {pixels_per_column} pixels x {channels_per_pixel} channels is {load} bytes; "
                   f"the driver allows at most {MAX_IM2COL_LOAD_BYTES}")
    for d, (n, lo_c, hi_c) in enumerate(zip(shape[1:-1], lower, upper)):
        if n - lo_c + hi_c < 1:
            out.append(f"spatial dim {d + 1}: the pixel box {n} - ({lo_c}) + ({hi_c}) holds no pixel")
    return out


def check_im2col(arg, pixels_per_column, channels_per_pixel, lower, upper, element_strides, channel_symbol=None):
    """Raise TmaRuleError naming every rule an im2col map of `arg` would break.
    `channel_symbol`: the shape symbol that is `arg`'s channel count, if one is:
    where the channels are the only problem and whole 16-byte units, the error's
    `fix` fixes that symbol (plan-gemm / plan-tma then fit the loads to the taps)."""
    channels = arg.shape[-1]
    problems = []
    fix = {}
    if channels % channels_per_pixel:
        # channels of whole 16-byte units: fixed at compile time, plan-gemm / plan-tma fit the loads to them
        fit = "" if channels * DTYPES[arg.dtype].size % 16 else \
            f", or compile the kernel with {channel_symbol} = {channels} fixed (-D {channel_symbol}={channels}), " \
            "where its loads fit the taps" if channel_symbol else \
            f", or declare the {channels} channels in the kernel's header, where its loads fit the taps"
        size = DTYPES[arg.dtype].size
        if channels * size % 16:        # no K tile helps: a tap is no whole number of 16-byte units
            problems.append(f"{channels} channels is not a multiple of the {channels_per_pixel} channels of one "
                            f"im2col load (a TMA im2col load must not straddle two filter taps, and a tap of "
                            f"{channels} channels is {channels * size} bytes, no multiple of the 16 bytes TMA moves: "
                            f"pad the channels to a multiple of {16 // size})")
        else:
            problems.append(f"{channels} channels is not a multiple of the {channels_per_pixel} channels of one "
                            "im2col load (a TMA im2col load must not straddle two filter taps; pad the channels to "
                            f"a multiple of {channels_per_pixel}, choose a K tile that divides {channels}{fit})")
        if fit and channel_symbol:
            fix = {channel_symbol: channels}
    others = im2col_problems(DTYPES[arg.dtype].size, arg.ptr, arg.shape, arg.tma_strides(), lower, upper,
                             channels_per_pixel, pixels_per_column, element_strides)
    if problems or others:
        raise TmaRuleError(f"argument {arg.name}: " + "; ".join(problems + others), {} if others else fix)


def encode_im2col(arg_name, data_type, rank, address, global_dim, global_strides, lower_corner, upper_corner,
                  channels_per_pixel, pixels_per_column, element_strides, interleave, swizzle, l2_promotion,
                  oob_fill):
    """cuTensorMapEncodeIm2col with these arguments (rules already checked), cached."""
    key = ("im2col", data_type, rank, address, global_dim, global_strides, lower_corner, upper_corner,
           channels_per_pixel, pixels_per_column, element_strides, interleave, swizzle, l2_promotion, oob_fill)
    m = CACHE.get(key)
    if m is None:
        from cuda.bindings import driver as cu
        m = check(cu.cuTensorMapEncodeIm2col(
            _enum(cu, "DATA_TYPE", data_type), rank, address, [cu.cuuint64_t(n) for n in global_dim],
            [cu.cuuint64_t(n) for n in global_strides], list(lower_corner), list(upper_corner),
            channels_per_pixel, pixels_per_column, [cu.cuuint32_t(e) for e in element_strides],
            _enum(cu, "INTERLEAVE", interleave), _enum(cu, "SWIZZLE", swizzle),
            _enum(cu, "L2_PROMOTION", l2_promotion), _enum(cu, "FLOAT_OOB_FILL", oob_fill)),
            f"argument {arg_name}: cuTensorMapEncodeIm2col")
        CACHE.put(key, m)
    return m
