"""Generated gemm kernels over the wgmma tile shapes plan-gemm takes: tile sizes,
K depths (128-, 64- and 32-byte swizzled operand rows; 16-byte rows, not
swizzled, for a warpgroup's 8 or 24 M/N-major columns), warpgroups split over M
or N, and each operand in either major order. Shared by the CPU and GPU tests."""

GEMM = """
kernel g(A: {dt}[{ashape}], B: {dt}[{bshape}], C: {ct}[M, N]) {{
    const BM = {bm}, BN = {bn}, BK = {bk};
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads {threads};
    shared a: {dt}[{atile}];
    shared b: {dt}[{btile}];
    local acc: f32[BM, BN];
    fill(acc, 0);
    for k in pipelined(cdiv(K, BK), stages = {stages}) {{
        copy(A[{acoord}], a);
        copy(B[{bcoord}], b);
        gemm(a, b, acc{flags});
    }}
    copy(acc, C[by * BM, bx * BN]);
}}
"""

# (BM, BN, BK, threads): what each one exercises
SHAPES = [
    (128, 128, 64, 256),    # 2 warpgroups over M, 128-byte rows (the examples' shape)
    (64, 256, 64, 256),     # BM = 64: 2 warpgroups over N, 128 columns each
    (64, 128, 64, 256),     # 2 warpgroups over N, 64 columns each
    (128, 128, 32, 256),    # K depth 32: 64-byte swizzle
    (128, 128, 16, 256),    # K depth 16: 32-byte swizzle
    (64, 64, 32, 128),      # one warpgroup
    (128, 96, 64, 256),     # N = 96: N-major b in 64-byte chunks
    (64, 192, 64, 256),     # over N, 96 columns each
    (192, 128, 64, 384),    # 3 warpgroups over M
    (128, 256, 32, 256),    # wide and shallow
    (64, 48, 48, 256),      # 24 columns per warpgroup: an N-major b in 16-byte chunks, not swizzled; K = 48:
                            # 32-byte swizzle, 3 chunks
    # M not a multiple of 64: swapped, wgmma computes acc^T = b^T @ a^T (B's columns on its rows, M its N)
    (16, 128, 64, 128),     # one warpgroup, 2 m64 tiles of B's columns, m64n16
    (16, 128, 64, 256),     # 2 warpgroups over B's columns
    (16, 64, 64, 256),      # 2 warpgroups over M: m64n8 each; an M-major a in 16-byte chunks, not swizzled
    (8, 64, 64, 128),       # m64n8
    (32, 256, 32, 256),     # K depth 32: 64-byte swizzle
    (96, 128, 64, 256),     # 96 rows: m64n96
    (48, 192, 16, 384),     # 3 warpgroups over B's columns, K depth 16
    # warpgroups over N that split it unevenly (N / warpgroups rounded up to 8, the last one what is left)
    (64, 24, 64, 256),      # 16 + 8 columns: both m64n16, the last reading 8 columns past b (its overrun)
    (64, 200, 64, 256),     # 104 + 96, 16-byte chunks (104 columns are no 32-byte chunks)
    (64, 128, 32, 384),     # 48 + 48 + 32
    (40, 64, 64, 256),      # swapped: 40 rows are wgmma's N, 24 + 16
    # neither side a multiple of 64: N padded to m64 tiles, swapped (wgmma reads b past its columns into
    # registers that hold no element)
    (32, 48, 64, 128),      # acc^T: 48 of 64 rows, m64n32
    (32, 40, 64, 256),      # acc^T: 40 of 64 rows, its 32 columns over 2 warpgroups: m64n16 each
    (96, 96, 64, 256),      # acc^T: 2 warpgroups over its rows, the second's rows 96 .. 127 padding
    (40, 24, 32, 128),      # acc^T: 24 of 64 rows, m64n40, K depth 32
    (8, 40, 64, 128),       # acc^T: 40 of 64 rows, m64n8
    (72, 40, 32, 128),      # acc^T: 40 of 64 rows, m64n72
    (8, 200, 64, 256),      # acc^T: 200 of 256 rows over 2 warpgroups, m64n8
    # ... and M padded, as is, where N's last m64 tile would hold 8 rows on one warpgroup row (every thread's
    # second fragment row padding: ptxas serializes the wgmmas)
    (16, 8, 16, 128),       # the smallest: m64n8k16, 16 rows of 64
    (32, 72, 64, 128),      # m64n72, rows 32 .. 63 padding
    (40, 136, 32, 256),     # 40 rows (warp 2's second 8 padding), split unevenly over N: 72 + 64, K depth 32
    (96, 136, 64, 256),     # 2 warpgroups over M, the second's rows 96 .. 127 padding
]


# K tiles of more than 256 rows: a [BK, BN] b whose chunks (32-byte rows at BN = 16, 64-byte at 32) load in two
# boxes of 136 rows; the second starts at the swizzle pattern's period (256 / 512 bytes), not 1024-aligned
DEEP = [(64, 16, 272, 128), (64, 32, 272, 128)]


def source(bm, bn, bk, threads, transpose_a=False, transpose_b=False, dt="f16", ct="f32", stages=2):
    return GEMM.format(
        dt=dt, ct=ct, bm=bm, bn=bn, bk=bk, threads=threads, stages=stages,
        ashape="K, M" if transpose_a else "M, K", bshape="N, K" if transpose_b else "K, N",
        atile="BK, BM" if transpose_a else "BM, BK", btile="BN, BK" if transpose_b else "BK, BN",
        acoord="k * BK, by * BM" if transpose_a else "by * BM, k * BK",
        bcoord="bx * BN, k * BK" if transpose_b else "k * BK, bx * BN",
        flags=(", transpose_a = true" if transpose_a else "") + (", transpose_b = true" if transpose_b else ""))


def _orientation(bm, bn, threads, keep_rows=False):
    """(swapped, the rows wgmma computes where they are padded, else 0) as plan-gemm picks them: as is where M
    is a multiple of 64; else acc^T = b^T @ a^T, its N rows padded to m64 tiles where N is no multiple of 64;
    or as is, M padded, where that cannot be: N's last m64 tile 8 rows on one warpgroup row, or M not split
    over the warpgroups' columns (each a multiple of 8 of at most 256, the last owning some). `keep_rows` (a
    parallel over acc reads a 1-D local tile at [i]): M padded first."""
    wg = threads // 128

    def pad(x):
        return -(-x // 64) * 64

    def plan(swap):
        real, other = (bn, bm) if swap else (bm, bn)
        rows = rows_over(pad(real), wg)
        cols = wg // rows
        width = split_width(other, cols)
        if real % 8 or other % 8 or width > 256 or other - width * (cols - 1) <= 0:
            return None
        if pad(real) > real and rows == 1 and real % 64 == 8:
            return None
        return swap, pad(real) if pad(real) > real else 0
    if bm % 64 == 0 or bm % 8:
        return False, 0
    first = not keep_rows
    return plan(first) or plan(not first) or (bn % 64 == 0, 0)       # (the last: refused)


def rows_over(m, wg) -> int:
    """Warpgroups over a product of m rows (a multiple of 64): as many as keep whole m64 tiles each
    and divide the block's (plan-gemm's _split)."""
    rows = wg
    while rows > 1 and m % (64 * rows):
        rows -= 1
    while wg % rows:
        rows -= 1
    return rows


def swapped(bm, bn, threads, keep_rows=False) -> bool:
    """Whether the tile runs as acc^T = b^T @ a^T (_orientation)."""
    return _orientation(bm, bn, threads, keep_rows)[0]


def padded(bm, bn, threads) -> int:
    """The rows wgmma computes for a tile of neither side a multiple of 64 (M padded to m64 tiles, or N of
    acc^T), else 0."""
    return _orientation(bm, bn, threads)[1]


def split(bm, bn, threads):
    """(rows wgmma computes, its columns, warpgroups over those columns) as plan-gemm splits them."""
    swap, rows = _orientation(bm, bn, threads)
    m, n = (rows or bn, bm) if swap else (rows or bm, bn)
    wg = threads // 128
    return m, n, wg // rows_over(m, wg)


def split_width(n, over_n) -> int:
    """Each warpgroup's columns: N / over_n rounded up to a multiple of 8 (the last takes what is left)."""
    return -(-n // (8 * over_n)) * 8


def swizzle(row_bytes) -> int:
    """The widest swizzle whose rows tile `row_bytes` (16: 16-byte rows, not swizzled)."""
    return next(s for s in (128, 64, 32, 16) if row_bytes % s == 0)


def cases():
    for shape in SHAPES:
        for ta in (False, True):
            for tb in (False, True):
                yield shape, ta, tb


def case_id(c):
    (bm, bn, bk, th), ta, tb = c
    return f"{bm}x{bn}x{bk}t{th}" + ("-ta" if ta else "") + ("-tb" if tb else "")


def check_gemm_against_numpy(k, m, n, kk):
    """Run gemm kernel `k` (A [m, kk] @ B [kk, n], f16) on numpy operands into a
    guarded output and compare with numpy's product."""
    import numpy as np
    from guard import guarded
    rng = np.random.default_rng(m * 7 + n * 3 + kk)
    a = rng.standard_normal((m, kk)).astype(np.float16)
    b = rng.standard_normal((kk, n)).astype(np.float16)
    c = guarded((m, n), "f16", like="numpy")
    k(a, b, c.view)
    c.check()
    np.testing.assert_allclose(c.view.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32),
                               rtol=2e-2, atol=5e-2)


# A local tile beside the accumulator in an epilogue: it takes the accumulator's fragment layout.
BESIDE = """
kernel g(A: f16[M, K], B: f16[K, N], C: {ot}[M, N]) {{
    const BM = {bm}, BN = 128, BK = 64;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 2 * max(BM, 64);
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    local acc: f32[BM, BN];
    local out: {ot}[BM, BN];
    fill(acc, 0);
    for k in pipelined(cdiv(K, BK), stages = 3) {{
        copy(A[by * BM, k * BK], a);
        copy(B[k * BK, bx * BN], b);
        gemm(a, b, acc);
    }}
    parallel (i, j) in (BM, BN) {{
        out[i, j] = acc[i, j] * 2.0 + (by * BM + i) - (bx * BN + j) * 0.5;
    }}
    copy(out, C[by * BM, bx * BN]);
}}
"""



# An unevenly split accumulator's epilogue (or one padded to m64 tiles): a parallel that reads shared memory
# (the registers past N read column N - 1, those past M row M - 1), one that writes it (they are skipped),
# through a shared tile stored by TMA.
UNEVEN = """
kernel g(A: f16[M, K], B: f16[K, N], Bias: f32[M, N], C: f32[M, N]) {{
    const BM = {bm}, BN = {bn}, BK = 64;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads {threads};
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    shared s: f32[BM, BN];
    local acc: f32[BM, BN];
    fill(acc, 0);
    for k in pipelined(cdiv(K, BK), stages = 3) {{
        copy(A[by * BM, k * BK], a);
        copy(B[k * BK, bx * BN], b);
        gemm(a, b, acc);
    }}
    copy(Bias[by * BM, bx * BN], s);
    parallel (i, j) in (BM, BN) {{
        acc[i, j] = acc[i, j] * 2.0 + s[i, j];
    }}
    parallel (i, j) in (BM, BN) {{
        s[i, j] = acc[i, j] - 1.0;
    }}
    copy(s, C[by * BM, bx * BN]);
}}
"""
# (BM, BN, threads): split unevenly over N; N padded to m64 tiles, swapped (acc^T's 40 of 64 rows, its 32,
# 24 + 16, 48 + 48, 8 or 72 columns); M padded where N's padding cannot be (32 of 64, 40 of 64 and split
# unevenly, 96 of 128 over two warpgroups)
UNEVEN_SPLITS = [(64, 24, 256), (64, 40, 256), (64, 200, 256), (64, 128, 384), (64, 40, 384),
                 (32, 40, 128), (40, 24, 256), (96, 40, 256), (8, 40, 128), (72, 40, 128),
                 (32, 72, 128), (40, 136, 256), (96, 136, 256)]


def uneven_operands(bm, bn):
    """(A, B, Bias, the expected C) for UNEVEN at BM, BN = bm, bn: small integers (exact sums), two column
    tiles and a ragged third, rows past a tile."""
    import numpy as np
    rng = np.random.default_rng(bn if bm == 64 else bm * 1000 + bn)
    m, n, k = 100, 2 * bn + 8, 200
    a = rng.integers(-3, 4, (m, k)).astype(np.float16)
    b = rng.integers(-3, 4, (k, n)).astype(np.float16)
    bias = rng.integers(-8, 9, (m, n)).astype(np.float32)
    want = 2 * (a.astype(np.float32) @ b.astype(np.float32)) + bias - 1
    return a, b, bias, want
