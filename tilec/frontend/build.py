"""Parse tree -> IR. One method per grammar rule; every node gets its span."""
from __future__ import annotations

from dataclasses import replace

import math
import re

from lark import Token, Transformer, Tree, v_args
from lark.exceptions import VisitError

from ..errors import SemanticError, Source, Span
from ..ir import nodes as ir
from ..ir.exprs import CALL_PARAMS, INT_CALLS, INT_MAX, children, divides_by, fold, map_stmt_exprs, walk_expr
from ..ir.printer import expr as print_expr
from .names import why_reserved

_KEYWORD_CONSTS = {"true": 1, "false": 0}

_DECLS = ("const", "let", "require", "grid", "threads", "shared", "local")


class _Decl:
    """A top-level declaration on its way into the Kernel node."""

    def __init__(self, kind, value, span):
        self.kind, self.value, self.span = kind, value, span


@v_args(meta=True)
class _Builder(Transformer):
    def __init__(self, source: Source):
        super().__init__()
        self.source = source

    def _span(self, meta) -> Span:
        if getattr(meta, "empty", True):
            return None
        return Span(self.source, meta.line, meta.column, meta.end_line, meta.end_column)

    def _tok_span(self, tok: Token) -> Span:
        return Span(self.source, tok.line, tok.column, tok.end_line, tok.end_column)

    def _named(self, tok: Token) -> str:
        """A declared name: not true or false, which the expressions after it would read as
        the literals 1 and 0 (refused here, before a use of the name meets the literal)."""
        if str(tok) in _KEYWORD_CONSTS:
            raise SemanticError(f"'{tok}' is a literal ({_KEYWORD_CONSTS[str(tok)]}, as in gemm's transpose_b = "
                                f"true), not a name; choose another", self._tok_span(tok))
        return str(tok)

    # ------------------------------------------------------------ expressions
    def _int(self, tok: Token) -> int:
        v = int(tok)
        if v > INT_MAX:
            raise SemanticError(f"integer literal {tok} is over 2^63-1 = {INT_MAX}: tilec's integers are 64-bit "
                                "signed", self._tok_span(tok))
        return v

    def int_lit(self, meta, ch):
        return ir.Int(self._int(ch[0]), span=self._span(meta))

    def float_lit(self, meta, ch):
        v = float(ch[0])
        if math.isinf(v):
            raise SemanticError(f"float literal {ch[0]} is over the largest f64 (about 1.8e308)", self._span(meta))
        return ir.Float(v, span=self._span(meta))

    def name(self, meta, ch):
        n = str(ch[0])
        if n in _KEYWORD_CONSTS:
            return ir.Int(_KEYWORD_CONSTS[n], span=self._span(meta))
        return ir.Var(n, span=self._span(meta))

    def binary(self, meta, ch):
        lhs, op, rhs = ch
        return ir.BinOp(str(op), lhs, rhs, span=self._span(meta))

    def unary_op(self, meta, ch):
        op, operand = ch
        if str(op) == "+":
            return operand
        return ir.UnaryOp(str(op), operand, span=self._span(meta))

    def kwarg(self, meta, ch):
        return ("kw", str(ch[0]), ch[1], self._tok_span(ch[0]))

    def _split_args(self, args):
        pos, kws = [], []
        for a in args:
            if a is None:
                continue
            if isinstance(a, tuple) and a and a[0] == "kw":
                if any(name == a[1] for name, _ in kws):
                    raise SemanticError(f"{a[1]} is given twice", a[3])
                kws.append((a[1], a[2]))
            else:
                if kws:
                    raise SemanticError("positional argument after a keyword argument", a.span)
                pos.append(a)
        return tuple(pos), tuple(kws)

    def call(self, meta, ch):
        func, *args = ch
        fname = str(func)
        span = self._span(meta)
        pos, kws = self._split_args(args)
        if fname in CALL_PARAMS:
            names = CALL_PARAMS[fname]
            for a in args:
                if isinstance(a, tuple) and a and a[0] == "kw":
                    raise SemanticError(f"{fname} has no argument '{a[1]}' (it takes {len(names)} positional "
                                        f"argument{'s' if len(names) > 1 else ''}: {fname}({', '.join(names)}))",
                                        a[3])
            if len(pos) != len(names):
                raise SemanticError(f"{fname} takes {len(names)} argument{'s' if len(names) > 1 else ''} "
                                    f"({', '.join(names)}), got {len(pos)}", span)
        return ir.Call(fname, pos, kws, span=span)

    def cast(self, meta, ch):
        return ir.Cast(ir.DTYPES[str(ch[0])], ch[1], span=self._span(meta))

    def subscript(self, meta, ch):
        return ir.Subscript(str(ch[0]), tuple(ch[1:]), span=self._span(meta))

    def slice(self, meta, ch):
        return ir.Slice(ch[0], ch[1], span=self._span(meta))

    def tuple(self, meta, ch):
        return ir.TupleExpr(tuple(ch), span=self._span(meta))

    # ------------------------------------------------------------ statements
    def shape(self, meta, ch):
        for d, x in enumerate(ch):
            text = isinstance(x, ir.Int) and x.span and self.source.line(x.span.line)[x.span.col - 1:x.span.end_col - 1]
            if text in _KEYWORD_CONSTS:
                raise SemanticError(f"dim {d} is {text}, a boolean literal: a dimension is an integer (a shape "
                                    "symbol, or an integer expression of consts and symbols)", x.span)
        return tuple(ch)

    def param(self, meta, ch):
        name, dtype, shape = ch
        dt, name = ir.DTYPES[str(dtype)], self._named(name)
        if shape is None:
            return ir.ScalarParam(name, dt, span=self._span(meta))
        return ir.TensorParam(name, dt, shape, span=self._span(meta))

    def const_item(self, meta, ch):
        return (self._named(ch[0]), ch[1], self._tok_span(ch[0]))

    def const_stmt(self, meta, ch):
        return _Decl("const", list(ch), self._span(meta))

    def tune_item(self, meta, ch):
        name, *values = ch
        return (self._named(name), tuple((self._int(v), self._tok_span(v)) for v in values), self._tok_span(name))

    def tune_stmt(self, meta, ch):
        *items, where = ch
        return _Decl("tune", (items, where), self._span(meta))

    def tune_where(self, meta, ch):
        text = re.sub(r"//[^\n]*", " ", self.source.text[meta.start_pos:meta.end_pos][len("where"):])
        return ir.TuneWhere(ch[0], " ".join(text.split()), span=self._span(meta))

    def let_stmt(self, meta, ch):
        return _Decl("let", (self._named(ch[0]), ch[1], self._tok_span(ch[0])), self._span(meta))

    def require_stmt(self, meta, ch):
        text = self.source.text[meta.start_pos:meta.end_pos]
        text = text[len("require"):].rstrip(";").strip()
        return _Decl("require", ir.Require(ch[0], text, span=self._span(meta)), self._span(meta))

    def grid_stmt(self, meta, ch):
        names = [c for c in ch if isinstance(c, Token)]
        kws = [c for c in ch if isinstance(c, tuple)]
        exprs = [c for c in ch if not isinstance(c, (Token, tuple))]
        if len(names) != len(exprs):
            raise SemanticError(f"grid names {len(names)} block indices but gives {len(exprs)} sizes",
                                self._span(meta))
        if len(names) > 3:
            raise SemanticError("a grid has at most 3 dimensions", self._span(meta))
        options = {"persistent": ir.Int(0), "stream_k": ir.Int(0), "group": ir.Int(1)}
        given = set()
        for _, key, value, span in kws:
            if key not in options:
                raise SemanticError(f"grid takes the options persistent = 0 or 1, stream_k = 0 or 1 and group = "
                                    f"rows, not '{key}'", span)
            if key in given:
                raise SemanticError(f"{key} is given twice", span)
            given.add(key)
            options[key] = value
        return _Decl("grid", (tuple(map(self._named, names)), tuple(exprs), options["persistent"], options["stream_k"],
                              options["group"]), self._span(meta))

    def threads_stmt(self, meta, ch):
        return _Decl("threads", ch[0], self._span(meta))

    def _tile_decl(self, scope, meta, ch):
        name, dtype, shape = ch
        return _Decl(scope, ir.Buffer(self._named(name), scope, ir.DTYPES[str(dtype)], shape,
                                      span=self._span(meta)), self._span(meta))

    def shared_decl(self, meta, ch):
        return self._tile_decl("shared", meta, ch)

    def local_decl(self, meta, ch):
        return self._tile_decl("local", meta, ch)

    def block(self, meta, ch):
        return list(ch)

    def _region(self, e, what):
        if isinstance(e, ir.Var):
            return ir.Region(e.name, (), (), span=e.span)
        if isinstance(e, ir.Subscript):
            starts, extents = [], []
            for ix in e.indices:
                if isinstance(ix, ir.Slice):
                    starts.append(ix.start)
                    extents.append(ir.BinOp("-", ix.stop, ix.start, span=ix.span))
                else:
                    starts.append(ix)
                    extents.append(None)
            return ir.Region(e.name, tuple(starts), tuple(extents), span=e.span)
        raise SemanticError(f"the {what} of a copy must be a tile or a tensor region", e.span)

    def _need_args(self, fname, pos, n, span, names):
        if len(pos) != n:
            raise SemanticError(f"{fname} takes {n} arguments ({', '.join(names)}), got {len(pos)}", span)

    def _tile_name(self, e, fname, what):
        if not isinstance(e, ir.Var):
            raise SemanticError(f"the {what} of {fname} must be a tile name", e.span)
        return e.name

    def call_stmt(self, meta, ch):
        func, *args = ch
        fname = str(func)
        span = self._span(meta)
        pos, kws = self._split_args(args)
        allowed_kws = {"gemm": {"transpose_a", "transpose_b", "tf32"}, "reduce": {"axis", "op"}}.get(fname, set())
        for k, v in kws:
            if k not in allowed_kws:
                raise SemanticError(f"{fname} has no argument '{k}'", v.span)
        if fname == "copy":
            self._need_args("copy", pos, 2, span, ["src", "dst"])
            return ir.Copy(self._region(pos[0], "source"), self._region(pos[1], "destination"), span=span)
        if fname == "fill":
            self._need_args("fill", pos, 2, span, ["tile", "value"])
            return ir.Fill(self._tile_name(pos[0], "fill", "first argument"), pos[1], span=span)
        if fname == "gemm":
            self._need_args("gemm", pos, 3, span, ["a", "b", "acc"])
            flags = {}
            for name in ("transpose_a", "transpose_b", "tf32"):
                v = dict(kws).get(name, ir.Int(0))
                if not isinstance(v, ir.Int) or v.value not in (0, 1):
                    raise SemanticError(f"{name} must be true or false", v.span)
                flags[name] = bool(v.value)
            a, b, acc = (self._tile_name(x, "gemm", w) for x, w in zip(pos, ("a", "b", "acc")))
            return ir.Gemm(a, b, acc, flags["transpose_b"], transpose_a=flags["transpose_a"], tf32=flags["tf32"],
                           span=span)
        if fname == "reduce":
            return self._reduce(pos, dict(kws), span)
        raise SemanticError(f"unknown statement '{fname}' (expected copy, fill, gemm or reduce)",
                            self._tok_span(func))

    def _reduce(self, pos, kw, span):
        """`reduce(s, acc, axis = 0 | 1, op = sum | max | min)`; tiles, ranks and extents are check-types'."""
        self._need_args("reduce", pos, 2, span, ["s", "acc"])
        src, dst = (self._tile_name(x, "reduce", w) for x, w in zip(pos, ("first argument", "second argument")))
        if "axis" not in kw:
            raise SemanticError("reduce needs the axis of s it reduces: axis = 0 (each column) or axis = 1 "
                                "(each row)", span)
        if "op" not in kw:
            raise SemanticError("reduce needs its operation: op = sum, op = max or op = min", span)
        axis, op = kw["axis"], kw["op"]
        if not (isinstance(axis, ir.Int) and axis.value in (0, 1)):
            raise SemanticError("reduce's axis must be the literal 0 (reduce each column) or 1 (reduce each row)",
                                axis.span)
        if not (isinstance(op, ir.Var) and op.name in ("sum", "max", "min")):
            raise SemanticError("reduce's op must be sum, max or min", op.span)
        return ir.Reduce(src, dst, axis.value, op.name, src_span=pos[0].span, dst_span=pos[1].span, span=span)

    def for_stmt(self, meta, ch):
        var, kind, *rest = ch
        var, body = self._named(var), rest[-1]
        pos, kws = self._split_args(rest[:-1])
        span = self._span(meta)
        kind_s = str(kind)
        if kind_s == "range":
            if not 1 <= len(pos) <= 3 or kws:
                raise SemanticError("range takes range(stop), range(start, stop) or range(start, stop, step)",
                                    self._tok_span(kind))
            if len(pos) == 1:
                return ir.For(str(var), pos[0], None, tuple(body), span=span)
            return ir.For(str(var), pos[1], None, tuple(body), span=span, start=pos[0],
                          step=pos[2] if len(pos) == 3 else None)
        if kind_s == "pipelined":
            kw = dict(kws)
            if len(pos) != 1 or set(kw) - {"stages", "producer"}:
                raise SemanticError("pipelined takes pipelined(n, stages = S) or pipelined(n, stages = S, producer = 1)",
                                    self._tok_span(kind))
            return ir.For(str(var), pos[0], kw.get("stages", ir.Int(2)), tuple(body),
                          producer=kw.get("producer", ir.Int(0)), span=span)
        raise SemanticError(f"a for loop runs over range(n) or pipelined(n, stages = S), not '{kind_s}'",
                            self._tok_span(kind))

    def parallel_stmt(self, meta, ch):
        names = [self._named(c) for c in ch if isinstance(c, Token)]
        rest = [c for c in ch if not isinstance(c, Token)]
        body = rest[-1]
        extents = rest[:-1]
        if len(names) != len(extents):
            raise SemanticError(f"parallel names {len(names)} indices but gives {len(extents)} extents",
                                self._span(meta))
        return ir.Parallel(tuple(names), tuple(extents), tuple(body), span=self._span(meta))

    def if_stmt(self, meta, ch):
        cond, then, orelse = ch
        if orelse is None:
            orelse = []
        elif isinstance(orelse, ir.If):
            orelse = [orelse]
        return ir.If(cond, tuple(then), tuple(orelse), span=self._span(meta))

    def assign_stmt(self, meta, ch):
        name, *idx, value = ch
        return ir.Assign(str(name), tuple(idx), value, span=self._span(meta))

    # ------------------------------------------------------------ the kernel
    def kernel(self, meta, ch):
        name, *rest = ch
        body = rest[-1]
        params = tuple(p for p in rest[:-1] if p is not None)
        span = self._span(meta)
        consts, lets, requires, buffers, stmts = [], [], [], [], []
        grid = threads = tune = None
        seen = {}
        let_lines = {d.value[0]: d.value[2] for d in body if isinstance(d, _Decl) and d.kind == "let"}
        for p in params:
            self._declare(seen, p.name, p.span, "parameter")
            if isinstance(p, ir.TensorParam) and not 1 <= len(p.shape) <= 5:
                raise SemanticError(f"tensor '{p.name}' has rank {len(p.shape)}; tensors have rank 1 to 5", p.span)
        for p in params:
            for d in getattr(p, "shape", ()):
                why = isinstance(d, ir.Var) and why_reserved(d.name, "shape symbol")  # a name in device code too
                if why:
                    raise SemanticError(why, d.span)
        for s in body:
            if isinstance(s, _Decl) and s.kind in ("let", "require", "grid", "threads", "shared", "local"):
                self._no_later_lets(s, seen, let_lines)
            if isinstance(s, _Decl):
                if s.kind == "const":
                    for cname, value, cspan in s.value:
                        self._declare(seen, cname, cspan, "const")
                        consts.append((cname, value, cspan))
                elif s.kind == "let":
                    self._declare(seen, s.value[0], s.value[2], "let")
                    lets.append((s.value[0], s.value[1]))
                elif s.kind == "require":
                    requires.append(s.value)
                elif s.kind == "grid":
                    if grid is not None:
                        raise SemanticError("grid is declared twice", s.span)
                    for g in s.value[0]:
                        self._declare(seen, g, s.span, "block index")
                    grid = s.value
                elif s.kind == "threads":
                    if threads is not None:
                        raise SemanticError("threads is declared twice", s.span)
                    threads = s.value
                elif s.kind == "tune":
                    if tune is not None:
                        raise SemanticError("tune is declared twice (one tune statement lists every tuned const)",
                                            s.span)
                    tune = (s, {c[0]: c for c in consts})
                else:
                    self._declare(seen, s.value.name, s.value.span, "tile")
                    buffers.append(s.value)
            else:
                stmts.append(s)
        stmts = self._nested_lets(stmts)
        bound = dict(seen)
        for p in params:        # a loop or parallel variable named like a shape symbol would hide it
            for d in getattr(p, "shape", ()):
                if isinstance(d, ir.Var):
                    bound.setdefault(d.name, "shape symbol")
        self._check_bound(stmts, bound)
        why = why_reserved(str(name), "kernel")
        if why:
            raise SemanticError(why, self._tok_span(name))
        if grid is None:
            raise SemanticError(f"kernel '{name}' has no grid declaration", self._tok_span(name),
                                note="add e.g. `grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));`")
        if threads is None:
            raise SemanticError(f"kernel '{name}' has no threads declaration", self._tok_span(name),
                                note="add e.g. `threads 128;`")
        space = self._tune_space(tune[0], tune[1], consts, seen, params) if tune is not None else ()
        where = tune[0].value[1] if tune is not None else None
        if where is not None:
            check_tune_condition(where.cond, seen, params)
        for e in [v for _, v, _ in consts] + [v for _, v in lets] + list(grid[1]) + [threads] + \
                [r.cond for r in requires] + [d for p in params for d in getattr(p, "shape", ())]:
            _no_tuple(e)
        for st in ir.walk_stmts(stmts):
            map_stmt_exprs(st, _no_tuple)
        return ir.Kernel(str(name), params, tuple(consts), tuple(lets), tuple(requires),
                         grid[0], grid[1], threads, tuple(buffers), tuple(stmts), span=span, tune=space,
                         tune_where=where, persistent=grid[2], stream_k=grid[3], group=grid[4])

    def _tune_space(self, decl, before, consts, seen, params):
        """`tune NAME in (INT, ...), ...;`: ((name, (value, ...)), ...) as written.
        Each name a const declared before the statement with an integer literal,
        once; each list's values distinct and the declared value among them."""
        kinds = dict(seen)
        for p in params:
            for d in getattr(p, "shape", ()):
                if isinstance(d, ir.Var):
                    kinds.setdefault(d.name, "shape symbol")
        space = []
        for cname, values, nspan in decl.value[0]:
            if any(cname == n for n, _ in space):
                raise SemanticError(f"'{cname}' is tuned twice", nspan)
            if cname not in before:
                later = next((c for c in consts if c[0] == cname), None)
                if later is not None:
                    raise SemanticError(f"'{cname}' is tuned before its const declaration (line {later[2].line}): "
                                        "declare it before the tune statement", nspan)
                if cname in kinds:
                    raise SemanticError(f"only consts can be tuned, and '{cname}' is a {kinds[cname]}", nspan)
                raise SemanticError(f"'{cname}' is not a const declared before the tune statement", nspan,
                                    note=f"consts declared before it: {', '.join(before) or 'none'}")
            declared = before[cname][1]
            if not isinstance(declared, ir.Int):
                raise SemanticError(f"const '{cname}' is tuned, so its declared value (the kernel's untuned "
                                    f"default) must be an integer literal, not '{print_expr(declared)}'",
                                    declared.span)
            listed = []
            for v, vspan in values:
                if v in listed:
                    raise SemanticError(f"tune lists {v} twice for '{cname}'", vspan)
                listed.append(v)
            if declared.value not in listed:
                raise SemanticError(f"the declared value of '{cname}', {declared.value}, is not one of its tune "
                                    f"values ({', '.join(map(str, listed))})", decl.span,
                                    note=f"the declared value (line {before[cname][2].line}) is the kernel's "
                                    "untuned default and its first candidate: list it, or declare one of the "
                                    "listed values")
            space.append((cname, tuple(listed)))
        return tuple(space)

    @staticmethod
    def _no_later_lets(decl, seen, let_lines):
        """A top-level let is unknown before its statement: `grid (bx) = (X); let X = M;`
        is an error at the grid's X, as `let Y = X; let X = M;` is."""
        v = decl.value
        if decl.kind == "let":
            exprs = [v[1]]
        elif decl.kind == "require":
            exprs = [v.cond]
        elif decl.kind == "grid":
            exprs = list(v[1])
        elif decl.kind == "threads":
            exprs = [v]
        else:                       # shared, local
            exprs = list(v.shape)
        for e in exprs:
            for x in walk_expr(e) if isinstance(e, ir.Expr) else ():
                if isinstance(x, ir.Var) and x.name in let_lines and x.name not in seen:
                    raise SemanticError(f"'{x.name}' is used before its let statement (line "
                                        f"{let_lines[x.name].line}): a let is known from its statement on", x.span)

    def _declare(self, seen, name, span, what):
        if name in ir.DTYPES:
            raise SemanticError(f"'{name}' is a dtype (it converts a value: {name}(x)); choose another name", span)
        why = why_reserved(name, what)
        if why:
            raise SemanticError(why, span)
        if name in seen:
            raise SemanticError(f"'{name}' is already declared (as a {seen[name]})", span)
        seen[name] = what

    def _check_bound(self, stmts, seen):
        """Loop and parallel variables, and lets inside blocks, are new names: they may
        not shadow a declaration or an enclosing loop's variable. A block's let is
        declared from its statement to the block's end."""
        for s in stmts:
            if isinstance(s, ir.Let):
                seen = dict(seen)
                self._declare(seen, s.name, s.span, "let")
            elif isinstance(s, ir.For):
                inner = dict(seen)
                self._declare(inner, s.var, s.span, "loop variable")
                self._check_bound(s.body, inner)
            elif isinstance(s, ir.Parallel):
                inner = dict(seen)
                for v in s.vars:
                    self._declare(inner, v, s.span, "parallel index")
                self._check_bound(s.body, inner)
            elif isinstance(s, ir.If):
                self._check_bound(s.then, seen)
                self._check_bound(s.orelse, seen)

    def _nested_lets(self, stmts) -> list:
        """`stmts` with each `let` inside a block (a loop's, an if's, a parallel body's)
        as a Let statement: it names its value for the rest of that block (fold-consts
        substitutes it there). Any other declaration belongs at the top level."""
        out = []
        for s in stmts:
            nested = {}
            for f in ir.STMT_BLOCK_FIELDS.get(type(s), ()):
                for inner in getattr(s, f):
                    if isinstance(inner, _Decl) and inner.kind != "let":
                        raise SemanticError(f"'{inner.kind}' declarations go at the top level of the kernel",
                                            inner.span)
                nested[f] = tuple(ir.Let(x.value[0], x.value[1], span=x.value[2]) if isinstance(x, _Decl) else x
                                  for x in self._nested_lets(getattr(s, f)))
            out.append(replace(s, **nested) if nested else s)
        return out

    def start(self, meta, ch):
        return ch[0]


def _no_tuple(e):
    """`e`, where a parenthesised list `(a, b)` in it is a value only as an im2col
    keyword's, one per spatial dimension (`kernel = (3, 3)`); anywhere else it is an
    error at the tuple."""
    if isinstance(e, ir.TupleExpr):
        raise SemanticError("a tuple is not a value here: a parenthesised list only gives an im2col keyword one "
                            "value per dimension (kernel = (3, 3))", e.span)
    if isinstance(e, ir.Call) and e.func == "im2col":
        inner = list(e.args)
        for _, v in e.kwargs:
            inner += list(v.items) if isinstance(v, ir.TupleExpr) else [v]
    else:
        inner = children(e)
    for x in inner:
        if isinstance(x, ir.Expr):
            _no_tuple(x)
    return e


def check_tune_condition(cond, declared: dict, params):
    """A tune condition (`tune ... where COND;`, or tilec.compile's where=): an
    integer expression of consts, shape symbols and integer scalar parameters
    (the values a tune knows before it compiles a candidate), calling only min,
    max, cdiv and abs. `declared`: the kernel's names and what each is
    ("parameter", "const", "let", "block index", "tile")."""
    symbols = {d.name for p in params for d in getattr(p, "shape", ()) if isinstance(d, ir.Var)}
    scalars = {p.name: p for p in params if isinstance(p, ir.ScalarParam)}
    allowed = "it may read consts, shape symbols and integer scalar parameters"
    for x in walk_expr(cond):
        if isinstance(x, ir.Var):
            kind = declared.get(x.name) or ("shape symbol" if x.name in symbols else None)
            if kind is None:
                raise SemanticError(f"unknown name '{x.name}'", x.span)
            if kind == "parameter" and x.name in scalars and not scalars[x.name].dtype.is_float:
                continue
            if kind not in ("const", "shape symbol"):
                what = f"a {scalars[x.name].dtype.name} scalar" if x.name in scalars else \
                    "a tensor" if kind == "parameter" else f"a {kind}"
                raise SemanticError(f"the tune condition reads '{x.name}', {what}: {allowed}", x.span)
        elif isinstance(x, ir.Call) and (x.func not in INT_CALLS or x.func == "select"):
            raise SemanticError(f"the tune condition calls '{x.func}': it may call min, max, cdiv and abs", x.span)
        elif isinstance(x, (ir.Float, ir.Cast, ir.Subscript, ir.TupleExpr, ir.Slice)):
            raise SemanticError(f"the tune condition is an integer expression ({allowed}), not "
                                f"'{print_expr(x)}'", x.span)
        divisor = divides_by(x)
        if divisor is not None and fold(divisor) == ir.Int(0):
            raise SemanticError(f"the tune condition divides by zero: '{print_expr(x)}'", x.span)


def declared_names(k: ir.Kernel) -> dict:
    """A parsed kernel's names and what each is, as the builder declared them."""
    names = {p.name: "parameter" for p in k.params}
    names.update((c[0], "const") for c in k.consts)
    names.update((name, "let") for name, _ in k.lets)
    names.update((g, "block index") for g in k.grid_vars)
    names.update((b.name, "tile") for b in k.buffers)
    return names


MAX_NESTING = 160      # levels of the parse tree: a sum of about 150 terms, far past what people write


def _too_deep(tree):
    """The first node of the parse tree nested deeper than MAX_NESTING, or None
    (walked with a stack: the transform, the passes and codegen recurse, and a
    deeper tree would end in Python's RecursionError, not an error at the line)."""
    stack = [(tree, 1)]
    while stack:
        t, depth = stack.pop()
        if depth > MAX_NESTING:
            return t
        stack.extend((c, depth + 1) for c in t.children if isinstance(c, Tree))
    return None


def build_ir(tree, source: Source) -> ir.Kernel:
    """The program's kernel, as IR."""
    deep = _too_deep(tree)
    if deep is not None:
        meta = deep.meta
        span = None if getattr(meta, "empty", True) else Span(source, meta.line, meta.column, meta.end_line,
                                                              meta.end_column)
        raise SemanticError(f"the program nests deeper than tilec takes ({MAX_NESTING} levels of expressions and "
                            "blocks): split a long expression over several statements (s[i, j] = a + b; "
                            "s[i, j] = s[i, j] + c;)", span)
    try:
        return _Builder(source).transform(tree)
    except VisitError as e:
        raise e.orig_exc from None
