"""Programs whose compile-time cost once grew without bound and without a word:
chains of lets (each reading the one before twice: 2^n nodes), and tune spaces
of a million candidates for `tilec check` and a tune. The loop nests that
check-barriers ran as a product of their trips are in test_check_barriers.py
(test_a_nest_runs_each_loop_a_few_times_per_level)."""
import time

import pytest

import tilec
from tilec import TilecError
from tilec.compiler import lower
from tilec.errors import SemanticError, Source
from tilec.ir import nodes as ir
from tilec.ir.exprs import fold, substitute, tree_size
from conftest import ROOT
from test_cli import tilec as run_tilec


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


HUGE = """kernel k(A: f32[M, N]) {
    const A1 = 1, A2 = 1, A3 = 1, A4 = 1, A5 = 1, A6 = 1;
    tune A1 in (1,2,3,4,5,6,7,8,9,10), A2 in (1,2,3,4,5,6,7,8,9,10), A3 in (1,2,3,4,5,6,7,8,9,10), \
A4 in (1,2,3,4,5,6,7,8,9,10), A5 in (1,2,3,4,5,6,7,8,9,10), A6 in (1,2,3,4,5,6,7,8,9,10)WHERE;
    grid (bx) = (A1);
    threads 128;
}
"""


def test_check_takes_a_sample_of_a_huge_space():
    """A space of a million candidates (6 consts, 10 values each: ~11 hours of `tilec
    check` at 40 ms a candidate): its `where` condition is evaluated on CHECK_POOL of
    them drawn with a fixed seed, and --max-candidates of those left (default 1024) are
    compiled, the declared ones first, in a blink; every value of every const turns up."""
    from tilec.autotune import CHECK_POOL, MAX_CHECKED, checked_candidates, statement_space
    for where in ("", " where A1 + A2 <= 4"):
        source = Source("k.tile", HUGE.replace("WHERE", where))
        space, first, cond = statement_space(source, {})
        start = time.perf_counter()
        cands, kept, pool, sampled = checked_candidates(source, {}, space, first, cond)
        assert time.perf_counter() - start < 5
        assert (len(cands), sampled, pool) == (MAX_CHECKED, True, CHECK_POOL)
        assert kept == pool if not where else 1000 < kept < 1400         # 1 in 10 of the space has A1 + A2 <= 4
        assert cands[0] == first and len({tuple(c.values()) for c in cands}) == len(cands)
        assert all(c["A1"] + c["A2"] <= 4 for c in cands) if where else True
        for name in ("A2", "A6") if not where else ("A6",):
            assert {c[name] for c in cands} == set(range(1, 11))
        assert checked_candidates(source, {}, space, first, cond) == (cands, kept, pool, sampled)   # the same
    # a space of at most CHECK_POOL: the condition on each candidate; all it leaves, fewer than the limit
    small = HUGE.replace("A5 in (1,2,3,4,5,6,7,8,9,10), A6 in (1,2,3,4,5,6,7,8,9,10)", "A5 in (1, 2)")
    source = Source("k.tile", small.replace("WHERE", " where A1 + A2 + A3 + A4 <= 6"))
    space, first, cond = statement_space(source, {})
    cands, kept, pool, sampled = checked_candidates(source, {}, space, first, cond)
    assert (len(cands), kept, pool, sampled) == (30, 30, 20_000, False)


def test_tilec_check_says_what_it_compiles(tmp_path):
    """Up front, on stderr: a sample's warning (the space's size, what is compiled, how
    to check it all), or, past 32 candidates, how many it compiles; the summary line
    says when it is a sample."""
    (tmp_path / "k.tile").write_text(HUGE.replace("WHERE", ""))
    start = time.perf_counter()
    p = run_tilec("check", "k.tile", "--max-candidates", "6", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert time.perf_counter() - start < 60
    assert p.stderr == ("k.tile: warning: tune: the space has 1000000 candidates (10 x 10 x 10 x 10 x 10 x 10 "
                        "values); tilec check draws 20000 of them and compiles 6 of those (--max-candidates 6): "
                        "narrow the space (a `where` condition, fewer values, -D for a const) or give "
                        "--max-candidates 0 to check every one\n")
    assert p.stdout.startswith("k.tile: ok (kernel k, ") and p.stdout.endswith(
        "tune: 6 of 6 candidates compile; a sample of the space's 1000000)\n")
    two = HUGE.replace(", A3 in (1,2,3,4,5,6,7,8,9,10), A4 in (1,2,3,4,5,6,7,8,9,10), A5 in (1,2,3,4,5,6,7,8,9,10), "
                       "A6 in (1,2,3,4,5,6,7,8,9,10)", "")
    (tmp_path / "k.tile").write_text(two.replace("WHERE", " where A1 + A2 <= 9"))
    p = run_tilec("check", "k.tile", cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr == "k.tile: tune: checking 36 candidates; 64 more excluded by the tune condition for every " \
                       "shape\n"
    p = run_tilec("check", "k.tile", "--max-candidates", "8", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr.startswith("k.tile: warning: tune: the space has 100 candidates (10 x 10 values); 36 left by "
                               "the tune condition; tilec check compiles 8 of them drawn at random "
                               "(--max-candidates 8): ")
    assert p.stdout.splitlines()[0].endswith("tune: 8 of 8 candidates compile; 64 more excluded by the tune "
                                             "condition for every shape; a sample of the space's 100)")
    p = run_tilec("check", "k.tile", "--max-candidates", "-1", cwd=tmp_path)
    assert p.returncode == 1 and p.stderr == "error: --max-candidates takes a count (0: every candidate), got -1\n"


def test_the_command_lines_default_is_the_checks():
    from tilec import autotune, cli
    assert cli.MAX_CHECKED == autotune.MAX_CHECKED


def test_a_tune_refuses_a_space_too_large_to_compile():
    """A tune's first call with new key values compiles every candidate its `where`
    keeps (about half a second of CPU each): past MAX_TUNED it is an error naming the
    count and what to do, before anything is compiled (a million: weeks of CPU)."""
    k = tilec.compile(Source("k.tile", HUGE.replace("WHERE", "")), arch="sm_90a")
    with pytest.raises(TilecError) as err:
        k._meeting((64, 64))
    assert err.value.message.startswith("autotune k at M=64 N=64: 1000000 candidates to compile and time, more than a "
                                     "tune takes (4096; ")
    assert "narrow the space (10 x 10 x 10 x 10 x 10 x 10 values) with a `where` condition" in err.value.message
    five = HUGE.replace(", A6 in (1,2,3,4,5,6,7,8,9,10)", "")
    k = tilec.compile(Source("k.tile", five.replace("WHERE", " where A1 * 100 <= M && A2 == 1")), arch="sm_90a")
    assert len(k._meeting((100, 64))[0]) == 1000
    with pytest.raises(TilecError, match=r"at M=500 N=64: 5000 candidates to compile and time \(the tune condition "
                                         r"`A1 \* 100 <= M && A2 == 1` is true for 5000 of the space's 100000\)"):
        k._meeting((500, 64))


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
