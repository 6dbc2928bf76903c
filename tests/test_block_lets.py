"""A `let` inside a block (a loop's, an if's, a parallel body's) names its value for
the rest of that block (fold-consts substitutes it there): on the interpreter against
numpy with guarded outputs, on the GPU, the IR it leaves, and the errors of its scope."""
import numpy as np
import pytest

import tilec
from guard import guarded
from tilec import TilecError
from tilec.compiler import lower
from tilec.errors import Source

ODD_TILES = """\
kernel odd_tiles(A: f32[M, N], B: f32[M, N]) {
    const BM = 64;
    const BN = 128;
    grid (bx) = (cdiv(N, BN));
    threads 128;
    shared s: f32[BM, BN];
    for i in range(1, cdiv(M, BM), 2) {
        let row = i * BM;
        let col = bx * BN;
        copy(A[row, col], s);
        copy(s, B[row, col]);
    }
}
"""

EVERY_KTH_ROW = """\
kernel doubled(A: f32[M, N], B: f32[M, N], k: i32) {
    const BM = 64, BN = 128;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    local r: f32[BM, BN];
    copy(A[by * BM, bx * BN], r);
    parallel (i, j) in (BM, BN) {
        let d = (by * BM + i) % k;
        if d == 0 {
            r[i, j] = r[i, j] * 2.0;
        }
    }
    copy(r, B[by * BM, bx * BN]);
}
"""


def odd_rows(m):
    rows = np.zeros(m, bool)
    for i in range(1, -(-m // 64), 2):
        rows[i * 64:i * 64 + 64] = True
    return rows


def check_odd_tiles(k, m, n, like="numpy"):
    a = np.random.default_rng(m).standard_normal((m, n)).astype(np.float32)
    out = guarded((m, n), "f32", like=like)
    if like == "torch":
        import torch
        k(torch.from_numpy(a).cuda(), out.view)
        torch.cuda.synchronize()
    else:
        k(a, out.view)
    out.check()
    got = out.view if like == "numpy" else out.view.cpu().numpy()
    rows = odd_rows(m)
    assert np.array_equal(got[rows], a[rows])
    assert (got[~rows] == np.float32(-7777.0)).all()


def check_doubled(k, like="numpy"):
    a = np.random.default_rng(1).standard_normal((100, 200)).astype(np.float32)
    out = guarded((100, 200), "f32", like=like)
    if like == "torch":
        import torch
        k(torch.from_numpy(a).cuda(), out.view, 3)
        torch.cuda.synchronize()
    else:
        k(a, out.view, 3)
    out.check()
    want = a.copy()
    want[np.arange(100) % 3 == 0] *= 2
    assert np.array_equal(out.view if like == "numpy" else out.view.cpu().numpy(), want)


@pytest.mark.parametrize("m", [1, 64, 300, 513])
def test_a_loops_lets_on_the_interpreter(m):
    check_odd_tiles(tilec.compile(ODD_TILES, backend="interpret"), m, 200)


def test_a_parallel_bodys_let_on_the_interpreter():
    check_doubled(tilec.compile(EVERY_KTH_ROW, backend="interpret"))


def test_the_lets_are_substituted_by_fold_consts():
    k = tilec.compile(ODD_TILES, backend="interpret")
    parsed, folded = k.ir("parse"), k.ir("fold-consts")
    assert "    let row = i * BM\n    let col = bx * BN\n    copy A[row, col] -> s" in parsed
    assert "let " not in folded
    assert "copy A[i * 64, bx * 128] -> s  // line 10" in folded
    assert "if (by * 64 + i) % k == 0 {" in tilec.compile(EVERY_KTH_ROW, backend="interpret").ir("fold-consts")


def error_of(text):
    with pytest.raises(TilecError) as info:
        lower(Source("t.tile", text))
    return str(info.value)


@pytest.mark.parametrize("edit, message", [
    (("let row = i * BM;", "let i = 3;"), """\
t.tile:8:13: error: 'i' is already declared (as a loop variable)
        let i = 3;
            ^"""),
    (("let col = bx * BN;", "let row = bx * BN;"), """\
t.tile:9:13: error: 'row' is already declared (as a let)
        let row = bx * BN;
            ^~~"""),
    (("    const BN = 128;", "    const BN = 128;\n    let col = 5;"), """\
t.tile:10:13: error: 'col' is already declared (as a let)
        let col = bx * BN;
            ^~~"""),
    (("        copy(s, B[row, col]);\n    }", "        copy(s, B[row, col]);\n    }\n    copy(s, B[row, 0]);"), """\
t.tile:13:15: error: unknown name 'row'
    copy(s, B[row, 0]);
              ^~~"""),
    (("let row = i * BM;", "const R = 2;"), """\
t.tile:8:9: error: 'const' declarations go at the top level of the kernel
        const R = 2;
        ^~~~~~~~~~~~"""),
    (("let row = i * BM;", "let row = im2col(A, kernel = (1, 1));"), """\
t.tile:8:13: error: an im2col view is declared at the top level of the kernel
        let row = im2col(A, kernel = (1, 1));
            ^~~"""),
    (("let row = i * BM;", "let row = q * BM;"), """\
t.tile:8:19: error: unknown name 'q'
        let row = q * BM;
                  ^"""),
])
def test_scope_errors(edit, message):
    text = ODD_TILES.replace(*edit)
    assert text != ODD_TILES
    assert error_of(text) == message


def test_a_let_used_before_its_statement_is_unknown():
    text = ODD_TILES.replace("        let row = i * BM;\n", "").replace(
        "copy(s, B[row, col]);", "copy(s, B[row, col]);\n        let row = 1;")
    assert error_of(text).startswith("t.tile:9:16: error: unknown name 'row'")


@pytest.mark.gpu
def test_block_lets_on_the_gpu():
    pytest.importorskip("torch")
    check_odd_tiles(tilec.compile(ODD_TILES), 513, 200, like="torch")
    check_doubled(tilec.compile(EVERY_KTH_ROW), like="torch")
