"""Front-end errors: each malformed or ill-typed program, and the exact text a
user sees (`file:line:col: error: message`, the source line, a caret line and
an optional note). Pure front end: no NVRTC, no GPU."""
import pytest

from tilec import ParseError, SemanticError, TilecError
from tilec.compiler import lower
from tilec.errors import Source


def error_of(text, consts=None):
    with pytest.raises(TilecError) as info:
        lower(Source("t.tile", text), consts)
    return info.value


# (error class, program, the rendered error)
CASES = [
    # ------------------------------------------------------------ syntax
    pytest.param(ParseError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1)
    threads 128;
}
""", """\
t.tile:3:5: error: unexpected 'threads'; expected ',' or ';'
    threads 128;
    ^~~~~~~""", id="missing-semicolon"),

    pytest.param(ParseError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    copy(A[0, 0], s;
}
""", """\
t.tile:5:20: error: unexpected ';'; expected one of '(', ')', ',', '=', '[', an operator
    copy(A[0, 0], s;
                   ^""", id="unbalanced-parenthesis"),

    pytest.param(ParseError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128 @ 2;
}
""", """\
t.tile:3:17: error: unexpected character '@'
    threads 128 @ 2;
                ^""", id="unknown-character"),

    pytest.param(ParseError, "", """\
t.tile:1:1: error: unexpected end of input; expected 'kernel'

^""", id="empty-file"),

    pytest.param(ParseError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: float[64, 128];
}
""", """\
t.tile:4:15: error: unexpected 'float'; expected a dtype
    shared s: float[64, 128];
              ^~~~~""", id="bad-dtype"),

    pytest.param(ParseError, """\
kernel k(A: f31[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
}
""", """\
t.tile:1:13: error: unexpected 'f31'; expected a dtype
kernel k(A: f31[M, N], B: f32[M, N]) {
            ^~~""", id="bad-dtype-parameter"),

    # ------------------------------------------------------------ names and declarations
    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 128), cdiv(M, 64));
    threads 128;
    shared s: f32[64, 128];
    copyy(A[by * 64, bx * 128], s);
}
""", """\
t.tile:5:5: error: unknown statement 'copyy' (expected copy, fill, gemm or reduce)
    copyy(A[by * 64, bx * 128], s);
    ^~~~~""", id="unknown-statement"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared s: f32[BM, BN];
    copy(A[by * BM, bx * BK], s);
}
""", """\
t.tile:6:26: error: unknown name 'BK'
    copy(A[by * BM, bx * BK], s);
                         ^~""", id="unknown-name"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    copy(A[foo(bx), 0], s);
}
""", """\
t.tile:5:12: error: unknown function 'foo'
    copy(A[foo(bx), 0], s);
           ^~~~~~~""", id="unknown-function"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared s: f32[BM, BN];
    shared s: f32[BM, BN];
}
""", """\
t.tile:6:5: error: 's' is already declared (as a tile)
    shared s: f32[BM, BN];
    ^~~~~~~~~~~~~~~~~~~~~~""", id="duplicate-tile"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const A = 64;
    grid (bx) = (1);
    threads 128;
}
""", """\
t.tile:2:11: error: 'A' is already declared (as a parameter)
    const A = 64;
          ^""", id="const-shadows-parameter"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = N / 2;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:2:25: error: const 'BN' is not a compile-time integer
    const BM = 64, BN = N / 2;
                        ^~~~~
note: consts may use integer literals and earlier consts only""", id="const-not-compile-time"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    const X = 4 / 0;
}
""", """\
t.tile:4:15: error: division by zero in a constant expression
    const X = 4 / 0;
              ^~~~~""", id="const-division-by-zero"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[M, 128];
}
""", """\
t.tile:4:19: error: tile 's' must have a compile-time shape
    shared s: f32[M, 128];
                  ^""", id="tile-shape-not-compile-time"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    for t in range(3) {
        shared s: f32[64, 128];
    }
}
""", """\
t.tile:5:9: error: 'shared' declarations go at the top level of the kernel
        shared s: f32[64, 128];
        ^~~~~~~~~~~~~~~~~~~~~~~""", id="nested-declaration"),

    pytest.param(SemanticError, """\
kernel k(A: f32[A1, A2, A3, A4, A5, A6]) {
    grid (bx) = (1);
    threads 128;
}
""", """\
t.tile:1:10: error: tensor 'A' has rank 6; tensors have rank 1 to 5
kernel k(A: f32[A1, A2, A3, A4, A5, A6]) {
         ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~""", id="tensor-rank-6"),

    # ------------------------------------------------------------ launch shape
    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    threads 128;
}
""", """\
t.tile:1:8: error: kernel 'k' has no grid declaration
kernel k(A: f32[M, N], B: f32[M, N]) {
       ^
note: add e.g. `grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));`""", id="missing-grid"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
}
""", """\
t.tile:1:8: error: kernel 'k' has no threads declaration
kernel k(A: f32[M, N], B: f32[M, N]) {
       ^
note: add e.g. `threads 128;`""", id="missing-threads"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 100;
}
""", """\
t.tile:3:13: error: threads must be a multiple of 32 between 32 and 1024, got 100
    threads 100;
            ^~~""", id="threads-not-multiple-of-32"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads M;
}
""", """\
t.tile:3:13: error: threads must be a compile-time integer
    threads M;
            ^""", id="threads-not-compile-time"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx, by) = (1);
    threads 128;
}
""", """\
t.tile:2:5: error: grid names 2 block indices but gives 1 sizes
    grid (bx, by) = (1);
    ^~~~~~~~~~~~~~~~~~~~""", id="grid-arity"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (bx);
    threads 128;
}
""", """\
t.tile:2:18: error: a grid size may use shape symbols and scalar parameters only; 'bx' is a block index
    grid (bx) = (bx);
                 ^~""", id="grid-uses-block-index"),

    # ------------------------------------------------------------ copies
    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    copy(A[0, 0], B[0, 0]);
}
""", """\
t.tile:4:5: error: copy from global to global: stage it through a shared tile
    copy(A[0, 0], B[0, 0]);
    ^~~~~~~~~~~~~~~~~~~~~~~""", id="copy-global-to-global"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    shared t: f32[64, 64];
    copy(s, t);
}
""", """\
t.tile:6:5: error: copy between tiles of shapes [64, 128] and [64, 64]
    copy(s, t);
    ^~~~~~~~~~~""", id="copy-tile-shape-mismatch"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    copy(A[0 : 64, 0 : 64], s);
}
""", """\
t.tile:5:20: error: the region's extents must match the tile shape [64, 128]
    copy(A[0 : 64, 0 : 64], s);
                   ^~~~~~""", id="copy-slice-extent-mismatch"),

    pytest.param(SemanticError, """\
kernel k(A: f16[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    copy(A[0, 0], s);
}
""", """\
t.tile:5:5: error: a global<->shared copy moves bytes as they are (by TMA, or the thread copies that stand in for it): f16 and f32 differ (convert through a parallel \
body or a local tile)
    copy(A[0, 0], s);
    ^~~~~~~~~~~~~~~~~""", id="tma-copy-dtype-mismatch"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    copy(A[0, 0, 0], s);
}
""", """\
t.tile:5:10: error: tensor 'A' has rank 2 but the region gives 3 coordinates
    copy(A[0, 0, 0], s);
         ^~~~~~~~~~""", id="region-wrong-rank"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[2, 64, 128];
    copy(A[0, 0], s);
}
""", """\
t.tile:5:5: error: a tile of rank 3 does not fit tensor 'A' of rank 2
    copy(A[0, 0], s);
    ^~~~~~~~~~~~~~~~~""", id="tile-rank-above-tensor-rank"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    copy(A[0, 0], s[0, 0]);
}
""", """\
t.tile:5:19: error: a tile side of a copy is the whole tile: write 's', not a subscript
    copy(A[0, 0], s[0, 0]);
                  ^~~~~~~""", id="copy-tile-subscript"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N], n: i32) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    copy(n, s);
}
""", """\
t.tile:5:10: error: the source of a copy must be a tensor or a tile; 'n' is not
    copy(n, s);
         ^""", id="copy-from-scalar"),

    # ------------------------------------------------------------ TMA rules known at compile time
    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    shared s: f32[64, 128];
    copy(A[0, bx * 3], s);
}
""", """\
t.tile:5:15: error: cannot prove the innermost coordinate 'bx * 3' of 'A' is a multiple of 4 elements (16 bytes \
of f32); a misaligned TMA access faults the GPU
    copy(A[0, bx * 3], s);
              ^~~~~~
note: write the coordinate as a multiple of the tile width, e.g. bx * BN""", id="inner-coordinate-alignment"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    shared s: f32[64, 128];
    copy(s, B[0, bx * 128 + 2]);
}
""", """\
t.tile:5:18: error: cannot prove the innermost coordinate 'bx * 128 + 2' of 'B' is a multiple of 4 elements (16 \
bytes of f32); a misaligned TMA access faults the GPU
    copy(s, B[0, bx * 128 + 2]);
                 ^~~~~~~~~~~~
note: write the coordinate as a multiple of the tile width, e.g. bx * BN""", id="store-inner-coordinate-alignment"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    shared s: f32[64, 1024];
    copy(A[0, bx * 128], s);
}
""", """\
t.tile:5:5: error: TMA box dimension 1 of 'A' is 1024; TMA boxes are at most 256 per dimension, and this tile would take 256 boxes (tilec splits a copy into at most 64)
    copy(A[0, bx * 128], s);
    ^~~~~~~~~~~~~~~~~~~~~~~~
note: use a smaller tile, or split the copy into several""", id="box-dimension-over-256"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    shared s: f32[2, 514];
    copy(A[0, bx * 128], s);
}
""", """\
t.tile:5:5: error: TMA box dimension 1 of 'A' is 514; TMA boxes are at most 256 per dimension, and no box width of at most 256 elements and a multiple of 16 bytes divides 514
    copy(A[0, bx * 128], s);
    ^~~~~~~~~~~~~~~~~~~~~~~~
note: use a smaller tile, or split the copy into several""", id="box-dimension-no-width"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 2];
    copy(A[0, 0], s);
}
""", """\
t.tile:5:5: error: the TMA box's inner dimension is 2 x 4 = 8 bytes; TMA needs a multiple of 16 bytes
    copy(A[0, 0], s);
    ^~~~~~~~~~~~~~~~~""", id="box-inner-bytes"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[256, 256];
    copy(A[0, 0], s);
}
""", """\
t.tile:4:5: error: shared tiles need 262144 bytes; a Hopper block has at most 232448 bytes of shared memory
    shared s: f32[256, 256];
    ^~~~~~~~~~~~~~~~~~~~~~~~""", id="shared-memory-too-big"),

    # ------------------------------------------------------------ tile elements and parallel bodies
    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    parallel (i, j) in (64, 128) {
        s[i, j, 0] = 1.0;
    }
}
""", """\
t.tile:6:9: error: tile 's' has rank 2 but is indexed with 3 indices
        s[i, j, 0] = 1.0;
        ^~~~~~~~~~~~~~~~~""", id="element-access-wrong-index-count"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    parallel (i, j) in (64, 128) {
        s[i, j] = A[i, j];
    }
}
""", """\
t.tile:6:19: error: 'A' is a global tensor; copy a region of it into a tile to read its elements
        s[i, j] = A[i, j];
                  ^~~~~~~""", id="element-of-global-tensor"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    s[0, 0] = 1.0;
}
""", """\
t.tile:5:5: error: tile elements are assigned inside a parallel body
    s[0, 0] = 1.0;
    ^~~~~~~~~~~~~~""", id="assignment-outside-parallel"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    parallel (i, j) in (64, 128) {
        copy(A[0, 0], s);
    }
}
""", """\
t.tile:6:9: error: copy cannot appear inside a parallel body
        copy(A[0, 0], s);
        ^~~~~~~~~~~~~~~~~""", id="copy-inside-parallel"),

    # ------------------------------------------------------------ reduce
    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    shared r: f32[64];
    reduce(s, r, axis = 2, op = sum);
}
""", """\
t.tile:6:25: error: reduce's axis must be the literal 0 (reduce each column) or 1 (reduce each row)
    reduce(s, r, axis = 2, op = sum);
                        ^""", id="reduce-axis"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    shared r: f32[64];
    reduce(s, r, axis = 1, op = mean);
}
""", """\
t.tile:6:33: error: reduce's op must be sum, max or min
    reduce(s, r, axis = 1, op = mean);
                                ^~~~""", id="reduce-op"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    shared r: f32[64];
    reduce(s, r, axis = 1, op = sum, keep = 1);
}
""", """\
t.tile:6:45: error: reduce has no argument 'keep'
    reduce(s, r, axis = 1, op = sum, keep = 1);
                                            ^""", id="reduce-unknown-keyword"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    shared r: f32[64];
    reduce(s, r, op = max);
}
""", """\
t.tile:6:5: error: reduce needs the axis of s it reduces: axis = 0 (each column) or axis = 1 (each \
row)
    reduce(s, r, op = max);
    ^~~~~~~~~~~~~~~~~~~~~~~""", id="reduce-no-axis"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[4];
    local r: f32[4, 48];
    reduce(r, s, axis = 1, op = sum);
}
""", """\
t.tile:6:12: error: reduce cannot read the local tile 'r' (f32[4, 48]) where it lies: with 128 threads \
its rows of 48 elements must each sit on all the threads (48 a multiple of 128) or on whole groups of \
threads (48 dividing 128 and 32, or a multiple of 32 dividing 128, with 4 x 48 a multiple of 128); copy \
it into a shared tile and reduce that
    reduce(r, s, axis = 1, op = sum);
           ^""", id="reduce-local-source-uneven"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    shared c: f32[4, 64, 128];
    reduce(c, s, axis = 1, op = sum);
}
""", """\
t.tile:6:12: error: reduce reduces a 2-D tile; 'c' has rank 3
    reduce(c, s, axis = 1, op = sum);
           ^""", id="reduce-source-rank"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    shared r: f32[64, 1];
    reduce(s, r, axis = 1, op = sum);
}
""", """\
t.tile:6:15: error: reduce writes a 1-D tile; 'r' has rank 2
    reduce(s, r, axis = 1, op = sum);
              ^""", id="reduce-result-rank"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    local acc: f32[64];
    reduce(s, acc, axis = 0, op = max);
}
""", """\
t.tile:6:15: error: reduce with axis = 0 gives one value per column of 's' (f32[64, 128]): 128 \
values, but 'acc' is f32[64]
    reduce(s, acc, axis = 0, op = max);
              ^~~""", id="reduce-result-extent"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    shared r: i32[64];
    reduce(s, r, axis = 1, op = sum);
}
""", """\
t.tile:6:15: error: reduce: 's' is f32 and 'r' is i32; floats reduce into a float tile, integers \
into an integer tile
    reduce(s, r, axis = 1, op = sum);
              ^""", id="reduce-float-into-integer"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    shared r: f32[64];
    reduce(A, r, axis = 1, op = sum);
}
""", """\
t.tile:6:12: error: reduce needs a shared or local tile; 'A' is not one
    reduce(A, r, axis = 1, op = sum);
           ^""", id="reduce-tensor"),

    # ------------------------------------------------------------ not lowered yet, and im2col views
    pytest.param(SemanticError, """\
kernel k(A: f16[M, K], B: f16[K, N]) {
    grid (bx) = (1);
    threads 128;
    shared a: f16[64, 64];
    shared b: f16[64, 64];
    local acc: f32[64, 32];
    gemm(a, b, acc);
}
""", """\
t.tile:7:5: error: gemm shapes do not chain: a [64, 64] @ b [64, 64] into acc [64, 32]
    gemm(a, b, acc);
    ^~~~~~~~~~~~~~~~""", id="gemm-shapes"),

    pytest.param(SemanticError, """\
kernel k(X: f16[M, C], Y: f16[M, C]) {
    grid (bx) = (1);
    threads 128;
    let Xc = im2col(X, kernel = (3, 3));
    shared a: f16[128, 64];
    copy(Xc[bx * 128, 0], a);
}
""", """\
t.tile:4:21: error: im2col needs a channels-last tensor of rank 3, 4 or 5 ([N, W, C], [N, H, W, C], [N, D, H, W, \
C]); 'X' has rank 2
    let Xc = im2col(X, kernel = (3, 3));
                    ^""", id="im2col-rank-2"),

    pytest.param(SemanticError, """\
kernel k(X: f16[N, H, W, C], Y: f16[M, C]) {
    grid (bx) = (1);
    threads 128;
    let Xc = im2col(X, kernel = (3, 3));
    shared a: f16[128, 64];
    copy(Xc[bx * 128, bx * 32], a);
}
""", """\
t.tile:6:23: error: cannot prove the view column 'bx * 32' is a multiple of the tile width 64; an im2col K tile \
must start on a multiple of its width
    copy(Xc[bx * 128, bx * 32], a);
                      ^~~~~~~""", id="im2col-column-alignment"),

    pytest.param(SemanticError, """\
kernel k(X: f16[N, H, W, C], Y: f16[M, C]) {
    grid (bx) = (1);
    threads 128;
    let Xc = im2col(X, kernel = (3, 3));
    shared a: f16[128, 64];
    copy(a, Xc[0, 0]);
}
""", """\
t.tile:6:13: error: an im2col view is read-only: copy from it into a shared tile
    copy(a, Xc[0, 0]);
            ^~~~~~~~""", id="im2col-view-as-destination"),

    # ------------------------------------------------------------ tune statements (docs/language.md §3)
    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BM in (64, 128), BN in (64, 256);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:5: error: the declared value of 'BN', 128, is not one of its tune values (64, 256)
    tune BM in (64, 128), BN in (64, 256);
    ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
note: the declared value (line 2) is the kernel's untuned default and its first candidate: list it, or declare one of the listed values""", id="tune-declared-value-not-listed"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64;
    tune BN in (64, 128);
    const BN = 128;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:10: error: 'BN' is tuned before its const declaration (line 4): declare it before the tune statement
    tune BN in (64, 128);
         ^~""", id="tune-const-declared-after"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune N in (64, 128);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:10: error: only consts can be tuned, and 'N' is a shape symbol
    tune N in (64, 128);
         ^""", id="tune-shape-symbol"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BK in (64, 128);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:10: error: 'BK' is not a const declared before the tune statement
    tune BK in (64, 128);
         ^~
note: consts declared before it: BM, BN""", id="tune-unknown-name"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BN in (64, 128), BM in (64), BN in (256);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:39: error: 'BN' is tuned twice
    tune BN in (64, 128), BM in (64), BN in (256);
                                      ^~""", id="tune-name-twice"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BN in (64, 128, 64);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:26: error: tune lists 64 twice for 'BN'
    tune BN in (64, 128, 64);
                         ^~""", id="tune-value-twice"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BN in (64, 128);
    tune BM in (32, 64);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:4:5: error: tune is declared twice (one tune statement lists every tuned const)
    tune BM in (32, 64);
    ^~~~~~~~~~~~~~~~~~~~""", id="tune-declared-twice"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 2 * BM;
    tune BN in (64, 128);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:2:25: error: const 'BN' is tuned, so its declared value (the kernel's untuned default) must be an integer literal, not '2 * BM'
    const BM = 64, BN = 2 * BM;
                        ^~~~~~""", id="tune-declared-expression"),

    pytest.param(ParseError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BN in (-64, 128);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:17: error: unexpected '-'; expected an integer
    tune BN in (-64, 128);
                ^""", id="tune-negative-value"),

    pytest.param(ParseError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BN in ();
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:17: error: unexpected ')'; expected an integer
    tune BN in ();
                ^""", id="tune-empty-list"),

    pytest.param(ParseError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BN in (128.0);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:20: error: unexpected character '.'
    tune BN in (128.0);
                   ^""", id="tune-float-value"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    for t in range(2) {
        tune BN in (64, 128);
    }
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:4:9: error: 'tune' declarations go at the top level of the kernel
        tune BN in (64, 128);
        ^~~~~~~~~~~~~~~~~~~~~""", id="tune-nested"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune A in (64, 128);
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:10: error: only consts can be tuned, and 'A' is a parameter
    tune A in (64, 128);
         ^""", id="tune-parameter"),

    # ------------------------------------------------------------ tune ... where (docs/language.md §3)
    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BM in (64, 128) where BM <= M && bx == 0;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:43: error: the tune condition reads 'bx', a block index: it may read consts, shape symbols and integer scalar parameters
    tune BM in (64, 128) where BM <= M && bx == 0;
                                          ^~""", id="tune-where-block-index"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N], alpha: f32, rows: i32) {
    const BM = 64, BN = 128;
    tune BM in (64, 128) where BM <= rows && alpha > 0;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:46: error: the tune condition reads 'alpha', a f32 scalar: it may read consts, shape symbols and integer scalar parameters
    tune BM in (64, 128) where BM <= rows && alpha > 0;
                                             ^~~~~""", id="tune-where-float-scalar"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BM in (64, 128) where A <= M;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:32: error: the tune condition reads 'A', a tensor: it may read consts, shape symbols and integer scalar parameters
    tune BM in (64, 128) where A <= M;
                               ^""", id="tune-where-tensor"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BM in (64, 128) where exp(M) > BM;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:32: error: the tune condition calls 'exp': it may call min, max, cdiv and abs
    tune BM in (64, 128) where exp(M) > BM;
                               ^~~~~~""", id="tune-where-call"),

    pytest.param(SemanticError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BM in (64, 128) where BM <= K;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:38: error: unknown name 'K'
    tune BM in (64, 128) where BM <= K;
                                     ^""", id="tune-where-unknown-name"),

    pytest.param(ParseError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BM in (64, 128) where;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:31: error: unexpected ';'; expected an expression
    tune BM in (64, 128) where;
                              ^""", id="tune-where-empty"),

    pytest.param(ParseError, """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    tune BM in (64, 128) BM <= M;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
}
""", """\
t.tile:3:26: error: unexpected 'BM'; expected one of ',', ';', 'where'
    tune BM in (64, 128) BM <= M;
                         ^~""", id="tune-where-missing-keyword"),
]


@pytest.mark.parametrize("cls, program, expected", CASES)
def test_error_text(cls, program, expected):
    err = error_of(program)
    assert str(err) == expected
    assert type(err) is cls


# ---------------------------------------------------------------- const overrides (-D)

COPY2D = """\
kernel copy2d(A: f32[M, N], B: f32[M, N]) {
    const BM = 64, BN = 128;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared s: f32[BM, BN];
    copy(A[by * BM, bx * BN], s);
    copy(s, B[by * BM, bx * BN]);
}
"""


def test_override_of_unknown_const():
    err = error_of(COPY2D, {"NOPE": 3})
    assert str(err) == ("error: kernel 'copy2d' has no const or shape symbol 'NOPE' to override (its consts: BM, "
                        "BN; its shape symbols: M, N)")


def test_override_with_a_value_that_breaks_a_rule_points_at_the_use():
    # BN = 2: an 8-byte inner box; reported at the copy that needs the box
    err = error_of(COPY2D, {"BN": 2})
    assert str(err) == """\
t.tile:6:5: error: the TMA box's inner dimension is 2 x 4 = 8 bytes; TMA needs a multiple of 16 bytes
    copy(A[by * BM, bx * BN], s);
    ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~"""


REQUIRES = """\
kernel r(A: f32[M, C], B: f32[M, C]) {
    const BN = 64;
    require C % 8 == 0 && BN % 64 == 0;
    grid (bx, by) = (cdiv(C, BN), cdiv(M, 64));
    threads 128;
    shared s: f32[64, BN];
    copy(A[by * 64, bx * BN], s);
    copy(s, B[by * 64, bx * BN]);
}
"""


@pytest.mark.parametrize("consts, shown", [({"BN": 32}, "BN = 32"), ({"C": 20}, "BN = 64, C = 20"),
                                           ({"C": 20, "BN": 32}, "BN = 32, C = 20")])
def test_a_require_the_consts_make_false_is_an_error_at_its_line(consts, shown):
    """A require that the consts (or shape symbols fixed at compile time) decide
    false would fail every launch: said at compile time, at its line."""
    assert str(error_of(REQUIRES, consts)) == f"""\
t.tile:3:5: error: require C % 8 == 0 && BN % 64 == 0 is false for every launch ({shown})
    require C % 8 == 0 && BN % 64 == 0;
    ^~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~"""


def test_a_require_the_consts_make_true_is_not_checked_at_launch():
    k = lower(Source("t.tile", REQUIRES), {"C": 24}).kernel
    assert k.requires == ()
    assert [r.text for r in lower(Source("t.tile", REQUIRES)).kernel.requires] == ["C % 8 == 0 && BN % 64 == 0"]


def test_override_that_is_not_an_integer():
    err = error_of(COPY2D, {"BM": "64"})
    assert str(err) == "error: const 'BM' must be an integer, got '64'"


# ---------------------------------------------------------------- messages that once read badly

def test_missing_semicolon_after_const():
    err = error_of("""\
kernel k(A: f32[M, N]) {
    const BM = 64, BN = 128
    grid (bx) = (1);
    threads 128;
}
""")
    assert str(err) == """\
t.tile:3:5: error: unexpected 'grid'; expected one of ',', ';', an operator
    grid (bx) = (1);
    ^~~~"""


def test_unclosed_brace():
    err = error_of("""\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    parallel (i, j) in (64, 128) {
}
""")
    assert str(err) == """\
t.tile:5:2: error: unexpected end of input; expected a statement or '}'
}
 ^"""


def test_extra_closing_brace():
    err = error_of("""\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
}
}
""")
    assert str(err) == """\
t.tile:5:1: error: unexpected '}'; expected end of input
}
^"""


def test_end_of_input_in_parameter_list():
    err = error_of("kernel k(A: f32[M, N]")
    assert str(err) == """\
t.tile:1:22: error: unexpected end of input; expected ')' or ','
kernel k(A: f32[M, N]
                     ^"""


def test_local_tile_at_other_indices():
    err = error_of("""\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    local r: f32[64, 128];
    parallel (i, j) in (64, 128) {
        r[j, i] = 1.0;
    }
}
""")
    assert str(err) == """\
t.tile:6:9: error: local tile 'r' must be indexed with the parallel loop's own indices, r[i, j], in a parallel \
over its whole shape [64, 128]
        r[j, i] = 1.0;
        ^~~~~~~~~~~~~~"""


@pytest.mark.parametrize("statement, col, name", [
    ("reduce(x, r, axis = 1, axis = 0, op = sum);", 28, "axis"),
    ("reduce(x, r, axis = 1, op = sum, op = max);", 38, "op"),
    ("gemm(a, b, acc, transpose_b = true, transpose_b = false);", 41, "transpose_b"),
])
def test_a_keyword_argument_given_twice(statement, col, name):
    err = error_of(f"""\
kernel k(X: f16[64, 64]) {{
    grid (bx) = (1);
    threads 128;
    shared x: f32[4, 64];
    shared r: f32[64];
    shared a: f16[64, 64];
    shared b: f16[64, 64];
    local acc: f32[64, 64];
    {statement}
}}
""")
    assert str(err).splitlines()[0] == f"t.tile:9:{col}: error: {name} is given twice"


def test_a_pipelined_option_given_twice():
    err = error_of("""\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    for kk in pipelined(4, stages = 2, stages = 3) {
    }
}
""")
    assert str(err).splitlines()[0] == "t.tile:4:40: error: stages is given twice"


def test_a_local_tile_read_at_a_row_index_of_another_length():
    """The message names the program's own indices and extents (it said `r[i0]`)."""
    err = error_of("""\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    local r: f32[32];
    shared s: f32[64, 64];
    parallel (i, j) in (64, 64) {
        s[i, j] = r[i];
    }
}
""")
    assert str(err).splitlines()[0] == (
        "t.tile:7:19: error: local tile 'r' of shape [32] must be indexed with the parallel loop's own indices in "
        "a parallel over its whole shape; this parallel is over (i, j) in (64, 64) (a 1-D tile may also be read at "
        "the row index, r[i], where its length is the parallel's 64 rows)")


def test_a_local_tile_in_a_parallel_over_part_of_it():
    err = error_of("""\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 32;
    local r: f32[32];
    shared s: f32[32];
    parallel (i) in (16) {
        s[i] = r[i];
    }
}
""")
    assert str(err).splitlines()[0] == (
        "t.tile:7:16: error: local tile 'r' must be indexed with the parallel loop's own indices, r[i], in a "
        "parallel over its whole shape [32]; this parallel is over (i) in (16)")


def test_a_local_tile_element_outside_a_parallel():
    err = error_of("""\
kernel k(A: f32[32]) {
    grid (bx) = (1);
    threads 32;
    local r: f32[32];
    shared s: f32[32];
    let x = r[0];
    fill(s, x);
}
""")
    assert str(err).splitlines()[0] == (
        "t.tile:6:13: error: local tile 'r' is read or written element by element only inside a parallel over its "
        "whole shape [32], at the parallel's own indices")


def test_caret_under_tab_indented_source():
    err = error_of("kernel k(A: f32[M, N]) {\n\tgrid (bx) = (1);\n\tthreads 100;\n}\n")
    _, src_line, caret_line = str(err).splitlines()
    assert src_line == "\tthreads 100;"
    # as a terminal shows it (tab stops every 8 columns) the caret is under "100"
    shown = src_line.expandtabs(8)
    assert caret_line.expandtabs(8).index("^") == shown.index("100")


# Float-valued index expressions were once printed into int TMA coordinates (C++
# truncated them silently); they are type errors.

@pytest.mark.parametrize("origin", ["1.5", "alpha"])
def test_float_region_origin(origin):
    err = error_of(f"""\
kernel k(A: f32[M, N], B: f32[M, N], alpha: f32) {{
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    copy(A[{origin}, 0], s);
    copy(s, B[0, 0]);
}}
""")
    assert isinstance(err, SemanticError)
    assert str(err) == f"""\
t.tile:5:12: error: a region origin must be an integer expression
    copy(A[{origin}, 0], s);
           ^{"~" * (len(origin) - 1)}"""


def test_float_loop_bound():
    err = error_of("""\
kernel k(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 128];
    for t in range(M / 2.0) {
        copy(A[t * 64, 0], s);
        copy(s, B[t * 64, 0]);
    }
}
""")
    assert str(err) == """\
t.tile:5:24: error: a loop bound must be an integer expression
    for t in range(M / 2.0) {
                       ^~~"""


def test_float_grid_size():
    err = error_of("""\
kernel k(A: f32[M, N], alpha: f32) {
    grid (bx) = (cdiv(N, alpha));
    threads 128;
}
""")
    assert str(err) == """\
t.tile:2:26: error: a grid size must be an integer expression
    grid (bx) = (cdiv(N, alpha));
                         ^~~~~"""


# ---------------------------------------------------------------- expressions in a parallel body

ELEMENTWISE = """\
kernel k(A: f32[N], B: f32[N], n: i32) {{
    grid (bx) = (cdiv(N, 64));
    threads 64;
    shared s: f32[64];
    copy(A[bx * 64], s);
    parallel (i) in (64) {{
        s[i] = {};
    }}
    copy(s, B[bx * 64]);
}}
"""


def expr_error(expr):
    """The error of a parallel body's `s[i] = expr;` (line 7, the expression at column 16)."""
    return str(error_of(ELEMENTWISE.format(expr)))


# Every built-in's argument count is checked at the call (once the interpreter
# failed with an IndexError and codegen with a ValueError on select(c, a)).
@pytest.mark.parametrize("call, message", [
    ("select(s[i] > 0.0, 1.0)", "select takes 3 arguments (c, a, b), got 2"),
    ("min(s[i])", "min takes 2 arguments (a, b), got 1"),
    ("max(s[i], 1.0, 2.0)", "max takes 2 arguments (a, b), got 3"),
    ("sqrt()", "sqrt takes 1 argument (x), got 0"),
    ("cdiv(i)", "cdiv takes 2 arguments (a, b), got 1"),
    ("exp(s[i], 2.0)", "exp takes 1 argument (x), got 2"),
    ("abs(s[i], 1)", "abs takes 1 argument (x), got 2"),
])
def test_call_arity(call, message):
    assert expr_error(call) == f"""\
t.tile:7:16: error: {message}
        s[i] = {call};
               {"^" + "~" * (len(call) - 1)}"""


def test_call_keyword_argument():
    assert expr_error("min(s[i], 1.0, x = 2)") == """\
t.tile:7:31: error: min has no argument 'x' (it takes 2 positional arguments: min(a, b))
        s[i] = min(s[i], 1.0, x = 2);
                              ^"""


@pytest.mark.parametrize("cond, col, message", [
    ("cdiv(M) > 0", 31, "cdiv takes 2 arguments (a, b), got 1"),
    ("M > 0 && min(M, N, 3) > 0", 40, "min takes 2 arguments (a, b), got 3"),
])
def test_tune_condition_call_arity(cond, col, message):
    err = error_of(f"""\
kernel k(A: f32[M, N]) {{
    const BM = 64;
    tune BM in (32, 64) where {cond};
    grid (bx) = (1);
    threads 128;
}}
""")
    call = cond[col - 31:].split(" > ")[0]
    assert str(err) == f"""\
t.tile:3:{col}: error: {message}
    tune BM in (32, 64) where {cond};
{" " * (col - 1)}^{"~" * (len(call) - 1)}"""


def test_where_argument_call_arity():
    from tilec.frontend import parse, parse_condition
    k = parse(Source("t.tile", COPY2D))
    with pytest.raises(SemanticError) as info:
        parse_condition("min(M, N, 3) > 0", k)
    assert str(info.value) == """\
where=:1:1: error: min takes 2 arguments (a, b), got 3
min(M, N, 3) > 0
^~~~~~~~~~~~"""


# Float indices and float cdiv arguments reached NVRTC ("expression must have
# integral type", an error inside tl_cdiv); they are type errors at the float part.
@pytest.mark.parametrize("expr, col, length, message", [
    ("s[i / 2.0]", 22, 3, "a tile index must be an integer expression"),
    ("s[n * 1.0]", 22, 3, "a tile index must be an integer expression"),
    ("s[select(n > 0, 1, 2.0)]", 35, 3, "a tile index must be an integer expression"),
    ("cdiv(s[i], 2)", 21, 4, "cdiv takes integer arguments"),
    ("f32(cdiv(n, sqrt(f32(n))))", 28, 12, "cdiv takes integer arguments"),
])
def test_integer_operands(expr, col, length, message):
    assert expr_error(expr) == f"""\
t.tile:7:{col}: error: {message}
        s[i] = {expr};
{" " * (col - 1)}^{"~" * (length - 1)}
note: convert a float to an integer with a cast, e.g. i32(x)"""


@pytest.mark.parametrize("expr", ["s[i32(s[i] * 2.0)]", "s[i % 2] + s[-i + 63]", "f32(cdiv(n, 2))"])
def test_integer_operands_accepted(expr):
    """(Into another tile: s[i] = s[i % 2] would race, iteration 2 reading what iteration 0 writes.)"""
    lower(Source("t.tile", ELEMENTWISE.format(expr).replace("        s[i] =", "        t[i] =")
                 .replace("    shared s: f32[64];\n", "    shared s: f32[64];\n    shared t: f32[64];\n")
                 .replace("copy(s, B", "copy(t, B")))


def test_float_index_of_an_assignment():
    err = error_of(ELEMENTWISE.format("1.0").replace("s[i] = 1.0", "s[i * 0.5] = 1.0"))
    assert str(err) == """\
t.tile:7:15: error: a tile index must be an integer expression
        s[i * 0.5] = 1.0;
              ^~~
note: convert a float to an integer with a cast, e.g. i32(x)"""


def test_float_cdiv_in_an_if_outside_parallel():
    err = error_of("""\
kernel k(A: f32[N], B: f32[N], alpha: f32) {
    grid (bx) = (cdiv(N, 64));
    threads 64;
    shared s: f32[64];
    if cdiv(alpha, 2) > 0 {
        copy(A[bx * 64], s);
        copy(s, B[bx * 64]);
    }
}
""")
    assert str(err) == """\
t.tile:5:13: error: cdiv takes integer arguments
    if cdiv(alpha, 2) > 0 {
            ^~~~~
note: convert a float to an integer with a cast, e.g. i32(x)"""


# Integers are 64-bit signed: a larger literal or folded constant was emitted as
# `...LL` past 64 bits; a float literal past f64 as `inff`, one past f32 in an
# f32 statement as a constant NVRTC refuses.
@pytest.mark.parametrize("expr, col, length, message", [
    ("99999999999999999999999", 16, 23,
     "integer literal 99999999999999999999999 is over 2^63-1 = 9223372036854775807: tilec's integers are 64-bit "
     "signed"),
    ("9223372036854775808", 16, 19,
     "integer literal 9223372036854775808 is over 2^63-1 = 9223372036854775807: tilec's integers are 64-bit signed"),
    ("3037000500 * 3037000500 + s[i]", 16, 23,
     "the constant expression '3037000500 * 3037000500' is 9223372037000250000, outside the 64-bit signed range "
     "(-2^63 .. 2^63-1) of tilec's integers"),
    ("1e999", 16, 5, "float literal 1e999 is over the largest f64 (about 1.8e308)"),
    ("-1e39 * s[i]", 17, 4,
     "float literal 1e39 is out of the range of f32 (magnitudes about 1.4e-45 to 3.4e38); a float literal is an "
     "f32 unless its statement reads an f64 tile or scalar"),
    ("s[i] + 1e-50", 23, 5,
     "float literal 1e-50 is out of the range of f32 (magnitudes about 1.4e-45 to 3.4e38); a float literal is an "
     "f32 unless its statement reads an f64 tile or scalar"),
])
def test_literal_range(expr, col, length, message):
    assert expr_error(expr) == f"""\
t.tile:7:{col}: error: {message}
        s[i] = {expr};
{" " * (col - 1)}^{"~" * (length - 1)}"""


@pytest.mark.parametrize("expr", ["9223372036854775807", "-9223372036854775807 - 1", "3.4028235e38 + s[i]",
                                  "1e-45"])
def test_literal_range_accepted(expr):
    lower(Source("t.tile", ELEMENTWISE.format(expr)))


def test_f64_statement_takes_f64_literals():
    lower(Source("t.tile", """\
kernel k(A: f64[N], B: f64[N]) {
    grid (bx) = (cdiv(N, 64));
    threads 64;
    shared s: f64[64];
    copy(A[bx * 64], s);
    fill(s, 1e300);
    parallel (i) in (64) {
        s[i] = s[i] * 1e-300;
    }
    copy(s, B[bx * 64]);
}
"""))


def test_const_overflow():
    err = error_of("""\
kernel k(A: f32[M, N]) {
    const Q = 99999999999 * 99999999999;
    grid (bx) = (1);
    threads 128;
}
""")
    assert str(err) == """\
t.tile:2:15: error: the constant expression '99999999999 * 99999999999' is 9999999999800000000001, outside the 64-bit \
signed range (-2^63 .. 2^63-1) of tilec's integers
    const Q = 99999999999 * 99999999999;
              ^~~~~~~~~~~~~~~~~~~~~~~~~"""


def test_override_outside_64_bits():
    err = error_of(COPY2D, {"BM": 2**64})
    assert str(err) == ("error: const 'BM' = 18446744073709551616 is outside the 64-bit signed range (-2^63 .. "
                        "2^63-1) of tilec's integers")


# A shape symbol is a name in the generated CUDA too (const int blockIdx = ...
# was an NVRTC error): the reserved names of parameters and consts apply to it.
GENERATED = "C++ or the generated CUDA uses it"


@pytest.mark.parametrize("name, why", [
    ("blockIdx", GENERATED), ("threadIdx", GENERATED), ("float", "a C++ keyword"), ("int", "a C++ keyword"),
    ("mbarrier_wait", GENERATED), ("tl_smem", GENERATED), ("__x", GENERATED), ("tma_load_2d", GENERATED),
    ("cdiv", GENERATED), ("mbarrier_arrive", GENERATED), ("wgmma_fence", GENERATED), ("make_float4", GENERATED),
    ("CUstream", GENERATED), ("cudaStreamDefault", GENERATED), ("NV_IF_TARGET", GENERATED), ("_Pragma", GENERATED),
    ("TILEC_OK", GENERATED), ("EOF", "C's or CUDA's headers define it"), ("int64_t", "C's or CUDA's headers define it")])
def test_reserved_shape_symbol(name, why):
    err = error_of(f"""\
kernel k(A: f32[M, {name}], B: f32[M, {name}]) {{
    grid (bx) = (1);
    threads 128;
}}
""")
    assert str(err) == f"""\
t.tile:1:20: error: '{name}' is a reserved name ({why}); choose another
kernel k(A: f32[M, {name}], B: f32[M, {name}]) {{
                   ^{"~" * (len(name) - 1)}"""


# C++20's keywords and alternative tokens, NVRTC's NULL and the char types: a
# scalar so named was "NVRTC rejected the generated CUDA (a tilec bug...)".
@pytest.mark.parametrize("name, why", [(n, "a C++ keyword") for n in (
    "xor", "bitand", "bitor", "compl", "not_eq", "or_eq", "and_eq", "xor_eq", "char8_t", "char16_t", "char32_t",
    "concept", "requires", "co_await", "co_return", "co_yield", "consteval", "constinit", "thread_local")] + [
    ("NULL", "C's or CUDA's headers define it"), ("size_t", "C's or CUDA's headers define it"),
    ("main", "C++'s program entry point")])
def test_reserved_cxx_scalar(name, why):
    err = error_of(f"""\
kernel k(A: f32[M, N], {name}: i32) {{
    grid (bx) = (1);
    threads 128;
}}
""")
    assert str(err) == f"""\
t.tile:1:24: error: '{name}' is a reserved name ({why}); choose another
kernel k(A: f32[M, N], {name}: i32) {{
                       ^{"~" * (len(name) + 4)}"""


# A kernel is the extern "C" function of its name: main, and the C functions and
# types NVRTC's headers declare at global scope (kernel main was an NVRTC error).
def test_kernel_named_main():
    err = error_of("""\
kernel main(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
}
""")
    assert str(err) == """\
t.tile:1:8: error: 'main' is a reserved name (C++'s program entry point); choose another
kernel main(A: f32[M, N]) {
       ^~~~"""


@pytest.mark.parametrize("name", ["round", "printf", "dim3", "norm", "erf", "malloc", "std"])
def test_kernel_named_like_a_cuda_global(name):
    err = error_of(f"""\
kernel {name}(A: f32[M, N]) {{
    grid (bx) = (1);
    threads 128;
}}
""")
    assert str(err) == f"""\
t.tile:1:8: error: '{name}' is a reserved name for a kernel: a kernel is the extern "C" function of its name, and \
the CUDA headers NVRTC compiles with declare '{name}' at global scope; choose another
kernel {name}(A: f32[M, N]) {{
       ^{"~" * (len(name) - 1)}"""


def test_kernel_named_a7_crashes_nvrtc():
    err = error_of("""\
kernel A7(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
}
""")
    assert str(err) == """\
t.tile:1:8: error: 'A7' is a reserved name for a kernel: NVRTC 13.5 crashes compiling a kernel so named; choose another
kernel A7(A: f32[M, N]) {
       ^~"""


# The host wrapper declares the parameters and shape symbols as Python names: a
# Python keyword there was a SyntaxError traceback from `<tilec host wrapper of k>`.
PY_KEYWORDS = ["lambda", "None", "True", "def", "import", "pass", "in", "is", "as", "with", "global", "async",
               "await", "yield", "from", "del", "raise", "except", "finally", "elif", "nonlocal"]


@pytest.mark.parametrize("name", PY_KEYWORDS)
def test_python_keyword_parameter(name):
    err = error_of(f"""\
kernel k(A: f32[M, N], {name}: f32) {{
    grid (bx) = (1);
    threads 128;
}}
""")
    assert str(err) == f"""\
t.tile:1:24: error: '{name}' is a Python keyword: the host wrapper could not name the parameter so; choose another
kernel k(A: f32[M, N], {name}: f32) {{
                       ^{"~" * (len(name) + 4)}"""


@pytest.mark.parametrize("name", ["lambda", "None", "pass", "in", "with"])
def test_python_keyword_tensor_and_shape_symbol(name):
    err = error_of(f"""\
kernel k({name}: f32[M, N]) {{
    grid (bx) = (1);
    threads 128;
}}
""")
    assert str(err).splitlines()[0] == (f"t.tile:1:10: error: '{name}' is a Python keyword: the host wrapper could "
                                        "not name the parameter so; choose another")
    err = error_of(f"""\
kernel k(A: f32[M, {name}], B: f32[M, {name}]) {{
    grid (bx) = (1);
    threads 128;
}}
""")
    assert str(err) == f"""\
t.tile:1:20: error: '{name}' is a Python keyword: the host wrapper could not name the shape symbol so; choose another
kernel k(A: f32[M, {name}], B: f32[M, {name}]) {{
                   ^{"~" * (len(name) - 1)}"""


def test_python_keyword_elsewhere_is_a_name():
    """Only the host wrapper's names are Python's: a tile, loop variable or const may be `lambda`."""
    lower(Source("t.tile", """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const lambda = 64;
    grid (bx) = (cdiv(M, lambda));
    threads 128;
    shared pass: f32[64, 64];
    copy(A[bx * lambda, 0], pass);
    for import in range(2) {
        parallel (i, j) in (64, 64) {
            pass[i, j] = pass[i, j] + f32(import);
        }
    }
    copy(pass, B[bx * lambda, 0]);
}
"""))


# Consts are overridden as tilec.compile(src, **consts): a const named after one of its
# other arguments was "compile() got multiple values for keyword argument 'arch'" when
# tuned, and silently the option's value otherwise.
@pytest.mark.parametrize("name", ["src", "arch", "fallback", "debug", "backend", "tune", "key", "where", "tune_l2"])
def test_const_named_like_a_compile_option(name):
    err = error_of(f"""\
kernel k(A: f32[M, N]) {{
    const BM = 64, {name} = 1;
    grid (bx) = ({name});
    threads 128;
}}
""")
    assert str(err) == f"""\
t.tile:2:20: error: '{name}' is a keyword argument of tilec.compile(): a const so named could not be overridden \
(tilec.compile(src, {name}=...) sets the option, not the const); choose another
    const BM = 64, {name} = 1;
                   ^{"~" * (len(name) - 1)}"""


def test_tuned_const_named_like_a_compile_option():
    err = error_of("""\
kernel k(A: f32[M, N]) {
    const arch = 1;
    tune arch in (1, 2);
    grid (bx) = (1);
    threads 128;
}
""")
    assert str(err).splitlines()[0] == ("t.tile:2:11: error: 'arch' is a keyword argument of tilec.compile(): a const "
                                        "so named could not be overridden (tilec.compile(src, arch=...) sets the "
                                        "option, not the const); choose another")


# A float scalar named like a shape symbol: the same error as an integer one, at the
# shape (it was "a grid size must be an integer expression" at the grid).
@pytest.mark.parametrize("dtype", ["f32", "i32", "f16"])
def test_scalar_named_like_a_shape_symbol(dtype):
    err = error_of(f"""\
kernel k(A: f32[M, N], M: {dtype}) {{
    grid (bx) = (cdiv(M, 64));
    threads 128;
}}
""")
    assert str(err) == """\
t.tile:1:17: error: a tensor shape may use shape symbols, consts and integer literals only; 'M' is a scalar parameter
kernel k(A: f32[M, N], M: f32) {
                ^
note: name the dimension with a shape symbol and, if it must equal 'M', check that with a require: \
require SYMBOL == M;""".replace("M: f32", f"M: {dtype}")


# An integer division by the constant 0 is an error wherever it is, as in a const
# (the interpreter gave 0; the device's result is undefined); a float one is IEEE's.
@pytest.mark.parametrize("expr, col, length, shown", [
    ("f32(i % 0)", 20, 5, "i % 0"),
    ("f32(i / 0)", 20, 5, "i / 0"),
    ("f32(cdiv(i, 0))", 20, 10, "cdiv(i, 0)"),
    ("s[i] + f32(i / (64 - 64))", 27, 13, "i / 0"),
])
def test_integer_division_by_zero(expr, col, length, shown):
    assert expr_error(expr) == f"""\
t.tile:7:{col}: error: integer division by zero: '{shown}'
        s[i] = {expr};
{" " * (col - 1)}^{"~" * (length - 1)}"""


def test_float_division_by_zero_accepted():
    lower(Source("t.tile", ELEMENTWISE.format("s[i] / 0")))


def test_division_by_a_zero_const_in_a_loop_bound():
    err = error_of("""\
kernel k(A: f32[N], B: f32[N]) {
    const Z = 0;
    grid (bx) = (cdiv(N, 64));
    threads 64;
    shared s: f32[64];
    for t in range(N % Z) {
        copy(A[bx * 64], s);
    }
}
""")
    assert str(err) == """\
t.tile:6:20: error: integer division by zero: 'N % 0'
    for t in range(N % Z) {
                   ^~~~~"""


# Was reported only at the first call, at `where=:1:1`.
@pytest.mark.parametrize("cond, col, length, shown", [
    ("M / 0 > 0", 31, 5, "M / 0"),
    ("M > 0 && M % (2 - 2) == 0", 40, 11, "M % (2 - 2)"),
    ("cdiv(M, 0) > 0", 31, 10, "cdiv(M, 0)"),
])
def test_tune_condition_division_by_zero(cond, col, length, shown):
    err = error_of(f"""\
kernel k(A: f32[M, N]) {{
    const BM = 64;
    tune BM in (32, 64) where {cond};
    grid (bx) = (1);
    threads 128;
}}
""")
    assert str(err) == f"""\
t.tile:3:{col}: error: the tune condition divides by zero: '{shown}'
    tune BM in (32, 64) where {cond};
{" " * (col - 1)}^{"~" * (length - 1)}"""


# ---------------------------------------------------------------- messages that say the rule

def test_scalar_in_a_tensor_shape():
    err = error_of("""\
kernel k(A: f32[n], n: i32) {
    grid (bx) = (1);
    threads 128;
}
""")
    assert str(err) == """\
t.tile:1:17: error: a tensor shape may use shape symbols, consts and integer literals only; 'n' is a scalar parameter
kernel k(A: f32[n], n: i32) {
                ^
note: name the dimension with a shape symbol and, if it must equal 'n', check that with a require: require \
SYMBOL == n;"""


def test_write_to_a_global_tensor():
    err = error_of("""\
kernel k(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    parallel (i, j) in (4, 4) {
        A[i, j] = 1.0;
    }
}
""")
    assert str(err) == """\
t.tile:5:9: error: 'A' is a global tensor; its elements are not assigned: write a tile and copy it into a region \
of the tensor
        A[i, j] = 1.0;
        ^~~~~~~~~~~~~~"""


STATEMENTS = """\
kernel k(A: f32[M, N], n: i32) {{
    const BM = 64;
    let L = n + 1;
    grid (bx) = (1);
    threads 128;
    shared s: f32[64];
    {}
}}
"""


@pytest.mark.parametrize("stmt, length, message", [
    ("thread 128;", 6, "unknown statement 'thread' (did you mean 'threads'?)"),
    ("grd (by) = (1);", 3, "unknown statement 'grd' (did you mean 'grid'?)"),
    ("shard t: f32[64];", 5, "unknown statement 'shard' (did you mean 'shared'?)"),
    ("cosnt C = 1;", 5, "unknown statement 'cosnt' (did you mean 'const'?)"),
    ("paralel (i) in (64) { s[i] = 1.0; }", 7, "unknown statement 'paralel' (did you mean 'parallel'?)"),
    ("n = 3;", 1, "'n' is a scalar parameter; scalars cannot be assigned (a scalar is a value passed by the call)"),
    ("A = 3;", 1, "'A' is a global tensor; it is not assigned: write a tile and copy it into a region of the tensor"),
    ("s = 1.0;", 1, "'s' is a tile; assign its elements inside a parallel body (s[i] = ...), or all of them with "
                    "fill(s, v)"),
    ("BM = 3;", 2, "'BM' is a const; consts cannot be assigned (override one when compiling: -D BM=...)"),
    ("L = 3;", 1, "'L' is a let; lets cannot be assigned"),
    ("bx = 3;", 2, "'bx' cannot be assigned: the only assignment is to a tile element, inside a parallel body "
                   "(s[i] = ...)"),
])
def test_statement_messages(stmt, length, message):
    err = error_of(STATEMENTS.format(stmt))
    assert type(err) is ParseError
    assert str(err) == f"""\
t.tile:7:5: error: {message}
    {stmt}
    ^{"~" * (length - 1)}"""


@pytest.mark.parametrize("stmt, expected", [
    ("foo 128;", "t.tile:7:9: error: unexpected '128'; expected '(' or '['"),
    ("n == 3;", "t.tile:7:7: error: unexpected '=='; expected '(' or '['"),
    ("copy(A[0, 0], s;", "t.tile:7:20: error: unexpected ';'; expected one of '(', ')', ',', '=', '[', an operator"),
    ("s[0] = 1.0 +;", "t.tile:7:17: error: unexpected ';'; expected an expression"),
])
def test_other_syntax_errors_keep_the_parsers_message(stmt, expected):
    assert str(error_of(STATEMENTS.format(stmt))).splitlines()[0] == expected
