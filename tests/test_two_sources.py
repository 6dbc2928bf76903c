"""One gemm operand tile filled by two K loops from different sources: two im2col
views (two convolutions summed into one accumulator, as a residual branch of
another channel count is) or a view and a plain tensor. Where the views' filter
taps need different swizzles (16 and 32 channels in a K tile of 64) the tile takes
the widest swizzle whose chunks tile both (tests/test_im2col_rules.py). The
interpreter and the GPU run each case against numpy, outputs in sentinel-filled
buffers."""
import numpy as np
import pytest

import tilec

from guard import guarded

SRC = """kernel two(X: f16[N, H, W, C1], Z: SECOND, Wt: f16[9 * C1, F], Vt: f16[9 * C2, F], Y: f32[NP, F]) {
    const C1 = 16, C2 = 16, BM = 64, BN = 64, BK = 64, S1 = 2, S2 = 2;
    require NP == N * H * W;
    let Xc = im2col(X, kernel = (3, 3), pad = (1, 1));
    VIEW
    grid (bx, by) = (cdiv(F, BN), cdiv(NP, BM));
    threads 128;
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    local acc: f32[BM, BN];
    fill(acc, 0);
    for k in pipelined(cdiv(9 * C1, BK), stages = S1) {
        copy(Xc[by * BM, k * BK], a);
        copy(Wt[k * BK, bx * BN], b);
        gemm(a, b, acc);
    }
    for k in pipelined(cdiv(9 * C2, BK), stages = S2) {
        copy(SOURCE[by * BM, k * BK], a);
        copy(Vt[k * BK, bx * BN], b);
        gemm(a, b, acc);
    }
    copy(acc, Y[by * BM, bx * BN]);
}
"""
VIEWS = (SRC.replace("SECOND", "f16[N, H, W, C2]").replace("VIEW", "let Zc = im2col(Z, kernel = (3, 3), pad = (1, 1));")
         .replace("SOURCE", "Zc"))
PLAIN = SRC.replace("SECOND", "f16[NP, 9 * C2]").replace("    VIEW\n", "").replace("SOURCE", "Z")
CASES = {"two views": (VIEWS, dict(S1=2, S2=3)), "two views, fewer stages second": (VIEWS, dict(S1=4, S2=1)),
         "a view and a tensor": (PLAIN, dict(S1=3, S2=2)), "32 channels": (VIEWS, dict(C1=32, C2=32, S1=2, S2=2)),
         # taps of different widths: the widest swizzle whose chunks tile both (32 and 64 bytes)
         "16 and 32 channels": (VIEWS, dict(C1=16, C2=32, S1=2, S2=3)),
         "128 and 32 channels": (VIEWS, dict(C1=128, C2=32, S1=3, S2=2)),
         # K tiles of 128 channels: two 128-byte chunks, one TMA load each
         "K tiles of 128": (VIEWS, dict(C1=128, C2=64, BK=128, S1=2, S2=2)),
         # taps of 8 and 24 channels: 16-byte chunks, not swizzled (wgmma's interleaved layout)
         "8 channels": (VIEWS, dict(C1=8, C2=8, S1=2, S2=2)),
         "8 and 24 channels": (VIEWS, dict(C1=8, C2=24, S1=3, S2=2)),
         "a view of 8 channels and a tensor": (PLAIN, dict(C1=8, S1=2, S2=3)),     # tiled loads of 16 bytes
         # 96 channels, no multiple of the K tile: 64-byte chunks
         "96 and 64 channels": (VIEWS, dict(C1=96, C2=64, S1=2, S2=3))}
SIZES = [(2, 5, 6, 64), (3, 7, 9, 136)]


def im2col(x):
    n, h, w, c = x.shape
    p = np.zeros((n, h + 2, w + 2, c))
    p[:, 1:-1, 1:-1] = x
    return np.concatenate([p[:, dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)], axis=-1) \
        .reshape(n * h * w, 9 * c)


def on(like, arrays):
    """The input arrays as the kernel takes them: numpy for the interpreter
    (`like` "numpy"), torch tensors on the GPU ("torch")."""
    if like == "numpy":
        return list(arrays)
    import torch
    return [torch.from_numpy(a).cuda() for a in arrays]


def run_exactly(src, like, args, outputs, wants, scalars=(), **consts):
    """Run `src` (the interpreter's kernel, or the GPU's: `like` "numpy" or
    "torch") on `args`, the guarded `outputs`' views and `scalars`; then
    nothing outside the views is written and each view equals its want exactly."""
    backend = {"backend": "interpret"} if like == "numpy" else {}
    tilec.compile(src, fallback=False, **backend, **consts)(*args, *(o.view for o in outputs), *scalars)
    if like == "torch":
        import torch
        torch.cuda.synchronize()
    for out, want in zip(outputs, wants):
        out.check()
        got = out.view if like == "numpy" else out.view.cpu().numpy()
        assert np.array_equal(got.astype(np.float64), want)


def problem(case, n, h, w, f, like):
    """The inputs (small integers: every sum is exact), a guarded output and the
    expected result."""
    src, consts = CASES[case]
    c1, c2 = consts.get("C1", 16), consts.get("C2", 16)
    rng = np.random.default_rng(n * h * w + f)
    x = rng.integers(-2, 3, (n, h, w, c1)).astype(np.float16)
    z = rng.integers(-2, 3, (n, h, w, c2) if src is VIEWS else (n * h * w, 9 * c2)).astype(np.float16)
    wt, vt = (rng.integers(-2, 3, (9 * c, f)).astype(np.float16) for c in (c1, c2))
    want = im2col(x) @ wt.astype(np.float64) + (im2col(z) if src is VIEWS else z.astype(np.float64)) @ vt
    return on(like, [x, z, wt, vt]), guarded((n * h * w, f), "f32", like=like), want


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("size", SIZES[:1])
def test_in_the_interpreter(case, size):
    src, consts = CASES[case]
    args, y, want = problem(case, *size, "numpy")
    run_exactly(src, "numpy", args, [y], [want], **consts)


@pytest.mark.parametrize("case", CASES)
def test_compiles_to_a_cubin(case):
    src, consts = CASES[case]
    k = tilec.compile(src, arch="sm_90a", **consts)
    assert k.cubin[:4] == b"\x7fELF" and k.compile_log == ""


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("size", SIZES)
def test_on_the_gpu(case, size):
    src, consts = CASES[case]
    args, y, want = problem(case, *size, "torch")
    run_exactly(src, "torch", args, [y], [want], **consts)


COLS = """kernel cols(X: f16[N, H, W, 16], Z: f16[N, H, W, 32], Y: f16[NP, 144], V: f16[NP, 288]) {
    require NP == N * H * W;
    let Xc = im2col(X, kernel = (3, 3), pad = (1, 1));
    let Zc = im2col(Z, kernel = (3, 3), pad = (1, 1));
    grid (bx, by) = (cdiv(288, 64), cdiv(NP, 64));
    threads 128;
    shared t: f16[64, 64];
    FIRST
    SECOND
}
"""
X_TO_Y = "if (bx * 64 < 144) {\n        copy(Xc[by * 64, bx * 64], t);\n        copy(t, Y[by * 64, bx * 64]);\n    }"
Z_TO_V = "copy(Zc[by * 64, bx * 64], t);\n    copy(t, V[by * 64, bx * 64]);"
ORDERS = {"16 then 32 channels": COLS.replace("FIRST", X_TO_Y).replace("SECOND", Z_TO_V),
          "32 then 16 channels": COLS.replace("FIRST", Z_TO_V).replace("SECOND", X_TO_Y)}


def cols_problem(like):
    rng = np.random.default_rng(5)
    x = rng.integers(-9, 9, (2, 5, 6, 16)).astype(np.float16)
    z = rng.integers(-9, 9, (2, 5, 6, 32)).astype(np.float16)
    return on(like, [x, z]), [guarded((60, 144), "f16", like=like), guarded((60, 288), "f16", like=like)], \
        [im2col(x), im2col(z)]


@pytest.mark.parametrize("order", ORDERS)
def test_a_tile_of_taps_from_views_of_16_and_32_channels(order):
    """A tile (not a gemm operand) filled from im2col views of 16 and 32 channels in
    a 64-wide K tile: it took the last view's chunks of 32 channels, and the launch
    refused the 16-channel view ("16 channels is not a multiple of the K tile width
    32", then the thread-copy variant ran). Its chunks are now 16 channels: a TMA
    load each, both views exact."""
    from tilec.compiler import lower
    assert [(b.layout, b.chunk) for b in lower(ORDERS[order]).stages["plan-tma"].buffers] == [("cols", 16)]
    run_exactly(ORDERS[order], "numpy", *cols_problem("numpy"))


@pytest.mark.gpu
@pytest.mark.parametrize("order", ORDERS)
def test_a_tile_of_taps_from_two_views_on_the_gpu(order):
    run_exactly(ORDERS[order], "torch", *cols_problem("torch"))


ONE = """kernel one(X: f16[N, H, W, {c}], Y: f16[NP, {k}]) {{
    require NP == N * H * W;
    let Xc = im2col(X, kernel = (3, 3), pad = (1, 1));
    grid (bx, by) = (cdiv({k}, 64), cdiv(NP, 64));
    threads 128;
    shared t: f16[64, 64];
    copy(Xc[by * 64, bx * 64], t);
    copy(t, Y[by * 64, bx * 64]);
}}
"""
STRADDLING = {24: 8, 96: 32, 40: 8}       # channels -> the chunk, gcd(C, 64)


def one_problem(c, like):
    rng = np.random.default_rng(c)
    x = rng.integers(-9, 9, (2, 5, 6, c)).astype(np.float16)
    return on(like, [x]), [guarded((60, 9 * c), "f16", like=like)], [im2col(x)]



@pytest.mark.parametrize("c", STRADDLING)
def test_a_tile_whose_k_tiles_straddle_taps(c):
    """A tile (not a gemm operand) filled from an im2col view whose fixed channel
    count is no multiple of the K tile (24, 40 or 96 channels in a 64-wide tile):
    its loads would straddle filter taps, so the launch refused the view and the
    thread-copy variant ran. It now takes chunks of gcd(C, 64) channels, one TMA
    load each."""
    from tilec.compiler import lower
    src = ONE.format(c=c, k=9 * c)
    assert [(b.layout, b.chunk) for b in lower(src).stages["plan-tma"].buffers] == [("cols", STRADDLING[c])]
    run_exactly(src, "numpy", *one_problem(c, "numpy"))


@pytest.mark.gpu
@pytest.mark.parametrize("c", STRADDLING)
def test_a_tile_whose_k_tiles_straddle_taps_on_the_gpu(c):
    run_exactly(ONE.format(c=c, k=9 * c), "torch", *one_problem(c, "torch"))


RING = """kernel ring(X: f16[N, H, W, {c}], Y: f32[NP, 64]) {{
    require NP == N * H * W;
    let Xc = im2col(X, kernel = (3, 3), pad = (1, 1));
    grid (bx, by) = (1, cdiv(NP, 64));
    threads 128;
    shared t: f16[64, 64];
    local acc: f32[64, 64];
    fill(acc, 0);
    for k in pipelined(cdiv(9 * {c}, 64), stages = {stages}) {{
        copy(Xc[by * 64, k * 64], t);
        parallel (i, j) in (64, 64) {{
            acc[i, j] = acc[i, j] + f32(t[i, j]);
        }}
    }}
    copy(acc, Y[by * 64, 0]);
}}
"""
RINGS = [(c, stages) for c in STRADDLING for stages in (2, 3)]


def ring_problem(c, like):
    """The K tiles of the view summed: the last one ends past its 9 * C columns,
    which read zero (the tile's columns past them are another tap's channels if
    the tap index wraps)."""
    rng = np.random.default_rng(c)
    x = rng.integers(-9, 9, (2, 5, 6, c)).astype(np.float16)
    tiles = -(-9 * c // 64)
    cols = np.zeros((60, tiles * 64))
    cols[:, :9 * c] = im2col(x)
    return on(like, [x]), [guarded((60, 64), "f32", like=like)], [cols.reshape(60, tiles, 64).sum(axis=1)]


@pytest.mark.parametrize("c, stages", RINGS)
def test_a_ring_of_tiles_whose_k_tiles_straddle_taps(c, stages):
    """The same chunked tile in a rotating pipelined loop: its copies (t's stage
    tiles) are chunked alike (they were row-major, so the threads read the
    chunks in the wrong places), and the last K tile reads zeros past the view's
    last column (a tap index that wrapped read the first tap's channels), copied
    from the module's zeros."""
    from tilec.compiler import lower
    src = RING.format(c=c, stages=stages)
    tiles = [(b.name, b.layout, b.chunk) for b in lower(src).kernel.buffers if b.scope == "shared"]
    assert tiles == [("t", "cols", STRADDLING[c])] + [(f"tl_t_stage{j}", "cols", STRADDLING[c])
                                                     for j in range(1, stages)]
    run_exactly(src, "numpy", *ring_problem(c, "numpy"))


@pytest.mark.gpu
@pytest.mark.parametrize("c, stages", RINGS)
def test_a_ring_of_tiles_whose_k_tiles_straddle_taps_on_the_gpu(c, stages):
    run_exactly(RING.format(c=c, stages=stages), "torch", *ring_problem(c, "torch"))
