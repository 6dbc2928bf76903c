"""C++ number semantics on numpy: the C types of tilec's dtypes, conversions,
16- and 8-bit floats stored as bits (arithmetic in float), a correctly rounded
fused multiply-add, and C++'s binary operators (int32 wrap-around, truncating
`/` and `%`)."""
from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np

from ...errors import SemanticError
from ...ir import nodes as ir

I32, U8, U16, U32 = (np.dtype(t) for t in (np.int32, np.uint8, np.uint16, np.uint32))
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
_WRAPPED = {"f16", "bf16", "f8e4m3", "f8e5m2"}   # stored as bits, arithmetic in float (codegen/cuda.py)
_POISON = 0xFF                                     # fresh shared memory and registers: NaN / -1


_BITS = {"bf16": U16, "f8e4m3": U8, "f8e5m2": U8}


def storage_dtype(dt: ir.DType) -> np.dtype:
    """How the interpreter holds elements of `dt`: bf16 and fp8 as their bits."""
    return _BITS[dt.name] if dt.name in _BITS else np.dtype(dt.numpy)


def _promote(t):
    return I32 if t.kind == "b" or (t.kind in "iu" and t.itemsize < 4) else t


def common_type(a, b):
    """C++'s usual arithmetic conversions."""
    if F64 in (a, b):
        return F64
    if F32 in (a, b):
        return F32
    a, b = _promote(a), _promote(b)
    if a == b:
        return a
    if a.kind == b.kind:
        return a if a.itemsize >= b.itemsize else b
    u, s = (a, b) if a.kind == "u" else (b, a)
    return u if u.itemsize >= s.itemsize else s


def convert(v, t):
    """C++'s conversion of value `v` to type `t`: integers wrap, floats round to
    nearest even, float -> integer truncates and saturates (PTX cvt.rzi; NaN -> 0)."""
    if v.dtype == t:
        return v
    if t.kind == "f" or v.dtype.kind in "biu":
        return v.astype(t)
    x = np.trunc(np.asarray(v, F64))
    info = np.iinfo(t)
    big, nan = x >= float(info.max), np.isnan(x)
    out = np.where(big | nan, 0, np.maximum(x, float(info.min))).astype(t)
    return np.where(big, info.max, out).astype(t)


# the NaN fminf and fmaxf return for two NaN operands (fmin and fmax of doubles: the second's)
_CANONICAL_NAN = np.uint32(0x7FFFFFFF).view(F32)


def min_max(op, a, b):
    """tl_min / tl_max of a and b, already in their common type: of integers a < b ? a :
    b and a < b ? b : a; of floats fminf / fmaxf (fmin / fmax of doubles) as the GPU
    computes them (H200), IEEE 754-2019 minimumNumber / maximumNumber: a NaN operand
    gives the other operand, two give the canonical NaN (doubles: b), and -0 < +0."""
    if a.dtype.kind != "f":
        return np.where(a < b, a, b) if op == "min" else np.where(a < b, b, a)
    sign = 1 if op == "max" else -1
    with np.errstate(invalid="ignore"):
        r = (np.fmax if op == "max" else np.fmin)(a, b)
        r = np.where((a == 0) & (b == 0), (a * sign + b * sign) * sign, r)     # -0 + +0 = +0
    return np.where(np.isnan(a) & np.isnan(b), _CANONICAL_NAN if a.dtype == F32 else b, r).astype(a.dtype)


def _bf16_bits(f):
    bits = np.asarray(f, F32).view(U32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(U16)
    return np.where(np.isnan(f), np.uint16(0x7FFF), rounded)


def _f8_format(exp_bits, man_bits, bias, has_inf):
    """fp8 codes -> float values, and the sorted non-negative finite values."""
    codes = np.arange(256)
    e, m = (codes >> man_bits) & ((1 << exp_bits) - 1), codes & ((1 << man_bits) - 1)
    mag = np.where(e == 0, m / 2.0 ** man_bits * 2.0 ** (1 - bias), (1 + m / 2.0 ** man_bits) * 2.0 ** (e - bias))
    top = e == (1 << exp_bits) - 1
    if has_inf:                                   # e5m2: IEEE-like top exponent
        mag = np.where(top, np.where(m == 0, np.inf, np.nan), mag)
    else:                                         # e4m3fn: only S.1111.111 is NaN
        mag = np.where(top & (m == (1 << man_bits) - 1), np.nan, mag)
    values = np.where(codes >= 128, -mag, mag)
    finite = values[:128][np.isfinite(values[:128])]
    return values.astype(F32), finite


_F8 = {"f8e4m3": _f8_format(4, 3, 7, False), "f8e5m2": _f8_format(5, 2, 15, True)}


def _f8_bits(f, name):
    """float -> fp8 with round-to-nearest-even and satfinite (cvt.rn.satfinite)."""
    pos = _F8[name][1]
    x = np.asarray(f, F64)
    ax = np.abs(x)
    hi = np.clip(np.searchsorted(pos, ax), 1, len(pos) - 1)
    lo = hi - 1
    d_lo, d_hi = ax - pos[lo], pos[hi] - ax
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    code = np.where(np.signbit(x), code | 0x80, code)
    return np.where(np.isnan(x), 0x7F, code).astype(U8)


def decode(a, dt: ir.DType):
    """Stored elements -> their value in device arithmetic (exact)."""
    if dt.name == "f16":
        return a.astype(F32)
    if dt.name == "bf16":
        return (np.asarray(a).astype(U32) << 16).view(F32)
    if dt.name in _F8:
        return _F8[dt.name][0][a]
    return a


def encode(v, dt: ir.DType):
    """A value -> stored elements of `dt`, as C++ assigns it (f16_t(float) etc.)."""
    if dt.name == "f16":
        return convert(v, F32).astype(np.float16)
    if dt.name == "bf16":
        return _bf16_bits(convert(v, F32))
    if dt.name in _F8:
        return _f8_bits(convert(v, F32), dt.name)
    return convert(v, storage_dtype(dt))


# ---------------------------------------------------------------- fused multiply-add, correctly rounded

def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _round_odd_sum(a, b):
    """a + b (doubles) rounded to odd: the last bit records inexactness, so one
    more rounding to a format at least 2 bits narrower is correctly rounded."""
    s, e = _two_sum(np.asarray(a, F64), np.asarray(b, F64))
    s, e = np.asarray(s), np.asarray(e)
    fix = (e != 0) & ((s.view(np.int64) & 1) == 0) & np.isfinite(s)
    return np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)


def _split(a):
    c = 134217729.0 * a          # Veltkamp: 2^27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _fma(a, b, c, t):
    """fma(a, b, c) in type t (f32 or f64), rounded once."""
    if t == F32:                 # a * b is exact in double; round to odd, then to float
        return _round_odd_sum(np.asarray(a, F64) * np.asarray(b, F64), c).astype(F32)
    a, b, c = np.broadcast_arrays(np.asarray(a, F64), np.asarray(b, F64), np.asarray(c, F64))
    with np.errstate(over="ignore", invalid="ignore"):
        p = a * b                # double: Dekker's exact product, then Boldo-Melquiond
        (ah, al), (bh, bl) = _split(a), _split(b)
        pe = ((ah * bh - p) + ah * bl + al * bh) + al * bl
        th, tl = _two_sum(c, p)
        z = np.where(np.isfinite(p) & np.isfinite(th), th + _round_odd_sum(tl, pe), p + c).astype(F64)
    finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
    factor0 = (a == 0) | (b == 0)
    # A zero result takes its sign from IEEE's rules, which th + (tl + pe) loses (fma(x, 0, -0)
    # is -0, that sum +0): where a factor is 0 the exact zero product plus c, summed as floats;
    # where c is 0 the product rounded (it underflowed); where a representable product (pe 0)
    # cancels c, p + c (+0).
    zero = finite & (z == 0)
    if zero.any():
        z = np.where(zero & factor0, p + c, z)
        z = np.where(zero & ~factor0 & (c == 0), p, z)
        z = np.where(zero & ~factor0 & (c != 0) & (pe == 0), p + c, z)
    # Near the largest double the steps overflow where the answer need not: Veltkamp's split
    # from |x| >= 2^996 (2^27 x passes it), a product of split parts, the sum c + p; near the
    # smallest their error terms underflow (a product under 2^-900). Lanes of finite operands
    # where one did, and zeros left from a product that cancels c inexactly, are the exact
    # sum of rationals, rounded once.
    tiny = np.abs(p) < 2.0 ** -900
    exact = finite & (~(np.isfinite(pe) & np.isfinite(th)) | (tiny & ~factor0)
                      | ((z == 0) & (c != 0) & (pe != 0)))
    if not exact.any():
        return z
    z = np.array(z, F64)
    for at in map(tuple, np.argwhere(exact)):
        z[at] = _exact_fma(float(a[at]), float(b[at]), float(c[at]))
    return z


def _exact_fma(a: float, b: float, c: float) -> float:
    """a * b + c of finite doubles, rounded once to nearest even (Python's int / int is
    correctly rounded); past the largest double, its infinity."""
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        return a * b + c        # a zero factor: IEEE's signed zero, as the float sum gives it
    try:
        return exact.numerator / exact.denominator
    except OverflowError:
        return float("inf") if exact > 0 else float("-inf")


@functools.lru_cache(maxsize=None)
def _f32_literal(v: float):
    """`repr(v) + "f"`, the literal the CUDA has, rounded straight from its
    decimal text to float (not through double)."""
    f = np.float32(v)
    if not np.isfinite(f):
        return f
    exact = Fraction(repr(v))
    with np.errstate(all="ignore"):
        cands = [c for c in (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf)))
                 if np.isfinite(c)]
    return min(cands, key=lambda c: (abs(Fraction(float(c)) - exact), int(np.array(c).view(U32)) & 1))


def arith(op, a, b, e=None):
    """A binary operator of C++ on two typed values."""
    t = common_type(a.dtype, b.dtype)
    a, b = convert(a, t), convert(b, t)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op in ("/", "%"):
        if t.kind == "f":
            if op == "%":
                raise SemanticError("'%' on floating-point values: C++ has no such operator, so the generated "
                                    "CUDA does not compile", e.span if e is not None else None)
            return a / b
        r = np.fmod(a, b)                          # C: the remainder has the dividend's sign
        return r if op == "%" else (a - r) // b    # ... and the quotient truncates
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    if op == ">=":
        return a >= b
    raise TypeError(f"cannot interpret operator {op}")
