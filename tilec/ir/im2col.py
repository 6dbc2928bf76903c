"""The im2col view's index math, as IR expressions, shared by the TMA lowering
(plan-tma) and the thread-copy fallback (codegen): view row m is output pixel
(n, o_0, ..., o_last), innermost output dim fastest; view column k is
(tap_0, ..., tap_last, c), channel fastest."""
from __future__ import annotations

import math

from . import nodes as ir
from .exprs import fold


def _b(op, a, b):
    return fold(ir.BinOp(op, a, b))


def output_extents(v: ir.Im2colView, x: ir.TensorParam) -> list:
    """O = (I + 2P - D(K - 1) - 1) / S + 1 per spatial dim, outermost first."""
    return [_b("+", _b("/", _b("-", _b("-", _b("+", i, ir.Int(2 * p)), ir.Int(d * (k - 1))), ir.Int(1)),
                       ir.Int(s)), ir.Int(1))
            for i, p, d, k, s in zip(x.shape[1:-1], v.pad, v.dilation, v.kernel, v.stride)]


def row(v: ir.Im2colView, x: ir.TensorParam, m) -> tuple:
    """(n, window origins...) of view row m: origin = o * S - P per spatial dim."""
    outs = output_extents(v, x)
    origins, rest = [], m
    for d in reversed(range(len(outs))):
        o = _b("%", rest, outs[d])
        rest = _b("/", rest, outs[d])
        origins.insert(0, _b("-", _b("*", o, ir.Int(v.stride[d])), ir.Int(v.pad[d])))
    return rest, tuple(origins)


def column(v: ir.Im2colView, x: ir.TensorParam, k) -> tuple:
    """(channel, tap offsets...) of view column k: offset = tap index * dilation.
    A column past the view's last (a K tile that ends past KH * KW * C) has a tap
    index of KH * KW or more, whose offsets (taken % KW, / KW % KH, ...) and
    channel k % C are still those of a point inside X. The thread copies test the
    column before they read; a TMA load of such columns copies zeros instead
    (TmaLoad.zeros_if, plan-tma)."""
    channels = x.shape[-1]
    taps = math.prod(v.kernel)
    tap = ir.Int(0) if taps == 1 else _b("/", k, channels)
    offsets, rest = [], tap
    for d in reversed(range(len(v.kernel))):
        offsets.insert(0, _b("*", _b("%", rest, ir.Int(v.kernel[d])), ir.Int(v.dilation[d])))
        rest = _b("/", rest, ir.Int(v.kernel[d]))
    return _b("%", k, channels), tuple(offsets)


def element(v: ir.Im2colView, x: ir.TensorParam, starts, names) -> tuple:
    """Element (m0 + i0, k0 + i1) of view `v` as threads read it straight from X
    (codegen's thread copy and the interpreter's): (the view row and column, the
    coordinates (n, spatial..., c) into X, the view's (rows, columns)). X's dims
    are the kernel parameters tl_X_dimD; the element is read when row < rows,
    column < columns and each spatial coordinate is inside its dim (else zero)."""
    xd = ir.TensorParam(x.name, x.dtype, tuple(ir.Var(f"tl_{x.name}_dim{d}") for d in range(len(x.shape))))
    m = ir.BinOp("+", starts[0], ir.Var(names[0]))
    k = ir.BinOp("+", starts[1], ir.Var(names[1]))
    n, origins = row(v, xd, m)
    c, offsets = column(v, xd, k)
    coords = [n] + [ir.BinOp("+", o, off) for o, off in zip(origins, offsets)] + [c]
    return (m, k), coords, (rows(v, xd), columns(v, xd))


def rows(v: ir.Im2colView, x: ir.TensorParam):
    """N * prod(O): the number of view rows."""
    n = x.shape[0]
    for o in output_extents(v, x):
        n = _b("*", n, o)
    return n


def columns(v: ir.Im2colView, x: ir.TensorParam):
    n = x.shape[-1]
    for k in v.kernel:
        n = _b("*", ir.Int(k), n)
    return n
