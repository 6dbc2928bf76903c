"""IR -> the Python host wrapper, through templates/host.py.j2."""
from __future__ import annotations

from .._version import __version__
from ..ir import nodes as ir
from ..ir.effects import written_tensors
from ..ir.exprs import free_names
from ..ir.printer import expr as tile_expr
from .abi import kernel_params
from .cuda import _env

_PY_OPS = {"/": "//", "&&": "and", "||": "or"}
_PY_PREC = {"or": 1, "and": 2, "==": 4, "!=": 4, "<": 4, "<=": 4, ">": 4, ">=": 4,
            "+": 5, "-": 5, "*": 6, "//": 6, "%": 6}


def py_expr(e, prec=0) -> str:
    if isinstance(e, ir.Int):
        return str(e.value)
    if isinstance(e, ir.Float):
        return repr(e.value)
    if isinstance(e, ir.Var):
        return e.name
    if isinstance(e, ir.BinOp):
        op = _PY_OPS.get(e.op, e.op)
        p = _PY_PREC[op]
        text = f"{py_expr(e.lhs, p)} {op} {py_expr(e.rhs, p + 1)}"
        return f"({text})" if p < prec else text
    if isinstance(e, ir.UnaryOp):
        return f"(not {py_expr(e.operand, 7)})" if e.op == "!" else f"-{py_expr(e.operand, 7)}"
    if isinstance(e, ir.Call):
        args = ", ".join(py_expr(a) for a in e.args)
        return f"rt.cdiv({args})" if e.func == "cdiv" else f"{e.func}({args})"
    raise TypeError(f"not a host expression: {e!r}")


def generate(k: ir.Kernel, source_name: str, debug: bool = False) -> str:
    lines = []
    for p in k.params:
        if isinstance(p, ir.TensorParam):
            lines.append(f'arg_{p.name} = call.tensor({p.name}, "{p.name}", "{p.dtype.name}", {len(p.shape)})')
        else:
            lines.append(f'call.scalar({p.name}, "{p.name}", "{p.dtype.name}")')
    # shape symbols: bound by their first bare appearance, checked everywhere else
    bound = {}
    checks = []
    for t in k.tensors:
        for d, e in enumerate(t.shape):
            if isinstance(e, ir.Var) and e.name not in bound:
                bound[e.name] = f"{t.name} dim {d}"
                lines.append(f"{e.name} = arg_{t.name}.shape[{d}]")
            elif isinstance(e, ir.Var):
                checks.append(f'call.bind(arg_{t.name}, {d}, {e.name}, "{e.name}", "{bound[e.name]}")')
            else:
                checks.append(f'call.expect(arg_{t.name}, {d}, {py_expr(e)}, "{tile_expr(e)}")')
    lines += checks
    for r in k.requires:
        names = sorted(free_names(r.cond))
        values = "{" + ", ".join(f'"{n}": {n}' for n in names) + "}"
        lines.append(f'call.require({py_expr(r.cond)}, {r.text!r}, {values})')
    grid = [py_expr(g) for g in k.grid] + ["1"] * (3 - len(k.grid))
    lines.append(f"grid = ({', '.join(grid)})")
    lines.append("if 0 in grid:")
    lines.append("    return call.nothing_to_do()  # an empty grid: no block to run")
    maps, params = [], []
    for p in kernel_params(k, debug):
        if p.kind == "tensor_map" and k.tensor_map(p.name).kind == "im2col":
            t = k.tensor_map(p.name)
            maps.append(f'call.tensor_map_im2col(arg_{t.tensor}, {t.box[0]}, {t.box[1]}, {t.lower_corner}, '
                        f'{t.upper_corner}, {t.element_strides}, "{t.swizzle}", "{t.l2_promotion}"),  # {t.name}')
        elif p.kind == "tensor_map":
            t = k.tensor_map(p.name)
            rounded = ", inner_rounded=True" if t.inner_rounded else ""
            note = f": ends at {t.tensor}'s last whole 16-byte granule" if t.inner_rounded else ""
            maps.append(f'call.tensor_map(arg_{t.tensor}, {t.box}, {t.element_strides}, "{t.swizzle}", '
                        f'"{t.l2_promotion}"{rounded}),  # {t.name}{note}')
        elif p.kind == "debug_record":
            params.append("call.debug_record(),")
        elif p.kind == "pointer":
            params.append(f"rt.pointer(arg_{p.tensor}),")
        elif p.kind == "dim":
            params.append(f"rt.i64(arg_{p.tensor}.shape[{p.index}]),")
        elif p.kind == "stride":
            params.append(f"rt.i64(arg_{p.tensor}.strides[{p.index}]),")
        elif p.kind == "symbol":
            params.append(f"rt.i64({p.name}),")
        else:
            params.append(f'rt.scalar_value({p.name}, "{p.dtype.name}"),')
    if maps:
        # An argument TMA cannot describe (e.g. rows not 16-byte aligned) runs the
        # thread-copy variant of the kernel, or raises with the rule it breaks.
        lines.append("try:")
        lines.append("    tensor_maps = [")
        lines += ["        " + x for x in maps]
        lines.append("    ]")
        lines.append("except rt.TmaRuleError as err:")
        lines.append(f"    return call.fall_back(err, fallback, {', '.join(p.name for p in k.params)})")
        params.insert(0, "*tensor_maps,")
    lines.append("return call.launch(grid, THREADS, DYNAMIC_SMEM_BYTES, [")
    lines += ["    " + x for x in params]
    lines.append("])")
    doc = ", ".join(f"{p.name}: {p.dtype.name}" + (f"[{', '.join(tile_expr(d) for d in p.shape)}]"
                                                    if isinstance(p, ir.TensorParam) else "")
                    for p in k.params)
    return _env().get_template("host.py.j2").render(
        version=__version__, source_name=source_name, kernel_name=k.name, threads=k.threads.value,
        smem_bytes=k.smem_bytes, writes=written_tensors(k), doc=doc, debug=debug and bool(k.barriers),
        barrier_names=tuple(b.name for b in k.barriers),
        signature=", ".join(p.name for p in k.params), lines=lines)
