"""lower-ranges: `for v in range(start, stop, step)` becomes the loop from 0 that
every later pass knows,

    for tl_v_iter in range(trips) { the body, with v = start + tl_v_iter * step }

as Python's range counts: trips = max(0, cdiv(stop - start, step)) for a positive
step, max(0, cdiv(start - stop, -step)) for a negative one, so an empty range runs
no iteration. A step that is not a compile-time integer must be an expression of
scalar parameters and shape symbols, values the host has before the launch: the
kernel gets a `require step != 0` (Python's range refuses a step of 0; here the
launch does, naming the loop), and the trip count picks its formula by the step's
sign. The loop variable's every use is replaced by its value, so the analyses after
this pass (mark-in-place's strides, check-barriers' trip counts) see it as a linear
expression of the new counter."""
from __future__ import annotations

from dataclasses import replace

from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.exprs import fold, substitute_body, walk_expr
from ..ir.printer import expr as show

NAME = "lower-ranges"

_KIND_WORDS = {"block": "a block index", "loop": "a loop variable", "lane": "a parallel index"}


def run(k: ir.Kernel, opts) -> ir.Kernel:
    requires = []
    body = _lower(k.body, requires)
    if body == k.body:
        return k
    return replace(k, body=body, requires=k.requires + tuple(requires))


def _lower(body, requires) -> tuple:
    out = []
    for s in body:
        nested = {f: _lower(getattr(s, f), requires) for f in ir.STMT_BLOCK_FIELDS.get(type(s), ())}
        if nested:
            s = replace(s, **nested)
        if isinstance(s, ir.For) and s.start is not None:
            s = _from_zero(s, requires)
        out.append(s)
    return tuple(out)


def _from_zero(s: ir.For, requires) -> ir.For:
    span = s.span
    start, stop = s.start, s.extent
    step = s.step if s.step is not None else ir.Int(1, span=span)

    def op(o, a, b):
        return ir.BinOp(o, a, b, span=span)

    def up(lo, hi, by):         # the iterations from lo up to hi (exclusive) by a step of by > 0
        count = op("-", hi, lo) if isinstance(by, ir.Int) and by.value == 1 else \
            ir.Call("cdiv", (op("-", hi, lo), by), span=span)
        return ir.Call("max", (ir.Int(0, span=span), count), span=span)

    if isinstance(step, ir.Int):
        if step.value == 0:
            raise SemanticError("range's step is 0: a loop needs a step that moves (Python's range refuses 0 too)",
                                step.span)
        trips = up(start, stop, step) if step.value > 0 else up(stop, start, ir.Int(-step.value, span=step.span))
    else:
        for x in walk_expr(step):
            if isinstance(x, ir.Var) and x.kind not in ("symbol", "scalar"):
                raise SemanticError(
                    f"range's step must be known before the launch: a compile-time integer, or an expression of "
                    f"scalar parameters and shape symbols (the launch checks that it is not 0); '{x.name}' is "
                    f"{_KIND_WORDS.get(x.kind, 'not one')}", x.span)
        where = f"line {span.line}" if span is not None else "the kernel"
        requires.append(ir.Require(op("!=", step, ir.Int(0, span=span)),
                                   f"{show(step)} != 0 (the step of the range of loop '{s.var}', {where})",
                                   span=step.span))
        negated = ir.UnaryOp("-", step, span=span)
        trips = ir.Call("select", (op(">", step, ir.Int(0, span=span)), up(start, stop, step),
                                   up(stop, start, negated)), span=span)
    counter = f"tl_{s.var}_iter"
    value = op("+", start, op("*", ir.Var(counter, "loop", span=span), step))
    return replace(s, var=counter, extent=fold(trips, "trunc"), body=substitute_body(s.body, {s.var: value}),
                   start=None, step=None)
