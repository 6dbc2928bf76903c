"""Ahead-of-time export (`tilec export`): a compiled kernel as a cubin, a C header
and a C++ source (templates/export.h.j2, export.cc.j2) whose one function checks
what the Python host wrapper checks (codegen/host.py: shape symbols, declared
dims, requires, the grid; runtime/tensormap.py: every TMA rule of every map),
encodes the tensor maps and launches, with cuda.h and libcuda alone.

This module decides every line; the templates print them. The kernel's
parameters come from abi.kernel_params, the maps from Kernel.tensor_maps, as for
the Python wrapper, so the two cannot disagree on what the kernel receives."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .._version import __version__
from ..arch import get as get_arch
from ..errors import TilecError, os_reason
from ..ir import nodes as ir
from ..ir.effects import written_tensors
from ..ir.exprs import free_names
from ..ir.printer import binary
from ..ir.printer import expr as tile_expr
from ..runtime import tensormap
from .abi import (WORKSPACE_FLAG_BYTES, balanced_grid, channel_symbol, kernel_params, shape_bindings,
                  workspace_bytes_per_block)
from .cuda import _env

# Scalar parameters by value: the kernel's own parameter type, bit for bit
# (16- and 8-bit floats travel as their bits, as the Python wrapper packs them).
SCALAR_CTYPES = {"f32": "float", "f64": "double", "i8": "int8_t", "u8": "uint8_t", "i16": "int16_t",
                 "u16": "uint16_t", "i32": "int32_t", "u32": "uint32_t", "i64": "int64_t", "u64": "uint64_t",
                 "f16": "uint16_t", "bf16": "uint16_t", "f8e4m3": "uint8_t", "f8e5m2": "uint8_t"}
BITS_NOTE = {"f16": "IEEE half bits", "bf16": "bfloat16 bits", "f8e4m3": "e4m3 bits", "f8e5m2": "e5m2 bits"}

# C's precedences, but comparisons on one level printed unchained, so a comparison
# of comparisons is parenthesised ((M < 64) == (N < 64)), as gcc's -Wparentheses wants.
_C_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3,
           "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
_COMPARE = 3
SWIZZLE_ENUM = {"none": "CU_TENSOR_MAP_SWIZZLE_NONE", "32B": "CU_TENSOR_MAP_SWIZZLE_32B",
                "64B": "CU_TENSOR_MAP_SWIZZLE_64B", "128B": "CU_TENSOR_MAP_SWIZZLE_128B"}
L2_ENUM = {"none": "CU_TENSOR_MAP_L2_PROMOTION_NONE", "64B": "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
           "128B": "CU_TENSOR_MAP_L2_PROMOTION_L2_128B", "256B": "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"}


class _HostExpr:
    """Host expressions (shapes, requires, the grid) as C++ over `long long`.
    Integer `/` and `%` floor like the Python wrapper's `//` and `%`: printed as
    C's operators where both sides are never negative (then they agree), else
    through floordiv / floormod. Records the helpers and names it used."""

    def __init__(self, k: ir.Kernel):
        self.k = k
        self.helpers = set()
        self.names = set()

    def nonneg(self, e) -> bool:
        if isinstance(e, ir.Int):
            return e.value >= 0
        if isinstance(e, ir.Var):
            p = self.k.param(e.name)
            return e.kind == "symbol" or (isinstance(p, ir.ScalarParam) and p.dtype.name.startswith("u"))
        if isinstance(e, ir.BinOp) and e.op in "+*/%":
            return self.nonneg(e.lhs) and self.nonneg(e.rhs)
        if isinstance(e, ir.Call) and e.func in ("cdiv", "min", "max"):
            return all(self.nonneg(a) for a in e.args)
        return isinstance(e, ir.Call) and e.func == "abs"

    def is_float(self, e) -> bool:
        if isinstance(e, ir.Float):
            return True
        if isinstance(e, ir.Var):
            p = self.k.param(e.name)
            return isinstance(p, ir.ScalarParam) and p.dtype.is_float
        if isinstance(e, ir.BinOp):
            return self.is_float(e.lhs) or self.is_float(e.rhs)
        if isinstance(e, ir.Call) and e.func in ("min", "max", "abs"):
            return any(self.is_float(a) for a in e.args)
        return isinstance(e, ir.UnaryOp) and self.is_float(e.operand)

    def divisors(self, e) -> list:
        """The divisors of `e` that are not literals (each checked for zero first)."""
        out = []
        if isinstance(e, ir.BinOp):
            out = self.divisors(e.lhs) + self.divisors(e.rhs)
            if e.op in "/%" and not isinstance(e.rhs, (ir.Int, ir.Float)) and not self.is_float(e):
                out.append(e.rhs)
        elif isinstance(e, ir.UnaryOp):
            out = self.divisors(e.operand)
        elif isinstance(e, ir.Call):
            out = [d for a in e.args for d in self.divisors(a)]
            if e.func == "cdiv" and not isinstance(e.args[1], ir.Int):
                out.append(e.args[1])
        return out

    def __call__(self, e, prec=0) -> str:
        if isinstance(e, ir.Int):
            return str(e.value) if -2**31 <= e.value < 2**31 else f"{e.value}LL"
        if isinstance(e, ir.Float):
            return repr(e.value)
        if isinstance(e, ir.Var):
            self.names.add(e.name)
            return e.name
        if isinstance(e, ir.BinOp):
            if e.op in "/%" and not self.is_float(e) and not (self.nonneg(e.lhs) and self.nonneg(e.rhs)):
                fn = "floordiv" if e.op == "/" else "floormod"
                self.helpers.add(fn)
                return f"tl_{fn}({self(e.lhs)}, {self(e.rhs)})"
            def show(x, p):     # && inside || parenthesised too (-Wparentheses)
                text = self(x, p)
                return f"({text})" if e.op == "||" and isinstance(x, ir.BinOp) and x.op == "&&" else text
            return binary(e, prec, _C_PREC, show, chains=_C_PREC[e.op] != _COMPARE)
        if isinstance(e, ir.UnaryOp):
            inner = self(e.operand, 7)
            return f"{e.op}({inner})" if inner[:1] in "-+" else f"{e.op}{inner}"     # `- -x` is not `--x`
        if isinstance(e, ir.Call) and e.func in ("min", "max"):
            if self.is_float(e):        # in double, as the Python wrapper's min / max of floats
                self.helpers.add(f"f{e.func}")
                return f"tl_f{e.func}_py({self(e.args[0])}, {self(e.args[1])})"
            return f"::std::{e.func}<long long>({self(e.args[0])}, {self(e.args[1])})"
        if isinstance(e, ir.Call) and e.func == "abs":
            fabs = self.is_float(e)
            self.helpers.add("fabs" if fabs else "abs")
            return f"::std::{'fabs' if fabs else 'llabs'}({self(e.args[0])})"
        if isinstance(e, ir.Call) and e.func == "cdiv":
            self.helpers.add("cdiv")
            return f"tl_cdiv({self(e.args[0])}, {self(e.args[1])})"
        raise TilecError(f"cannot export the host expression {tile_expr(e)}", getattr(e, "span", None))


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _message(*parts) -> list:
    """fail()'s arguments after the code: text pieces (joined, quoted) and values
    (("v", C++ expression))."""
    out, text = [], ""
    for p in parts:
        if isinstance(p, tuple):
            if text:
                out.append(_c_string(text))
            out.append(p[1])
            text = ""
        else:
            text += p
    return out + ([_c_string(text)] if text else [])


def _wrap(head: str, items: list, tail: str, width: int = 112) -> list:
    """`head` + items joined by ", " + `tail`, over lines of at most `width`
    characters where it can, continued under the first item."""
    lines, cur = [], head
    pad = " " * len(head)
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else tail)
        if cur not in (head, pad) and len(cur) + 1 + len(piece) > width:
            lines.append(cur)
            cur = pad
        cur += ("" if cur in (head, pad) else " ") + piece
    return lines + [cur]


def _source_comment(span, ind="  ") -> list:
    if span is None:
        return []
    return [f"{ind}// {span.source.name}:{span.line}: {span.source.line(span.line).strip()}"]


def _static_problems(t: ir.TensorMap, dtype: ir.DType) -> list:
    """The rules a map breaks whatever the argument (box, swizzle, element strides,
    corners, channels, pixels): tensormap's checks on a legal stand-in tensor."""
    per16 = max(1, 16 // dtype.size)
    rank = len(t.element_strides)
    if t.kind == "im2col":
        spatial = tuple(max(1, 1 + lo - hi) for lo, hi in zip(t.lower_corner, t.upper_corner))
        shape = (1, *spatial, t.box[1])
    else:
        shape = tuple(max(b, per16) if d == rank - 1 else b for d, b in enumerate(t.box))
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= -(-n // per16) * per16
    strides = tuple(reversed(strides))
    if t.kind == "im2col":
        return tensormap.im2col_problems(dtype.size, 0, shape, strides, t.lower_corner, t.upper_corner, t.box[1],
                                         t.box[0], t.element_strides)
    return tensormap.tiled_problems(dtype.size, 0, shape, strides, t.box, t.element_strides, t.swizzle)


@dataclass
class _MapDecl:
    """One map's constant description in the generated source."""
    name: str
    kind: str
    comment: list
    fields: list        # (C++ initializer text, comment)
    rule: str = ""      # the constant's name


def _own_names(k: ir.Kernel) -> dict:
    """The names of the launcher's own parameters ("stream", "workspace",
    "workspace_bytes", "err", "err_len"; ("shape", tensor) and ("strides", tensor)):
    each as it reads (A_shape) unless the kernel has a parameter or a shape symbol
    of that name, then with the prefix tl_, which no name of the kernel has. Every
    other name the launcher declares or calls where the kernel's names are in scope
    starts with tl_ (tl_grid, tl_fail, tl_t_A, ...) or is qualified (::std::min)."""
    kernel_names = {p.name for p in k.params} | {d.name for t in k.tensors for d in t.shape if isinstance(d, ir.Var)}

    def own(n):
        return f"tl_{n}" if n in kernel_names else n
    names = {n: own(n) for n in ("stream", "workspace", "workspace_bytes", "err", "err_len")}
    for t in k.tensors:
        names["shape", t.name], names["strides", t.name] = own(f"{t.name}_shape"), own(f"{t.name}_strides")
    return names


def _map_decl(k: ir.Kernel, t: ir.TensorMap, rounded: bool) -> _MapDecl:
    """rounded: TiledMap has the inner_rounded field (some map of the kernel is rounded)."""
    p = k.param(t.tensor)
    problems = _static_problems(t, p.dtype)
    if problems:
        raise TilecError(f"tensor map {t.name} of {t.tensor} breaks TMA rules whatever the arguments: "
                         + "; ".join(problems), t.span)
    es = "{" + ", ".join(map(str, t.element_strides)) + "}"
    head = [(_c_string(t.tensor), "the tensor argument it describes"),
            (f"CU_TENSOR_MAP_DATA_TYPE_{p.dtype.tmap}, {p.dtype.size}", f"{p.dtype.name}: data type, bytes"),
            (str(len(p.shape)), "rank")]
    tail = [(SWIZZLE_ENUM[t.swizzle], "swizzle"), (L2_ENUM[t.l2_promotion], "L2 promotion")]
    if t.kind == "im2col":
        symbol = channel_symbol(k, t)
        tail.append((_c_string(symbol) if symbol else "nullptr", "the shape symbol of the channels, where one is"))
        body = [(str(t.box[0]), "pixels per column (rows of the tile)"),
                (str(t.box[1]), "channels per pixel (columns of the tile)"),
                ("{" + ", ".join(map(str, t.lower_corner)) + "}", "pixel box lower corner, per spatial dim"),
                ("{" + ", ".join(map(str, t.upper_corner)) + "}", "pixel box upper corner, per spatial dim"),
                (es, "element strides (the convolution strides)")]
    else:
        body = [("{" + ", ".join(map(str, t.box)) + "}", "box"), (es, "element strides")]
    fields = head + body + tail
    if t.kind == "tiled" and rounded:
        fields.append(("true" if t.inner_rounded else "false",
                       "inner_rounded: a store map ending at the last whole 16-byte granule"))
    return _MapDecl(t.name, t.kind, _source_comment(t.span, ""), fields, f"tl_rule_{t.name}")


def _param_refs(k: ir.Kernel, names: dict) -> list:
    """The kernel's parameters (abi.kernel_params, its order) as the addresses
    cuLaunchKernel reads them from (`names`: _own_names)."""
    refs = []
    for p in kernel_params(k):
        if p.kind == "tensor_map":
            refs.append(f"&tl_{p.name}")
        elif p.kind == "pointer":
            refs.append(f"tl_param(&{p.tensor})")
        elif p.kind == "dim":
            refs.append(f"tl_param(&{names['shape', p.tensor]}[{p.index}])")
        elif p.kind == "stride":
            refs.append(f"tl_param(&{names['strides', p.tensor]}[{p.index}])")
        elif p.kind == "symbol":
            refs.append(f"tl_param(&tl_i32_{p.name})")     # its 32-bit copy
        elif p.kind == "scalar":
            refs.append(f"tl_param(&{p.name})")
        elif p.kind == "workspace":
            refs.append(f"tl_param(&{names['workspace']})")
        else:
            raise TilecError(f"cannot export a kernel parameter of kind {p.kind}")
    return refs


@dataclass
class Export:
    name: str                   # the kernel
    files: dict                 # file name -> bytes or str

    def write(self, out_dir) -> list:
        """Write the files into the directory `out_dir` (made if missing); an OS
        error is a TilecError naming the path ("cannot write into app.cc: it is
        not a directory")."""
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise TilecError(f"cannot write into {out_dir}: it is not a directory (-o names the directory "
                             "to write the files into)")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TilecError(f"cannot make the directory {out_dir}: {os_reason(e)}") from None
        written = []
        for fname, data in self.files.items():
            path = out / fname
            try:
                path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
            except OSError as e:
                raise TilecError(f"cannot write {path}: {os_reason(e)}") from None
            written.append(path)
        return written


def generate(kernel, fallback: bool = True, name: str | None = None, fixes=()) -> Export:
    """The export of `kernel` (a tilec.kernel.Kernel built with tma on and debug off).
    fallback: also export the thread-copy variant (kernel.fallback) and run it when
    an argument breaks a TMA rule, as the Python wrapper does; else that is an error.
    name: the export's name (default: the kernel's): the files NAME.h, NAME.cc,
    NAME.cubin, and the function tilec_NAME, so that exports of one kernel with
    different consts or fixed shape symbols link into one program.
    fixes: {shape symbol: value, ...} each: the program compiled with those fixed
    (kernel.fixed) is exported too, as NAME_C24 (its own files), and a launch whose
    arguments have those values runs it, as a Python call runs a program a launch
    fixed before (Kernel._launcher)."""
    if kernel.debug:
        raise TilecError(f"kernel {kernel.name}: a debug build cannot be exported (its kernel takes a debug "
                         "record the launcher does not pass); compile it with debug=False")
    k: ir.Kernel = kernel.kernel_ir
    name = check_name(k.name if name is None else name)
    source_name = kernel.source.name
    function = f"tilec_{name}"
    own = _own_names(k)
    err = [own["err"], own["err_len"]]
    ex = _HostExpr(k)
    lines = []
    fixes = _checked_fixes(k, fixes)
    fixed_exports = [generate(kernel.fixed(**fix), fallback, f"{name}_{suffix}") for fix, suffix in fixes]
    fixed_said = [", ".join(f"{s} = {v}" for s, v in fix.items()) for fix, _ in fixes]     # "C = 24"

    def fail(code, *parts):
        return "\n".join(_wrap("    return tl_fail(", [*err, code, *_message(*parts)], ");"))

    def zero_checks(e, what):
        for d in ex.divisors(e):
            lines.append(f"  if ({ex(d)} == 0)")
            lines.append(fail("TILEC_EARG", f"{what}: division by {tile_expr(d)} = 0"))

    # Shape symbols: bound by their first bare appearance, checked everywhere else
    # (codegen/host.py's rule). Bindings are printed for the names used below.
    binds, dims = shape_bindings(k)
    binding = {b.symbol: f"  const long long {b.symbol} = {own['shape', b.tensor]}[{b.dim}];  // {b.tensor} dim {b.dim}"
               for b in binds}
    checks = []
    for c in dims:
        got, value = f"{own['shape', c.tensor]}[{c.dim}]", ex(c.expr)
        checks.append(f"  if ({got} != {value})")
        if c.bound_from:
            checks.append(fail("TILEC_EARG", f"argument {c.tensor}: dim {c.dim} is ", ("v", got),
                               f" but {c.expr.name} = ", ("v", c.expr.name), f" (from {c.bound_from})"))
        else:
            says, value_follows, _ = c.says.partition("{}")     # "9 * C = {}", or a number alone
            checks.append(fail("TILEC_EARG", f"argument {c.tensor}: dim {c.dim} is ", ("v", got),
                               f" but the declaration says {says}", *([("v", value)] if value_follows else [])))
    if checks:
        lines.append("  // every other appearance of a symbol, and the dims declared as expressions")
        lines += checks
    for r in k.requires:
        lines += _source_comment(r.span)
        zero_checks(r.cond, f"require {r.text}")
        shown = []
        for i, n in enumerate(sorted(free_names(r.cond))):
            shown += [("" if i == 0 else ", ") + f"{n} = ", ("v", n)]
            ex.names.add(n)
        lines.append(f"  if (!({ex(r.cond)}))")
        lines.append(fail("TILEC_EARG", f"require {r.text} failed (", *shown, ")"))
    grid_at = len(lines)      # the overlap checks go here, after the shapes' (codegen/host.py's order)
    grid = [ex(g) for g in k.grid] + ["1"] * (3 - len(k.grid))
    lines += _source_comment(k.grid[0].span if k.grid and k.grid[0].span else None)
    for g in k.grid:
        zero_checks(g, "grid")
    lines.append(f"  const long long tl_grid[3] = {{{', '.join(grid)}}};")
    lines.append("  if (tl_grid[0] == 0 || tl_grid[1] == 0 || tl_grid[2] == 0)")
    lines.append(f"    return tl_succeed({', '.join(err)}, \"\");  // an empty grid: no block to run")

    fb = kernel.fallback if k.tensor_maps and fallback else None
    slot_bytes = workspace_bytes_per_block(k)
    stream, err_args = own["stream"], ", ".join(err)
    if fb is not None and workspace_bytes_per_block(fb.kernel_ir) != slot_bytes:
        raise TilecError(f"kernel {k.name}: its thread-copy variant's stream-K slots differ from its own; "
                         "export it with fallback off")
    launched = kernel_params(k) + (kernel_params(fb.kernel_ir) if fb else [])
    symbols = list(dict.fromkeys(p.name for p in launched if p.kind == "symbol"))
    if symbols:
        lines.append("  // the shape symbols as the kernel takes them: 32-bit ints")
    for n in symbols:
        lines.append(f"  if ({n} > 2147483647)")
        lines.append(fail("TILEC_EARG", f"shape symbol {n} = ", ("v", n),
                          " is over 2^31-1: kernels index each dimension with 32-bit ints"))
        lines.append(f"  const int tl_i32_{n} = static_cast<int>({n});")
    params = _param_refs(k, own)
    if fb is not None:
        fk = fb.kernel_ir
        if fk.tensor_maps or fk.grid != k.grid or fk.requires != k.requires:
            raise TilecError(f"kernel {k.name}: its thread-copy variant does not launch like it; "
                             "export it with fallback off")
    rounded = any(t.inner_rounded for t in k.tensor_maps)
    decls = [_map_decl(k, t, rounded) for t in k.tensor_maps]
    if k.tensor_maps:
        lines.append("  // The tensor maps: every TMA rule checked before its map is encoded.")
        lines.append("  ::std::string tl_why;  // the rule an argument breaks")
        lines.append(f"  CUtensorMap {', '.join('tl_' + t.name for t in k.tensor_maps)};")
        for i, (t, d) in enumerate(zip(k.tensor_maps, decls)):
            call = (f"tl_encode_{t.kind}(tl_{t.name}, {d.rule}, {t.tensor}, {own['shape', t.tensor]}, "
                    f"{own['strides', t.tensor]}, tl_why);")
            lines += _wrap("  int tl_rc = ", [call], "") if i == 0 else \
                _wrap("  if (tl_rc == TILEC_OK) tl_rc = ", [call], "")
        if fb is not None:
            fb_params = _param_refs(fb.kernel_ir, own)
            lines.append("  if (tl_rc == TILEC_ETMA) {  // what TMA cannot copy, the thread-copy variant does")
            lines += _wrap("    void* tl_thread_copy_params[] = {", fb_params or ["nullptr"], "};")
            fb_args = ["tl_thread_copy_variant", "tl_grid", "tl_thread_copy_params", stream,
                       *([own["workspace_bytes"]] if k.stream_k else []), *err,
                       f"tl_why + \": TMA cannot copy it, so kernel {k.name} ran its thread-copy variant (correct, "
                       "slower)\""]
            lines += _wrap("    return tl_launch(", fb_args, ");")
            lines.append("  }")
        lines.append("  if (tl_rc != TILEC_OK)")
        lines.append(f"    return tl_fail({err_args}, tl_rc, tl_why);")
    lines += _wrap("  void* tl_params[] = {", params or ["nullptr"], "};")
    lines += _wrap("  return tl_launch(", ["tl_tma_variant" if k.tensor_maps else "tl_kernel", "tl_grid", "tl_params",
                                          stream, *([own["workspace_bytes"]] if k.stream_k else []), *err, '""'], ");")

    names = ex.names | set(symbols)
    bindings = [binding[n] for n in binding if n in names]
    if bindings:
        bindings[:0] = _source_comment(k.tensors[0].span) + ["  // shape symbols, bound by their first appearance"]
    entry = []
    call = [stream] + ([own["workspace"], own["workspace_bytes"]] if k.stream_k else []) + \
        [a for p in k.params for a in ((p.name, own["shape", p.name], own["strides", p.name])
                                       if isinstance(p, ir.TensorParam) else (p.name,))] + err
    read_at = {b.symbol: f"{own['shape', b.tensor]}[{b.dim}]" for b in binds}
    for (fix, _), sub, said in zip(fixes, fixed_exports, fixed_said):
        if not entry:
            entry.append("  // a launch with shape symbols a program was compiled for runs that program (export fixes)")
        test = " && ".join(f"{read_at[s]} == {v}" for s, v in fix.items())
        entry.append(f"  if ({test})  // {said}")
        entry += _wrap(f"    return tilec_{sub.name}(", call, ");")
    if k.stream_k:
        entry += [f"  if ({own['workspace']} == 0)",
                  fail("TILEC_EARG", "workspace: a null pointer; a stream_k = 1 kernel needs a zeroed workspace "
                       f"of {function}_workspace_bytes() bytes")]
    entry += ["  // what a Python tensor cannot break: negative dims, a null pointer to elements;",
              "  // and no two elements of a written tensor at one address"]
    written = written_tensors(k)
    for t in k.tensors:
        entry += _wrap(f"  const tl_tensor tl_t_{t.name}{{", [
            _c_string(t.name), t.name, str(len(t.shape)), own["shape", t.name], own["strides", t.name],
            str(t.dtype.size), "true" if t.name in written else "false"], "};")
    entry.append("  CUdevice tl_device = -1;  // the current context's, once a tensor's memory is checked")
    for t in k.tensors:
        entry.append(f"  if (int tl_rc = tl_check_tensor(tl_t_{t.name}, tl_device, {err_args}))")
        entry.append("    return tl_rc;")
    pairs = _overlap_checks(k, written, err_args)
    lines = entry + bindings + lines[:grid_at] + pairs + lines[grid_at:]

    doc, args = [], []
    for p in k.params:
        if isinstance(p, ir.TensorParam):
            rank = len(p.shape)
            decl = f"{p.name}: {p.dtype.name}[{', '.join(tile_expr(d) for d in p.shape)}]"
            args.append(f"CUdeviceptr {p.name}, const int64_t {own['shape', p.name]}[{rank}], "
                        f"const int64_t {own['strides', p.name]}[{rank}]")
            doc.append(f"{decl}: device pointer, shape[{rank}], strides[{rank}] in elements")
        else:
            args.append(f"{SCALAR_CTYPES[p.dtype.name]} {p.name}")
            note = f" ({BITS_NOTE[p.dtype.name]})" if p.dtype.name in BITS_NOTE else ""
            doc.append(f"{p.name}: {p.dtype.name}{note}")
    args = [f"CUstream {stream}"] + ([f"CUdeviceptr {own['workspace']}", f"size_t {own['workspace_bytes']}"]
                                     if k.stream_k else []) + args + [f"char* {err[0]}", f"size_t {err[1]}"]
    kinds = {t.kind for t in k.tensor_maps}
    variants = [("tl_tma_variant" if k.tensor_maps else "tl_kernel", f"{name}.cubin", kernel.cubin, k.smem_bytes,
                 k.launch_threads, "the TMA variant" if k.tensor_maps else "the kernel")]
    if fb is not None:
        variants.append(("tl_thread_copy_variant", f"{name}.thread_copy.cubin", fb.cubin, fb.kernel_ir.smem_bytes,
                         fb.kernel_ir.launch_threads, "the thread-copy variant, for arguments TMA cannot describe"))
    common = dict(version=__version__, source_name=source_name, kernel_name=k.name, file_name=name, function=function,
                  fixes=[(said, sub.name) for said, sub in zip(fixed_said, fixed_exports)],
                  consts=k.consts_text, arch=kernel.arch, args=args, doc=doc, fallback=fb is not None,
                  has_maps=bool(k.tensor_maps), guard=f"TILEC_EXPORT_{name.upper()}_H",
                  stream_k=bool(k.stream_k), flag_bytes=WORKSPACE_FLAG_BYTES, slot_bytes=slot_bytes)
    header = _env().get_template("export.h.j2").render(**common)
    helpers = ex.helpers | ({"cdiv"} if k.tensor_maps else set())    # tma_strides rounds up with cdiv
    runs_on, runs_on_note = _runs_on(kernel.arch)
    source = _env().get_template("export.cc.j2").render(
        **common, runs_on=runs_on, runs_on_note=runs_on_note, lines=lines, maps=decls, tiled="tiled" in kinds,
        im2col="im2col" in kinds, rounded=rounded,
        helpers=sorted(helpers), overlaps=bool(written), pairs=bool(pairs),
        persistent=bool(k.persistent), balanced=balanced_grid(k),
        variants=[dict(var=v, file=f, size=len(c), smem=s, threads=t, what=w, rows=_byte_rows(c))
                  for v, f, c, s, t, w in variants])
    files = {f"{name}.h": header, f"{name}.cc": source}
    files.update({f: c for _, f, c, *_ in variants})
    for sub in fixed_exports:
        files.update(sub.files)
    return Export(name, files)


def _checked_fixes(k: ir.Kernel, fixes) -> list:
    """(fix, its export's name suffix) of each distinct fix, in order: a dict of shape
    symbols this program reads from its arguments (not fixed in it already) to values."""
    binds, _ = shape_bindings(k)
    symbols = [b.symbol for b in binds]
    out = []
    for fix in fixes:
        if not isinstance(fix, dict) or not fix:
            raise TilecError(f"a fix is a dict of shape symbols to values, e.g. {{'C': 24}}, got {fix!r}")
        for s in fix:
            if s not in symbols:
                fixed = " (fixed in this program already)" if any(s == n for n, _ in k.fixed) else ""
                raise TilecError(f"fix {fix!r}: {s!r} is not a shape symbol of kernel {k.name}{fixed}; its shape "
                                 f"symbols: {', '.join(symbols) or 'none'}")
        fix = dict(sorted(fix.items(), key=lambda item: symbols.index(item[0])))
        if fix not in [f for f, _ in out]:
            out.append((fix, "_".join(f"{s}{v}" for s, v in fix.items())))
    return out


def check_name(name) -> str:
    """An export's name: a C identifier (it names the function tilec_NAME and the files)."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise TilecError(f"an export's name is a C identifier (letters, digits and _, not starting with a digit): "
                         f"it names the files NAME.h, NAME.cc and the function tilec_NAME; got {name!r}")
    return name


def _overlap_checks(k: ir.Kernel, written, err_args: str) -> list:
    """rt.Call.check_overlaps: each pair of tensors of which the kernel writes one."""
    tensors = [t.name for t in k.tensors]
    why = dict(k.in_place)
    lines = []
    for i, x in enumerate(tensors):
        for y in tensors[i + 1:]:
            if x in written or y in written:
                w, r = (x, y) if x in written else (y, x)
                reason = None if r in written else why[(w, r)]    # None: may be one (mark-in-place)
                reason = "nullptr" if reason is None else _c_string(reason)
                lines.append(f"  if (int tl_rc = tl_check_pair(tl_t_{x}, tl_t_{y}, {reason}, {err_args}))")
                lines.append("    return tl_rc;")
    if lines:
        lines[:0] = ["  // no written tensor shares memory with another argument, unless in place (mark-in-place)"]
    return lines


def _runs_on(arch: str) -> tuple:
    """tilec.arch.runs_on, the device test of a cubin for `arch`, as C++ over major
    and minor, and its words."""
    a = get_arch(arch)
    if a.specific:
        return f"major == {a.major} && minor == {a.minor}", f"an {a.name} cubin runs on compute capability " \
                                                            f"{a.major}.{a.minor} only"
    return f"major == {a.major} && minor >= {a.minor}", f"an {a.name} cubin runs on {a.major}.x from " \
                                                        f"{a.major}.{a.minor} on"


def _byte_rows(data: bytes, per_line: int = 16) -> list:
    return [", ".join(f"0x{b:02x}" for b in data[i:i + per_line]) for i in range(0, len(data), per_line)]


def export(src, out_dir, arch: str = "sm_90a", fallback: bool = True, name: str | None = None, fixes=(),
           **consts) -> list:
    """Compile `src` (a path or the program text) with `consts` for `arch` and write
    its export (named `name`, default the kernel's; with `fixes`, generate's) to
    `out_dir`; the paths written."""
    return export_consts(src, out_dir, consts, arch, fallback, name, fixes)


def export_consts(src, out_dir, consts: dict, arch: str = "sm_90a", fallback: bool = True, name: str | None = None,
                  fixes=()) -> list:
    """export() with the consts as a dict (`tilec export -D name=...`: a const may
    have the name of one of export()'s arguments)."""
    from ..kernel import compile as compile_kernel
    if name is not None:
        check_name(name)        # before compiling
    kernel = compile_kernel(src, arch=arch, fallback=fallback, debug=False, tune=False, **consts)   # declared consts
    return generate(kernel, fallback, name, fixes).write(out_dir)
