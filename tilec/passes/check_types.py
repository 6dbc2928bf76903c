"""check-types: memory spaces, ranks, dtypes and the places each name may be
used. After this pass every Copy's regions name what they should."""
from __future__ import annotations

import math
import struct
from dataclasses import replace

import numpy as np

from ..arch import get as get_arch
from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.exprs import (FLOAT_CALLS, children, divides_by, float_part, is_float, linear, map_body, map_stmt_exprs,
                        reads_f64, walk_expr)
from ..ir.printer import expr as show_expr
from ..ir.tma import MAX_ELEMENT_STRIDE

NAME = "check-types"

_GRID_KINDS = {"symbol", "scalar"}


def run(k: ir.Kernel, opts) -> ir.Kernel:
    t = k.threads.value
    if not (32 <= t <= 1024 and t % 32 == 0):
        raise SemanticError(f"threads must be a multiple of 32 between 32 and 1024, got {t}", k.threads.span)
    if k.producer_warpgroup and t + ir.PRODUCER_THREADS > 1024:
        raise SemanticError(f"threads {t} and the producer warpgroup (producer = 1) make {t + ir.PRODUCER_THREADS} "
                            "threads, over a block's 1024", k.threads.span)
    # the shapes first: a scalar parameter named like a shape symbol is an error there, whatever its dtype
    for p in k.tensors:
        for d in p.shape:
            for x in walk_expr(d):
                if isinstance(x, ir.Var) and x.kind != "symbol":
                    raise SemanticError(f"a tensor shape may use shape symbols, consts and integer literals only; "
                                        f"'{x.name}' is a {_kind_word(x.kind)}", x.span,
                                        note=f"name the dimension with a shape symbol and, if it must equal "
                                        f"'{x.name}', check that with a require: require SYMBOL == {x.name};"
                                        if x.kind == "scalar" else None)
    for g in k.grid:
        _only_kinds(g, _GRID_KINDS, "a grid size")
        _integer(k, g, "a grid size")
        if isinstance(g, ir.Int) and g.value < 0:
            raise SemanticError(f"a grid size of {g.value}: a grid has 0 or more blocks a dimension", g.span)
    for r in k.requires:
        _only_kinds(r.cond, _GRID_KINDS, "a require")
    for e in k.grid + tuple(r.cond for r in k.requires):
        _no_zero_divisor(k, e)
    _no_zero_divisors(k, k.body)
    target = get_arch(opts.arch)
    operands = {n for g in ir.walk_stmts(k.body) if isinstance(g, ir.Gemm) for n in (g.a, g.acc)}
    for b in k.buffers:
        _fits(b, t, target, b.name in operands)
    for p in k.scalars:
        if p.dtype.name.startswith("f8"):
            raise SemanticError(f"scalar parameter '{p.name}': fp8 scalars are not supported; pass an f32",
                                p.span)
    calls = [(name, e) for name, e in k.lets if isinstance(e, ir.Call) and e.func == "im2col"]
    patches = {name: _patch_view(k, e) for name, e in calls if _of_tile(k, e)}
    views = tuple(_im2col_view(k, name, e) for name, e in calls if name not in patches)
    k = replace(k, views=views, body=_patch_gemms(k, k.body, patches))
    return replace(k, body=_check_body(k, k.body, lanes=None))


def _split_rows(p, extents, tile_shape, s) -> tuple:
    """A region of tensor `p` whose explicit extents split the tile's first dimension
    over several tensor dimensions (their product), the rest the tile's other
    dimensions: that box (ir.split_box), or () where the extents are not such.
    Its rows must end in whole 16-byte granules (no store tail splits with it)."""
    n = len(tile_shape)
    default = (1,) * (len(extents) - n) + tuple(tile_shape)     # what an extent not written is
    if len(extents) <= n or any(x is not None and not isinstance(x, ir.Int) for x in extents):
        return ()
    box = tuple(want if x is None else x.value for x, want in zip(extents, default))
    lead = box[:len(box) - n + 1]
    if box[len(box) - n + 1:] != tuple(tile_shape[1:]) or math.prod(lead) != tile_shape[0] or \
            box == (1,) * (len(box) - n) + tuple(tile_shape):
        return ()
    if not ir.rows_in_whole_granules(p):
        raise SemanticError(f"a region that splits the tile's {tile_shape[0]} rows over several dimensions of "
                            f"'{p.name}' needs its rows in whole 16-byte granules (its last dimension a "
                            f"compile-time multiple of {16 // p.dtype.size})", s.span)
    return box


def _of_tile(k, call: ir.Call) -> bool:
    return bool(call.args) and isinstance(call.args[0], ir.Var) and k.buffer(call.args[0].name) is not None


def _patch_view(k, call: ir.Call) -> tuple:
    """Check `im2col(p, kernel = (KH, KW), stride = S)` of a shared tile p: (p, (KH, KW), S)."""
    p = k.buffer(call.args[0].name)
    if len(call.args) != 1 or p.scope != "shared" or len(p.shape) != 3:
        raise SemanticError(f"an im2col view of a tile takes one shared tile of rank 3, a patch of pixels [PH, PW, "
                            f"C]; '{p.name}' is a {p.scope} tile of rank {len(p.shape)}", call.span)
    given = dict(call.kwargs)
    for key, v in call.kwargs:
        if key not in ("kernel", "stride"):
            raise SemanticError(f"an im2col view of shared tile '{p.name}' takes only kernel = (KH, KW) and stride "
                                f"= S: its padding is the zeros of the load that fills the patch (origins outside "
                                f"the tensor)", v.span)
    stride = given.get("stride", ir.Int(1))
    if not isinstance(stride, ir.Int) or not 1 <= stride.value <= MAX_ELEMENT_STRIDE:
        raise SemanticError(f"the stride of an im2col view of a tile is a compile-time integer from 1 to "
                            f"{MAX_ELEMENT_STRIDE} (TMA loads its column phases with that element stride)",
                            stride.span)
    v = given.get("kernel")
    items = v.items if isinstance(v, ir.TupleExpr) else ()
    if len(items) != 2 or not all(isinstance(i, ir.Int) and i.value >= 1 for i in items):
        raise SemanticError("an im2col view of a tile needs the filter size as compile-time integers: "
                            "kernel = (KH, KW)", (v or call).span)
    kh, kw = (i.value for i in items)
    if kh > p.shape[0] or kw > p.shape[1]:
        raise SemanticError(f"the filter ({kh} x {kw}) is larger than patch '{p.name}' ({p.shape[0]} x "
                            f"{p.shape[1]} pixels)", v.span)
    return p.name, (kh, kw), stride.value


def _patch_gemms(k, body, patches: dict):
    """A gemm of an im2col view of a shared tile reads the tile (`Gemm.patch`): the
    barrier passes see the tile read; the view is no other statement's operand."""
    def rewrite(s):
        if isinstance(s, ir.Gemm) and s.a in patches:
            tile, kernel, stride = patches[s.a]
            return replace(s, a=tile, patch=kernel, patch_stride=stride)
        if isinstance(s, ir.Gemm) and {s.b, s.acc} & patches.keys() or \
                isinstance(s, ir.Copy) and {s.src.name, s.dst.name} & patches.keys():
            raise SemanticError("an im2col view of a shared tile is only the first operand of a gemm", s.span)
        return s
    return map_body(body, rewrite) if patches else body


MAX_SHARED_TILE = 2**24         # bytes: far past the 232448 a block can have (plan-smem says so
                                # precisely); a bound that keeps later passes from expanding absurd tiles
MAX_LOCAL_PER_THREAD = 255      # elements of a local tile per thread: a thread's registers (a tile of 256-1024
                                # a thread compiled, spilled to local memory, in 12-200 s of NVRTC: session 42)
MAX_OPERAND_PER_THREAD = 1024   # ... of a gemm's accumulator or register A: plan-gemm counts their fragments
                                # precisely and names the gemm's rule; this bound only stops absurd tiles first


def _fits(b: ir.Buffer, threads: int, target, gemm_operand: bool = False):
    """A tile far too large is rejected here, at its declaration, before later
    passes expand it (one TMA load per 128-byte chunk, one register per element);
    plan-tma, plan-smem and plan-gemm give the precise limits for the rest."""
    if b.scope == "shared" and b.bytes > MAX_SHARED_TILE:
        raise SemanticError(f"shared tile '{b.name}' is {b.bytes} bytes; {target.block} has at most "
                            f"{target.smem_per_block} bytes of shared memory", b.span)
    per_thread = -(-b.elements // threads)
    most = MAX_OPERAND_PER_THREAD if gemm_operand else MAX_LOCAL_PER_THREAD
    if b.scope == "local" and per_thread > most:
        raise SemanticError(f"local tile '{b.name}' puts {per_thread} elements in each of the {threads} threads, "
                            f"whose registers hold at most {MAX_LOCAL_PER_THREAD}: use a shared tile, a smaller "
                            f"tile or more threads", b.span)


_IM2COL_ARGS = ("kernel", "stride", "pad", "dilation")


def _im2col_view(k, name, call: ir.Call) -> ir.Im2colView:
    """Check `im2col(X, kernel = ..., stride = ..., pad = ..., dilation = ...)`."""
    if len(call.args) != 1 or not isinstance(call.args[0], ir.Var) or \
            not isinstance(k.param(call.args[0].name), ir.TensorParam):
        raise SemanticError("im2col takes one tensor: im2col(X, kernel = (KH, KW), stride = S, pad = P, "
                            "dilation = D)", call.span)
    x = k.param(call.args[0].name)
    rank = len(x.shape)
    if not 3 <= rank <= 5:
        raise SemanticError(f"im2col needs a channels-last tensor of rank 3, 4 or 5 ([N, W, C], [N, H, W, C], "
                            f"[N, D, H, W, C]); '{x.name}' has rank {rank}", call.args[0].span)
    spatial = rank - 2
    given = dict(call.kwargs)
    for key, v in call.kwargs:
        if key not in _IM2COL_ARGS:
            raise SemanticError(f"im2col has no argument '{key}' (it takes {', '.join(_IM2COL_ARGS)})", v.span)
    if "kernel" not in given:
        raise SemanticError("im2col needs the filter size: kernel = (KH, KW)", call.span)
    values = {}
    for key, default in zip(_IM2COL_ARGS, (None, 1, 0, 1)):
        v = given.get(key, ir.Int(default))
        items = v.items if isinstance(v, ir.TupleExpr) else (v,) * spatial
        if len(items) != spatial:
            raise SemanticError(f"im2col {key} has {len(items)} values; '{x.name}' has {spatial} spatial "
                                f"dimension{'s' if spatial > 1 else ''}", v.span)
        for it in items:
            low = 0 if key == "pad" else 1
            if not isinstance(it, ir.Int) or it.value < low:
                raise SemanticError(f"im2col {key} must be compile-time integers of at least {low}", it.span)
        values[key] = tuple(it.value for it in items)
    return ir.Im2colView(name, x.name, values["kernel"], values["stride"], values["pad"], values["dilation"],
                         span=call.span)


def _only_kinds(e, allowed, what):
    for x in walk_expr(e):
        if isinstance(x, ir.Var) and x.kind not in allowed:
            raise SemanticError(f"{what} may use shape symbols and scalar parameters only; "
                                f"'{x.name}' is a {_kind_word(x.kind)}", x.span)
        if isinstance(x, ir.Subscript):
            raise SemanticError(f"{what} cannot read tile elements", x.span)


def _no_zero_divisors(k, body):
    for s in body:
        map_stmt_exprs(s, lambda e: _no_zero_divisor(k, e))
        for f in ir.STMT_BLOCK_FIELDS.get(type(s), ()):
            _no_zero_divisors(k, getattr(s, f))


def _no_zero_divisor(k, e):
    """An integer `/`, `%` or cdiv by the constant 0 (after the consts are folded
    in) is an error, as in a const: the device's result is undefined. A float
    division by 0 is IEEE's infinity and stays."""
    for x in walk_expr(e):
        divisor = divides_by(x)
        if isinstance(divisor, ir.Int) and divisor.value == 0 and not is_float(k, x):
            from ..ir.printer import expr as show
            raise SemanticError(f"integer division by zero: '{show(x)}'", x.span)
    return e


def _kind_word(kind):
    return {"block": "block index", "loop": "loop variable", "lane": "parallel index", "scalar": "scalar parameter",
            "symbol": "shape symbol",
            "tile": "tile", "tensor": "tensor", "view": "view"}.get(kind, kind)


def _check_body(k, body, lanes):
    out = []
    for s in body:
        if isinstance(s, ir.Copy):
            if lanes is not None:
                raise SemanticError("copy cannot appear inside a parallel body", s.span)
            s = _check_copy(k, s)
        elif isinstance(s, ir.Fill):
            if lanes is not None:
                raise SemanticError("fill cannot appear inside a parallel body", s.span)
            b = _tile(k, s.buffer, s.span, "fill")
            _check_value(k, s.value, lanes)
            _f32_literals(s.value, b.dtype.name == "f64")
        elif isinstance(s, ir.Gemm):
            if lanes is not None:
                raise SemanticError("gemm cannot appear inside a parallel body", s.span)
            for name in (s.a, s.b, s.acc):
                _tile(k, name, s.span, "gemm")
        elif isinstance(s, ir.Reduce):
            if lanes is not None:
                raise SemanticError("reduce cannot appear inside a parallel body", s.span)
            _check_reduce(k, s)
        elif isinstance(s, ir.Parallel):
            if lanes is not None:
                raise SemanticError("parallel bodies do not nest", s.span)
            for x in s.extents:
                if not isinstance(x, ir.Int) or x.value <= 0:
                    raise SemanticError("parallel extents must be positive compile-time integers", x.span)
            lanes_here = dict(zip(s.vars, (x.value for x in s.extents)))
            s = replace(s, body=_check_body(k, s.body, lanes_here))
            _check_shared_bounds(k, s.body, lanes_here)
            _check_races(k, s.body, lanes_here)
        elif isinstance(s, ir.Assign):
            if lanes is None:
                raise SemanticError("tile elements are assigned inside a parallel body", s.span)
            _check_element(k, ir.Subscript(s.buffer, s.indices, span=s.span), lanes, write=True)
            _check_value(k, s.value, lanes)
            _f32_literals(s.value, k.buffer(s.buffer).dtype.name == "f64" or reads_f64(k, s.value))
        elif isinstance(s, ir.For):
            _no_elements(s.extent, "a loop bound")
            _integer(k, s.extent, "a loop bound")
            if isinstance(s.extent, ir.Int) and s.extent.value > 2**31 - 1:
                raise SemanticError(f"this loop runs {s.extent.value} trips; a loop's trip count is a 32-bit int in "
                                    f"the kernel (at most {2**31 - 1})", s.span)
            s = replace(s, body=_check_body(k, s.body, lanes))
        elif isinstance(s, ir.If):
            if lanes is None:
                _no_elements(s.cond, "an if condition outside a parallel body")
                for x in walk_expr(s.cond):
                    if isinstance(x, ir.Call) and x.func == "cdiv":
                        _int_args(k, x)
            else:
                _check_value(k, s.cond, lanes)
            _f32_literals(s.cond, reads_f64(k, s.cond))     # codegen computes it in double then
            s = replace(s, then=_check_body(k, s.then, lanes), orelse=_check_body(k, s.orelse, lanes))
        out.append(s)
    return tuple(out)


MAX_CHECKED_LANES = 1 << 20    # index spaces up to this many lanes have their shared indices checked


_COMPARE = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
            ">=": np.greater_equal}


def _lane_values(lanes: dict, e):
    """The values of integer (or comparison) expression `e` over a parallel's index
    space, lane by lane (numpy, broadcastable to the space; C++'s truncating `/` and
    `%`), where it reads only the lanes' indices and integers; else None."""
    if math.prod(lanes.values()) > MAX_CHECKED_LANES:
        return None
    axes = {v: np.arange(n, dtype=np.int64).reshape([n if d == a else 1 for d in range(len(lanes))])
            for a, (v, n) in enumerate(lanes.items())}

    def ev(e):
        if isinstance(e, ir.Int):
            return np.int64(e.value) if -2**62 < e.value < 2**62 else None
        if isinstance(e, ir.Var):
            return axes.get(e.name)
        if isinstance(e, ir.UnaryOp) and e.op == "-":
            x = ev(e.operand)
            return None if x is None else -x
        if isinstance(e, ir.UnaryOp) and e.op == "!":
            x = ev(e.operand)
            return None if x is None else (x == 0).astype(np.int64)
        if isinstance(e, ir.BinOp) and (e.op in _COMPARE or e.op in ("&&", "||")):
            a, b = ev(e.lhs), ev(e.rhs)
            if a is None or b is None:
                return None
            out = _COMPARE[e.op](a, b) if e.op in _COMPARE else (a != 0) & (b != 0) if e.op == "&&" else \
                (a != 0) | (b != 0)
            return np.asarray(out).astype(np.int64)
        if isinstance(e, ir.Call) and e.func in ("min", "max", "abs"):
            xs = [ev(x) for x in e.args]
            if any(x is None for x in xs):
                return None
            return np.abs(xs[0]) if e.func == "abs" else (np.minimum if e.func == "min" else np.maximum)(*xs)
        if not isinstance(e, ir.BinOp) or e.op not in ("+", "-", "*", "/", "%"):
            return None
        a, b = ev(e.lhs), ev(e.rhs)
        if a is None or b is None or np.max(np.abs(a)) > 2**31 or np.max(np.abs(b)) > 2**31:
            return None                     # (kept far from int64 overflow)
        if e.op in ("/", "%"):
            if np.any(b == 0):
                return None
            q = np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))
            return q if e.op == "/" else a - b * q
        return a + b if e.op == "+" else a - b if e.op == "-" else a * b

    return ev(e)


def _index_range(lanes: dict, e) -> tuple | None:
    """The least and greatest value integer expression `e` takes over a parallel's
    index space, computed lane by lane (_lane_values); None where it reads anything
    but the lanes' indices and integers."""
    values = _lane_values(lanes, e)
    return None if values is None else (int(np.min(values)), int(np.max(values)))


def _check_shared_bounds(k, body, lanes):
    """A shared tile's element index that the parallel's index space alone takes past
    the tile (`s[i + 1, j]` over all of s's rows) is an error: shared memory is not
    bounds-checked on the GPU, so it would read or write another tile's bytes. What
    an `if`, a `select` arm or the right side of `&&` / `||` may skip is refused
    only where the index is outside on every lane (`x[i, 64]` of a 64-column tile):
    a condition may keep a lane-dependent index in."""
    def unguarded(e):
        """The element accesses in `e` that every lane evaluating it makes."""
        if isinstance(e, ir.Subscript):
            yield e
        inside = (e.args[0],) if isinstance(e, ir.Call) and e.func == "select" else \
            (e.lhs,) if isinstance(e, ir.BinOp) and e.op in ("&&", "||") else children(e)
        for x in inside:
            yield from unguarded(x)

    def check(sub, what, guarded=False):
        """`guarded`: only some lanes may make the access; refused only where every lane's index is outside."""
        b = k.buffer(sub.name)
        if b is None or b.scope != "shared":
            return
        for d, (i, n) in enumerate(zip(sub.indices, b.shape)):
            r = _index_range(lanes, i)
            if r is not None and (r[1] < 0 or r[0] > n - 1 if guarded else r[0] < 0 or r[1] > n - 1):
                names = ", ".join(f"{v} < {x}" for v, x in lanes.items())
                raise SemanticError(
                    f"this {what} of {show_expr(sub)} goes past dimension {d} of shared tile '{sub.name}' (0 to "
                    f"{n - 1}): over this parallel ({names}) the index runs from {r[0]} to {r[1]}; shared memory is "
                    f"not bounds-checked on the GPU, so it would {what} other bytes " +
                    ("(no lane's index is inside the tile, whatever the condition around it)" if guarded else
                     "(an access that only some lanes make goes under an if, or in a select arm)"),
                    i.span if _within(i.span, sub.span) else sub.span)     # (a let's index: its use)

    def visit(body, guarded):
        for s in body:
            if isinstance(s, ir.Assign):
                check(ir.Subscript(s.buffer, s.indices, span=s.span), "write", guarded)
                exprs = (*s.indices, s.value)
            elif isinstance(s, ir.If):
                exprs = (s.cond,)
                visit(s.then, True)
                visit(s.orelse, True)
            else:
                continue
            for x in exprs:
                first = {id(sub) for sub in unguarded(x)}
                for sub in walk_expr(x):
                    if isinstance(sub, ir.Subscript):
                        check(sub, "read", guarded or id(sub) not in first)

    visit(body, False)


def _addends(e):
    """The terms of `e` as a sum (`by * 16 + 4294967296`: the product and the literal):
    a literal among them is the coordinate's offset. (A large literal inside a product
    or a `%` is computed in 64 bits and may leave a small coordinate.)"""
    if isinstance(e, ir.BinOp) and e.op in "+-":
        yield from _addends(e.lhs)
        yield from _addends(e.rhs)
    else:
        yield e


def _within(inner, outer) -> bool:
    """Does span `inner` lie inside span `outer` (an index written in the subscript,
    not substituted from a let elsewhere)?"""
    if inner is None or not inner.line or outer is None or not outer.line:
        return inner is not None and bool(inner.line) and outer is None
    return (outer.line, outer.col) <= (inner.line, inner.col) and \
        (inner.end_line, inner.end_col) <= (outer.end_line, outer.end_col)


def _check_races(k, body, lanes):
    """Iterations of a parallel run at once on different threads (each thread its
    own in order), so one may not touch a shared element that another writes:
    `s[i, j] = s[0, 0] + 1.0` reads s[0, 0] while iteration (0, 0) writes it, and
    `s[0, j] = ...` has every i write one element. Checked lane by lane where the
    accesses' indices (and the conditions around them: an if, a select arm, the
    right of && / ||) read only the lanes' indices and integers, as the bounds are;
    an access whose index or condition reads anything else (a loop variable, a
    block index, a shape symbol, a scalar, an element) is not checked: the
    condition may keep the iterations apart (rowsum.tile's `if k * BN + j >= N`
    never holds where j = 0)."""
    shape = tuple(lanes.values())
    if math.prod(shape) > MAX_CHECKED_LANES:
        return
    accesses = []        # (subscript, write, mask over the lanes: bool array or True)

    def cond_mask(c, mask, negate=False):
        v = None if mask is None else _lane_values(lanes, c)
        if v is None:
            return None             # not known lane by lane: what it guards is not checked
        v = (v == 0) if negate else (v != 0)
        return v if mask is True else mask & v

    def reads(e, mask):
        if isinstance(e, ir.Subscript) and mask is not None:
            accesses.append((e, False, mask))
        if isinstance(e, ir.Call) and e.func == "select":
            reads(e.args[0], mask)
            reads(e.args[1], cond_mask(e.args[0], mask))
            reads(e.args[2], cond_mask(e.args[0], mask, negate=True))
        elif isinstance(e, ir.BinOp) and e.op in ("&&", "||"):
            reads(e.lhs, mask)
            reads(e.rhs, cond_mask(e.lhs, mask, negate=e.op == "||"))
        else:
            for x in children(e):
                reads(x, mask)

    def visit(stmts, mask):
        for s in stmts:
            if isinstance(s, ir.Assign):
                for x in (*s.indices, s.value):
                    reads(x, mask)
                if mask is not None:
                    accesses.append((ir.Subscript(s.buffer, s.indices, span=s.span), True, mask))
            elif isinstance(s, ir.If):
                reads(s.cond, mask)
                visit(s.then, cond_mask(s.cond, mask))
                visit(s.orelse, cond_mask(s.cond, mask, negate=True))
            elif isinstance(s, ir.For):
                reads(s.extent, mask)
                visit(s.body, mask)

    visit(body, True)
    written = {sub.name for sub, write, _ in accesses if write}
    lane_ids = np.arange(math.prod(shape)).reshape(shape)
    for name in sorted(written):
        b = k.buffer(name)
        if b is None or b.scope != "shared" or not all(isinstance(n, int) for n in b.shape):
            continue
        owner = np.full(math.prod(b.shape), -1, np.int64)        # the lane that writes each element
        writer = np.full(math.prod(b.shape), -1, np.int64)       # and the first write of it (an index in `mine`)
        mine = []
        for sub, write, mask in accesses:
            if sub.name != name:
                continue
            idx = [_lane_values(lanes, i) for i in sub.indices]
            if any(v is None for v in idx):
                continue
            idx = [np.broadcast_to(v, shape) for v in idx]
            active = np.broadcast_to(mask, shape).copy()
            flat = np.zeros(shape, np.int64)
            for v, n in zip(idx, b.shape):
                active &= (v >= 0) & (v < n)
                flat = flat * n + np.clip(v, 0, n - 1)
            mine.append((sub, write, lane_ids[active], flat[active]))
        for i, (sub, write, ls, es) in enumerate(mine):
            if not write:
                continue
            order = np.lexsort((ls, es))
            e_sorted, l_sorted = es[order], ls[order]
            clash = np.nonzero((e_sorted[1:] == e_sorted[:-1]) & (l_sorted[1:] != l_sorted[:-1]))[0]
            if clash.size:
                c = clash[0]
                _race(k, lanes, b, sub, sub, int(l_sorted[c + 1]), int(l_sorted[c]), int(e_sorted[c]), True)
            prior = owner[es]
            bad = np.nonzero((prior >= 0) & (prior != ls))[0]
            if bad.size:
                e = int(es[bad[0]])
                _race(k, lanes, b, sub, mine[writer[e]][0], int(ls[bad[0]]), int(prior[bad[0]]), e, True)
            owner[es] = ls
            writer[es[writer[es] < 0]] = i
        for sub, write, ls, es in mine:
            w = owner[es]
            bad = np.nonzero((w >= 0) & (w != ls))[0]
            if bad.size:
                e = int(es[bad[0]])
                _race(k, lanes, b, sub, mine[writer[e]][0], int(ls[bad[0]]), int(w[bad[0]]), e, write)


def _race(k, lanes, b, sub, writer, lane, other, element, write):
    def at(lane_id):
        pos = np.unravel_index(lane_id, tuple(lanes.values()))
        return "(" + ", ".join(f"{v} = {int(p)}" for v, p in zip(lanes, pos)) + ")"
    elem = ", ".join(str(int(x)) for x in np.unravel_index(element, b.shape))
    line = f" (line {writer.span.line})" if writer.span is not None and writer.span.line and \
        (sub.span is None or writer.span.line != sub.span.line) else ""
    raise SemanticError(
        f"iterations of this parallel race on shared tile '{b.name}': iteration {at(lane)} "
        f"{'writes' if write else 'reads'} {b.name}[{elem}] (here {show_expr(sub)}), which iteration {at(other)} "
        f"writes{line}; iterations run at once on different threads, so the result would depend on their timing",
        sub.span, note="read only elements that the same iteration writes, or write the values into another "
                       "tile and read them in a second parallel (a block barrier goes between the two)")


def _check_reduce(k, s: ir.Reduce):
    """A 2-D tile into a 1-D tile of the extent that is left; floats into floats,
    integers into integers (how a local tile lies is plan-gemm's, which knows its
    layout)."""
    src, dst = _tile(k, s.src, s.src_span, "reduce"), _tile(k, s.dst, s.dst_span, "reduce")
    if len(src.shape) != 2:
        raise SemanticError(f"reduce reduces a 2-D tile; '{src.name}' has rank {len(src.shape)}", s.src_span)
    if len(dst.shape) != 1:
        raise SemanticError(f"reduce writes a 1-D tile; '{dst.name}' has rank {len(dst.shape)}", s.dst_span)
    left = src.shape[1 - s.axis]
    if dst.shape[0] != left:
        what = "row" if s.axis == 1 else "column"
        raise SemanticError(f"reduce with axis = {s.axis} gives one value per {what} of '{src.name}' "
                            f"({_decl(src)}): {left} values, but '{dst.name}' is {_decl(dst)}", s.dst_span)
    if src.dtype.is_float != dst.dtype.is_float:
        raise SemanticError(f"reduce: '{src.name}' is {src.dtype.name} and '{dst.name}' is {dst.dtype.name}; "
                            "floats reduce into a float tile, integers into an integer tile", s.dst_span)


def _decl(b: ir.Buffer) -> str:
    return f"{b.dtype.name}[{', '.join(map(str, b.shape))}]"


def _integer(k, e, what):
    """Reject float-valued index expressions (C++ would truncate them silently)."""
    for x in walk_expr(e):
        bad = isinstance(x, ir.Float) or (isinstance(x, ir.Call) and x.func in FLOAT_CALLS) or \
            (isinstance(x, ir.Cast) and x.dtype.is_float) or \
            (isinstance(x, ir.Var) and x.kind == "scalar" and k.param(x.name).dtype.is_float)
        if bad:
            raise SemanticError(f"{what} must be an integer expression", x.span)


def _no_elements(e, what):
    for x in walk_expr(e):
        if isinstance(x, ir.Subscript):
            raise SemanticError(f"{what} cannot read tile elements", x.span)
        if isinstance(x, ir.Var) and x.kind in ("tile", "tensor", "view"):
            raise SemanticError(f"'{x.name}' is a {_kind_word(x.kind)}, not a value", x.span)


def _tile(k, name, span, what):
    b = k.buffer(name)
    if b is None:
        raise SemanticError(f"{what} needs a shared or local tile; '{name}' is not one", span)
    return b


_CAST_NOTE = "convert a float to an integer with a cast, e.g. i32(x)"


def _check_value(k, e, lanes):
    for x in walk_expr(e):
        if isinstance(x, ir.BinOp) and x.op == "%" and (is_float(k, x.lhs) or is_float(k, x.rhs)):
            raise SemanticError("'%' takes integers; a float operand has no remainder here", x.span)
        if isinstance(x, ir.Call) and x.func == "cdiv":
            _int_args(k, x)
        if isinstance(x, ir.Subscript):
            _check_element(k, x, lanes)
        elif isinstance(x, ir.Var) and x.kind in ("tile", "tensor", "view"):
            raise SemanticError(f"'{x.name}' is a {_kind_word(x.kind)}; read one element as {x.name}[...]",
                                x.span)


def _f32_literals(e, double):
    """A float literal is an f32 (`1.5f`) unless the statement computes in double
    (an f64 tile or scalar involved): one that f32 cannot hold, over about 3.4e38
    or a nonzero value that rounds to 0, is an error (NVRTC refuses it)."""
    if double:
        return
    for x in walk_expr(e):
        if isinstance(x, ir.Float) and x.value != 0:
            try:
                f32 = struct.unpack("f", struct.pack("f", x.value))[0]
            except OverflowError:
                f32 = math.inf
            if f32 == 0 or math.isinf(f32):
                text = _text(x.span) or repr(x.value)
                raise SemanticError(f"float literal {text} is out of the range of f32 (magnitudes about 1.4e-45 to "
                                    "3.4e38); a float literal is an f32 unless its statement reads an f64 tile or "
                                    "scalar", x.span)


def _text(span):
    if span is None or span.line != span.end_line:
        return None
    return span.source.line(span.line)[span.col - 1:span.end_col - 1]


def _int_args(k, call: ir.Call):
    """cdiv divides integers (an integer ceiling); a float argument is an error at it."""
    for a in call.args:
        part = float_part(k, a)
        if part is not None:
            raise SemanticError(f"{call.func} takes integer arguments", part.span, note=_CAST_NOTE)


def _check_element(k, sub: ir.Subscript, lanes, write=False):
    if isinstance(k.param(sub.name), ir.TensorParam):
        if write:
            raise SemanticError(f"'{sub.name}' is a global tensor; its elements are not assigned: write a tile "
                                "and copy it into a region of the tensor", sub.span)
        raise SemanticError(f"'{sub.name}' is a global tensor; copy a region of it into a tile to read "
                            "its elements", sub.span)
    b = _tile(k, sub.name, sub.span, "element access")
    if any(isinstance(i, ir.Slice) for i in sub.indices):
        raise SemanticError("slices are for copy regions, not element access", sub.span)
    if len(sub.indices) != len(b.shape):
        raise SemanticError(f"tile '{b.name}' has rank {len(b.shape)} but is indexed with "
                            f"{len(sub.indices)} indices", sub.span)
    for i in sub.indices:
        part = float_part(k, i)
        if part is not None:
            raise SemanticError("a tile index must be an integer expression", part.span, note=_CAST_NOTE)
    if b.scope == "local":
        # A local tile lives in registers, element e in thread e % threads: only the
        # parallel loop's own index reaches it without moving data between threads.
        ok = (lanes is not None and tuple(lanes.values()) == b.shape and
              all(isinstance(i, ir.Var) and i.name == v for i, v in zip(sub.indices, lanes)))
        # A 1-D tile read at the row index of a parallel over [M, N]: where the parallel walks a
        # gemm accumulator, the tile lives in its rows (plan-gemm places it there or says why not).
        ok = ok or (not write and lanes is not None and len(lanes) == 2 and len(b.shape) == 1 and
                    isinstance(sub.indices[0], ir.Var) and sub.indices[0].name == next(iter(lanes)) and
                    b.shape[0] == next(iter(lanes.values())))
        if not ok:
            raise SemanticError(_local_index_message(b, lanes, write), sub.span)


def _local_index_message(b: ir.Buffer, lanes: dict | None, write: bool) -> str:
    """Why a local tile's element cannot be reached here, in the names the program uses."""
    shape = list(b.shape)
    if lanes is None:
        return (f"local tile '{b.name}' is read or written element by element only inside a parallel over its "
                f"whole shape {shape}, at the parallel's own indices")
    names, extents = ", ".join(lanes), ", ".join(str(v) for v in lanes.values())
    if len(lanes) == len(shape):
        other = "" if list(lanes.values()) == shape else f"; this parallel is over ({names}) in ({extents})"
        return (f"local tile '{b.name}' must be indexed with the parallel loop's own indices, {b.name}[{names}], "
                f"in a parallel over its whole shape {shape}{other}")
    text = (f"local tile '{b.name}' of shape {shape} must be indexed with the parallel loop's own indices in a "
            f"parallel over its whole shape; this parallel is over ({names}) in ({extents})")
    if len(shape) == 1 and len(lanes) == 2 and not write:
        first, rows = next(iter(lanes.items()))
        text += (f" (a 1-D tile may also be read at the row index, {b.name}[{first}], where its length is the "
                 f"parallel's {rows} rows)")
    return text


def _check_copy(k, s: ir.Copy) -> ir.Copy:
    sides = []
    for r, what in ((s.src, "source"), (s.dst, "destination")):
        sp = k.space(r.name)
        if sp == "scalar":
            raise SemanticError(f"the {what} of a copy must be a tensor or a tile; '{r.name}' is not", r.span)
        if sp == "view":
            if what == "destination":
                raise SemanticError("an im2col view is read-only: copy from it into a shared tile", r.span)
            if len(r.starts) != 2:
                raise SemanticError(f"an im2col view is a matrix: write {r.name}[m0, k0]", r.span)
            x = k.param(k.view(r.name).tensor)
            sides.append((sp, x.dtype, None))
            continue
        if sp in ("shared", "local"):
            if r.starts:
                raise SemanticError(f"a tile side of a copy is the whole tile: write '{r.name}', not a subscript",
                                    r.span)
            b = k.buffer(r.name)
            sides.append((sp, b.dtype, b.shape))
        else:
            p = k.param(r.name)
            if r.starts and len(r.starts) != len(p.shape):
                raise SemanticError(f"tensor '{p.name}' has rank {len(p.shape)} but the region gives "
                                    f"{len(r.starts)} coordinates", r.span)
            for d, x in enumerate(r.starts):
                _no_elements(x, "a region origin")
                _integer(k, x, "a region origin")
                big = next((i for i in _addends(x) if isinstance(i, ir.Int) and not -2**31 <= i.value < 2**31), None)
                if big is not None:
                    what = f"is {big.value}" if big is x else f"({show_expr(x)}) holds {big.value}"
                    raise SemanticError(f"the region's coordinate {d} {what}, outside a "
                                        f"32-bit int: kernels index each dimension with 32-bit ints (TMA coordinates "
                                        f"are), and a shape symbol is at most {2**31 - 1}",
                                        big.span or x.span or r.span)
            sides.append((sp, p.dtype, None))
    (ssp, sdt, sshape), (dsp, ddt, dshape) = sides
    if ssp == "view":
        if dsp != "shared" or len(dshape) != 2:
            raise SemanticError("an im2col view is copied into a 2-D shared tile (a TMA im2col load)", s.span)
        if sdt != ddt:
            raise SemanticError(f"a TMA im2col load moves bytes: {sdt.name} and {ddt.name} differ", s.span)
        for x, want in zip(s.src.extents, dshape):
            x = None if x is None else linear(x)
            if x is not None and not (isinstance(x, ir.Int) and x.value == want):
                raise SemanticError(f"the region's extents must match the tile shape {list(dshape)}",
                                    x.span or s.src.span)
        return replace(s, src=replace(s.src, extents=tuple(ir.Int(v) for v in dshape)))
    if ssp == "global" and dsp == "global":
        raise SemanticError("copy from global to global: stage it through a shared tile", s.span)
    tile_shape = sshape or dshape
    if sshape and dshape and sshape != dshape:
        raise SemanticError(f"copy between tiles of shapes {list(sshape)} and {list(dshape)}", s.span)
    if {ssp, dsp} == {"global", "shared"} and sdt != ddt:
        raise SemanticError(f"a global<->shared copy moves bytes as they are (by TMA, or the thread copies that "
                            f"stand in for it): {sdt.name} and {ddt.name} differ (convert through a parallel body "
                            f"or a local tile)", s.span)
    # fill in region origins and extents on the global side
    new = []
    for r, sp in ((s.src, ssp), (s.dst, dsp)):
        if sp == "global":
            p = k.param(r.name)
            rank = len(p.shape)
            if len(tile_shape) > rank:
                raise SemanticError(f"a tile of rank {len(tile_shape)} does not fit tensor '{p.name}' of rank {rank}",
                                    s.span)
            box = (1,) * (rank - len(tile_shape)) + tuple(tile_shape)
            starts = r.starts or tuple(ir.Int(0) for _ in range(rank))
            extents = tuple(None if x is None else linear(x) for x in (r.extents or (None,) * rank))
            split = _split_rows(p, extents, tile_shape, s)
            for x, want in zip(extents, split or box):
                if x is not None and not (isinstance(x, ir.Int) and x.value == want):
                    raise SemanticError(f"the region's extents must match the tile shape {list(tile_shape)}",
                                        x.span or r.span)
            box = split or box
            r = replace(r, starts=starts, extents=tuple(ir.Int(v) for v in box))
        new.append(r)
    return replace(s, src=new[0], dst=new[1])
