"""The im2col legality checks: the launch-time validator's verdicts on a table of
parameter sets (from tma-reference.md §3, several verified on the H100 by
../shared/probes/encode_rules_probe.py), and the compile-time checks."""
import pytest
from hypothesis import given, settings, strategies as st

from tilec.compiler import lower
from tilec.errors import SemanticError
from tilec.ir.nodes import TmaLoad, walk_stmts
from tilec.runtime.tensormap import im2col_problems

F16, F32 = 2, 4


def nhwc(n, h, w, c):
    return (n, h, w, c), (h * w * c, w * c, c, 1)


# (name, dtype size, address, shape+strides, lower, upper, channels/pixel, pixels/column, element strides, legal)
CASES = [
    ("baseline", F16, 0, nhwc(8, 56, 56, 64), (-1, -1), (-1, -1), 64, 128, (1, 1, 1, 1), True),
    ("corner -128 (rank 4)", F16, 0, nhwc(8, 56, 56, 64), (-1, -128), (-1, -1), 64, 128, (1, 1, 1, 1), True),
    ("corner -129 (rank 4)", F16, 0, nhwc(8, 56, 56, 64), (-1, -129), (-1, -1), 64, 128, (1, 1, 1, 1), False),
    ("corner 127 (rank 4)", F16, 0, nhwc(8, 56, 56, 64), (0, 0), (127, 0), 64, 128, (1, 1, 1, 1), True),
    ("corner 128 (rank 4)", F16, 0, nhwc(8, 56, 56, 64), (0, 0), (128, 0), 64, 128, (1, 1, 1, 1), False),
    ("channels/pixel 256", F16, 0, nhwc(2, 8, 8, 256), (-1, -1), (-1, -1), 256, 64, (1, 1, 1, 1), True),
    ("channels/pixel 257", F16, 0, nhwc(2, 8, 8, 512), (-1, -1), (-1, -1), 257, 64, (1, 1, 1, 1), False),
    ("channels/pixel 0", F16, 0, nhwc(2, 8, 8, 64), (-1, -1), (-1, -1), 0, 64, (1, 1, 1, 1), False),
    ("channels/pixel 4 f16 (8 bytes)", F16, 0, nhwc(2, 8, 8, 64), (-1, -1), (-1, -1), 4, 64, (1, 1, 1, 1), False),
    ("channels/pixel 8 f16 (16 bytes)", F16, 0, nhwc(2, 8, 8, 64), (-1, -1), (-1, -1), 8, 64, (1, 1, 1, 1), True),
    ("channels/pixel 4 f32 (16 bytes)", F32, 0, nhwc(2, 8, 8, 4), (-1, -1), (-1, -1), 4, 64, (1, 1, 1, 1), True),
    ("channels/pixel 2 f32 (8 bytes)", F32, 0, nhwc(2, 8, 8, 4), (-1, -1), (-1, -1), 2, 64, (1, 1, 1, 1), False),
    ("pixels/column 1024", F16, 0, nhwc(8, 56, 56, 64), (-1, -1), (-1, -1), 8, 1024, (1, 1, 1, 1), True),
    ("load of 128 KiB", F16, 0, nhwc(8, 56, 56, 64), (-1, -1), (-1, -1), 64, 1024, (1, 1, 1, 1), True),
    ("load of 256 KiB", F16, 0, nhwc(8, 56, 56, 128), (-1, -1), (-1, -1), 128, 1024, (1, 1, 1, 1), False),
    ("f64 load of 256 KiB", 8, 0, nhwc(8, 56, 56, 256), (-1, -1), (-1, -1), 256, 128, (1, 1, 1, 1), False),
    ("pixel box of one pixel", F16, 0, nhwc(2, 8, 8, 16), (0, 0), (-7, -7), 16, 64, (1, 1, 1, 1), True),
    ("empty pixel box (upper)", F16, 0, nhwc(2, 8, 8, 16), (0, 0), (-8, -8), 16, 64, (1, 1, 1, 1), False),
    ("empty pixel box (lower)", F16, 0, nhwc(2, 8, 8, 16), (8, 8), (0, 0), 16, 64, (1, 1, 1, 1), False),
    ("pixels/column 1025", F16, 0, nhwc(8, 56, 56, 64), (-1, -1), (-1, -1), 8, 1025, (1, 1, 1, 1), False),
    ("pixels/column 1", F16, 0, nhwc(8, 56, 56, 64), (-1, -1), (-1, -1), 8, 1, (1, 1, 1, 1), True),
    ("pixels/column 0", F16, 0, nhwc(8, 56, 56, 64), (-1, -1), (-1, -1), 8, 0, (1, 1, 1, 1), False),
    ("f16 C=3: 6-byte pixel stride", F16, 0, nhwc(8, 56, 56, 3), (-1, -1), (-1, -1), 8, 64, (1, 1, 1, 1), False),
    ("f16 C=8: 16-byte pixel stride", F16, 0, nhwc(8, 56, 56, 8), (-1, -1), (-1, -1), 8, 64, (1, 1, 1, 1), True),
    ("f32 C=3", F32, 0, nhwc(1, 7, 7, 3), (0, 0), (0, 0), 4, 64, (1, 1, 1, 1), False),
    ("address +8", F16, 8, nhwc(8, 56, 56, 64), (-1, -1), (-1, -1), 64, 128, (1, 1, 1, 1), False),
    ("address +16", F16, 16, nhwc(8, 56, 56, 64), (-1, -1), (-1, -1), 64, 128, (1, 1, 1, 1), True),
    ("stride 8", F16, 0, nhwc(8, 56, 56, 64), (0, 0), (0, 0), 64, 128, (1, 8, 8, 1), True),
    ("stride 9", F16, 0, nhwc(8, 56, 56, 64), (0, 0), (0, 0), 64, 128, (1, 9, 1, 1), False),
    ("rank 3 corner -32768", F16, 0, ((4, 100, 64), (6400, 64, 1)), (-32768,), (0,), 64, 64, (1, 1, 1), True),
    ("rank 3 corner -32769", F16, 0, ((4, 100, 64), (6400, 64, 1)), (-32769,), (0,), 64, 64, (1, 1, 1), False),
    ("rank 3 corner 32767", F16, 0, ((4, 100, 64), (6400, 64, 1)), (0,), (32767,), 64, 64, (1, 1, 1), True),
    ("rank 5 corner -16", F16, 0, ((2, 8, 8, 8, 64), (32768, 4096, 512, 64, 1)), (-16, 0, 0), (0, 0, 0), 64, 64,
     (1, 1, 1, 1, 1), True),
    ("rank 5 corner -17", F16, 0, ((2, 8, 8, 8, 64), (32768, 4096, 512, 64, 1)), (-17, 0, 0), (0, 0, 0), 64, 64,
     (1, 1, 1, 1, 1), False),
    ("rank 5 corner 15", F16, 0, ((2, 8, 8, 8, 64), (32768, 4096, 512, 64, 1)), (0, 0, 0), (0, 0, 15), 64, 64,
     (1, 1, 1, 1, 1), True),
    ("rank 5 corner 16", F16, 0, ((2, 8, 8, 8, 64), (32768, 4096, 512, 64, 1)), (0, 0, 0), (0, 16, 0), 64, 64,
     (1, 1, 1, 1, 1), False),
    ("rank 2 is not im2col", F16, 0, ((56, 64), (64, 1)), (), (), 64, 64, (1, 1), False),
    ("rank 6 is not im2col", F16, 0, ((1, 2, 2, 2, 2, 64), (1024, 512, 256, 128, 64, 1)), (0,) * 4, (0,) * 4, 64, 64,
     (1,) * 6, False),
    ("non-contiguous channels", F16, 0, ((2, 8, 8, 64), (8192, 1024, 128, 2)), (-1, -1), (-1, -1), 64, 64,
     (1, 1, 1, 1), False),
    ("padded rows (legal strides)", F16, 0, ((2, 8, 8, 64), (9216, 1152, 128, 1)), (-1, -1), (-1, -1), 64, 64,
     (1, 1, 1, 1), True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_im2col_validator_verdicts(case):
    name, esize, addr, (shape, strides), lo, hi, cpp, ppc, es, legal = case
    problems = im2col_problems(esize, 0x7F0000000000 + addr, shape, strides, lo, hi, cpp, ppc, es)
    assert (problems == []) == legal, problems
    for p in problems:
        assert any(w in p for w in ("corner", "channelsPerPixel", "pixelsPerColumn", "stride", "aligned", "rank",
                                    "contiguous", "bytes", "pixel box")), p


SRC = """
kernel c(X: {dt}[N, H, W, C], Y: {dt}[NP, K]) {{
    const BM = {bm}, BK = {bk};
    grid (bx, by) = (cdiv(K, BK), cdiv(NP, BM));
    threads 128;
    let Xc = im2col(X, kernel = {k}, stride = {s}, pad = {p}, dilation = {d});
    shared t: {dt}[BM, BK];
    copy(Xc[by * BM, {k0}], t);
    copy(t, Y[by * BM, bx * BK]);
}}"""


@pytest.mark.parametrize("params, error", [
    (dict(bk=4), "an im2col load of 4 channels moves 8 bytes per pixel"),
    (dict(bk=512), "TMA needs 1 .. 256 channels"),
    (dict(bm=2048, bk=8), "TMA loads at most 1024"),
    (dict(bm=1024, bk=128), "the driver encodes at most 131072 bytes per im2col load"),
    (dict(k0="bx * 4"), "cannot prove the view column 'bx * 4' is a multiple of the tile width 64"),
    (dict(s=9), "an im2col stride of 9: TMA element strides are at most 8"),
    (dict(k="(3, 3)", p=129), "corners in [-128, 127]"),
    (dict(k="(3, 3, 3)"), "im2col kernel has 3 values; 'X' has 2 spatial dimensions"),
    (dict(p=-1), "im2col pad must be compile-time integers of at least 0"),
    (dict(dt="f32", bk=2), "an im2col load of 2 channels moves 8 bytes per pixel"),
])
def test_im2col_compile_time_rules(params, error):
    args = dict(dt="f16", bm=128, bk=64, k="(3, 3)", s=1, p=1, d=1, k0="bx * BK")
    args.update(params)
    with pytest.raises(SemanticError) as err:
        lower(SRC.format(**args))
    assert error in err.value.message


def test_legal_im2col_compiles():
    lower(SRC.format(dt="f16", bm=128, bk=64, k="(3, 3)", s=2, p=1, d=2, k0="bx * BK"))


TWO_VIEWS = """kernel two(X: f16[N, H, W, C1], Z: f16[N, H, W, C2], Wt: f16[9 * C1, F], Vt: f16[9 * C2, F], Y: f32[NP, F]) {
    require NP == N * H * W;
    let Xc = im2col(X, kernel = (3, 3), pad = (1, 1));
    let Zc = im2col(Z, kernel = (3, 3), pad = (1, 1));
    grid (bx, by) = (cdiv(F, 64), cdiv(NP, 64));
    threads 128;
    shared a: f16[64, 64];
    shared b: f16[64, 64];
    local acc: f32[64, 64];
    fill(acc, 0);
    for k in pipelined(cdiv(9 * C1, 64), stages = 2) {
        copy(Xc[by * 64, k * 64], a);
        copy(Wt[k * 64, bx * 64], b);
        gemm(a, b, acc);
    }
    for k in pipelined(cdiv(9 * C2, 64), stages = 2) {
        copy(Zc[by * 64, k * 64], a);
        copy(Vt[k * 64, bx * 64], b);
        gemm(a, b, acc);
    }
    copy(acc, Y[by * 64, bx * 64]);
}
"""


@pytest.mark.parametrize("consts, swizzle", [
    ("C1 = 16, C2 = 32", 32), ("C1 = 32, C2 = 16", 32),
    ("C1 = 32", 64),            # C2: a shape symbol, a multiple of 32 checked at launch
    ("C1 = 128, C2 = 32", 64),  # 128 channels: two 32-channel chunks of one tap a K tile
    ("C1 = 8, C2 = 16", 16),    # 16-byte chunks, not swizzled (wgmma's interleaved layout)
    ("C1 = 24, C2 = 24", 16),   # 48 bytes a tap: three 16-byte chunks, the K tile no multiple of C
    ("C1 = 96, C2 = 64", 64),   # 192 bytes a tap: three 64-byte chunks
    ("C1 = 4, C2 = 32", 64),    # 8 bytes a tap fit no TMA load: the launch check refuses X
])
def test_one_operand_tile_from_views_of_different_tap_swizzles(consts, swizzle):
    """A gemm operand filled from two im2col views whose filter taps need different
    swizzles (e.g. 16 and 32 channels of f16 in a 64-wide K tile) was an error; it
    now takes the widest swizzle whose chunks tile every view's taps, and each view
    loads one chunk of that width per TMA load."""
    k = lower(TWO_VIEWS.replace("    require", f"    const {consts};\n    require", 1)).stages["plan-tma"]
    assert k.buffer("a").swizzle == swizzle
    width = swizzle // 2
    tma = f"{swizzle}B" if swizzle > 16 else "none"
    assert {(m.name, m.box, m.swizzle) for m in k.tensor_maps if m.kind == "im2col"} == {
        ("tmap_Xc", (64, width), tma), ("tmap_Zc", (64, width), tma)}
    loads = [s for s in walk_stmts(k.body) if isinstance(s, TmaLoad) and s.view == "Xc"]
    assert [(s.bytes, s.smem_offset) for s in loads] == [(64 * width * 2, t * 64 * width * 2)
                                                          for t in range(64 // width)]


def test_one_operand_tile_from_views_of_one_tap_swizzle_compiles():
    lower(TWO_VIEWS.replace("    require", "    const C1 = 16, C2 = 16;\n    require", 1))
    lower(TWO_VIEWS)                      # both C symbols: 128-byte chunks, C % 64 checked at launch


CHANNELS = st.one_of(st.none(), st.integers(1, 40).map(lambda c: 8 * c), st.integers(1, 300))   # None: a symbol


@settings(max_examples=60, deadline=None)
@given(c1=CHANNELS, c2=CHANNELS, bk=st.sampled_from([16, 32, 48, 64, 96, 128]))
def test_an_operand_takes_the_widest_swizzle_that_fits_every_tap(c1, c2, bk):
    """Property: a gemm operand that im2col views of channel counts C1, C2 (fixed
    in the header, or shape symbols) fill takes the widest chunk (128, 64, 32 or 16
    bytes) that divides its K tile's bytes and every fixed C's bytes that TMA can
    load at all (multiples of 16), and each view loads one chunk a TMA load."""
    from test_two_sources import VIEWS
    fixed = ", ".join(f"{n} = {c}" for n, c in (("C1", c1), ("C2", c2)) if c is not None)
    old = "const C1 = 16, C2 = 16, BM = 64"
    assert VIEWS.count(old) == 1
    src = VIEWS.replace(old, f"const {fixed + ', ' if fixed else ''}BM = 64")
    k = lower(src, {"BK": bk}).stages["plan-tma"]
    loadable = [2 * c for c in (c1, c2) if c is not None and 2 * c % 16 == 0]
    want = max(sw for sw in (128, 64, 32, 16) if 2 * bk % sw == 0 and all(b % sw == 0 for b in loadable))
    assert k.buffer("a").swizzle == want
    assert {(m.box, m.swizzle) for m in k.tensor_maps if m.kind == "im2col"} == {
        ((64, want // 2), f"{want}B" if want > 16 else "none")}
