"""Random valid tile programs with independent numpy references, for
tests/test_random_programs.py.

A program is built from a description (tensors, tiles, statements, element
expressions); the description prints the .tile text and, separately, runs a
small numpy model of what the language says it computes (docs/language.md):
blocks as a stacked array axis, TMA boxes zero-filled outside the tensor and
clipped on store, thread copies converting through float (double with f64),
C++ arithmetic on element values (usual conversions, truncating int / and %,
float literals double where the expression reads f64 or assigns an f64 tile,
`a * b + c` as one fused multiply-add, §13 / §17). Nothing here calls tilec.

Floats: the model computes what the interpreter is documented to compute, bit
for bit (IEEE f32/f64 ops, correctly rounded fma, f16/bf16 by round to nearest
even); `exp`, `log` and `rsqrt` are numpy's (the interpreter's) and may differ
from the GPU's in the last bit, so each output also gets a bound on how far a
GPU result may be from the model: zero where no such call feeds the output,
else a few units of the coarsest precision involved times a magnitude bound of
the expression (its value with every operand replaced by its absolute value,
from the calls up). The generator keeps those calls out of conditions, int
casts, and divisors, where a last-bit difference could change more than that.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np
from hypothesis import strategies as st

import ml_dtypes

ELSIZE = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "i32": 4, "f8e4m3": 1, "f8e5m2": 1}
FLOATS = ("f16", "bf16", "f32", "f64")
INTS = ("i8", "i32")
NP = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32),
      "f64": np.dtype(np.float64), "i8": np.dtype(np.int8), "i32": np.dtype(np.int32),
      "f8e4m3": np.dtype(ml_dtypes.float8_e4m3fn), "f8e5m2": np.dtype(ml_dtypes.float8_e5m2)}
UNIT = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8, "f32": 2.0 ** -24, "f64": 2.0 ** -53}
TINY = {"f16": 2.0 ** -24, "bf16": 2.0 ** -133, "f32": 2.0 ** -149, "f64": 2.0 ** -1074}
F32, F64, I32 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32)
VARS = ("i", "j", "l", "m")


def per16(dt):
    return max(1, 16 // ELSIZE[dt])


# ================================================================ C++ value model

def scalar_value(dt, v):
    """A scalar argument as element arithmetic reads it: f16 / bf16 as the float of
    the 16-bit value the host passed (rounded to nearest even)."""
    if dt in ("f16", "bf16"):
        return np.float32(NP[dt].type(v))
    return (np.float32 if dt == "f32" else np.float64 if dt == "f64" else np.int32)(v)


def ctype(v):
    """The C type of a model value: bool, int8 (a raw i8 element), int32, float32, float64."""
    return np.asarray(v).dtype


def promote(t):
    return I32 if t.kind == "b" or (t.kind == "i" and t.itemsize < 4) else t


def common(a, b):
    if F64 in (a, b):
        return F64
    if F32 in (a, b):
        return F32
    return I32


def _min_max(f, a, b):
    """min / max of a and b in their common type: of integers a < b ? a : b (b : a);
    of floats what fminf / fmaxf give (IEEE 754-2019 minimumNumber / maximumNumber):
    a NaN gives the other operand, two NaNs the canonical NaN (doubles: b's), and -0
    is below +0."""
    if a.dtype.kind != "f":
        return np.where(a < b, a, b) if f == "min" else np.where(a < b, b, a)
    with np.errstate(invalid="ignore"):
        below = (a < b) | ((a == b) & np.signbit(a) & ~np.signbit(b))     # a before b
    pick = np.where(below, a, b) if f == "min" else np.where(below, b, a)
    pick = np.where(np.isnan(a), b, np.where(np.isnan(b), a, pick))
    nan = np.array(0x7FFFFFFF, np.uint32).view(F32) if a.dtype == F32 else b
    return np.where(np.isnan(a) & np.isnan(b), nan, pick).astype(a.dtype)


def to_type(v, t):
    """C++ conversion: float -> int truncates (saturating, NaN -> 0, as PTX cvt.rzi
    does), int -> int wraps, anything -> float rounds to nearest even."""
    v = np.asarray(v)
    if v.dtype == t:
        return v
    if t.kind == "f" or v.dtype.kind in "bi":
        with np.errstate(all="ignore"):
            return v.astype(t)
    x = np.trunc(v.astype(F64))
    info = np.iinfo(t)
    out = np.where(np.isnan(x), 0, np.clip(np.nan_to_num(x, nan=0.0), info.min, info.max))
    return out.astype(t)


def decode(stored, dt):
    """A tile's stored elements -> their value in element arithmetic."""
    if dt in ("f16", "bf16"):
        return stored.astype(F32)
    return stored


def encode(v, dt):
    """A value assigned to a `dt` element: f16_t / bf16_t from float."""
    if dt in ("f16", "bf16"):
        with np.errstate(all="ignore"):
            return to_type(v, F32).astype(NP[dt])
    return to_type(v, NP[dt])


def convert_copy(stored, src, dst):
    """A thread copy's element conversion: integer to integer wraps (tl_to_int's integer
    overload); else through float, or double with f64."""
    if src == dst:
        return stored
    if src in INTS and dst in INTS:
        return to_type(stored, NP[dst])
    via = F64 if "f64" in (src, dst) else F32
    return encode(to_type(decode(stored, src), via), dst)


def fma(a, b, c, t):
    """a * b + c rounded once, in float32 or float64."""
    a, b, c = (np.asarray(x, t) for x in (a, b, c))
    with np.errstate(all="ignore"):
        if t == F32:
            p = a.astype(F64) * b.astype(F64)             # exact
            s = p + c.astype(F64)
            bb = s - p
            err = (p - (s - bb)) + (c.astype(F64) - bb)   # s + err == p + c exactly
            odd = (s.view(np.int64) & 1) == 1
            fix = np.isfinite(s) & (err != 0) & ~odd      # round to odd, then to float: one rounding
            s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
            return s.astype(F32)
        naive = a * b + c
        out = np.array(naive, F64)
        flat_a, flat_b, flat_c = (np.broadcast_to(x, out.shape).ravel() for x in (a, b, c))
        res = out.ravel()
        for n in range(res.size):
            x, y, z = float(flat_a[n]), float(flat_b[n]), float(flat_c[n])
            if math.isfinite(x * y) and math.isfinite(z) and math.isfinite(res[n]):
                exact = Fraction(x) * Fraction(y) + Fraction(z)
                res[n] = float(exact)                   # correctly rounded
                if exact == 0:      # (a Fraction has no -0): -0.0 only for a zero product and z both -0.0
                    product_sign = math.copysign(1.0, x) * math.copysign(1.0, y)
                    negative = (x == 0 or y == 0) and product_sign < 0 and z == 0 and math.copysign(1.0, z) < 0
                    res[n] = -0.0 if negative else 0.0
        return res.reshape(out.shape)


# ================================================================ element expressions

@dataclass(frozen=True)
class E:
    pass


@dataclass(frozen=True)
class Lit(E):
    text: str
    is_float: bool


@dataclass(frozen=True)
class Elem(E):
    tile: str
    idx: tuple          # per tile dim: ("own",) | ("rev",) | ("shift", c) | ("half",) | ("clamp", c) | ("stride", c)


@dataclass(frozen=True)
class Var(E):
    name: str           # an index variable, a loop variable or an int scalar: int; a float scalar


@dataclass(frozen=True)
class Bin(E):
    op: str
    a: E
    b: E


@dataclass(frozen=True)
class Neg(E):
    a: E


@dataclass(frozen=True)
class Call(E):
    f: str
    args: tuple


@dataclass(frozen=True)
class Cast(E):
    dt: str
    a: E


TRANSCENDENTAL = ("exp", "exp2", "log", "log2", "rsqrt")


def index_text(kind, rest, v, n) -> str:
    """An element index of tile dimension `n` at the parallel's index `v`; every form stays in
    0..n-1. Printed forms with a top-level `-` or `/` caught the CUDA printer's missing
    parentheses (session 23: a[3 - i, j] read a[3 - i * 16 + j])."""
    if kind == "own":
        return v
    if kind == "rev":
        return f"{n - 1} - {v}"
    if kind == "half":
        return f"{v} / 2"
    if kind == "shift":
        return f"({v} + {rest[0]}) % {n}"
    if kind == "clamp":
        return f"min({v} + {rest[0]}, {n - 1})"
    return f"{v} * {rest[0]} % {n}"


def index_sel(kind, rest, own, n):
    """index_text's elements, as numpy indices of `own` = arange(n)."""
    if kind == "own":
        return own
    if kind == "rev":
        return n - 1 - own
    if kind == "half":
        return own // 2
    if kind == "shift":
        return (own + rest[0]) % n
    if kind == "clamp":
        return np.minimum(own + rest[0], n - 1)
    return own * rest[0] % n


def text(e, tiles) -> str:
    if isinstance(e, Lit):
        return e.text
    if isinstance(e, Elem):
        t = tiles[e.tile]
        parts = []
        for d, (kind, *rest) in enumerate(e.idx):
            v, n = VARS[d], t.shape[d]
            parts.append(index_text(kind, rest, v, n))
        return f"{e.tile}[{', '.join(parts)}]"
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Bin):
        return f"({text(e.a, tiles)} {e.op} {text(e.b, tiles)})"
    if isinstance(e, Neg):
        return f"-{text(e.a, tiles)}"
    if isinstance(e, Call):
        return f"{e.f}({', '.join(text(a, tiles) for a in e.args)})"
    if isinstance(e, Cast):
        return f"{e.dt}({text(e.a, tiles)})"
    raise TypeError(e)


def walk(e):
    yield e
    for c in (getattr(e, "a", None), getattr(e, "b", None), *getattr(e, "args", ())):
        if isinstance(c, E):
            yield from walk(c)


def reads_f64(e, tiles, scalars):
    """§13: a float literal is a double where the expression reads an f64 tile or scalar."""
    for x in walk(e):
        if isinstance(x, Elem) and tiles[x.tile].dtype == "f64":
            return True
        if isinstance(x, Var) and scalars.get(x.name) == "f64":
            return True
    return False


def has_transcendental(e):
    return any(isinstance(x, Call) and x.f in TRANSCENDENTAL for x in walk(e))


@dataclass
class Val:
    v: np.ndarray
    mag: object = None       # None: the same on the GPU; else a magnitude bound of the possible difference's scale


def _mag(x):
    return np.abs(x.v.astype(F64)) if x.mag is None else x.mag


class Ev:
    """Evaluates an expression on stacked tiles: env maps index variables, loop
    variables and scalars to values broadcastable to [blocks, *tile]."""

    def __init__(self, tiles, state, env, scalars, double):
        self.tiles, self.state, self.env, self.scalars, self.double = tiles, state, env, scalars, double

    def __call__(self, e) -> Val:
        m = getattr(self, type(e).__name__)
        return m(e)

    def Lit(self, e):
        if e.is_float:
            return Val(np.asarray(float(e.text), F64 if self.double else F32))
        return Val(np.asarray(int(e.text), I32))

    def Var(self, e):
        return Val(np.asarray(self.env[e.name]))

    def Elem(self, e):
        t = self.tiles[e.tile]
        arr = self.state[e.tile]                   # [B, *full]
        lead = arr.ndim - 1 - len(t.shape)
        idx = [slice(None)] * arr.ndim
        for d, (kind, *rest) in enumerate(e.idx):
            n = t.shape[d]
            own = np.arange(n)
            sel = index_sel(kind, rest, own, n)
            shape = [1] * arr.ndim
            shape[1 + lead + d] = n
            idx[1 + lead + d] = sel.reshape(shape)
        mag = self.state.get(e.tile + "@mag")
        if any(k != "own" for k, *_ in e.idx):
            grids = np.ix_(*[np.arange(s) for s in arr.shape])
            full = tuple(np.broadcast_arrays(*[g if isinstance(i, slice) else i for g, i in zip(grids, idx)]))
            arr = arr[full]
            mag = None if mag is None else mag[full]
        return Val(decode(arr, t.dtype), mag)

    def Neg(self, e):
        x = self(e.a)
        with np.errstate(all="ignore"):
            return Val(-x.v.astype(promote(ctype(x.v))), x.mag)

    def Cast(self, e):
        x = self(e.a)
        if e.dt in ("f16", "bf16"):                # f16_t(float(x)), used as float
            return Val(decode(encode(x.v, e.dt), e.dt), x.mag)
        return Val(to_type(x.v, NP[e.dt]), x.mag)

    def _mul_parts(self, x):
        if isinstance(x, Bin) and x.op == "*":
            f, g = self(x.a), self(x.b)
            return f, g, common(promote(ctype(f.v)), promote(ctype(g.v)))
        v = self(x)
        return v, None, promote(ctype(v.v))

    def Bin(self, e):
        if e.op in ("+", "-"):
            sides = [self._mul_parts(e.a), self._mul_parts(e.b)]
            t = common(sides[0][2], sides[1][2])
            mag = None
            if any(f.mag is not None or (g is not None and g.mag is not None) for f, g, _ in sides):
                mag = sum(_mag(f) if g is None else _mag(f) * _mag(g) for f, g, _ in sides)
            if t.kind == "f":
                for i in (0, 1):          # the left product is the one fused when both sides are products
                    f, g, tm = sides[i]
                    if g is not None and tm == t:
                        o = sides[1 - i]
                        c = to_type(_val_of(o, self), t)
                        fv, gv = to_type(f.v, t), to_type(g.v, t)
                        if e.op == "-":
                            if i == 0:
                                c = -c
                            else:
                                fv = -fv
                        return Val(fma(fv, gv, c, t), mag)
            a, b = (_val_of(s, self) for s in sides)
            with np.errstate(all="ignore"):
                a, b = to_type(a, t), to_type(b, t)
                return Val(a + b if e.op == "+" else a - b, mag)
        if e.op in ("&&", "||"):
            a, b = self(e.a), self(e.b)
            f = np.logical_and if e.op == "&&" else np.logical_or
            return Val(f(a.v != 0, b.v != 0))
        a, b = self(e.a), self(e.b)
        t = common(promote(ctype(a.v)), promote(ctype(b.v)))
        x, y = to_type(a.v, t), to_type(b.v, t)
        cmp = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
               ">=": np.greater_equal}
        if e.op in cmp:
            return Val(cmp[e.op](x, y))
        mag = None
        with np.errstate(all="ignore"):
            if e.op == "*":
                out = x * y
                if a.mag is not None or b.mag is not None:
                    mag = _mag(a) * _mag(b)
            elif e.op == "/":
                if t.kind == "f":
                    out = x / y
                    if a.mag is not None:
                        mag = _mag(a) / np.abs(y.astype(F64))
                else:                              # C: truncating quotient
                    r = np.fmod(x, y)
                    out = ((x - r) // y).astype(t)
            elif e.op == "%":
                out = np.fmod(x, y).astype(t)
            else:
                raise TypeError(e.op)
        return Val(np.asarray(out), mag)

    def Call(self, e):
        f = e.f
        if f == "select":
            c = self(e.args[0])
            a, b = self(e.args[1]), self(e.args[2])
            t = common(promote(ctype(a.v)), promote(ctype(b.v)))
            mag = None
            if a.mag is not None or b.mag is not None:
                mag = np.where(c.v != 0, _mag(a), _mag(b))
            return Val(np.where(c.v != 0, to_type(a.v, t), to_type(b.v, t)), mag)
        args = [self(a) for a in e.args]
        if f in ("min", "max"):                    # in the common type (_min_max)
            t = common(promote(ctype(args[0].v)), promote(ctype(args[1].v)))
            a, b = to_type(args[0].v, t), to_type(args[1].v, t)
            mag = None
            if args[0].mag is not None or args[1].mag is not None:
                # fmax: a NaN operand (sqrt of a negative) is not picked, so its NaN bound is not the result's
                mag = np.fmax(_mag(args[0]), _mag(args[1]))
            return Val(_min_max(f, a, b), mag)
        if f == "abs":
            a = args[0]
            t = ctype(a.v)
            with np.errstate(all="ignore"):
                return Val(np.where(a.v < 0, -a.v.astype(promote(t)), a.v).astype(t), a.mag)
        t = F64 if self.double else F32
        x = to_type(args[0].v, t)
        with np.errstate(all="ignore"):
            out = {"sqrt": np.sqrt, "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2}[f](x) \
                if f != "rsqrt" else (t.type(1) / np.sqrt(x)).astype(t)
            flush = f == "exp2" and t == F32        # results below 2^-126 are 0 (language.md §13)
            if flush:
                out = np.where(out < 2.0 ** -126, F32.type(0), out).astype(F32)
            if args[0].mag is None:         # an exact argument: sqrt is exact too, the others within a few units
                return Val(np.asarray(out, t), None if f == "sqrt" else np.abs(np.asarray(out, F64)))
            # an argument off by up to e = units * mag_x moves the result by about |f'(x)| * e
            # (exp by exp(x) * e: an argument near 9 makes a unit of error nine of the result's)
            ax, mx, ao = np.abs(x.astype(F64)), args[0].mag, np.abs(np.asarray(out, F64))
            mag = {"sqrt": ao + 0.5 * mx / np.sqrt(ax), "exp": ao * (1 + mx), "exp2": ao * (1 + mx),
                   "log": ao + mx / ax, "log2": ao + 1.5 * mx / ax, "rsqrt": ao * (1 + 0.5 * mx / ax)}[f]
            if flush:   # an argument off by a unit near -126 may flush on one side only: 2^-126 apart
                mag = mag + np.where(ao < 2.0 ** -125, 2.0 ** -126 / (16 * UNIT["f32"]), 0.0)
        return Val(np.asarray(out, t), mag)


def _val_of(side, ev):
    f, g, _ = side
    if g is None:
        return f.v
    t = common(promote(ctype(f.v)), promote(ctype(g.v)))
    with np.errstate(all="ignore"):
        return to_type(f.v, t) * to_type(g.v, t)


# ================================================================ programs

@dataclass
class Tensor:
    name: str
    dtype: str
    dims: list          # shape expressions: symbol names (or "9 * C" style text for im2col outputs)
    role: str           # "in" | "out"
    align: bool = True


@dataclass
class Tile:
    name: str
    scope: str
    dtype: str
    shape: tuple


# statements
@dataclass
class Load:
    tile: str
    tensor: str
    prefix: tuple       # origins of leading tensor dims outside the block space: loop variable names or ints
    off: tuple          # per space dim


@dataclass
class Store:
    tile: str
    tensor: str
    off: tuple


@dataclass
class Fill:
    tile: str
    value: Lit


@dataclass
class CopyTT:
    src: str
    dst: str


@dataclass
class Assign:
    tile: str
    value: E


@dataclass
class PIf:
    cond: E
    then: list
    orelse: list


@dataclass
class Par:
    shape: tuple
    body: list


@dataclass
class If:
    cond: E             # over block indices, scalars, loop variables
    then: list
    orelse: list


@dataclass
class For:
    var: str
    extent: str         # a symbol, a scalar or an int literal, as text (range's stop)
    stages: object      # None: range; int: pipelined
    body: list
    start: str = ""     # range(start, stop, step) where set: an int literal or a scalar, as text
    step: int = 1


@dataclass
class Program:
    name: str
    tensors: list
    tiles: list
    stmts: list
    space: tuple        # the block space: per dim (symbol, tile extent, extra blocks)
    sizes: dict         # symbol -> value
    threads: int
    scalars: list = field(default_factory=list)       # (name, dtype, value)
    template: object = None                           # a program of its own template (Im2col, Gemm)
    run_fallback: bool = False                        # also run the thread-copy variant k.fallback
    data_seed: int = 0
    kind: str = ""

    # ---------------------------------------------------------- text
    @property
    def tile_map(self):
        return {t.name: t for t in self.tiles}

    def text(self) -> str:
        if self.template is not None:
            return self.template.text(self)
        params = [f"{t.name}: {t.dtype}[{', '.join(t.dims)}]" for t in self.tensors]
        params += [f"{n}: {dt}" for n, dt, _ in self.scalars]
        R = len(self.space)
        counts = [f"(cdiv({s}, {T}) + {x})" if x else f"cdiv({s}, {T})" for s, T, x in self.space]
        names, grid = ["bx"], [counts[-1]]
        if R >= 2:
            names.append("by")
            grid.append(counts[-2])
        if R >= 3:
            names.append("bz")
            grid.append(" * ".join(counts[:R - 2]))
        lines = [f"kernel {self.name}({', '.join(params)}) {{",
                 f"    grid ({', '.join(names)}) = ({', '.join(grid)});",
                 f"    threads {self.threads};"]
        for t in self.tiles:
            lines.append(f"    {t.scope} {t.name}: {t.dtype}[{', '.join(map(str, t.shape))}];")
        self._emit(self.stmts, lines, 1)
        lines.append("}")
        return "\n".join(lines) + "\n"

    def origins(self):
        R = len(self.space)
        out = []
        for d, (s, T, x) in enumerate(self.space):
            if d == R - 1:
                b = "bx"
            elif d == R - 2:
                b = "by"
            else:
                inner = [f"(cdiv({s2}, {T2}) + {x2})" if x2 else f"cdiv({s2}, {T2})"
                         for s2, T2, x2 in self.space[d + 1:R - 2]]
                cnt = f"(cdiv({s}, {T}) + {x})" if x else f"cdiv({s}, {T})"
                b = f"(bz / ({' * '.join(inner)}) % {cnt})" if inner else f"(bz % {cnt})"
            out.append(f"{b} * {T}" if T != 1 else b)
        return out

    def _region(self, tensor, prefix, off):
        parts = [str(p) for p in prefix]
        for o, k in zip(self.origins(), off):
            parts.append(o if k == 0 else f"{o} + {k}" if k > 0 else f"{o} - {-k}")
        return f"{tensor}[{', '.join(parts)}]"

    def _emit(self, stmts, lines, depth):
        pad = "    " * depth
        tiles = self.tile_map
        for s in stmts:
            if isinstance(s, Load):
                lines.append(f"{pad}copy({self._region(s.tensor, s.prefix, s.off)}, {s.tile});")
            elif isinstance(s, Store):
                lines.append(f"{pad}copy({s.tile}, {self._region(s.tensor, (), s.off)});")
            elif isinstance(s, Fill):
                lines.append(f"{pad}fill({s.tile}, {s.value.text});")
            elif isinstance(s, CopyTT):
                lines.append(f"{pad}copy({s.src}, {s.dst});")
            elif isinstance(s, Par):
                lines.append(f"{pad}parallel ({', '.join(VARS[:len(s.shape)])}) in ({', '.join(map(str, s.shape))}) {{")
                self._emit(s.body, lines, depth + 1)
                lines.append(pad + "}")
            elif isinstance(s, Assign):
                r = len(tiles[s.tile].shape)
                lines.append(f"{pad}{s.tile}[{', '.join(VARS[:r])}] = {text(s.value, tiles)};")
            elif isinstance(s, (PIf, If)):
                lines.append(f"{pad}if {text(s.cond, tiles)} {{")
                self._emit(s.then, lines, depth + 1)
                if s.orelse:
                    lines.append(pad + "} else {")
                    self._emit(s.orelse, lines, depth + 1)
                lines.append(pad + "}")
            elif isinstance(s, For):
                rng = f"range({s.extent})" if s.stages is None and not s.start else \
                    f"range({s.start}, {s.extent}, {s.step})" if s.stages is None else \
                    f"pipelined({s.extent}, stages = {s.stages})"
                lines.append(f"{pad}for {s.var} in {rng} {{")
                self._emit(s.body, lines, depth + 1)
                lines.append(pad + "}")
            else:
                raise TypeError(s)

    # ---------------------------------------------------------- data
    def tensor_shape(self, t):
        return tuple(self.sizes[d] if d in self.sizes else eval(d, {}, dict(self.sizes)) for d in t.dims)

    def inputs(self):
        """The input arrays (numpy, contiguous), from data_seed."""
        rng = np.random.default_rng(self.data_seed)
        if hasattr(self.template, "inputs"):
            return self.template.inputs(self, rng)
        out = {}
        for t in self.tensors:
            if t.role != "in":
                continue
            shape = self.tensor_shape(t)
            if t.dtype in INTS:
                out[t.name] = rng.integers(-100, 100, shape).astype(NP[t.dtype])
            else:
                x = rng.standard_normal(shape)
                if rng.random() < 0.3:
                    x = np.round(x * 8)           # small integers: sums exact
                out[t.name] = x.astype(F32).astype(NP[t.dtype])
        return out

    def scalar_values(self):
        return [v for _, _, v in self.scalars]

    # ---------------------------------------------------------- the reference
    def reference(self, inputs, outputs):
        """outputs: name -> the output's initial contents (numpy). Returns name ->
        (expected array, tolerance array or None for bit-exact)."""
        if self.template is not None:
            return self.template.reference(self, inputs, outputs)
        return Sim(self, inputs, outputs).run()

    def expected_fallback(self, views=True):
        """True: the call must warn TmaFallbackWarning; False: it must not; None:
        either. `views`: the TMA rules judge the views passed (torch tensors);
        else the contiguous copies of them (numpy arrays, which the GPU path copies
        into fresh device memory: tilec/runtime/interpret/args.py). A TMA'd tensor
        with a stride that is no multiple of 16 bytes, or an unaligned view, must
        fall back; a stored tensor's rows shorter than a 16-byte granule, an empty
        tensor, or an im2col view's launch rules (its pixel box) may."""
        by_name = {t.name: t for t in self.tensors}
        if any(0 in self.tensor_shape(t) for t in self.tensors):
            return None         # an empty grid launches nothing, and checks nothing (session 22, seed 33 #449)
        if self.template is not None:
            tma = self.template.tma(self)
        else:
            tma = set()
            tiles = self.tile_map

            def visit(stmts):
                for s in stmts:
                    # a store at an offset below its block's origin may be at a negative coordinate:
                    # tilec makes it a thread copy (a TMA store there faults the GPU)
                    negative = isinstance(s, Store) and any(k < 0 for k in s.off)
                    if isinstance(s, (Load, Store)) and tiles[s.tile].scope == "shared" and not negative:
                        tma.add((s.tensor, isinstance(s, Store)))
                    if not isinstance(s, Par):
                        for b in ("then", "orelse", "body"):
                            visit(getattr(s, b, []))
            visit(self.stmts)
        must, may = False, self.template is not None and self.template.may_fall_back(self, views)
        for n, store in tma:
            t = by_name[n]
            shape = self.tensor_shape(t)
            if 0 in shape:
                may = True
                continue
            if views:
                must |= not t.align
            else:
                strides = [math.prod(shape[d + 1:]) * ELSIZE[t.dtype] for d in range(len(shape) - 1)]
                if any(st_ % 16 for st_, n_ in zip(strides, shape) if n_ > 1):
                    must = True
                elif any(st_ % 16 for st_ in strides):
                    may = True
            if store and shape[-1] * ELSIZE[t.dtype] < 16:
                may = True
        return True if must else None if may else False


class Sim:
    """The numpy model of a program's blocks, stacked on axis 0."""

    def __init__(self, p, inputs, outputs):
        self.p, self.tiles = p, p.tile_map
        self.tensors = {t.name: t for t in p.tensors}
        self.arrays = dict(inputs)
        self.out = {n: np.array(v) for n, v in outputs.items()}
        self.tol = {n: None for n in outputs}
        counts = [-(-p.sizes[s] // T) + x for s, T, x in p.space]
        self.counts = counts
        self.bidx = [a.ravel() for a in np.indices(counts)] if counts else []
        self.nb = math.prod(counts)
        R = len(p.space)
        self.env = {"bx": self.bidx[R - 1]}
        if R >= 2:
            self.env["by"] = self.bidx[R - 2]
        if R >= 3:
            self.env["bz"] = np.ravel_multi_index(self.bidx[:R - 2], counts[:R - 2])
        self.env.update({n: scalar_value(dt, v) for n, dt, v in p.scalars})
        self.scalar_types = {n: dt for n, dt, _ in p.scalars}
        self.full = tuple(T for _, T, _ in p.space)
        self.state = {}
        for t in p.tiles:             # poison: reading before writing shows
            fill = np.nan if t.dtype in FLOATS else -1
            self.state[t.name] = np.full((self.nb, *self.full), fill).astype(NP[t.dtype])
            self.state[t.name + "@mag"] = None

    def run(self):
        self.block(self.p.stmts, np.ones(self.nb, bool))
        return {n: (self.out[n], self.tol[n]) for n in self.out}

    def bshape(self, m):
        return m.reshape((self.nb,) + (1,) * len(self.full))

    def box(self, tensor, prefix, off, env):
        """Indices of each block's box in `tensor` (a tuple of broadcast index arrays
        [B, *full]) and the mask of those inside it."""
        shape = self.p.tensor_shape(self.tensors[tensor])
        lead = len(shape) - len(self.full)
        idx, ok = [], np.ones((self.nb, *self.full), bool)
        for d, pre in enumerate(prefix):
            v = env[pre] if isinstance(pre, str) else pre
            a = np.full((self.nb, *self.full), int(v))
            idx.append(a)
            ok &= (a >= 0) & (a < shape[d])
        R = len(self.full)
        for d in range(R):
            T = self.full[d]
            o = self.bidx[d] * T + off[d]
            sh = [self.nb] + [1] * R
            a = o.reshape(sh) + np.arange(T).reshape([1] + [T if e == d else 1 for e in range(R)])
            a = np.broadcast_to(a, (self.nb, *self.full))
            idx.append(a)
            ok &= (a >= 0) & (a < shape[lead + d])
        return [np.clip(a, 0, max(0, n - 1)) for a, n in zip(idx, shape)], ok

    def block(self, stmts, active):
        for s in stmts:
            {Load: self.load, Store: self.store, Fill: self.fill, CopyTT: self.copytt, Par: self.par, If: self.if_,
             For: self.for_}[type(s)](s, active)

    def _abs_of(self, name):
        return abs_of(self.tiles, self.state, name)

    def _set(self, name, new, active, mag=None):
        m = self.bshape(active)
        old_mag = self.state[name + "@mag"]
        if mag is not None and old_mag is None:
            old_mag = self._abs_of(name)
        self.state[name] = np.where(m, new, self.state[name])
        if old_mag is not None:
            if mag is None:
                mag = self._abs_of(name)
            self.state[name + "@mag"] = np.where(m, mag, old_mag)

    def load(self, s, active):
        t, src = self.tiles[s.tile], self.tensors[s.tensor]
        idx, ok = self.box(s.tensor, s.prefix, s.off, self.env)
        vals = self.arrays[s.tensor][tuple(idx)]
        vals = np.where(ok, vals, np.zeros((), vals.dtype))
        self._set(s.tile, convert_copy(vals, src.dtype, t.dtype), active)

    def store(self, s, active):
        t, dst = self.tiles[s.tile], self.tensors[s.tensor]
        idx, ok = self.box(s.tensor, (), s.off, self.env)
        ok = ok & self.bshape(active)
        vals = convert_copy(self.state[s.tile], t.dtype, dst.dtype)
        target = tuple(a[ok] for a in idx)
        self.out[s.tensor][target] = vals[ok]
        mag = self.state[s.tile + "@mag"]
        if mag is not None:
            if self.tol[s.tensor] is None:
                self.tol[s.tensor] = np.zeros(self.out[s.tensor].shape)
            tol = store_tolerance(dst.dtype, [x.dtype for x in self.p.tiles], mag)
            self.tol[s.tensor][target] = tol[ok]

    def fill(self, s, active):
        t = self.tiles[s.tile]
        v = float(s.value.text) if s.value.is_float else int(s.value.text)
        if s.value.is_float:
            v = np.float64(v) if t.dtype == "f64" else np.float32(v)
        else:
            v = np.int32(v)
        self._set(s.tile, np.broadcast_to(encode(np.asarray(v), t.dtype), self.state[s.tile].shape), active)

    def copytt(self, s, active):
        a, b = self.tiles[s.src], self.tiles[s.dst]
        self._set(s.dst, convert_copy(self.state[s.src], a.dtype, b.dtype), active, self.state[s.src + "@mag"])

    def if_(self, s, active):
        c = np.broadcast_to(np.asarray(Ev(self.tiles, self.state, self.env, self.scalar_types, False)(s.cond).v != 0),
                            (self.nb,))
        self.block(s.then, active & c)
        self.block(s.orelse, active & ~c)

    def for_(self, s, active):
        def value(text):
            if text.lstrip("-").isdigit():
                return int(text)
            return int(self.p.sizes[text] if text in self.p.sizes else self.env[text])
        for k in range(value(s.start) if s.start else 0, value(s.extent), s.step):
            self.env[s.var] = np.int32(k)
            self.block(s.body, active)
        self.env.pop(s.var, None)

    def par(self, s, active):
        r = len(s.shape)
        R = len(self.full)
        env = dict(self.env)
        for d in range(R):
            if d < R - r:
                continue
            sh = [1] * (R + 1)
            sh[1 + d] = self.full[d]
            env[VARS[d - (R - r)]] = np.arange(self.full[d], dtype=np.int32).reshape(sh)
        for name in ("bx", "by", "bz"):
            if name in env:
                env[name] = self.bshape(np.asarray(env[name]).astype(np.int32))
        lanes = np.broadcast_to(self.bshape(active), (self.nb, *self.full))
        self.lane_block(s.body, env, lanes)

    def lane_block(self, stmts, env, lanes):
        run_lanes(self.tiles, self.state, self.scalar_types, stmts, env, lanes)


def abs_of(tiles, state, name):
    return np.nan_to_num(np.abs(decode(state[name], tiles[name].dtype).astype(F64)), nan=0.0)


def run_lanes(tiles, state, scalar_types, stmts, env, lanes):
    """A parallel body's statements on the lanes (a mask [blocks, *tile]) where they
    run: `state` maps each tile to its stacked elements, and "name@mag" to None or
    a magnitude bound (see Ev)."""
    for s in stmts:
        if isinstance(s, Assign):
            t = tiles[s.tile]
            double = t.dtype == "f64" or reads_f64(s.value, tiles, scalar_types)
            v = Ev(tiles, state, env, scalar_types, double)(s.value)
            new = np.broadcast_to(encode(v.v, t.dtype), lanes.shape)
            old = state[s.tile + "@mag"]
            if v.mag is not None and old is None:
                old = abs_of(tiles, state, s.tile)
            state[s.tile] = np.where(lanes, new, state[s.tile])
            if old is not None:
                mag = abs_of(tiles, state, s.tile) if v.mag is None else np.broadcast_to(v.mag, lanes.shape)
                state[s.tile + "@mag"] = np.where(lanes, mag, old)
        else:
            double = reads_f64(s.cond, tiles, scalar_types)
            c = np.broadcast_to(Ev(tiles, state, env, scalar_types, double)(s.cond).v != 0, lanes.shape)
            run_lanes(tiles, state, scalar_types, s.then, env, lanes & c)
            run_lanes(tiles, state, scalar_types, s.orelse, env, lanes & ~c)


def store_tolerance(dst_dtype, tile_dtypes, mag):
    """How far a stored float may be from the model where exp, log or rsqrt fed it."""
    if dst_dtype not in FLOATS:
        return np.zeros(np.shape(mag))
    units = max([UNIT[dst_dtype]] + [UNIT[x] for x in tile_dtypes if x in FLOATS])
    return 16 * units * mag + 4 * TINY[dst_dtype]



# ================================================================ im2col programs

SPATIAL = {1: ("W",), 2: ("H", "W"), 3: ("Dd", "H", "W")}


@dataclass
class Im2col:
    spatial: int
    dt: str
    n: int
    sizes: tuple
    c: int
    k: int
    s: int
    p: int
    d: int
    bm: int
    scale: bool          # a parallel body t = t * alpha + t[i, j] (an element op on the loaded tile)
    fixed: bool = False  # the header says C's value ...
    bk: int = 0          # ... and the K tile may span filter taps (BK = 64 > C: chunks of C); 0: min(C, 64)

    @property
    def width(self):
        return self.bk or min(self.c, 64)

    def may_fall_back(self, prog, views):
        return True          # its pixel box may break a launch rule

    def tma(self, prog):
        return {("X", False), ("Y", True)}

    def outs(self):
        return [(i + 2 * self.p - self.d * (self.k - 1) - 1) // self.s + 1 for i in self.sizes]

    def declarations(self):
        """A program of this view's spatial dims, its taps' count (text), and its const, require
        and let statements (Conv prints them too)."""
        dims = SPATIAL[self.spatial]
        outs = [f"(({d} + 2 * P - DIL * (KK - 1) - 1) / S + 1)" for d in dims]
        kernel = "KK" if self.spatial == 1 else "(" + ", ".join(["KK"] * self.spatial) + ")"
        return dims, " * ".join(["KK"] * self.spatial), (
            f"const KK = {self.k}, S = {self.s}, P = {self.p}, DIL = {self.d};",
            f"require NP == N * {' * '.join(f'max(0, {o})' for o in outs)};",
            f"let Xc = im2col(X, kernel = {kernel}, stride = S, pad = P, dilation = DIL);")

    def text(self, prog):
        dims, ks, (consts, require, let) = self.declarations()
        body = ""
        if self.scale:
            body = ("\n    parallel (i, j) in (BM, BK) {\n"
                    "        t[i, j] = t[i, j] * alpha + f32(i % 3 - j % 2);\n    }")
        c = self.c if self.fixed else "C"
        return f"""kernel {prog.name}(X: {self.dt}[N, {', '.join(dims)}, {c}], Y: {self.dt}[NP, {ks} * {c}], alpha: f32) {{
    {consts}
    const BM = {self.bm}, BK = {self.width};
    {require}
    grid (bx, by) = (cdiv({ks} * {c}, BK), cdiv(NP, BM));
    threads 128;
    {let}
    shared t: {self.dt}[BM, BK];
    copy(Xc[by * BM, bx * BK], t);{body}
    copy(t, Y[by * BM, bx * BK]);
}}
"""

    def matrix(self, x):
        """The [N * prod(O), K^spatial * C] im2col matrix by slicing a zero-padded input per tap."""
        n, *sp, c = x.shape
        outs = self.outs()
        if min(outs) <= 0:
            return np.zeros((0, self.k ** self.spatial * c), x.dtype)
        xp = np.pad(x, [(0, 0)] + [(self.p, self.p)] * self.spatial + [(0, 0)])
        cols = []
        for tap in itertools.product(range(self.k), repeat=self.spatial):
            sl = tuple([slice(None)] + [slice(t * self.d, t * self.d + self.s * (o - 1) + 1, self.s)
                                        for t, o in zip(tap, outs)] + [slice(None)])
            cols.append(xp[sl].reshape(n * math.prod(outs), c))
        return np.concatenate(cols, axis=1)

    def reference(self, prog, inputs, outputs):
        m = self.matrix(inputs["X"])
        if not self.scale:
            return {"Y": (m, None)}
        rows, cols = m.shape
        alpha = np.float32(prog.scalars[0][2])
        v = decode(m, self.dt).astype(F32)
        extra = ((np.arange(rows) % self.bm % 3)[:, None] - (np.arange(cols) % self.width % 2)[None, :])
        out = fma(v, np.broadcast_to(alpha, v.shape), extra.astype(F32), F32)
        return {"Y": (encode(out, self.dt), None)}


@st.composite
def im2col_program(draw):
    spatial = draw(st.sampled_from([1, 2, 2, 3]))
    dt, c = draw(st.sampled_from([("f16", 8), ("f16", 16), ("f16", 64), ("f32", 4), ("f32", 8), ("f16", 24),
                                  ("f16", 96)]))
    n = draw(st.integers(1, 3))
    sizes = tuple(draw(st.sampled_from([1, 4, 7, 9] if spatial < 3 else [1, 4, 5])) for _ in range(spatial))
    k = draw(st.sampled_from([1, 2, 3, 5]) if spatial < 3 else st.sampled_from([1, 2, 3]))
    s, p, d = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([0, 1, 2, 3])), draw(st.sampled_from([1, 2]))
    spec = Im2col(spatial, dt, n, sizes, c, k, s, p, d, draw(st.sampled_from([32, 64, 128])), draw(st.booleans()))
    if draw(st.integers(0, 2)) == 0:
        spec = replace(spec, fixed=True, bk=draw(st.sampled_from([0, 64])))
    dims = SPATIAL[spatial]
    sym = dict(zip(("N", *dims, "C"), (n, *sizes, c)))
    rows = n * math.prod(max(0, o) for o in spec.outs())
    sym["NP"] = rows
    x = Tensor("X", dt, ["N", *dims, "C"], "in", align=draw(st.sampled_from([True] * 5 + [False])))
    y = Tensor("Y", dt, ["NP", f"{k ** spatial} * C"], "out", align=draw(st.sampled_from([True] * 5 + [False])))
    return Program("im2col_r", [x, y], [Tile("t", "shared", dt, (spec.bm, spec.width))], [], (), sym, 128,
                   scalars=[("alpha", "f32", draw(st.sampled_from([0.5, -1.25, 3.0])))], template=spec,
                   run_fallback=draw(st.sampled_from([False] * 4 + [True])),
                   data_seed=draw(st.integers(0, 2 ** 32 - 1)), kind="im2col")


# ================================================================ gemm programs

@dataclass
class Gemm:
    """A pipelined gemm (any tile shape plan-gemm takes, either operand transposed,
    a producer warpgroup, a persistent grid, stream-K, tile groups), an accumulator
    that may start from values other than 0, and an element epilogue on it (or on a
    local tile beside it) before the store. The operands are small integers, so every
    sum wgmma forms is exact in f32 whatever its order: the model's product is the
    GPU's bit for bit, and so is the epilogue (the module docstring's rules)."""
    dt: str
    ct: str
    bm: int
    bn: int
    bk: int
    threads: int
    ta: bool
    tb: bool
    stages: int
    producer: bool
    persistent: bool
    stream_k: bool
    group: int           # 0: no group clause
    init: tuple          # ("zero",) | ("fill", text) | ("index", a, b, c, m): exact values, multiples of 0.5
    epilogue: list       # statements of a parallel over (BM, BN)
    out: bool            # the epilogue writes `local out: ct[BM, BN]`, stored instead of acc
    blocks: bool = False  # each K step's gemm into `part` (from 0), which threads add to acc: a rotating body
    halves: bool = False  # ... and a second gemm into `part2`, both halved into acc: the first is waited for
                          # while the second runs (wgmma.wait_group 1)
    staged: bool = False  # A's tile loads into `a_in` and threads copy it into the operand `a` (its swizzle)
    regs_a: bool = False  # ... a local `a`: wgmma's A from registers
    rows: str = ""       # after the K loop: acc's rows reduced (this op) into `local rv: f32[BM]`, which lives
                         # in acc's rows, and subtracted from them (rv[i] read beside acc)
    rows_step: bool = False  # ... rv[i] = rv[i] * 0.5 + f32(i % 3) first, a parallel over rv's rows
    twice: int = 0       # the stages of a second K loop after the first, over the same tiles (acc gets 2 A B)
    own: bool = False    # ... over tiles of its own, a2 and b2 (a producer's rings must own theirs)
    bk2: int = 0         # own tiles: the second loop's K depth (BK2; 0: BK)
    reps: str = ""       # the K loop(s) inside `for rep in range(reps)` ("n": the scalar, 0 to 4; or "2")

    def tiles(self):
        ts = [Tile("acc", "local", "f32", (self.bm, self.bn))]
        if self.out:
            ts.append(Tile("out", "local", self.ct, (self.bm, self.bn)))
        return {t.name: t for t in ts}

    def init_text(self):
        if self.init[0] == "fill":
            return f"    fill(acc, {self.init[1]});\n"
        text = "    fill(acc, 0);\n"
        if self.init[0] == "index":
            a, b, c, m = self.init[1:]
            text += (f"    parallel (i, j) in (BM, BN) {{\n"
                     f"        acc[i, j] = f32((i * {a} + j * {b} + bx * {c} + by) % {m}) * 0.5 - 1.5;\n    }}\n")
        return text

    names = ("A", "B", "C")

    def head(self, prog):
        """The parameters, consts and lets before the grid; the grid's extents; A's region at step k."""
        a_dims, b_dims = ("K, M" if self.ta else "M, K"), ("N, K" if self.tb else "K, N")
        params = f"A: {self.dt}[{a_dims}], B: {self.dt}[{b_dims}], C: {self.ct}[M, N]"
        return params, "", ("N", "M", "K"), f"A[{'k * BK, by * BM' if self.ta else 'by * BM, k * BK'}]"

    def text(self, prog):
        params, decls, (n, m, k), a_region = self.head(prog)
        A, B, C = self.names
        bk2 = "BK2" if self.bk2 else "BK"         # the second loop's K depth (tiles of its own)

        def k_loop(stages, a="a", b="b", bk="BK"):
            return (f"    for k in pipelined(cdiv({k}, {bk}), stages = {stages}"
                    + (", producer = 1" if self.producer else "") + ") {\n"
                    + f"        copy({a_region.replace('k * BK', f'k * {bk}')}, {'a_in' if self.staged else a});\n"
                    f"        copy({B}[{f'bx * BN, k * {bk}' if self.tb else f'k * {bk}, bx * BN'}], {b});\n"
                    + (f"        parallel (r, c) in ({'BK, BM' if self.ta else 'BM, BK'}) {{\n"
                       f"            a[r, c] = a_in[r, c];\n"
                       f"        }}\n" if self.staged else "")
                    + self.k_step(flags, a, b)
                    + "    }\n")
        grid = f"grid (bx, by) = (cdiv({n}, BN), cdiv({m}, BM))"
        if self.persistent:
            grid += ", persistent = 1"
        if self.stream_k:
            grid += ", stream_k = 1"
        if self.group:
            grid += f", group = {self.group}"
        flags = (", transpose_a = true" if self.ta else "") + (", transpose_b = true" if self.tb else "") + \
            (", tf32 = true" if self.dt == "f32" else "")
        lines = []
        Program._emit(prog, self.epilogue, lines, 2)
        epilogue = ""
        if self.epilogue:
            epilogue = "    parallel (i, j) in (BM, BN) {\n" + "\n".join(lines) + "\n    }\n"
        scalars = "".join(f", {n}: {dt}" for n, dt, _ in prog.scalars)
        return (f"kernel {prog.name}({params}{scalars}) {{\n"
                + decls
                + f"    const BM = {self.bm}, BN = {self.bn}, BK = {self.bk}{f', BK2 = {self.bk2}' if self.bk2 else ''};\n"
                f"    {grid};\n"
                f"    threads {self.threads};\n"
                f"    {'local' if self.regs_a else 'shared'} a: {self.dt}[{'BK, BM' if self.ta else 'BM, BK'}];\n"
                + (f"    shared a_in: {self.dt}[{'BK, BM' if self.ta else 'BM, BK'}];\n" if self.staged else "")
                + f"    shared b: {self.dt}[{'BN, BK' if self.tb else 'BK, BN'}];\n"
                f"    local acc: f32[BM, BN];\n"
                + (f"    shared a2: {self.dt}[{f'{bk2}, BM' if self.ta else f'BM, {bk2}'}];\n"
                   f"    shared b2: {self.dt}[{f'BN, {bk2}' if self.tb else f'{bk2}, BN'}];\n" if self.own else "")
                + (f"    local out: {self.ct}[BM, BN];\n" if self.out else "")
                + ("    local part: f32[BM, BN];\n" if self.blocks else "")
                + ("    local part2: f32[BM, BN];\n" if self.halves else "")
                + ("    local rv: f32[BM];\n" if self.rows else "")
                + self.init_text()
                + (f"    for rep in range({self.reps}) {{\n" if self.reps else "")
                + k_loop(self.stages)
                + (k_loop(self.twice, *(("a2", "b2", bk2) if self.own else ())) if self.twice else "")
                + ("    }\n" if self.reps else "")
                + (f"    reduce(acc, rv, axis = 1, op = {self.rows});\n" if self.rows else "")
                + ("    parallel (i) in (BM) {\n        rv[i] = rv[i] * 0.5 + f32(i % 3);\n    }\n"
                   if self.rows and self.rows_step else "")
                + ("    parallel (i, j) in (BM, BN) {\n        acc[i, j] = acc[i, j] - rv[i];\n    }\n"
                   if self.rows else "")
                + epilogue
                + f"    copy({'out' if self.out else 'acc'}, {C}[by * BM, bx * BN]);\n}}\n")

    def k_step(self, flags, a="a", b="b") -> str:
        """A K step's gemm of tiles a and b: into acc, or into `part` (and `part2`: halves)
        that threads add to acc."""
        if not self.blocks:
            return f"        gemm({a}, {b}, acc{flags});\n"
        parts, half = (("part", "part2"), " * 0.5") if self.halves else (("part",), "")
        return "".join(f"        fill({p}, 0);\n        gemm({a}, {b}, {p}{flags});\n" for p in parts) + \
            "".join(f"        parallel (i, j) in (BM, BN) {{\n            acc[i, j] = acc[i, j] + {p}[i, j]{half};\n"
                    "        }\n" for p in parts)

    def inputs(self, prog, rng):
        out = {}
        for t in prog.tensors:
            if t.role == "in":
                out[t.name] = rng.integers(-2, 3, prog.tensor_shape(t)).astype(F32).astype(NP[t.dtype])
        return out

    def tma(self, prog):
        return {(self.names[0], False), (self.names[1], False)}     # the loads; C's store: may_fall_back

    def may_fall_back(self, prog, views):
        """C's store is a TMA store or thread stores, as plan-gemm decides: a C that
        breaks a TMA rule may fall back."""
        c = next(t for t in prog.tensors if t.name == self.names[2])
        n = prog.tensor_shape(c)[1]
        return (not c.align if views else n * ELSIZE[self.ct] % 16 != 0) or n * ELSIZE[self.ct] < 16

    def operands(self, prog, inputs):
        """The product's operands as [M, K] and [K, N] matrices (float64, exact)."""
        a = decode(inputs["A"], self.dt).astype(F64)
        b = decode(inputs["B"], self.dt).astype(F64)
        return (a.T if self.ta else a), (b.T if self.tb else b)

    def reference(self, prog, inputs, outputs):
        a, b = self.operands(prog, inputs)
        M, N = a.shape[0], b.shape[1]
        BM, BN = self.bm, self.bn
        gy, gx = -(-M // BM), -(-N // BN)
        nb = gx * gy

        def whole(x):                              # [blocks, BM, BN] -> the [M, N] matrix they tile
            return x.reshape(gy, gx, BM, BN).transpose(0, 2, 1, 3).reshape(gy * BM, gx * BN)[:M, :N]
        prod = np.zeros((gy * BM, gx * BN))
        prod[:M, :N] = a @ b                       # exact: small integers
        blocks = prod.reshape(gy, BM, gx, BN).transpose(0, 2, 1, 3).reshape(nb, BM, BN)
        by = (np.arange(nb) // gx).astype(np.int32).reshape(nb, 1, 1)
        bx = (np.arange(nb) % gx).astype(np.int32).reshape(nb, 1, 1)
        i = np.arange(BM, dtype=np.int32).reshape(1, BM, 1)
        j = np.arange(BN, dtype=np.int32).reshape(1, 1, BN)
        if self.init[0] == "fill":
            init = np.full((nb, BM, BN), float(self.init[1]))
        elif self.init[0] == "index":
            ca, cb, cc, m = self.init[1:]
            init = np.broadcast_to(((i * ca + j * cb + bx * cc + by) % m) * 0.5 - 1.5, (nb, BM, BN))
        else:
            init = np.zeros((nb, BM, BN))
        tiles = self.tiles()
        if self.reps == "n":
            reps = next(v for n_, _, v in prog.scalars if n_ == "n")
        else:
            reps = int(self.reps or 1)
        state = {"acc": (init + blocks * (2 if self.twice else 1) * reps).astype(F32), "acc@mag": None}
        if self.rows:       # exact: acc holds multiples of 0.5 far below 2^23, and no -0.0
            acc = state["acc"].astype(F64)
            rv = {"max": acc.max(axis=2), "min": acc.min(axis=2), "sum": acc.sum(axis=2)}[self.rows]
            if self.rows_step:
                rv = rv * 0.5 + (np.arange(BM) % 3)
            state["acc"] = (acc - rv[:, :, None]).astype(F32)
        if self.out:
            state["out"] = np.full((nb, BM, BN), np.nan).astype(NP[self.ct])
            state["out@mag"] = None
        scalars = {n_: dt for n_, dt, _ in prog.scalars}
        env = {"i": i, "j": j, "bx": bx, "by": by}
        env.update({n_: scalar_value(dt, v) for n_, dt, v in prog.scalars})
        run_lanes(tiles, state, scalars, self.epilogue, env, np.ones((nb, BM, BN), bool))
        src = "out" if self.out else "acc"
        want = whole(convert_copy(state[src], tiles[src].dtype, self.ct)).copy()
        tol = None
        if state[src + "@mag"] is not None:
            tol = store_tolerance(self.ct, [t.dtype for t in tiles.values()], whole(state[src + "@mag"]))
        return {self.names[2]: (want, tol)}


@dataclass
class Conv(Gemm):
    """A convolution as implicit gemm (examples/conv2d.tile's form): A is an im2col
    view of an N, spatial..., C input (1-3 spatial dims, any kernel, stride, pad and
    dilation), B the [taps * C, F] weights (or [F, taps * C], transpose_b). `fixed`:
    the header says C's value (plan-gemm then fits the swizzle's chunks to its taps)."""
    spatial: int = 2
    n: int = 1
    sizes: tuple = ()
    c: int = 8
    f: int = 8
    k: int = 3
    s: int = 1
    p: int = 1
    d: int = 1
    fixed: bool = False
    names = ("X", "Wt", "Y")

    def view(self):
        return Im2col(self.spatial, self.dt, self.n, self.sizes, self.c, self.k, self.s, self.p, self.d, self.bm,
                      False)

    def head(self, prog):
        dims, taps, statements = self.view().declarations()
        c = self.c if self.fixed else "C"
        w = f"F, {taps} * {c}" if self.tb else f"{taps} * {c}, F"
        params = f"X: {self.dt}[N, {', '.join(dims)}, {c}], Wt: {self.dt}[{w}], Y: {self.ct}[NP, F]"
        decls = "".join(f"    {x}\n" for x in statements)
        return params, decls, ("F", "NP", f"{taps} * {c}"), "Xc[by * BM, k * BK]"

    def may_fall_back(self, prog, views):
        return True          # the im2col view's pixel box may break a launch rule

    def operands(self, prog, inputs):
        a = decode(self.view().matrix(inputs["X"]), self.dt).astype(F64)
        b = decode(inputs["Wt"], self.dt).astype(F64)
        return a, (b.T if self.tb else b)


# (BM, BN, BK, threads) beyond tests/gemm_shapes.py's: the shipped examples' big tiles
BIG_GEMM_TILES = [(128, 256, 64, 256), (192, 128, 64, 384), (128, 64, 64, 256), (64, 256, 64, 128)]
WIDE_K_TILES = [(128, 128, 128, 256), (64, 64, 96, 128)]     # K tiles of two or three swizzled chunks


SMEM = 232448       # a Hopper block's shared memory


def _ring_bytes(bm, bn, bk, dt, stages):
    """Shared memory of a ring of `stages` copies of a [BM, BK] and a [BK, BN] tile."""
    return stages * (bm * bk + bk * bn) * ELSIZE[dt]


def _schedule(draw, bm, bn, bk, threads, ct, dt, scalars, ta=False):
    """Drawn pipeline and grid options, the accumulator's start and the epilogue (reading the
    float `scalars`), as Gemm's fields."""
    from gemm_shapes import swapped
    persistent = draw(st.booleans())
    stream_k = persistent and draw(st.booleans())
    producer = draw(st.booleans())
    big = bm * bk + bk * bn > 128 * 64 + 64 * 256 // 2
    stages = draw(st.sampled_from([2, 3, 4] if big else [1, 2, 3, 4, 6]))
    if producer and stages < 2:
        stages = 2
    # the ring fits in shared memory, with stream-K beside a partial f32 tile
    while stages > 2 and _ring_bytes(bm, bn, bk, dt, stages) + bm * bn * 4 * stream_k + 1024 > SMEM:
        stages -= 1
    group = draw(st.sampled_from([0, 0, 1, 2, 8]))
    init = draw(st.sampled_from([("zero",)] * 3 + [("fill", "1.5"), ("fill", "-2.0")]
                                + [("index", draw(st.integers(1, 5)), draw(st.integers(1, 5)),
                                    draw(st.integers(0, 3)), draw(st.integers(2, 9)))]))
    if stream_k:                                   # stream-K sums partial accumulators: they start from 0
        init = ("zero",)
    regs = min(255, 65536 // (threads + 128 * producer) // 8 * 8)   # a thread's registers, as plan-gemm counts them
    out = 2 * bm * bn // threads + 26 <= regs and draw(st.integers(0, 3)) == 0   # a local beside acc
    # K steps into `part`, added to acc by threads (a rotating body: no producer, no stream-K)
    blocks = not producer and not stream_k and (2 + out) * bm * bn // threads + 26 <= regs and \
        draw(st.integers(0, 2)) == 0
    # ... in two halves, two gemms in flight (exact: integer sums halved, multiples of 0.5)
    halves = blocks and (3 + out) * bm * bn // threads + 26 <= regs and draw(st.booleans())
    # A's operand written by the threads from a plain tile (a rotating body too)
    staged = not producer and not stream_k and draw(st.integers(0, 3)) == 0
    # ... into a local `a` (wgmma's A from registers: 16-bit, K-major, each warpgroup whole rows of acc,
    # its elements in pairs counted beside the accumulators)
    regs_a = staged and dt in ("f16", "bf16") and not ta and bm % (64 * (threads // 128)) == 0 and \
        (1 + out + blocks + halves) * bm * bn // threads + bm * bk // threads // 2 + 26 <= regs and draw(st.booleans())
    # acc's rows reduced into a local tile that lives in them: where quads hold the rows (no
    # producer, no acc^T: M a multiple of 64, or padded to one, as plan-gemm pads it for such a
    # tile), not with stream-K's partial tiles
    rows = not producer and not stream_k and not swapped(bm, bn, threads, keep_rows=True) and \
        draw(st.integers(0, 2)) == 0
    rows = draw(st.sampled_from(["max", "min", "sum"])) if rows else ""
    rows_step = bool(rows) and draw(st.booleans())
    # a second K loop over the same tiles or its own (a producer's rings own theirs; stream-K splits one loop)
    twice, own = 0, False
    if not stream_k and draw(st.integers(0, 4)) == 0:
        twice = draw(st.sampled_from([1, 2, 3] if big else [1, 2, 4]))
        own = producer or (not staged and draw(st.booleans()))
        if producer and twice < 2:
            twice = 2
        # shared memory: both rings and, in a persistent producer kernel, acc's staging (at most all of it)
        staging = bm * bn * 4 if producer and persistent else 0
        while own and twice > 1 and _ring_bytes(bm, bn, bk, dt, stages + twice) + 1024 + staging > SMEM:
            twice -= 1
        if own and _ring_bytes(bm, bn, bk, dt, stages + twice) + 1024 + staging > SMEM or producer and twice < 2:
            twice, own = 0, False
    # the K loop(s) repeated by an outer loop: the rings' stages and phases go on (stream-K: one loop)
    reps = "" if stream_k or draw(st.integers(0, 5)) else draw(st.sampled_from(["n", "2"]))
    tiles = {"acc": Tile("acc", "local", "f32", (bm, bn))}
    if out:
        tiles["out"] = Tile("out", "local", ct, (bm, bn))
    ctx = Ctx(tiles, {"acc": False}, 2, ["bx", "by", "n"], [n for n, dt, _ in scalars if dt != "i32"])
    if out:
        epilogue = body(draw, ctx, "out", ct, False, depth=2)
    elif draw(st.booleans()):
        epilogue = body(draw, ctx, "acc", "f32", True, depth=2)
    else:
        epilogue = []
    return dict(stages=stages, producer=producer, persistent=persistent, stream_k=stream_k, group=group,
                init=init, epilogue=epilogue, out=out, blocks=blocks, halves=halves, staged=staged, regs_a=regs_a,
                rows=rows, rows_step=rows_step, twice=twice, own=own, reps=reps), list(tiles.values())


def _scalars(draw):
    scalars = [("alpha", "f32", draw(st.sampled_from(ALPHAS))), ("n", "i32", draw(st.integers(0, 4)))]
    if draw(st.integers(0, 3)) == 0:
        scalars.append(("h", draw(st.sampled_from(["f16", "bf16"])), draw(st.sampled_from(HALF_SCALARS))))
    return scalars


@st.composite
def gemm_program(draw):
    from gemm_shapes import SHAPES
    kind = draw(st.integers(0, 7))
    f8 = kind == 0
    if f8:
        dt = draw(st.sampled_from(["f8e4m3", "f8e5m2"]))
        bm, bn, threads = draw(st.sampled_from([(128, 128, 256), (64, 128, 128), (128, 256, 256), (64, 64, 128)]))
        bk, ta, tb = 128, False, True              # wgmma reads 8-bit operands K-major only
    elif kind == 1:                                # f32 read as tf32 (tf32 = true): K-major only as well
        dt = "f32"
        bm, bn, threads = draw(st.sampled_from([(128, 128, 256), (64, 128, 128), (128, 64, 256), (64, 64, 128),
                                                (16, 128, 128), (192, 128, 384), (64, 24, 256)]))
        bk, ta, tb = draw(st.sampled_from([32, 32, 16, 8, 64])), False, True
    else:
        dt = draw(st.sampled_from(["f16", "f16", "bf16"]))
        bm, bn, bk, threads = draw(st.sampled_from(SHAPES + BIG_GEMM_TILES))
        ta, tb = draw(st.booleans()), draw(st.booleans())
    ct = draw(st.sampled_from(["f32", "f16", "bf16"]))
    scalars = _scalars(draw)
    sched, tiles = _schedule(draw, bm, bn, bk, threads, ct, dt, scalars, ta)
    if sched["own"] and not f8 and draw(st.booleans()):    # the second loop's tiles of another K depth
        bk2 = draw(st.sampled_from([d for d in (16, 32, 48, 64) if d != bk]))
        staging = bm * bn * 4 if sched["producer"] and sched["persistent"] else 0
        if _ring_bytes(bm, bn, bk, dt, sched["stages"]) + _ring_bytes(bm, bn, bk2, dt, sched["twice"]) + 1024 \
                + staging <= SMEM:
            sched["bk2"] = bk2
    spec = Gemm(dt, ct, bm, bn, bk, threads, ta, tb, **sched)

    def size(t):
        return draw(st.sampled_from(sorted({1, max(1, t - 1), t, t + 1, 2 * t + 3, 3 * t - 1})))
    k_steps = draw(st.sampled_from([0, 1, 1, 2, 3, 5, 9]))
    K = max(0, k_steps * bk - draw(st.sampled_from([0, 0, 8, 16, 1]))) if k_steps else 0
    sizes = {"M": size(bm), "N": size(bn), "K": K}
    unaligned = draw(st.integers(0, 5)) == 0
    align = lambda: not (unaligned and draw(st.booleans()))        # noqa: E731
    tensors = [Tensor("A", dt, ["K", "M"] if ta else ["M", "K"], "in", align()),
               Tensor("B", dt, ["N", "K"] if tb else ["K", "N"], "in", align()),
               Tensor("C", ct, ["M", "N"], "out", align())]
    return Program("gemm_r", tensors, tiles, [], (), sizes, threads, scalars, template=spec,
                   run_fallback=draw(st.sampled_from([False] * 4 + [True])),
                   data_seed=draw(st.integers(0, 2 ** 32 - 1)), kind="gemm")


@st.composite
def conv_program(draw):
    """examples/conv2d.tile's implicit gemm over 1-3 spatial dims, random geometry and tiles."""
    from gemm_shapes import SHAPES
    spatial = draw(st.sampled_from([1, 2, 2, 3]))
    dt = draw(st.sampled_from(["f16", "f16", "bf16"]))
    bm, bn, bk, threads = draw(st.sampled_from(SHAPES + BIG_GEMM_TILES + WIDE_K_TILES))
    tb = draw(st.booleans())
    ct = draw(st.sampled_from(["f16", "f16", "f32", "bf16"]))
    scalars = _scalars(draw)
    sched, tiles = _schedule(draw, bm, bn, bk, threads, ct, dt, scalars)
    c = draw(st.sampled_from([4, 8, 16, 24, 32, 64, 72, 128]))
    fixed = draw(st.integers(0, 2)) == 0
    f = draw(st.sampled_from([8, 16, 24, 64, 100, 128, 136, 264]))
    k = draw(st.sampled_from([1, 2, 3, 5]) if spatial < 3 else st.sampled_from([1, 2, 3]))
    s_, p_, d_ = draw(st.sampled_from([1, 1, 2, 3])), draw(st.sampled_from([0, 1, 1, 2])), draw(st.sampled_from([1, 1, 2]))
    n = draw(st.integers(1, 3))
    sizes = tuple(draw(st.sampled_from([1, 4, 7, 9, 13] if spatial < 3 else [1, 4, 5])) for _ in range(spatial))
    spec = Conv(dt, ct, bm, bn, bk, threads, False, tb, **sched, spatial=spatial, n=n, sizes=sizes, c=c, f=f, k=k,
                s=s_, p=p_, d=d_, fixed=fixed)
    dims = SPATIAL[spatial]
    sym = dict(zip(("N", *dims, "C", "F"), (n, *sizes, c, f)))
    sym["NP"] = n * math.prod(max(0, o) for o in spec.view().outs())
    taps = k ** spatial
    unaligned = draw(st.integers(0, 5)) == 0
    align = lambda: not (unaligned and draw(st.booleans()))        # noqa: E731
    tensors = [Tensor("X", dt, ["N", *dims, "C"], "in", align()),
               Tensor("Wt", dt, ["F", f"{taps} * C"] if tb else [f"{taps} * C", "F"], "in", align()),
               Tensor("Y", ct, ["NP", "F"], "out", align())]
    return Program("conv_r", tensors, tiles, [], (), sym, threads, scalars, template=spec,
                   run_fallback=draw(st.sampled_from([False] * 4 + [True])),
                   data_seed=draw(st.integers(0, 2 ** 32 - 1)), kind="conv")


# ================================================================ element expressions, drawn

FLOAT_LITS = ["0.5", "1.5", "2.0", "0.25", "3.0", "0.1", "1e-3", "7.75"]
ALPHAS = [0.5, -1.25, 0.3, 3.0, 1e-3, 2.0]
HALF_SCALARS = [0.1, -2.5, 1 / 3, 1000.7, 0.5]          # most of them change when rounded to 16 bits


class Ctx:
    """What an element expression may read: tiles (name -> shiftable), index vars
    (the parallel's own), int variables (loop variables, n), float scalars."""

    def __init__(self, tiles, readable, r, ints, floats):
        self.tiles, self.readable, self.r, self.ints, self.floats = tiles, readable, r, ints, floats

    def elem(self, draw, kinds):
        names = [n for n in self.readable if (self.tiles[n].dtype in FLOATS) == (kinds == "float")] \
            if kinds != "any" else list(self.readable)
        if not names:
            return None
        name = draw(st.sampled_from(sorted(names)))
        t = self.tiles[name]
        if not self.readable[name]:
            idx = (("own",),) * len(t.shape)
        else:
            idx = tuple(draw(st.sampled_from([("own",), ("own",), ("rev",), ("shift", draw(st.integers(1, 5))),
                                              ("half",), ("clamp", draw(st.integers(1, 3))),
                                              ("stride", draw(st.integers(2, 3)))]))
                        for _ in t.shape)
        return Elem(name, idx)


def float_expr(draw, ctx, depth, transc=True):
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        choice = draw(st.integers(0, 5))
        if choice <= 2:
            e = ctx.elem(draw, "float") or ctx.elem(draw, "any")
            if e is not None:
                return e
        if choice == 3 and ctx.floats:
            return Var(draw(st.sampled_from(ctx.floats)))
        if choice == 4:
            return Cast("f32", Var(draw(st.sampled_from(VARS[:ctx.r] + tuple(ctx.ints)))))
        return Lit(draw(st.sampled_from(FLOAT_LITS)), True)
    op = draw(st.sampled_from(["+", "+", "-", "*", "*", "/", "neg", "min", "max", "abs", "select", "cast",
                               "sqrt", "exp", "exp2", "log", "log2", "rsqrt", "fma"]))
    sub = lambda: float_expr(draw, ctx, depth - 1, transc)          # noqa: E731
    exact = lambda: float_expr(draw, ctx, depth - 1, False)         # noqa: E731
    if op in ("+", "-", "*"):
        return Bin(op, sub(), sub())
    if op == "fma":                                  # the contracted shapes: a * b + c, c - a * b
        a, b, c = sub(), sub(), sub()
        return Bin("+", Bin("*", a, b), c) if draw(st.booleans()) else Bin("-", c, Bin("*", a, b))
    if op == "/":                                    # divisors: exact on both sides, nonzero
        den = Var(draw(st.sampled_from(ctx.floats))) if ctx.floats and draw(st.booleans()) else \
            Lit(draw(st.sampled_from(FLOAT_LITS)), True)
        return Bin("/", sub(), den)
    if op == "neg":
        return Neg(sub())
    if op in ("min", "max"):
        return Call(op, (sub(), sub()))
    if op == "abs":
        return Call("abs", (sub(),))
    if op == "select":
        return Call("select", (cond(draw, ctx, 1), sub(), sub()))
    if op == "cast":
        return Cast(draw(st.sampled_from(["f16", "bf16", "f32", "f64"])), sub())
    if op == "sqrt":
        return Call("sqrt", (Call("abs", (sub(),)) if draw(st.booleans()) else sub(),))
    if not transc:
        return Bin("+", sub(), sub())
    if op in ("exp", "exp2"):                        # exact arguments (see the module docstring)
        return Call(op, (exact(),))
    if op in ("log", "log2"):
        return Call(op, (Bin("+", Call("abs", (exact(),)), Lit("1.0", True)),))
    return Call("rsqrt", (Bin("+", Call("abs", (exact(),)), Lit("0.25", True)),))


def int_expr(draw, ctx, depth):
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        choice = draw(st.integers(0, 4))
        if choice <= 1:
            e = ctx.elem(draw, "int")
            if e is not None:
                return e
        if choice == 2:
            return Var(draw(st.sampled_from(VARS[:ctx.r] + tuple(ctx.ints))))
        return Lit(str(draw(st.integers(0, 9))), False)
    op = draw(st.sampled_from(["+", "-", "*", "/", "%", "neg", "min", "max", "abs", "select", "cast"]))
    sub = lambda: int_expr(draw, ctx, depth - 1)                    # noqa: E731
    if op in ("+", "-"):
        return Bin(op, sub(), sub())
    if op == "*":                                    # one small factor: no int32 overflow
        return Bin("*", sub(), Lit(str(draw(st.integers(0, 7))), False))
    if op in ("/", "%"):                             # truncating, by a positive literal
        return Bin(op, sub(), Lit(str(draw(st.integers(1, 9))), False))
    if op == "neg":
        return Neg(sub())
    if op in ("min", "max"):
        return Call(op, (sub(), sub()))
    if op == "abs":
        return Call("abs", (sub(),))
    if op == "select":
        return Call("select", (cond(draw, ctx, 1), sub(), sub()))
    return Cast("i32", float_expr(draw, ctx, depth - 1, transc=False))


def cond(draw, ctx, depth):
    """A condition without exp/log/rsqrt (both sides compute it exactly)."""
    kind = draw(st.integers(0, 3 if depth > 0 else 1))
    cmp = draw(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]))
    if kind == 0:
        return Bin(cmp, float_expr(draw, ctx, 1, transc=False), Lit(draw(st.sampled_from(["0.0", "0.5", "-1.0"])),
                                                                       True))
    if kind == 1:
        return Bin(cmp, int_expr(draw, ctx, 1), Lit(str(draw(st.integers(0, 9))), False))
    return Bin(draw(st.sampled_from(["&&", "||"])), cond(draw, ctx, depth - 1), cond(draw, ctx, depth - 1))


def value_for(draw, ctx, dt, depth):
    if dt in FLOATS or draw(st.integers(0, 5)) == 0:
        e = float_expr(draw, ctx, depth) if dt in FLOATS else Cast("i32", float_expr(draw, ctx, depth, False))
        return e
    return int_expr(draw, ctx, depth)


def body(draw, ctx, target, target_dt, written, depth=3):
    """1-3 statements of a parallel body over `target` (its first write unconditional
    unless `written`: the tile already holds values everywhere)."""
    out = []
    for n in range(draw(st.integers(1, 3))):
        if written:
            ctx.readable.setdefault(target, False)       # read at own indices only: it is being written
        if written and draw(st.integers(0, 2)) == 0:
            then = [Assign(target, value_for(draw, ctx, target_dt, depth - 1))]
            orelse = [Assign(target, value_for(draw, ctx, target_dt, depth - 1))] if draw(st.booleans()) else []
            out.append(PIf(cond(draw, ctx, 1), then, orelse))
        else:
            out.append(Assign(target, value_for(draw, ctx, target_dt, depth)))
        written = True
    return out


# ================================================================ tile programs

DTYPES = ("f16", "bf16", "f32", "f64", "i8", "i32")


def _space_sizes(draw, T):
    return draw(st.sampled_from(sorted({1, 2, 3, max(1, T - 1), T, T + 1, 2 * T + 3, 3 * T - 1} - {0})))


@st.composite
def tile_program(draw):
    kind = draw(st.sampled_from(["inplace", "shared_out", "local_out", "local_in", "fill", "reduce", "reduce"]))
    R = draw(st.integers(1, 3 if kind == "reduce" else 4))
    dA = draw(st.sampled_from(DTYPES))
    two = draw(st.booleans())
    dB = draw(st.sampled_from(DTYPES))
    dY = dA if kind == "inplace" else draw(st.sampled_from(DTYPES))
    dR = draw(st.sampled_from(DTYPES))               # a local tile's, or the accumulator's
    if kind == "reduce":
        dR = draw(st.sampled_from(["f32", "f64"] if dA in FLOATS else ["i32", "f32"]))
    acc_shared = kind == "reduce" and draw(st.booleans())
    tma_dtypes = [dB] if two else []
    if kind != "local_in":
        tma_dtypes.append(dA)
    if kind not in ("local_out", "local_in") and not (kind == "reduce" and not acc_shared):
        tma_dtypes.append(dY)
    per = max([per16(x) for x in tma_dtypes] + [1])
    budget = 2048 if "f64" not in (dA, dB, dY, dR) else 512
    widths = [w for w in (per, 2 * per, 4 * per, 8 * per, 16 * per) if w <= 256]
    widths += [w for w in (512, 1024) if w <= budget // 2]     # wider than a TMA box: several boxes a copy
    if not tma_dtypes:
        widths += [1, 3, 5, 7]
    w = draw(st.sampled_from(widths))
    r = draw(st.integers(1, R))
    T = [1] * (R - r)
    for d in range(r - 1):
        T.append(draw(st.sampled_from([t for t in (1, 2, 3, 4, 5, 8, 16) if t * w * math.prod(T[R - r:]) <= budget]
                                      or [1])))
    T.append(w)
    elems = math.prod(T)
    threads = draw(st.sampled_from([x for x in (32, 64, 128, 256) if elems <= 32 * x] or [256]))
    syms = [f"D{d}" for d in range(R)]
    sizes, space = {}, []
    for d in range(R):
        sizes[syms[d]] = _space_sizes(draw, T[d])
    shifted = draw(st.integers(0, 3)) == 0

    def offsets(dt):
        if not shifted:
            return (0,) * R
        return tuple(draw(st.integers(-T[d], T[d])) if d < R - 1 else per16(dt) * draw(st.integers(-2, 2))
                     for d in range(R))
    extra = [int(shifted and draw(st.booleans())) for _ in range(R)]
    space = tuple((syms[d], T[d], extra[d]) for d in range(R))
    unaligned = draw(st.integers(0, 5)) == 0
    align = lambda: not (unaligned and draw(st.booleans()))        # noqa: E731

    tshape = tuple(T[R - r:])
    prefix = ()
    tensors = []
    if kind == "reduce":
        sizes["K"] = draw(st.integers(0, 5))
        tensors.append(Tensor("A", dA, ["K"] + syms, "in", align()))
        prefix = ("k",)
    else:
        tensors.append(Tensor("A", dA, list(syms), "in", align()))
    if two:
        tensors.append(Tensor("B", dB, ["K"] + syms if kind == "reduce" else list(syms), "in", align()))
    tensors.append(Tensor("Y", dY, list(syms), "out", align()))
    scalars = [("alpha", "f32", draw(st.sampled_from(ALPHAS))), ("n", "i32", draw(st.integers(0, 4)))]
    if draw(st.integers(0, 4)) == 0:
        scalars.append(("g", "f64", draw(st.sampled_from([0.1, -2.5, 1 / 3]))))
    if draw(st.integers(0, 3)) == 0:             # read as float of the 16-bit value (language.md §2)
        scalars.append(("h", draw(st.sampled_from(["f16", "bf16"])), draw(st.sampled_from(HALF_SCALARS))))
    floats = [n for n, dt, _ in scalars if dt != "i32"]
    tiles = []
    stmts = []
    loff, soff = offsets(dA), offsets(dY)
    boff = offsets(dB)

    def tile(name, scope, dt):
        t = Tile(name, scope, dt, tshape)
        tiles.append(t)
        return t

    readable = {}
    if kind != "local_in":
        tile("a", "shared", dA)
    if two:
        tile("b", "shared", dB)
    ints = ["n"]

    if kind == "reduce":
        tile("acc", "shared" if acc_shared else "local", dR)
        loop_body = [Load("a", "A", ("k",), loff)]
        if two:
            loop_body.append(Load("b", "B", ("k",), boff))
            readable["b"] = True
        readable["a"] = True
        ctx = Ctx({t.name: t for t in tiles}, readable, r, ints + ["k"], floats)
        ctx.readable["acc"] = False
        op = draw(st.sampled_from(["+", "+", "max"]))
        term = value_for(draw, ctx, dR, 2)
        upd = Bin("+", Elem("acc", (("own",),) * r), term) if op == "+" else \
            Call("max", (Elem("acc", (("own",),) * r), term))
        par = Par(tshape, [Assign("acc", upd)])
        if draw(st.integers(0, 3)) == 0:
            loop_body.append(If(Bin("==", Bin("%", Var("k"), Lit("2", False)), Lit("0", False)), [par], []))
        else:
            loop_body.append(par)
        stages = draw(st.sampled_from([None, None, 1, 2, 3, 4]))
        if draw(st.integers(0, 3)) == 0:    # a statement before the loads (hoist-loads moves them ahead of it)
            ahead = Ctx({t.name: t for t in tiles}, {"acc": False}, r, ints + ["k"], floats)
            loop_body.insert(0, Par(tshape, [Assign("acc", Bin("+", Elem("acc", (("own",),) * r),
                                                                 value_for(draw, ahead, dR, 1)))]))
        loops = [For("k", "K", stages, loop_body)]
        if draw(st.integers(0, 3)) == 0:    # a second pass over the same tiles: the loops share their copies
            loops.append(For("k", "K", draw(st.sampled_from([None, 1, 2, 3])), loop_body))
        # inside another loop (a rotating one keeps its copies' phases from trip to trip)
        outer = draw(st.sampled_from([None, None, None, "2", "3", "n"]))
        stmts += [Fill("acc", Lit("0", False))] + (loops if outer is None else [For("z", outer, None, loops)])
        if acc_shared and dR != dY:
            tile("o", "shared", dY)
            stmts += [CopyTT("acc", "o"), Store("o", "Y", soff)]
        else:
            stmts.append(Store("acc", "Y", soff))
        return Program(f"red{R}", tensors, tiles, stmts, space, sizes, threads, scalars,
                       run_fallback=draw(st.sampled_from([False] * 4 + [True])),
                       data_seed=draw(st.integers(0, 2 ** 32 - 1)), kind=kind)

    if kind != "local_in":
        stmts.append(Load("a", "A", prefix, loff))
    if two:
        stmts.append(Load("b", "B", prefix, boff))
        readable["b"] = True
    if kind == "inplace":
        target, tdt, written, store_from = "a", dA, True, "a"
    elif kind == "shared_out":
        readable["a"] = True
        if draw(st.booleans()):                       # a shared -> shared copy converting a's elements
            tile("c", "shared", draw(st.sampled_from(DTYPES)))
            stmts.append(CopyTT("a", "c"))
            readable["c"] = True
        tile("o", "shared", dY)
        target, tdt, written, store_from = "o", dY, False, "o"
    elif kind == "local_out":
        readable["a"] = True
        tile("r", "local", dR)
        target, tdt, written, store_from = "r", dR, False, "r"
    elif kind == "local_in":
        tile("r", "local", dR)
        stmts.append(Load("r", "A", prefix, loff))
        target, tdt, written, store_from = "r", dR, True, "r"
    else:                                             # fill
        readable["a"] = True
        tile("o", "shared", dY)
        lit = draw(st.sampled_from(["0", "1", "3"] + (FLOAT_LITS if dY in FLOATS else [])))
        stmts.append(Fill("o", Lit(lit, "." in lit or "e" in lit)))
        target, tdt, written, store_from = "o", dY, True, "o"
    tiles_map = {t.name: t for t in tiles}
    wrap = draw(st.sampled_from(["none", "none", "if", "for"]))
    loop_ints = ints + (["t"] if wrap == "for" else [])
    ctx = Ctx(tiles_map, readable, r, loop_ints, floats)
    if wrap == "for" and not written:                 # the loop may run 0 times: write the target first
        stmts.append(Fill(target, Lit("1", False)))
        written = True
    par = Par(tshape, body(draw, ctx, target, tdt, written))
    if wrap == "if":
        bcond = draw(st.sampled_from([
            Bin("==", Bin("%", Var("bx"), Lit("2", False)), Lit("0", False)),
            Bin("<", Var("bx"), Var("n")),
            Bin("||", Bin(">", Var("n"), Lit("2", False)), Bin("==", Var("bx"), Lit("1", False))),
        ] + ([Bin(">=", Bin("+", Var("bx"), Var("by")), Lit("1", False))] if R >= 2 else [])))
        lit = Lit("2", False) if tdt in INTS else Lit("0.5", True)
        stmts.append(If(bcond, [par], [Fill(target, lit)] if draw(st.booleans()) or not written else []))
    elif wrap == "for":
        stages = draw(st.sampled_from([None, None, 2]))
        start, step = ("", 1) if stages is not None or draw(st.booleans()) else \
            (draw(st.sampled_from(["1", "n", "-2", "3"])), draw(st.sampled_from([1, 2, -1, -2, 3])))
        stmts.append(For("t", draw(st.sampled_from(["n", "2", "3"])), stages, [par], start, step))
    else:
        stmts.append(par)
    stmts.append(Store(store_from, "Y", soff))
    return Program(f"{kind}{R}", tensors, tiles, stmts, space, sizes, threads, scalars,
                   run_fallback=draw(st.sampled_from([False] * 4 + [True])),
                   data_seed=draw(st.integers(0, 2 ** 32 - 1)), kind=kind)


@st.composite
def program(draw):
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(im2col_program())
    if kind == 1:
        return draw(gemm_program() if draw(st.booleans()) else conv_program())
    return draw(tile_program())
