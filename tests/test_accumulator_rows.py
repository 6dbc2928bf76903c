"""1-D local tiles kept in a gemm accumulator's rows (layout 'rows', language.md
§12): a reduce of the accumulator's rows into one (a shuffle, no shared memory),
`parallel` bodies over its rows (each row on the 4 lanes of its quad, lane 0
writing shared tiles), and `parallel` bodies over the accumulator reading it at
[i]. The interpreter and the GPU against numpy over warpgroup counts and m64 tiles
per warpgroup, with guarded outputs; the placement's refusals, each at its line."""
import warnings

import numpy as np
import pytest

import tilec
from tilec.compiler import lower

from guard import guarded

SRC = """kernel row_stats(A: f16[M, K], B: f16[K, N], C: f32[M, N], R: f32[NB, M], T: f32[NB, M]) {
    const BM = 128, BN = 64, BK = 64, WG = 2;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128 * WG;
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    shared r: f32[BM];
    shared t: f32[BM];
    local acc: f32[BM, BN];
    local peak: f32[BM];
    local total: f32[BM];
    local scale: f32[BM];
    fill(acc, 0);
    for k in pipelined(cdiv(K, BK), stages = 2) {
        copy(A[by * BM, k * BK], a);
        copy(B[k * BK, bx * BN], b);
        gemm(a, b, acc);
    }
    reduce(acc, peak, axis = 1, op = max);
    fill(scale, 2.0);
    parallel (i) in (BM) {
        scale[i] = scale[i] / (abs(peak[i]) + 1.0);
        r[i] = peak[i];
    }
    parallel (i, j) in (BM, BN) {
        acc[i, j] = acc[i, j] * scale[i];
    }
    reduce(acc, total, axis = 1, op = sum);
    parallel (i) in (BM) {
        t[i] = total[i];
    }
    copy(acc, C[by * BM, bx * BN]);
    copy(r, R[bx, by * BM]);
    copy(t, T[bx, by * BM]);
}
"""
# (BM, WG): one warpgroup, one m64 tile; one warpgroup, two m64 tiles (4 rows a
# thread); two warpgroups over M; three; two warpgroups of two m64 tiles each; two
# warpgroups side by side over N (each row in both); two over M by two over N; rows
# padded to m64 tiles (M no multiple of 64: not swapped, as the tiles' rows must be
# acc's): 32 of 64, 96 of 128 over two warpgroups, 40 of 64 on two side by side
CONFIGS = [(64, 1), (128, 1), (128, 2), (192, 3), (256, 2), (64, 2), (128, 4), (32, 1), (96, 2), (40, 2)]
SHAPES = [(64, 64, 64), (200, 104, 96), (132, 200, 64)]     # strides TMA takes: no fallback


def operands(m, n, k, seed):
    rng = np.random.default_rng(seed)     # small integers: every product and sum of the gemm is exact
    return (rng.integers(-4, 5, (m, k)).astype(np.float16), rng.integers(-4, 5, (k, n)).astype(np.float16))


def reference(a, b, bm, bn):
    """C, R, T as the kernel computes them in f32: each block's row maxima over its
    BN columns (those past N hold 0), scale = 2 / (|peak| + 1), C = P * scale, T
    its row sums (float64: the kernel's order of f32 additions differs)."""
    m, n = a.shape[0], b.shape[1]
    p = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    nb = -(-n // bn)
    padded = np.zeros((m, nb * bn), np.float32)
    padded[:, :n] = p
    blocks = padded.reshape(m, nb, bn).transpose(1, 0, 2)            # [NB, M, BN]
    peak = blocks.max(axis=2)
    scale = np.float32(2.0) / (np.abs(peak) + np.float32(1.0))
    scaled = blocks * scale[:, :, None]
    c = scaled.transpose(1, 0, 2).reshape(m, nb * bn)[:, :n]
    return c, peak, scaled.astype(np.float64).sum(axis=2)


def check(c, r, t, a, b, bm):
    want_c, want_r, want_t = reference(a, b, bm, 64)
    np.testing.assert_array_equal(c, want_c)
    np.testing.assert_array_equal(r, want_r)
    np.testing.assert_allclose(t, want_t, rtol=0, atol=1e-5)     # 64 f32 terms of at most 2


def test_the_tiles_live_in_rows():
    k = lower(SRC, {}).stages["plan-gemm"]
    assert {b.name: b.layout for b in k.buffers if b.scope == "local"} == \
        {"acc": "wgmma", "peak": "rows", "total": "rows", "scale": "rows"}


@pytest.mark.parametrize("bm, wg, rows", [(32, 1, 64), (96, 2, 128), (40, 2, 64)])
def test_rows_of_fewer_than_64_keep_the_accumulator_as_is(bm, wg, rows):
    """M no multiple of 64 would run swapped (acc^T, N a multiple of 64), whose fragments
    hold no row of acc: with tiles that must live in its rows, M is padded instead."""
    k = lower(SRC, {"BM": bm, "WG": wg}).stages["plan-gemm"]
    acc = k.buffer("acc")
    assert (acc.transposed, acc.fragment_rows) == (False, rows)
    assert {b.name: b.layout for b in k.buffers if b.scope == "local"} == \
        {"acc": "wgmma", "peak": "rows", "total": "rows", "scale": "rows"}
    without = SRC.replace("acc[i, j] = acc[i, j] * scale[i];", "acc[i, j] = acc[i, j] * 2.0;")
    assert lower(without, {"BM": bm, "WG": wg}).stages["plan-gemm"].buffer("acc").transposed


def test_rows_beside_a_tile_that_sums_a_gemms_parts_keep_the_gemm_as_is():
    """The gemm accumulates into `part`, which threads add to acc, and the row tile is read
    beside acc: part is planned unswapped too (acc takes part's layout; a GPU hunt's random
    program found the swapped part refused, session 54)."""
    src = SRC.replace("    local acc: f32[BM, BN];\n", "    local acc: f32[BM, BN];\n    local part: f32[BM, BN];\n") \
        .replace("        gemm(a, b, acc);\n", "        fill(part, 0);\n        gemm(a, b, part);\n"
                 "        parallel (i, j) in (BM, BN) {\n            acc[i, j] = acc[i, j] + part[i, j];\n        }\n")
    k = lower(src, {"BM": 32, "WG": 1}).stages["plan-gemm"]
    assert {b.name: (b.layout, b.transposed, b.fragment_rows) for b in k.buffers if b.scope == "local"} == {
        "acc": ("wgmma", False, 64), "part": ("wgmma", False, 64), "peak": ("rows", False, 64),
        "total": ("rows", False, 64), "scale": ("rows", False, 64)}
    a, b = operands(100, 104, 96, seed=5)
    outs = [guarded(s, np.float32, like="numpy") for s in ((100, 104), (2, 100), (2, 100))]
    tilec.compile(src, backend="interpret", BM=32, WG=1)(a, b, *(o.view for o in outs))
    for o in outs:
        o.check()
    check(*(o.view for o in outs), a, b, 32)


@pytest.mark.parametrize("bm, wg", CONFIGS, ids=lambda x: str(x))
@pytest.mark.parametrize("m, n, k", SHAPES, ids=lambda x: str(x))
def test_rows_in_the_interpreter(bm, wg, m, n, k):
    a, b = operands(m, n, k, seed=m + n + k)
    nb = -(-n // 64)
    outs = [guarded(s, np.float32, like="numpy") for s in ((m, n), (nb, m), (nb, m))]
    tilec.compile(SRC, backend="interpret", BM=bm, WG=wg)(a, b, *(o.view for o in outs))
    for o in outs:
        o.check()
    check(*(o.view for o in outs), a, b, bm)


@pytest.mark.gpu
@pytest.mark.parametrize("bm, wg", CONFIGS, ids=lambda x: str(x))
@pytest.mark.parametrize("m, n, k", SHAPES + [(1000, 1032, 512)], ids=lambda x: str(x))
def test_rows_on_the_gpu(bm, wg, m, n, k):
    import torch
    a, b = operands(m, n, k, seed=m + n + k)
    nb = -(-n // 64)
    outs = [guarded(s, "f32", fill=float("nan")) for s in ((m, n), (nb, m), (nb, m))]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(SRC, fallback=False, BM=bm, WG=wg)(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(),
                                                         *(o.view for o in outs))
    torch.cuda.synchronize()
    for o in outs:
        o.check()
    check(*(o.view.cpu().numpy() for o in outs), a, b, bm)


def edited(old, new, consts=None):
    assert old in SRC
    return lambda: lower(SRC.replace(old, new), consts or {})


@pytest.mark.parametrize("make, message", [
    (edited("    copy(t, T[bx, by * BM]);\n", "    copy(t, T[bx, by * BM]);\n    copy(scale, r);\n"),
     "<string>:35:5: error: local tile 'scale' must live in an accumulator's rows (line 26 reads scale[i] "
     "beside 'acc'), but here a copy cannot move it"),
    (edited("        r[i] = peak[i];", "        r[i] = r[i] + peak[i];"),
     "<string>:21:5: error: local tile 'scale' must live in an accumulator's rows (line 26 reads scale[i] "
     "beside 'acc'), but here a parallel over it runs each row on the 4 lanes of a quad, so it cannot both "
     "read and write the shared tile 'r'"),
    (edited("    const BM = 128, BN = 64, BK = 64, WG = 2;", "    const BM = 8, BN = 64, BK = 64, WG = 1;"),
     "<string>:26:33: error: local tile 'scale' must live in an accumulator's rows (line 26 reads scale[i] "
     "beside 'acc'), but here the fragments of 'acc' hold its transpose (a swapped gemm of 8 rows)"),
    (edited("        acc[i, j] = acc[i, j] * scale[i];", "        acc[i, j] = acc[i, j] * scale[i];\n"
            "    }\n    parallel (i, j) in (BM, BN) {\n        a[i, j] = f16(scale[i]);"),
     "<string>:29:23: error: local tile 'scale' must live in an accumulator's rows (line 26 reads scale[i] "
     "beside 'acc'), but here the parallel walks no gemm accumulator whose rows it could be kept in"),
    (edited("        acc[i, j] = acc[i, j] * scale[i];", "        a[i, j] = f16(scale[i]);"),
     "<string>:26:23: error: local tile 'scale' must live in an accumulator's rows (line 26 reads scale[i] "
     "in a parallel over (i, j) in (128, 64)), but here the parallel walks no gemm accumulator whose rows it "
     "could be kept in"),
], ids=["copied", "shared read and written", "acc transposed", "beside a shared tile", "only beside a shared tile"])
def test_what_cannot_live_in_rows_is_an_error_at_its_use(make, message):
    with pytest.raises(tilec.TilecError) as e:
        make()
    assert str(e.value).splitlines()[0] == message


def test_a_reduce_into_a_tile_used_elsewhere_keeps_it_at_e_mod_threads():
    """Without a read at [i] beside the accumulator, a reduce's result goes to rows only
    where nothing else refuses: copied out, it stays where §5 puts it (as before)."""
    src = SRC.replace("        acc[i, j] = acc[i, j] * scale[i];", "        acc[i, j] = acc[i, j] * 2.0;") \
        .replace("    copy(t, T[bx, by * BM]);\n", "    copy(t, T[bx, by * BM]);\n    copy(peak, r);\n")
    k = lower(src, {}).stages["plan-gemm"]
    assert {b.name: b.layout for b in k.buffers if b.scope == "local"} == \
        {"acc": "wgmma", "peak": "row", "total": "rows", "scale": "row"}
