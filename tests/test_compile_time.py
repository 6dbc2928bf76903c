"""Programs whose compile-time cost once grew without bound and without a word:
chains of lets (each reading the one before twice: 2^n nodes). The loop nests that
check-barriers ran as a product of their trips are in test_check_barriers.py
(test_a_nest_runs_each_loop_a_few_times_per_level)."""
import time

import pytest

from tilec.compiler import lower
from tilec.errors import SemanticError, Source
from tilec.ir import nodes as ir
from tilec.ir.exprs import fold, substitute, tree_size
from conftest import ROOT


def chain(n, link="L{p} * 2 + L{p}", first="M % 7", block=False):
    """n lets, each `link` of the one before, the last one in a TMA load's row; at the
    top of the kernel, or (`block`) inside a loop, the first one reading its variable."""
    pad = "        " if block else "    "
    lets = f"{pad}let L0 = {'r % 7' if block else first};\n" + "".join(
        f"{pad}let L{k} = {link.format(p=k - 1)};\n" for k in range(1, n))
    body = f"{pad}copy(A[L{n - 1} % 64, bx * 16], s);\n{pad}copy(s, B[0, bx * 16]);\n"
    if block:
        body = f"    for r in range(cdiv(M, 16)) {{\n{lets}{body}    }}\n"
    return ("kernel k(A: f32[M, N], B: f32[M, N]) {\n    grid (bx) = (cdiv(N, 16));\n    threads 128;\n"
            f"    shared s: f32[16, 16];\n{'' if block else lets}{body}}}\n")


def _value(e, **names):
    v = fold(substitute(e, {n: ir.Int(x) for n, x in names.items()}), "trunc")
    assert isinstance(v, ir.Int), v
    return v.value


def test_a_chain_of_30_lets_lowers_at_once():
    """`let Lk = L{k-1} * 2 + L{k-1}`, 30 of them: each let is written out where it is
    used, so L29 was 2^30 nodes, which fold, substitute, check-types and every printer
    walked (20 links took 50 s to check, 18 12 s). A let past 256 nodes is folded as
    the linear combination it is (M % 7 * 3^k), with the same value."""
    start = time.perf_counter()
    low = lower(Source("k.tile", chain(30)))
    assert time.perf_counter() - start < 2
    lets = dict(low.stages["fold-consts"].lets)
    for k in (5, 12, 29):
        assert tree_size(lets[f"L{k}"]) < 300
        assert _value(lets[f"L{k}"], M=12) == 5 * 3 ** k
    assert len(low.ir_text("fold-consts")) < 20_000
    load = next(s for s in ir.walk_stmts(low.kernel.body) if isinstance(s, ir.TmaLoad))
    assert _value(load.coords[0], M=12, bx=0) == 5 * 3 ** 29 % 64


def test_a_chain_of_lets_in_a_loop_lowers_at_once():
    start = time.perf_counter()
    low = lower(Source("k.tile", chain(30, block=True)))
    assert time.perf_counter() - start < 2
    load = next(s for s in ir.walk_stmts(low.kernel.body) if isinstance(s, ir.TmaLoad))
    assert _value(load.coords[0], r=3, bx=0) == 3 * 3 ** 29 % 64


@pytest.mark.parametrize("block", [False, True])
def test_a_chain_of_lets_that_is_no_linear_combination_is_an_error(block):
    """`let Lk = L{k-1} / 2 + L{k-1}` doubles at each link and folds to nothing smaller:
    an error at the first let past 10000 nodes, at once, not minutes of lowering."""
    start = time.perf_counter()
    with pytest.raises(SemanticError) as err:
        lower(Source("k.tile", chain(30, "L{p} / 2 + L{p}", block=block)))
    assert time.perf_counter() - start < 2
    assert err.value.message.startswith("let 'L11' is an expression of 12285 nodes once the lets it reads are "
                                        "written out in it (at most 10000)")
    assert "compute the value in fewer steps" in err.value.render()


def test_the_examples_lets_are_left_as_they_are():
    """Nothing in the examples comes near the size where a let is folded as a linear
    combination: their largest let, written out, is a few dozen nodes."""
    from tilec.passes import fold_consts
    for path in sorted((ROOT / "examples").glob("*.tile")):
        k = lower(path).stages["fold-consts"]
        assert all(tree_size(e) <= fold_consts.LET_LINEAR_ABOVE // 4 for _, e in k.lets), path


def test_a_chain_of_float_lets_is_not_refolded():
    """A float sum's rounding depends on its form: a chain of lets of a tile's element
    stays as written (and is an error where it passes 10000 nodes)."""
    def program(n):
        lets = "".join(f"        let x{k} = x{k - 1} * 2 + x{k - 1};\n" for k in range(1, n))
        return ("kernel k(A: f32[M, N]) {\n    grid (bx) = (1);\n    threads 128;\n    local t: f32[16, 16];\n"
                "    copy(A[0, 0], t);\n    parallel (i, j) in (16, 16) {\n        let x0 = t[i, j];\n"
                f"{lets}        t[i, j] = x{n - 1};\n    }}\n    copy(t, A[0, 0]);\n}}\n")
    k = lower(Source("k.tile", program(9))).stages["fold-consts"]
    assign = next(s for s in ir.walk_stmts(k.body) if isinstance(s, ir.Assign))
    assert tree_size(assign.value) == 6 * 2 ** 8 - 3 > 256         # t[i, j]: 3 nodes
    with pytest.raises(SemanticError, match="let 'x11' is an expression of 12285 nodes"):
        lower(Source("k.tile", program(14)))
