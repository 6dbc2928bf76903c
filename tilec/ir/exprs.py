"""Expression utilities shared by passes: folding, substitution, free names,
and the divisibility facts that TMA alignment proofs rest on."""
from __future__ import annotations

import math
from dataclasses import fields, replace

from . import nodes as ir

INT_BINOPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "==": lambda a, b: int(a == b),
    "!=": lambda a, b: int(a != b),
    "<": lambda a, b: int(a < b),
    "<=": lambda a, b: int(a <= b),
    ">": lambda a, b: int(a > b),
    ">=": lambda a, b: int(a >= b),
    "&&": lambda a, b: int(bool(a) and bool(b)),
    "||": lambda a, b: int(bool(a) or bool(b)),
}
INT_CALLS = {
    "min": (2, min),
    "max": (2, max),
    "cdiv": (2, lambda a, b: -(-a // b)),
    "abs": (1, abs),
    "select": (3, lambda c, a, b: a if c else b),     # c ? a : b (make-persistent's stream-K schedule)
}
FLOAT_CALLS = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt"}
# Integers are 64-bit signed: literals, folded constants and const overrides
# must lie in this range (generated CUDA writes the larger ones as `...LL`).
INT_MIN, INT_MAX = -2**63, 2**63 - 1
# Every built-in a program may call in an expression, and its parameters: the
# front end checks each call's argument count against this table
# (im2col, a let's view, takes keywords and is checked by check-types).
CALL_PARAMS = {
    "min": ("a", "b"), "max": ("a", "b"), "cdiv": ("a", "b"), "abs": ("x",), "select": ("c", "a", "b"),
    "exp": ("x",), "exp2": ("x",), "log": ("x",), "log2": ("x",), "sqrt": ("x",), "rsqrt": ("x",),
}
assert all(len(CALL_PARAMS[f]) == n for f, (n, _) in INT_CALLS.items()) and FLOAT_CALLS <= set(CALL_PARAMS)


def map_expr(e, fn):
    """Rebuild `e` bottom-up, applying `fn` to every node after its children."""
    if isinstance(e, ir.BinOp):
        e = replace(e, lhs=map_expr(e.lhs, fn), rhs=map_expr(e.rhs, fn))
    elif isinstance(e, ir.UnaryOp):
        e = replace(e, operand=map_expr(e.operand, fn))
    elif isinstance(e, ir.Call):
        e = replace(e, args=tuple(map_expr(a, fn) for a in e.args),
                    kwargs=tuple((k, map_expr(v, fn)) for k, v in e.kwargs))
    elif isinstance(e, ir.Cast):
        e = replace(e, value=map_expr(e.value, fn))
    elif isinstance(e, ir.TupleExpr):
        e = replace(e, items=tuple(map_expr(i, fn) for i in e.items))
    elif isinstance(e, ir.Subscript):
        e = replace(e, indices=tuple(map_expr(i, fn) for i in e.indices))
    elif isinstance(e, ir.Slice):
        e = replace(e, start=map_expr(e.start, fn), stop=map_expr(e.stop, fn))
    return fn(e)


def walk_expr(e):
    yield e
    for child in children(e):
        yield from walk_expr(child)


def sized(e) -> bool:
    """Does integer expression `e` grow with a shape symbol (a tensor's size)?
    Device code computes in 32-bit ints, symbols included; a product of two
    sized factors (cdiv(M, BM) * cdiv(N, BN)) is computed in 64 bits."""
    return any(isinstance(x, ir.Var) and x.kind == "symbol" for x in walk_expr(e))


def widened(e):
    """`e` as device code computes it: a product of two sized factors with its
    left factor cast to i64 (static_cast<long long>(a) * b), anything else as is."""
    if isinstance(e, ir.BinOp) and e.op == "*" and sized(e.lhs) and sized(e.rhs):
        return ir.BinOp("*", ir.Cast(ir.DTYPES["i64"], e.lhs, span=e.span), e.rhs, span=e.span)
    return e


def children(e):
    """The expressions directly inside `e`."""
    if isinstance(e, ir.BinOp):
        return (e.lhs, e.rhs)
    if isinstance(e, ir.UnaryOp):
        return (e.operand,)
    if isinstance(e, ir.Call):
        return tuple(e.args) + tuple(v for _, v in e.kwargs)
    if isinstance(e, ir.Cast):
        return (e.value,)
    if isinstance(e, ir.TupleExpr):
        return e.items
    if isinstance(e, ir.Subscript):
        return e.indices
    if isinstance(e, ir.Slice):
        return (e.start, e.stop)
    return ()


def reads_f64(k, e) -> bool:
    """Does `e` read an f64 tile or scalar? Then device code (and the interpreter)
    computes it in double, its float literals included; else in float."""
    for x in walk_expr(e):
        if isinstance(x, ir.Subscript):
            b = k.buffer(x.name)
            if b is not None and b.dtype.name == "f64":
                return True
        if isinstance(x, ir.Var) and x.kind == "scalar" and k.param(x.name).dtype.name == "f64":
            return True
    return False


def float_part(k, e):
    """The part of `e` that makes it a float value (`e` itself, or the operand
    whose type it takes), or None when `e` is an integer expression."""
    if isinstance(e, ir.Float) or (isinstance(e, ir.Call) and e.func in FLOAT_CALLS):
        return e
    if isinstance(e, ir.Cast):
        return e if e.dtype.is_float else None
    if isinstance(e, ir.Var) and e.kind == "scalar":
        return e if k.param(e.name).dtype.is_float else None
    if isinstance(e, ir.Subscript):
        b = k.buffer(e.name)
        return e if b is not None and b.dtype.is_float else None
    if isinstance(e, ir.BinOp) and e.op in "+-*/%":
        return float_part(k, e.lhs) or float_part(k, e.rhs)
    if isinstance(e, ir.UnaryOp) and e.op == "-":
        return float_part(k, e.operand)
    if isinstance(e, ir.Call) and e.func in ("min", "max", "abs", "select"):
        args = e.args[1:] if e.func == "select" else e.args
        return next((p for p in (float_part(k, a) for a in args) if p is not None), None)
    return None


def is_float(k, e) -> bool:
    """Is `e` a float value (check-types' typing; codegen's casts ask it too)?"""
    return float_part(k, e) is not None


def float_width(k, e, double: bool) -> int | None:
    """The bits of the C++ float type device code computes `e` in (32: float,
    64: double), None for an integer or boolean expression: C++'s usual
    arithmetic conversions over f64 (double), other float elements, scalars and
    casts (float, f16 and its kin read as float), float literals and calls
    (double where the expression reads f64, `double`)."""
    if isinstance(e, ir.Float) or (isinstance(e, ir.Call) and e.func in FLOAT_CALLS):
        return 64 if double else 32
    if isinstance(e, (ir.Cast, ir.Var, ir.Subscript)):
        if isinstance(e, ir.Cast):
            dt = e.dtype
        elif isinstance(e, ir.Var):
            dt = k.param(e.name).dtype if e.kind == "scalar" else None
        else:
            dt = getattr(k.buffer(e.name), "dtype", None)
        return None if dt is None or not dt.is_float else 64 if dt.name == "f64" else 32
    if isinstance(e, ir.BinOp):
        if e.op not in "+-*/%":
            return None
        parts = (e.lhs, e.rhs)
    elif isinstance(e, ir.UnaryOp):
        parts = (e.operand,) if e.op == "-" else ()
    elif isinstance(e, ir.Call) and e.func in ("min", "max", "abs", "select"):
        parts = e.args[1:] if e.func == "select" else e.args
    else:
        return None
    best = None
    for x in parts:         # (a loop, not a generator: one frame per level of a long sum)
        w = float_width(k, x, double)
        if w is not None and (best is None or w > best):
            best = w
    return best


def fused_product(k, e, double: bool) -> tuple[int, int] | None:
    """(the side of `e` device code fuses with the other into one multiply-add,
    0 the left and 1 the right; the float width of both, 32 or 64), None where
    nothing is: `a * b + c`, `a * b - c`, `c + a * b`, `c - a * b` whose product
    has the float type of the sum, the left product where both sides are
    products. Codegen prints it as __fmaf_rn / __fma_rn and NVRTC compiles with
    --fmad=false, so no other operations are fused; the interpreter computes the
    same fused operation."""
    if not (isinstance(e, ir.BinOp) and e.op in ("+", "-")):
        return None
    width = float_width(k, e, double)
    if width is None:
        return None
    for i, side in enumerate((e.lhs, e.rhs)):
        if isinstance(side, ir.BinOp) and side.op == "*" and float_width(k, side, double) == width:
            return i, width
    return None


def free_names(e) -> set:
    return {x.name for x in walk_expr(e) if isinstance(x, ir.Var)}


def _int64(value, x):
    """The folded value of `x`, an error at `x` where it leaves the 64-bit signed range."""
    if not INT_MIN <= value <= INT_MAX:
        from ..errors import SemanticError
        from ..ir.printer import expr as show
        raise SemanticError(f"the constant expression '{show(x)}' is {value}, outside the 64-bit signed range "
                            "(-2^63 .. 2^63-1) of tilec's integers", x.span)
    return ir.Int(value, span=x.span)


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


DIVISIONS = {"floor": {"/": INT_BINOPS["/"], "%": INT_BINOPS["%"]},
             "trunc": {"/": _trunc_div, "%": lambda a, b: a - b * _trunc_div(a, b)}}


def _integral(e) -> bool:
    """Provably an integer: literals, and names of the integer kinds (shape symbols,
    consts, loop, lane and block indices) under integer arithmetic."""
    if isinstance(e, ir.Int):
        return True
    if isinstance(e, ir.Var):
        return e.kind in ("symbol", "const", "loop", "lane", "block")
    if isinstance(e, ir.BinOp):
        return e.op in ("+", "-", "*", "/", "%") and _integral(e.lhs) and _integral(e.rhs)
    if isinstance(e, ir.Call):
        return e.func in INT_CALLS and all(_integral(a) for a in e.args)
    return isinstance(e, ir.UnaryOp) and e.op == "-" and _integral(e.operand)


def fold(e, division: str = "floor"):
    """Constant-fold integer arithmetic. `division` says what `/` and `%` of constants
    are: "floor" where the host computes them (consts, the grid, require, shapes;
    Python's // and %), "trunc" in the kernel body (C++'s, what the device computes
    for the same expression unfolded: -1 / 2 is 0), "exact" for a let, which may be
    used in either: only where both agree (operands >= 0), else left to the use."""
    def step(x):
        if isinstance(x, ir.BinOp) and isinstance(x.lhs, ir.Int) and isinstance(x.rhs, ir.Int):
            if x.op in ("/", "%") and x.rhs.value == 0:
                from ..errors import SemanticError
                raise SemanticError("division by zero in a constant expression", x.span)
            if x.op in ("/", "%"):
                if division == "exact" and (x.lhs.value < 0 or x.rhs.value < 0):
                    return x
                return _int64(DIVISIONS["trunc" if division == "trunc" else "floor"][x.op](x.lhs.value, x.rhs.value), x)
            return _int64(INT_BINOPS[x.op](x.lhs.value, x.rhs.value), x)
        if isinstance(x, ir.BinOp) and x.op in "+-" and isinstance(x.rhs, ir.Int) and \
                isinstance(x.lhs, ir.BinOp) and x.lhs.op in "+-" and isinstance(x.lhs.rhs, ir.Int):
            # (a + c1) - c2 -> a + (c1 - c2)
            inner = x.lhs.rhs.value if x.lhs.op == "+" else -x.lhs.rhs.value
            total = inner + (x.rhs.value if x.op == "+" else -x.rhs.value)
            x = ir.BinOp("+" if total >= 0 else "-", x.lhs.lhs, ir.Int(abs(total)), span=x.span)
        if isinstance(x, ir.BinOp) and x.op in ("/", "%") and isinstance(x.rhs, ir.Int) and x.rhs.value == 1:
            return x.lhs if x.op == "/" else ir.Int(0, span=x.span)
        if isinstance(x, ir.BinOp):
            # x * 1, x + 0, and of integers 0 * x, 0 / x: keep generated index math short (0 / x is 0 for
            # the x = 0 of an empty tensor too, which launches nothing; a float's 0 * x is NaN for an Inf x)
            if (x.op in ("*", "/", "%") and isinstance(x.lhs, ir.Int) and x.lhs.value == 0 and _integral(x.rhs)) or \
                    (x.op == "*" and isinstance(x.rhs, ir.Int) and x.rhs.value == 0 and _integral(x.lhs)):
                return ir.Int(0, span=x.span)
            # a && 0, a || 1: decided by the literal (the expressions have no side effects)
            if x.op in ("&&", "||") and any(isinstance(y, ir.Int) and bool(y.value) == (x.op == "||")
                                             for y in (x.lhs, x.rhs)):
                return ir.Int(int(x.op == "||"), span=x.span)
            if x.op == "*" and isinstance(x.rhs, ir.Int) and x.rhs.value == 1:
                return x.lhs
            if x.op == "*" and isinstance(x.lhs, ir.Int) and x.lhs.value == 1:
                return x.rhs
            if x.op in "+-" and isinstance(x.rhs, ir.Int) and x.rhs.value == 0:
                return x.lhs
            if x.op == "+" and isinstance(x.lhs, ir.Int) and x.lhs.value == 0:
                return x.rhs
        if isinstance(x, ir.UnaryOp) and isinstance(x.operand, ir.Int):
            return _int64(-x.operand.value if x.op == "-" else int(not x.operand.value), x)
        if isinstance(x, ir.Call) and x.func == "select" and len(x.args) == 3 and isinstance(x.args[0], ir.Int):
            return x.args[1] if x.args[0].value else x.args[2]     # decided by the literal, as a && 0 is
        if isinstance(x, ir.Call) and x.func in INT_CALLS and all(isinstance(a, ir.Int) for a in x.args):
            n, f = INT_CALLS[x.func]
            if len(x.args) == n:
                if x.func == "cdiv" and x.args[1].value == 0:
                    from ..errors import SemanticError
                    raise SemanticError("division by zero in a constant expression", x.span)
                return _int64(f(*(a.value for a in x.args)), x)
        return x
    return map_expr(e, step)


def substitute(e, mapping: dict):
    """Replace Vars by name with expressions (consts, lets)."""
    def step(x):
        if isinstance(x, ir.Var) and x.name in mapping:
            return mapping[x.name]
        return x
    return map_expr(e, step)


def divides_by(x):
    """The divisor of `x` if it is a division (`/`, `%` or cdiv), else None."""
    if isinstance(x, ir.BinOp) and x.op in ("/", "%"):
        return x.rhs
    if isinstance(x, ir.Call) and x.func == "cdiv" and len(x.args) == 2:
        return x.args[1]
    return None


def divisor(e) -> int:
    """The largest d this analysis proves divides every value of integer `e`
    (0 means e is always 0). Unknown names divide by 1."""
    if isinstance(e, ir.Int):
        return abs(e.value)
    if isinstance(e, ir.BinOp):
        a, b = divisor(e.lhs), divisor(e.rhs)
        if e.op in "+-":
            return math.gcd(a, b)
        if e.op == "*":
            return a * b
    if isinstance(e, ir.UnaryOp) and e.op == "-":
        return divisor(e.operand)
    return 1


_NON_NEGATIVE_KINDS = ("symbol", "block", "loop", "lane")    # a shape, a block index, range(n)'s and a lane's index


def non_negative(e, lets: dict, scalars=frozenset()) -> bool:
    """Whether this analysis proves integer `e` is never negative: literals, shape
    symbols, block, loop and lane indices, make-persistent's tile numbers, the
    scalar parameters named in `scalars` (a grid's extent: the launch refuses a
    negative grid), and sums, products, quotients, cdiv, min and max of such
    (`lets`: name -> the ir.Let of each let it may read). Another scalar
    parameter, or a difference, may be negative."""
    def proven(x, lets):
        if isinstance(x, ir.Int):
            return x.value >= 0
        if isinstance(x, ir.Var):
            if x.kind == "let" and x.name in lets:
                let = lets[x.name]
                return let.index or proven(let.value, {n: v for n, v in lets.items() if n != x.name})
            return x.kind in _NON_NEGATIVE_KINDS or (x.kind == "scalar" and x.name in scalars)
        if isinstance(x, ir.BinOp) and x.op in ("+", "*", "/", "%"):
            return proven(x.lhs, lets) and proven(x.rhs, lets)
        if isinstance(x, ir.Call) and x.func in ("cdiv", "min", "select"):
            return all(proven(a, lets) for a in (x.args[1:] if x.func == "select" else x.args))
        if isinstance(x, ir.Call) and x.func == "max":
            return any(proven(a, lets) for a in x.args)
        return False
    return proven(e, lets)


def map_stmt_exprs(s, fn):
    """Apply `fn` to every expression held by statement `s` (not nested blocks)."""
    changes = {}
    for f in fields(s):
        v = getattr(s, f.name)
        if isinstance(v, ir.Expr):
            changes[f.name] = fn(v)
        elif isinstance(v, ir.Region):
            changes[f.name] = replace(v, starts=tuple(fn(x) for x in v.starts),
                                      extents=tuple(None if x is None else fn(x) for x in v.extents))
        elif f.name in ("coords", "indices", "extents") and isinstance(v, tuple):
            changes[f.name] = tuple(fn(x) if isinstance(x, ir.Expr) else x for x in v)
    return replace(s, **changes) if changes else s


def map_body(body, fn_stmt):
    """Rebuild a block: nested blocks first, then `fn_stmt` on each statement,
    which returns a statement or a list of statements."""
    out = []
    for s in body:
        nested = {f: map_body(getattr(s, f), fn_stmt) for f in ir.STMT_BLOCK_FIELDS.get(type(s), ())}
        if nested:
            s = replace(s, **nested)
        r = fn_stmt(s)
        if isinstance(r, (list, tuple)):
            out.extend(r)
        else:
            out.append(r)
    return tuple(out)


def substitute_body(body, mapping: dict) -> tuple:
    """A block with Vars replaced by name in every expression of every statement,
    nested blocks included (a loop's value, a let, a tile's block indices)."""
    return map_body(body, lambda s: map_stmt_exprs(s, lambda e: substitute(e, mapping)))


_TILE_FIELDS = ("buffer", "src", "dst", "a", "b", "acc")


def _tile_fields(s):
    """(field, tile name) for each tile statement `s` names in its own fields: its
    tile fields and the regions of copies (not its expressions' `t[i, j]`)."""
    for f in fields(s):
        v = getattr(s, f.name)
        if f.name in _TILE_FIELDS and isinstance(v, str):
            yield f.name, v
        elif isinstance(v, ir.Region):
            yield f.name, v.name


def rename_tiles(body, mapping: dict) -> tuple:
    """A block with tiles renamed (`mapping`: old name -> new) wherever a statement
    names one: its tile fields, the regions of copies, and `t[i, j]` in expressions,
    nested blocks included."""
    def in_expr(e):
        return map_expr(e, lambda x: replace(x, name=mapping[x.name])
                        if isinstance(x, ir.Subscript) and x.name in mapping else x)

    def stmt(s):
        s = map_stmt_exprs(s, in_expr)
        changes = {}
        for f, name in _tile_fields(s):
            if name in mapping:
                v = getattr(s, f)
                changes[f] = replace(v, name=mapping[name]) if isinstance(v, ir.Region) else mapping[name]
        return replace(s, **changes) if changes else s
    return map_body(body, stmt)


def tiles_named(body) -> set:
    """Every tile name the statements of `body` use (rename_tiles' places)."""
    names = set()

    def in_expr(e):
        names.update(x.name for x in walk_expr(e) if isinstance(x, ir.Subscript))
        return e

    def stmt(s):
        names.update(name for _, name in _tile_fields(s))
        map_stmt_exprs(s, in_expr)
        return s
    map_body(body, stmt)
    return names


def tree_size(e) -> int:
    """The nodes of `e` as a tree (what printing it writes), counted over `e` as it is
    held, a graph whose shared subexpressions are counted once: in time linear in
    the graph, where the tree may be exponentially larger (a chain of lets, each
    reading the one before twice)."""
    sizes = {}

    def count(x):
        n = sizes.get(id(x))
        if n is None:
            n = sizes[id(x)] = 1 + sum(count(c) for c in children(x))
        return n
    return count(e)


def linear_terms(e, division: str = "floor"):
    """`e` folded as a linear combination: ({printed term: (term, coefficient)}, constant).
    Non-linear parts (products of names, divisions, calls) are opaque terms.
    `division`: fold's, for the division of constants."""
    from ..ir.printer import expr as show

    terms: dict = {}
    const = 0

    def add(x, coef):
        nonlocal const
        if isinstance(x, ir.Int):
            const += coef * x.value
        elif isinstance(x, ir.BinOp) and x.op in "+-":
            add(x.lhs, coef)
            add(x.rhs, coef if x.op == "+" else -coef)
        elif isinstance(x, ir.UnaryOp) and x.op == "-":
            add(x.operand, -coef)
        elif isinstance(x, ir.BinOp) and x.op == "*" and isinstance(x.rhs, ir.Int):
            add(x.lhs, coef * x.rhs.value)
        elif isinstance(x, ir.BinOp) and x.op == "*" and isinstance(x.lhs, ir.Int):
            add(x.rhs, coef * x.lhs.value)
        else:
            key = show(x)
            old = terms.get(key, (x, 0))
            terms[key] = (x, old[1] + coef)

    add(fold(e, division), 1)
    return terms, const


def linear(e, division: str = "floor"):
    """Fold `e` as a linear combination: terms that cancel are dropped, so
    `(by * 64 + 64) - by * 64` becomes 64. Non-linear parts stay opaque terms."""
    terms, const = linear_terms(e, division)
    out = None
    for x, coef in terms.values():
        if coef == 0:
            continue
        term = x if coef in (1, -1) else ir.BinOp("*", x, ir.Int(abs(coef)))
        if out is None:
            out = term if coef > 0 else ir.UnaryOp("-", term)
        else:
            out = ir.BinOp("+" if coef > 0 else "-", out, term)
    if out is None:
        return ir.Int(const, span=getattr(e, "span", None))
    if const:
        out = ir.BinOp("+" if const > 0 else "-", out, ir.Int(abs(const)))
    return out
