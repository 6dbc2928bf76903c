"""IR -> the Python host wrapper, through templates/host.py.j2."""
from __future__ import annotations

from .._version import __version__
from ..ir import nodes as ir
from ..ir.effects import written_tensors
from ..ir.exprs import free_names
from ..ir.printer import binary, expr as tile_expr
from .abi import balanced_grid, channel_symbol, kernel_params, shape_bindings, workspace_bytes_per_block
from .cuda import _env

_PY_OPS = {"/": "//", "&&": "and", "||": "or"}
_PY_COMPARE = 4            # Python chains comparisons: a < b == c is (a < b) and (b == c)
_PY_PREC = {"or": 1, "and": 2, "==": _PY_COMPARE, "!=": _PY_COMPARE, "<": _PY_COMPARE, "<=": _PY_COMPARE,
            ">": _PY_COMPARE, ">=": _PY_COMPARE, "+": 5, "-": 5, "*": 6, "//": 6, "%": 6}


def _is_bool(e) -> bool:
    """Does Python compute `e` as a bool (a comparison, `not`, and / or of such)?"""
    return (isinstance(e, ir.BinOp) and e.op in ("==", "!=", "<", "<=", ">", ">=", "&&", "||")) or \
        (isinstance(e, ir.UnaryOp) and e.op == "!")


def py_expr(e, prec=0) -> str:
    if isinstance(e, ir.Int):
        return str(e.value)
    if isinstance(e, ir.Float):
        return repr(e.value)
    if isinstance(e, ir.Var):
        return e.name
    if isinstance(e, ir.BinOp):
        op = _PY_OPS.get(e.op, e.op)
        show = py_expr
        if op in ("and", "or"):     # C's 0 / 1, where Python's `and` returns an operand: 5 and 6 is 6
            show = lambda x, p: py_expr(x, p) if _is_bool(x) else f"bool({py_expr(x)})"  # noqa: E731
        return binary(e, prec, _PY_PREC, show, op, chains=_PY_PREC[op] != _PY_COMPARE)
    if isinstance(e, ir.UnaryOp):
        return f"(not {py_expr(e.operand, 7)})" if e.op == "!" else f"-{py_expr(e.operand, 7)}"
    if isinstance(e, ir.Call):
        if e.func == "select":
            c, a, b = (py_expr(x) for x in e.args)
            return f"({a} if {c} else {b})"
        args = ", ".join(py_expr(a) for a in e.args)
        return f"tl_rt.cdiv({args})" if e.func == "cdiv" else f"{e.func}({args})"
    raise TypeError(f"not a host expression: {e!r}")


def _tuple(values) -> str:
    """A tuple innermost first, as the driver takes it (the IR keeps outermost first)."""
    return repr(tuple(reversed(values)))


def _map(k: ir.Kernel, t: ir.TensorMap) -> dict:
    """One tensor map's encode call: the driver's argument names and values."""
    x = k.param(t.tensor)
    where = f"line {t.span.line}" if t.span else "the kernel"
    common = [("tensorDataType", f'"{x.dtype.tmap}"'), ("tensorRank", str(len(x.shape))),
              ("globalAddress", f"tl_arg_{x.name}.ptr")]
    layout = [("interleave", '"NONE"'), ("swizzle", '"NONE"' if t.swizzle == "none" else f'"{t.swizzle}"'),
              ("l2Promotion", '"NONE"' if t.l2_promotion == "none" else f'"L2_{t.l2_promotion}"'),
              ("oobFill", '"NONE"')]
    if t.kind == "im2col":
        v = next(v for v in k.views if v.tensor == x.name)
        symbol = channel_symbol(k, t)
        symbol = [("channelSymbol", f'"{symbol}"')] if symbol else []
        return dict(name=t.name, tensor=x.name, function="cuTensorMapEncodeIm2col",
                    comment=[f"tl_{t.name}: {t.box[0]} pixels x {t.box[1]} channels of {v.name} = im2col({x.name}) "
                             f"per load (copies at {where})"],
                    args=common + [("globalDim", f"tl_arg_{x.name}.global_dims()"),
                                   ("globalStrides", f"tl_arg_{x.name}.global_strides()"),
                                   ("pixelBoxLowerCorner", _tuple(t.lower_corner)),
                                   ("pixelBoxUpperCorner", _tuple(t.upper_corner)),
                                   ("channelsPerPixel", str(t.box[1])), ("pixelsPerColumn", str(t.box[0])),
                                   ("elementStrides", _tuple(t.element_strides))] + layout + symbol)
    box = ", ".join(map(str, t.box))
    rows = ["its rows cut at their last whole 16-byte granule (TMA stores write whole granules;",
            "the kernel's store tail writes the rest)"] if t.inner_rounded else []
    dims = f"tl_arg_{x.name}.global_dims(whole_granules=True)" if t.inner_rounded else f"tl_arg_{x.name}.global_dims()"
    return dict(name=t.name, tensor=x.name, function="cuTensorMapEncodeTiled",
                comment=[f"tl_{t.name}: {x.name} in boxes of [{box}] (copies at {where})" + ("," if rows else "")]
                + rows,
                args=common + [("globalDim", dims), ("globalStrides", f"tl_arg_{x.name}.global_strides()"),
                               ("boxDim", _tuple(t.box)), ("elementStrides", _tuple(t.element_strides))] + layout)


def _param(k: ir.Kernel, p) -> str:
    """A non-map kernel parameter as the ctypes value the launch packs."""
    if p.kind == "debug_record":
        return "tl_call.debug_record()"
    if p.kind == "workspace":
        return f"tl_rt.Workspace({workspace_bytes_per_block(k)})"     # per launched block: its slot of partial sums
    if p.kind == "pointer":
        return f"tl_rt.pointer(tl_arg_{p.tensor})"
    if p.kind == "dim":
        return f"tl_rt.i64(tl_arg_{p.tensor}.shape[{p.index}])"
    if p.kind == "stride":
        return f"tl_rt.i64(tl_arg_{p.tensor}.strides[{p.index}])"
    if p.kind == "symbol":
        return f'tl_rt.symbol("{p.name}", {p.name})'
    return f'tl_rt.scalar_value({p.name}, "{p.dtype.name}")'


def generate(k: ir.Kernel, source_name: str, debug: bool = False) -> str:
    arguments = []
    for p in k.params:
        if isinstance(p, ir.TensorParam):
            arguments.append(f'tl_arg_{p.name} = tl_call.tensor({p.name}, "{p.name}", "{p.dtype.name}", '
                             f'{len(p.shape)})')
        else:
            arguments.append(f'{p.name} = tl_call.scalar({p.name}, "{p.name}", "{p.dtype.name}")')
    # shape symbols: bound by their first bare appearance, checked everywhere else
    bound, dims = shape_bindings(k)
    binds = [f"{b.symbol} = tl_arg_{b.tensor}.shape[{b.dim}]" for b in bound]
    checks = [f'tl_call.bind(tl_arg_{c.tensor}, {c.dim}, {c.expr.name}, "{c.expr.name}", "{c.bound_from}")'
              if c.bound_from else f'tl_call.expect(tl_arg_{c.tensor}, {c.dim}, {py_expr(c.expr)}, "{c.says}")'
              for c in dims]
    for r in k.requires:
        values = "{" + ", ".join(f'"{n}": {n}' for n in sorted(free_names(r.cond))) + "}"
        checks.append(f'tl_call.require({py_expr(r.cond)}, {r.text!r}, {values})')
    tensors = [p for p in k.params if isinstance(p, ir.TensorParam)]
    overlaps = bool(written_tensors(k)) and len(tensors) > 1
    if overlaps:
        checks.append("tl_call.check_overlaps(tl_IN_PLACE)")     # after the shapes: their errors say more
    params = kernel_params(k, debug)
    at = {b.symbol: ([p.name for p in k.params].index(b.tensor), b.dim) for b in bound}
    fixable = {s: at[s] for s in (channel_symbol(k, t) for t in k.tensor_maps) if s}
    doc = ", ".join(f"{p.name}: {p.dtype.name}" + (f"[{', '.join(tile_expr(d) for d in p.shape)}]"
                                                    if isinstance(p, ir.TensorParam) else "")
                    for p in k.params) + (f"; compiled with {k.fixed_text}" if k.fixed else "")
    return _env().get_template("host.py.j2").render(
        version=__version__, source_name=source_name, kernel_name=k.name, threads=k.launch_threads,
        smem_bytes=k.smem_bytes, writes=written_tensors(k), overlaps=overlaps,
        in_place=[f"{pair!r}: {why!r}" for pair, why in k.in_place], doc=doc, debug=debug and bool(k.barriers),
        barrier_names=tuple(b.name for b in k.barriers), signature=", ".join(p.name for p in k.params),
        arguments=arguments, binds=binds, checks=checks, persistent=bool(k.persistent), balanced=balanced_grid(k),
        stream_k=bool(k.stream_k), grid=", ".join([py_expr(g) for g in k.grid] + ["1"] * (3 - len(k.grid))),
        maps=[_map(k, k.tensor_map(p.name)) for p in params if p.kind == "tensor_map"], fixable=fixable,
        params=["tl_" + p.name if p.kind == "tensor_map" else _param(k, p) for p in params])
