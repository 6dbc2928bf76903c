"""fold-consts: apply const overrides, fold consts and integer lets into every
expression, bind shape symbols, and resolve each remaining name to its kind."""
from __future__ import annotations

from dataclasses import replace

from ..errors import SemanticError, TilecError
from ..ir import nodes as ir
from ..ir.exprs import (FLOAT_CALLS, INT_CALLS, INT_MAX, INT_MIN, children, fold, free_names, linear, map_expr,
                        map_stmt_exprs, substitute, substitute_body, tree_size, walk_expr)
from ..ir.printer import expr as show_expr

NAME = "fold-consts"

MAX_STAGES = 8
# A let is copied into each use, the lets it reads written out in it, so a chain of lets that each
# read the one before twice (`let L2 = L1 * 2 + L1;`) doubles at each link: 2^20 nodes at 20 links,
# which every pass and the printers walked (50 s). A let's value past LET_LINEAR_ABOVE nodes (the
# examples' largest is 29) is folded as a linear combination where that is smaller (`M * 9`); one
# still past MAX_LET_NODES (a chain of divisions or calls) is an error at the let.
LET_LINEAR_ABOVE = 256
MAX_LET_NODES = 10_000


def run(k: ir.Kernel, opts) -> ir.Kernel:
    overrides = opts.consts
    declared = {c[0] for c in k.consts}
    params = {p.name for p in k.params}
    symbols = []        # shape symbols: a tensor's dims that are a name, no const or parameter
    for t in k.tensors:
        for d in t.shape:
            if isinstance(d, ir.Var) and d.name not in declared and d.name not in params and d.name not in symbols:
                symbols.append(d.name)
    for name in overrides:
        if name not in declared and name not in symbols:
            raise TilecError(f"kernel '{k.name}' has no const or shape symbol '{name}' to override"
                             f" (its consts: {', '.join(sorted(declared)) or 'none'}; its shape symbols: "
                             f"{', '.join(symbols) or 'none'})")

    # consts, in order; an override replaces the declared value
    values: dict = {}
    consts = []
    for name, expr, span in k.consts:
        if name in overrides:
            v = overrides[name]
            if not isinstance(v, int) or isinstance(v, bool):
                raise TilecError(f"const '{name}' must be an integer, got {v!r}")
            if not INT_MIN <= v <= INT_MAX:
                raise TilecError(f"const '{name}' = {v} is outside the 64-bit signed range (-2^63 .. 2^63-1) of "
                                 "tilec's integers")
        else:
            e = fold(substitute(expr, values))
            if not isinstance(e, ir.Int):
                raise SemanticError(f"const '{name}' is not a compile-time integer", expr.span,
                                    note="consts may use integer literals and earlier consts only")
            v = e.value
        values[name] = ir.Int(v, span=span)
        consts.append((name, v))

    # shape symbols fixed by an override: their value in every shape and expression
    fixed = []
    for name in symbols:
        if name in overrides:
            v = overrides[name]
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= INT_MAX:
                raise TilecError(f"shape symbol '{name}' must be fixed to a positive integer, got {v!r}")
            values[name] = ir.Int(v)
            fixed.append((name, v))

    # names and their kinds
    kinds = {}
    for p in k.params:
        kinds[p.name] = "tensor" if isinstance(p, ir.TensorParam) else "scalar"
    symbols = [s for s in symbols if s not in values]
    for s in symbols:
        kinds[s] = "symbol"
    for g in k.grid_vars:
        kinds[g] = "block"
    for b in k.buffers:
        kinds[b.name] = "tile"

    env = dict(values)
    lets = []
    floats = {p.name for p in k.params if isinstance(p, ir.ScalarParam) and p.dtype.is_float}
    for name, e in k.lets:
        written = e
        for x in walk_expr(e):      # (a let's names are checked here, used or not; as written: lets unexpanded;
            # a later let's name is the builder's error, _no_later_lets)
            if isinstance(x, ir.Var) and x.name not in kinds and x.name not in env:
                raise SemanticError(f"unknown name '{x.name}'", x.span)
        e = fold(substitute(e, env), "exact")
        if isinstance(e, ir.Call) and e.func == "im2col":
            kinds[name] = "view"
            lets.append((name, e))
            continue
        for x in walk_expr(written):
            if isinstance(x, ir.Var) and kinds.get(x.name) in ("tensor", "tile", "view"):
                what = {"tensor": "a tensor", "tile": "a tile", "view": "an im2col view"}[kinds[x.name]]
                raise SemanticError(f"let '{name}' reads '{x.name}', {what}: a let names a number (an integer or "
                                    f"float expression) or an im2col view (let Xc = im2col(X, ...)); use "
                                    f"'{x.name}' by its own name", x.span)
        e = _bounded(name, e, "exact", written.span, floats)
        env[name] = e
        lets.append((name, e))

    def resolve(e, bound, division="floor"):
        def step(x):
            if isinstance(x, ir.Var):
                kind = bound.get(x.name) or kinds.get(x.name)
                if kind is None:
                    raise SemanticError(f"unknown name '{x.name}'", x.span)
                return replace(x, kind=kind)
            if isinstance(x, ir.Call) and x.func not in INT_CALLS and x.func not in FLOAT_CALLS \
                    and x.func != "im2col":
                raise SemanticError(f"unknown function '{x.func}'", x.span)
            return x
        return map_expr(fold(substitute(e, env), division), step)

    params = []
    for p in k.params:
        if isinstance(p, ir.TensorParam):
            p = replace(p, shape=tuple(resolve(d, {}) for d in p.shape))
            for d, x in enumerate(p.shape):
                if isinstance(x, ir.Float) or isinstance(x, ir.Int) and x.value < 0:
                    raise SemanticError(f"dim {d} of tensor '{p.name}' is {show_expr(x)}: a dimension is an integer "
                                        ">= 0 (a shape symbol, or an integer expression of consts and symbols)",
                                        x.span or p.span)
        params.append(p)

    buffers = []
    for b in k.buffers:
        shape = []
        for d in b.shape:
            v = fold(substitute(d, env))
            if not isinstance(v, ir.Int):
                raise SemanticError(f"tile '{b.name}' must have a compile-time shape", d.span)
            if v.value <= 0:
                raise SemanticError(f"tile '{b.name}' has a dimension of {v.value}", d.span)
            shape.append(v.value)
        buffers.append(replace(b, shape=tuple(shape)))

    threads = fold(substitute(k.threads, env))
    if not isinstance(threads, ir.Int):
        raise SemanticError("threads must be a compile-time integer", k.threads.span)

    flag = lambda v: v in (0, 1)  # noqa: E731
    persistent = _option(k.persistent, flag, "persistent must be a compile-time 0 (a block per tile) or 1 (as many "
                                             "blocks as the GPU holds at once, each looping over tiles)", resolve)
    stream_k = _option(k.stream_k, flag, "stream_k must be a compile-time 0 or 1 (the last wave's tiles split their "
                                         "K steps over the blocks)", resolve)
    if stream_k and not persistent:
        raise SemanticError("stream_k = 1 splits the tiles of a persistent grid's last wave: it needs persistent = 1",
                            k.stream_k.span)
    group = _option(k.group, lambda v: v >= 1, "group must be a compile-time integer >= 1 (the rows of tiles "
                                                "that are numbered together)", resolve)
    if group > 1 and len(k.grid) < 2:
        raise SemanticError(f"group = {group} numbers the tiles of {group} rows (the grid's second index) "
                            "together: it needs a grid of 2 or 3 dims", k.group.span)
    body = _resolve_body(k.body, lambda e, bound: resolve(e, bound, "trunc"), {},    # device code: C++'s / and %
                         floats)
    requires = []
    for r in k.requires:
        cond = resolve(r.cond, {})
        if isinstance(cond, ir.Int):    # decided by the consts (and fixed symbols): now, not at every launch
            if cond.value == 0:
                shown = ", ".join(f"{n} = {values[n].value}" for n in sorted(free_names(r.cond)) if n in values)
                raise SemanticError(f"require {r.text} is false for every launch" + (f" ({shown})" if shown else ""),
                                    r.span)
            continue
        requires.append(replace(r, cond=cond))
    return replace(k, params=tuple(params), consts=tuple(consts), fixed=tuple(fixed), lets=tuple(lets),
                   persistent=persistent,
                   stream_k=stream_k, group=group,
                   requires=tuple(requires),
                   grid=tuple(resolve(g, {}) for g in k.grid), threads=threads,
                   buffers=tuple(buffers), body=body)


def _resolve_body(body, resolve, bound, floats=frozenset()):
    out = []
    body = list(body)
    while body:
        s = body.pop(0)
        if isinstance(s, ir.Let):       # a let inside a block: its value in the rest of the block
            if isinstance(s.value, ir.Call) and s.value.func == "im2col":
                raise SemanticError("an im2col view is declared at the top level of the kernel", s.span)
            value = _bounded(s.name, resolve(s.value, bound), "trunc", s.value.span, floats)
            body = list(substitute_body(body, {s.name: value}))
            continue
        if isinstance(s, ir.For):
            stages = s.stages
            if stages is not None:
                st = resolve(stages, bound)
                if not isinstance(st, ir.Int) or not 1 <= st.value <= MAX_STAGES:
                    raise SemanticError(f"stages must be a compile-time integer from 1 to {MAX_STAGES}", stages.span)
                stages = st.value
            producer = s.producer
            if isinstance(producer, ir.Expr):
                pr = resolve(producer, bound)
                if not isinstance(pr, ir.Int) or pr.value not in (0, 1):
                    raise SemanticError("producer must be a compile-time 0 (thread 0 of the consumers issues the "
                                        "loads) or 1 (a producer warpgroup of its own)", producer.span)
                producer = pr.value
            inner = dict(bound, **{s.var: "loop"})
            s = replace(s, extent=resolve(s.extent, bound), stages=stages, producer=producer,
                        start=None if s.start is None else resolve(s.start, bound),
                        step=None if s.step is None else resolve(s.step, bound),
                        body=_resolve_body(s.body, resolve, inner, floats))
        elif isinstance(s, ir.Parallel):
            inner = dict(bound, **{v: "lane" for v in s.vars})
            s = replace(s, extents=tuple(resolve(x, bound) for x in s.extents),
                        body=_resolve_body(s.body, resolve, inner, floats))
        elif isinstance(s, ir.If):
            s = replace(s, cond=resolve(s.cond, bound), then=_resolve_body(s.then, resolve, bound, floats),
                        orelse=_resolve_body(s.orelse, resolve, bound, floats))
        else:
            s = map_stmt_exprs(s, lambda e: resolve(e, bound))
            if isinstance(s, (ir.Copy,)):
                for r in (s.src, s.dst):
                    resolve(ir.Var(r.name, span=r.span), bound)
            elif isinstance(s, (ir.Fill, ir.Assign)):
                resolve(ir.Var(s.buffer, span=s.span), bound)
            elif isinstance(s, ir.Reduce):
                resolve(ir.Var(s.src, span=s.src_span), bound)
                resolve(ir.Var(s.dst, span=s.dst_span), bound)
        out.append(s)
    return tuple(out)


def _bounded(name, e, division, span, floats):
    """A let's value `e` (its lets substituted, folded with `division`) as it is
    copied into its uses: past LET_LINEAR_ABOVE nodes as a linear combination
    where it is an integer one (no float, tile element or cast in it: `floats`
    names the float scalars; a float sum's rounding would change), that is smaller
    and whose coefficients are 64-bit integers; an error past MAX_LET_NODES."""
    n = tree_size(e)
    if n <= LET_LINEAR_ABOVE:
        return e
    if all(not isinstance(x, (ir.Float, ir.Subscript, ir.Cast)) and not (isinstance(x, ir.Var) and x.name in floats)
           and not (isinstance(x, ir.Call) and x.func in FLOAT_CALLS) for x in _nodes(e)):
        folded = linear(e, division)
        if tree_size(folded) < n and all(INT_MIN <= x.value <= INT_MAX for x in _nodes(folded)
                                         if isinstance(x, ir.Int)):
            e, n = folded, tree_size(folded)
    if n > MAX_LET_NODES:
        raise SemanticError(f"let '{name}' is an expression of {n} nodes once the lets it reads are written out in "
                            f"it (at most {MAX_LET_NODES})", span,
                            note="a let is copied into each use, so a let that reads another twice doubles its "
                                 "size: a chain of them grows exponentially; compute the value in fewer steps")
    return e


def _nodes(e):
    """Each node of `e` once (a let's value is a graph: its shared parts are not walked again)."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop()
        if id(x) not in seen:
            seen.add(id(x))
            yield x
            todo.extend(children(x))


def _option(value, valid, message, resolve) -> int:
    """A grid option (persistent, stream_k, group) as the compile-time integer
    it must be, `valid` saying which; `message` where it is not."""
    if not isinstance(value, ir.Expr):
        return value
    v = resolve(value, {})
    if not isinstance(v, ir.Int) or not valid(v.value):
        raise SemanticError(message, value.span)
    return v.value
