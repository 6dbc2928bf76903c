"""Property tests of the TMA legality checks:

(a) runtime.tensormap.tiled_problems against an oracle written from the
    cuTensorMapEncodeTiled table (../shared/docs/tma-reference.md §2);
(b) ir.exprs.divisor, the fact the compile-time alignment proof rests on, is sound;
(c) plan-tma accepts an innermost coordinate `bx * BN` exactly when BN * elsize
    is a multiple of 16 bytes."""
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tilec import SemanticError
from tilec.compiler import lower
from tilec.errors import Source
from tilec.ir import nodes as ir
from tilec.ir.exprs import divisor, fold
from tilec.runtime.tensormap import tiled_problems

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------- (a) the encode table

SWIZZLE_SPAN = {"32B": 32, "64B": 64, "128B": 128}


def broken_rules(size, address, shape, strides, box, element_strides, swizzle):
    """The rules of tma-reference.md §2 that these arguments break (outermost
    first, strides in elements; the table's arrays are innermost first)."""
    broken = set()
    if address % 16:
        broken.add("address")                   # globalAddress 16-byte aligned
    if any(not 1 <= n <= 2**32 for n in shape):
        broken.add("dim")                       # globalDim[i] in 1 .. 2^32
    if strides[-1] != 1 and shape[-1] != 1:
        broken.add("contiguous")                # dim 0 (innermost) is contiguous by definition
    for s in strides[:-1]:                      # globalStrides: dims 1 .. rank-1, in bytes
        if (s * size) % 16 or not 0 <= s * size < 2**40:
            broken.add("stride")
    if any(not 1 <= b <= 256 for b in box):
        broken.add("box")                       # boxDim[i] in 1 .. 256
    if (box[-1] * size) % 16:
        broken.add("inner")                     # boxDim[0] * elsize a multiple of 16 bytes
    if swizzle != "none" and box[-1] * size > SWIZZLE_SPAN[swizzle]:
        broken.add("swizzle")                   # boxDim[0] * elsize <= the swizzle span
    if any(not 1 <= e <= 8 for e in element_strides):
        broken.add("element stride")            # elementStrides[i] in 1 .. 8
    n = size
    for b, e in zip(box, element_strides):
        n *= b // e if e > 0 else 1
    if n > 228 * 1024 and all(e > 0 for e in element_strides):
        broken.add("box bytes")                 # not in the table: the H100's driver (test_gpu_validator.py)
    return broken


# Each message must name exactly one rule.
MESSAGE_RULES = {
    "address": r"^base address 0x[0-9a-f]+ is not 16-byte aligned",
    "dim": r"^dim \d+ is -?\d+; TMA dims are 1 \.\. 2\^32$",
    "contiguous": r"^innermost dim \d+ has stride -?\d+ elements; TMA needs it contiguous",
    "stride": r"^(row|dim \d+) stride -?\d+ bytes is (not a multiple of 16|outside TMA's 0 \.\. 2\^40)",
    "box": r"^box dim \d+ is -?\d+; TMA boxes are 1 \.\. 256 per dim$",
    "inner": r"^the box's inner dimension is -?\d+ bytes; TMA needs a multiple of 16$",
    "swizzle": r"^the box's inner dimension is \d+ bytes, more than the (32B|64B|128B) swizzle span$",
    "element stride": r"^element stride -?\d+ in dim \d+ is outside TMA's 1 \.\. 8$",
    "box bytes": r"^the box brings \d+ bytes; the driver encodes at most 233472 \(228 KiB",
}


def rule_of(message):
    rules = [r for r, pattern in MESSAGE_RULES.items() if re.search(pattern, message)]
    assert len(rules) == 1, f"message {message!r} names rules {rules}"
    return rules[0]


RULES = sorted(MESSAGE_RULES)


@st.composite
def tiled_args(draw):
    """A legal map (a row-major tensor with padded rows, a box of whole 16-byte
    rows), then, half the time, a few rules broken on purpose. The oracle judges
    the result on its own: a change may break more rules than it aimed at, or none."""
    size = draw(st.sampled_from([1, 2, 4, 8]))
    rank = draw(st.integers(1, 5))
    step = 16 // size                                   # elements per 16 bytes
    address = 16 * draw(st.integers(0, 2**24))
    shape = draw(st.lists(st.integers(1, 3000), min_size=rank, max_size=rank))
    strides = [1]
    for n in reversed(shape[1:]):
        packed = strides[0] * n
        strides.insert(0, -(-packed // step) * step + step * draw(st.integers(0, 3)))
    box = draw(st.lists(st.integers(1, 256), min_size=rank, max_size=rank))
    box[-1] = step * draw(st.integers(1, 256 // step))
    element_strides = draw(st.lists(st.integers(1, 8), min_size=rank, max_size=rank))
    swizzle = draw(st.sampled_from(["none", "32B", "64B", "128B"]))
    if swizzle != "none":
        box[-1] = min(box[-1], SWIZZLE_SPAN[swizzle] // size)

    dim = draw(st.integers(0, rank - 1))
    for rule in (draw(st.sets(st.sampled_from(RULES), min_size=1, max_size=3)) if draw(st.booleans()) else ()):
        if rule == "address":
            address += draw(st.sampled_from([1, 2, 4, 8]))
        elif rule == "dim":
            shape[dim] = draw(st.sampled_from([0, 2**32 + 1, 2**33]))
        elif rule == "contiguous":
            strides[-1] = draw(st.sampled_from([0, 2, 3]))
        elif rule == "stride" and rank > 1:
            d = min(dim, rank - 2)
            strides[d] = draw(st.sampled_from([strides[d] + 1, -step, 2**40 // size, 2**41 // size]))
        elif rule == "box":
            box[dim] = draw(st.sampled_from([0, 257, 1024]))
        elif rule == "inner" and step > 1:
            box[-1] += draw(st.integers(1, step - 1))
        elif rule == "swizzle":
            swizzle = draw(st.sampled_from(["32B", "64B"]))
            box[-1] = 2 * SWIZZLE_SPAN[swizzle] // size
        elif rule == "element stride":
            element_strides[dim] = draw(st.sampled_from([0, 9, 16]))
        elif rule == "box bytes" and rank > 1:
            box[:-1] = [256] * (rank - 1)
            element_strides[:-1] = [1] * (rank - 1)
    return size, address, shape, strides, box, element_strides, swizzle


@SETTINGS
@given(tiled_args())
@example((4, 0, [1000, 1000], [1000, 1], [64, 128], [1, 1], "none"))          # legal
@example((2, 0, [7, 3], [3, 1], [7, 8], [1, 1], "none"))                      # 6-byte rows
@example((4, 8, [10, 10], [16, 1], [8, 4], [1, 1], "none"))                   # 8-byte aligned base
@example((4, 0, [10, 64], [64, 1], [10, 64], [1, 1], "128B"))                 # 256-byte box, 128B swizzle
@example((1, 0, [2**32], [1], [16], [1], "none"))                             # the largest dim
@example((1, 0, [2**32 + 1], [1], [16], [1], "none"))                         # dim too large
@example((8, 0, [4, 4], [2**37, 1], [4, 2], [1, 1], "none"))                  # stride 2^40 bytes
@example((8, 0, [1, 1, 1], [16, 16, 1], [114, 64, 4], [1, 1, 1], "none"))    # a 228 KiB box: the most
@example((8, 0, [1, 1, 1], [2, 2, 1], [82, 89, 4], [1, 1, 1], "none"))       # 233536 bytes: refused on the H100
@example((8, 0, [9, 9, 9], [16, 16, 1], [229, 64, 4], [2, 1, 1], "none"))    # 114 x 64 x 4 x 8 with stride 2: legal
def test_tiled_problems_match_the_encode_table(args):
    problems = tiled_problems(*args)
    expected = broken_rules(*args)
    assert (problems == []) == (not expected)
    assert {rule_of(m) for m in problems} == expected


def test_tiled_problems_rank_outside_1_to_5():
    assert tiled_problems(4, 0, [2] * 6, [1] * 6, [1] * 6, [1] * 6) == ["rank 6 is outside TMA's 1..5"]


def test_tiled_problems_messages():
    assert tiled_problems(2, 0, [7, 3], [3, 1], [7, 8], [1, 1]) == \
        ["row stride 6 bytes is not a multiple of 16 (TMA requires 16-byte aligned strides)"]
    assert tiled_problems(4, 0, [5, 7, 8], [70, 10, 1], [1, 1, 4], [1, 1, 1]) == [
        "dim 0 stride 280 bytes is not a multiple of 16 (TMA requires 16-byte aligned strides)",
        "row stride 40 bytes is not a multiple of 16 (TMA requires 16-byte aligned strides)"]
    assert tiled_problems(4, 0x1004, [64, 64], [64, 1], [64, 32], [1, 1], "64B") == [
        "base address 0x1004 is not 16-byte aligned (TMA requires 16-byte aligned tensors)",
        "the box's inner dimension is 128 bytes, more than the 64B swizzle span"]


# ---------------------------------------------------------------- (b) divisor is sound

NAMES = ("x", "y", "z")

leaves = st.one_of(st.integers(-64, 64).map(ir.Int), st.sampled_from(NAMES).map(ir.Var))
exprs = st.recursive(
    leaves,
    lambda sub: st.one_of(
        st.builds(ir.BinOp, st.sampled_from(["+", "-", "*"]), sub, sub),
        st.builds(lambda e: ir.UnaryOp("-", e), sub)),
    max_leaves=12)


def evaluate(e, env):
    """C++'s value of integer expression `e` at the names' values `env` (the brute-force
    side here and in test_shared_bounds: + - * / % with truncating / and %, unary -,
    min, max, abs)."""
    if isinstance(e, ir.Int):
        return e.value
    if isinstance(e, ir.Var):
        return env[e.name]
    if isinstance(e, ir.UnaryOp):
        return -evaluate(e.operand, env)
    if isinstance(e, ir.Call):
        xs = [evaluate(x, env) for x in e.args]
        return abs(xs[0]) if e.func == "abs" else min(xs) if e.func == "min" else max(xs)
    a, b = evaluate(e.lhs, env), evaluate(e.rhs, env)
    if e.op in ("/", "%"):
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)
        return q if e.op == "/" else a - b * q
    return {"+": a + b, "-": a - b, "*": a * b}[e.op]


@SETTINGS
@given(exprs, st.lists(st.fixed_dictionaries({n: st.integers(-10**6, 10**6) for n in NAMES}), min_size=1,
                       max_size=8))
def test_divisor_divides_every_value(e, envs):
    d = divisor(e)
    assert d >= 0
    for env in envs:
        value = evaluate(e, env)
        if d == 0:
            assert value == 0, "divisor 0 claims the expression is always 0"
        else:
            assert value % d == 0


@SETTINGS
@given(exprs, st.fixed_dictionaries({n: st.integers(-10**6, 10**6) for n in NAMES}))
def test_folding_keeps_the_value_and_the_divisor_sound(e, env):
    # plan-tma sees folded expressions
    f = fold(e)
    assert evaluate(f, env) == evaluate(e, env)
    d = divisor(f)
    assert (evaluate(f, env) == 0) if d == 0 else evaluate(f, env) % d == 0


@pytest.mark.parametrize("text, d", [
    ("x * 24", 24), ("24 * x", 24), ("x * 24 + 8", 8), ("(x + 1) * 16", 16), ("x * 4 * 8", 32),
    ("x * 64 - 16 * y", 16), ("-(x * 12)", 12), ("0", 0), ("x * 0", 0), ("x", 1), ("x * y", 1),
])
def test_divisor_examples(text, d):
    # parse the expression as a const-free grid size of a tiny kernel
    k = lower(Source("t.tile", f"kernel k(A: f32[x, y]) {{ grid (bx) = ({text}); threads 32; }}")).stages["parse"]
    assert divisor(k.grid[0]) == d


# ---------------------------------------------------------------- (c) plan-tma's inner coordinate proof

SIZES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4,
         "i64": 8, "u64": 8, "f8e4m3": 1, "f8e5m2": 1}
# coordinates whose proven divisor is exactly BN (bx and by are unknown block indices)
COORDS = ["bx * BN", "BN * bx", "(bx + 1) * BN", "bx * BN - BN", "by * BN + bx * BN"]


@SETTINGS
@given(st.sampled_from(sorted(SIZES)), st.integers(1, 300), st.sampled_from(COORDS), st.booleans())
@example("f32", 3, "bx * BN", True)
@example("f32", 4, "bx * BN", True)
@example("f16", 8, "bx * BN", False)
@example("u8", 8, "bx * BN", True)
def test_inner_coordinate_is_accepted_exactly_when_aligned(dt, bn, coord, load):
    # the tile is [8, 16], a legal box for every dtype, so only the coordinate can be rejected
    copy = f"copy(A[by * 8, {coord}], s);" if load else f"copy(s, A[by * 8, {coord}]);"
    program = f"""\
kernel k(A: {dt}[M, N]) {{
    const BN = {bn};
    grid (bx, by) = (cdiv(N, BN), cdiv(M, 8));
    threads 128;
    shared s: {dt}[8, 16];
    {copy}
}}
"""
    # a store at a coordinate that may be negative is a thread copy (TMA stores fault there): any BN
    aligned = bn * SIZES[dt] % 16 == 0 or (not load and coord == "bx * BN - BN")
    try:
        lower(Source("t.tile", program))
    except SemanticError as err:
        assert not aligned, str(err)
        assert err.message.startswith("cannot prove the innermost coordinate")
        start = program.splitlines()[5].index(coord) + 1
        assert err.span.line == 6 and start <= err.span.col < start + len(coord)     # the caret is on it
    else:
        assert aligned, f"BN = {bn} with {dt} was accepted"


@pytest.mark.parametrize("e, want", [
    (ir.BinOp("*", ir.Int(0), ir.Var("C", "symbol")), ir.Int(0)),
    (ir.BinOp("/", ir.Int(0), ir.BinOp("+", ir.Var("k", "loop"), ir.Var("C", "symbol"))), ir.Int(0)),
    (ir.BinOp("%", ir.Int(0), ir.Var("C", "symbol")), ir.Int(0)),
    (ir.BinOp("*", ir.Var("bx", "block"), ir.Int(0)), ir.Int(0)),
    # a float may be Inf or NaN (0 * Inf is NaN), and 0 / 0.0 is NaN: kept
    (ir.BinOp("*", ir.Int(0), ir.Var("alpha", "scalar")), None),
    (ir.BinOp("/", ir.Int(0), ir.Var("alpha", "scalar")), None),
    (ir.BinOp("&&", ir.BinOp("==", ir.Var("C", "symbol"), ir.Int(8)), ir.Int(0)), ir.Int(0)),
    (ir.BinOp("||", ir.Int(3), ir.Var("alpha", "scalar")), ir.Int(1)),
    (ir.BinOp("&&", ir.Var("C", "symbol"), ir.Int(1)), None),
])
def test_folding_a_zero_or_a_decided_condition(e, want):
    assert fold(e) == (e if want is None else want)
