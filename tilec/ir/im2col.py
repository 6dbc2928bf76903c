"""The im2col view's index math, as IR expressions, shared by the TMA lowering
(plan-tma) and the thread-copy fallback (codegen): view row m is output pixel
(n, o_0, ..., o_last), innermost output dim fastest; view column k is
(tap_0, ..., tap_last, c), channel fastest."""
from __future__ import annotations

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
    """(channel, tap offsets...) of view column k: offset = tap index * dilation."""
    channels = x.shape[-1]
    offsets, tap = [], _b("/", k, channels)
    for d in reversed(range(len(v.kernel))):
        offsets.insert(0, _b("*", _b("%", tap, ir.Int(v.kernel[d])), ir.Int(v.dilation[d])))
        tap = _b("/", tap, ir.Int(v.kernel[d]))
    return _b("%", k, channels), tuple(offsets)


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
