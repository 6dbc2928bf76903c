"""Bad input never crashes the compiler: random token streams and mutated
examples either compile or raise a TilecError that points into the source."""
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tilec.codegen import cuda as cuda_codegen
from tilec.codegen import host as host_codegen
from tilec.compiler import lower
from tilec.errors import Source, TilecError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [p.read_text() for p in sorted((ROOT / "examples").glob("*.tile"))]
TOKENS = ["kernel", "k", "(", ")", "{", "}", "[", "]", ",", ";", ":", "=", "==", "+", "-", "*", "/", "%", "<",
          "&&", "||", "!", "const", "let", "require", "grid", "threads", "shared", "local", "copy", "fill", "gemm",
          "parallel", "for", "in", "range", "pipelined", "if", "else", "im2col", "kernel", "stages", "f16", "f32",
          "bf16", "i8", "A", "B", "s", "t", "M", "N", "bx", "by", "i", "j", "BM", "0", "1", "16", "64", "128",
          "256", "1.5", "cdiv", "min", "exp", "//c\n", "\n", "@", "$", "\"", "99999999999999999999"]


def check(text):
    try:
        lowered = lower(Source("fuzz.tile", text))
    except TilecError as e:
        assert e.span is not None or "const" in e.message, e.render()
        assert e.render().startswith("fuzz.tile:") or e.span is None
        return
    k = lowered.kernel
    cuda_codegen.generate(k, "fuzz.tile")
    host_codegen.generate(k, "fuzz.tile")


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@seed(20261123)
@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=60))
def test_random_token_streams(tokens):
    check(" ".join(tokens))


@st.composite
def mutated_example(draw):
    text = draw(st.sampled_from(EXAMPLES))
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        i = draw(st.integers(0, len(text) - 1))
        j = min(len(text), i + draw(st.integers(1, 12)))
        op = draw(st.sampled_from(["delete", "duplicate", "insert", "replace"]))
        if op == "delete":
            text = text[:i] + text[j:]
        elif op == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        else:
            tok = draw(st.sampled_from(TOKENS))
            text = text[:i] + f" {tok} " + (text[i:] if op == "insert" else text[j:])
    return text


@seed(20261124)
@SETTINGS
@given(mutated_example())
def test_mutated_examples(text):
    check(text)


@seed(20261125)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.text(max_size=200))
def test_arbitrary_text(text):
    check(text)


NUMBERS = [0, 1, 2, 3, 5, 7, 15, 16, 17, 31, 32, 33, 255, 256, 257, 1000, 4096, 2**31, 2**40]


@st.composite
def renumbered_example(draw):
    """An example with some of its integers replaced: reaches the checks past the parser."""
    import re
    text = draw(st.sampled_from(EXAMPLES))
    for _ in range(draw(st.integers(1, 3))):
        nums = list(re.finditer(r"\b\d+\b", text))
        m = nums[draw(st.integers(0, len(nums) - 1))]
        text = text[:m.start()] + str(draw(st.sampled_from(NUMBERS))) + text[m.end():]
    return text


@seed(20261126)
@SETTINGS
@given(renumbered_example())
def test_renumbered_examples(text):
    check(text)


def _exprs():
    """Integer expressions of the language's operators, as IR."""
    from tilec.ir import nodes as ir
    leaf = st.one_of(st.integers(0, 99).map(ir.Int), st.sampled_from(["A", "B", "M", "BM"]).map(ir.Var))
    ops = ["||", "&&", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%"]
    return st.recursive(leaf, lambda sub: st.one_of(
        st.builds(ir.BinOp, st.sampled_from(ops), sub, sub),
        st.builds(ir.UnaryOp, st.sampled_from(["!", "-"]), sub),
        st.builds(lambda f, a, b: ir.Call(f, (a, b)), st.sampled_from(["min", "max", "cdiv"]), sub, sub)),
        max_leaves=10)


@seed(20261126)
@SETTINGS
@given(_exprs())
def test_printed_expressions_parse_back_to_the_same_ir(e):
    """What `--emit ir` prints of an expression (a tune condition, a require, an
    if) is the language: parsed again, it is the same tree (comparisons do not
    chain in the grammar, so the printer parenthesises `(a == b) == c`)."""
    from dataclasses import replace
    from tilec.frontend.build import build_ir
    from tilec.frontend.parse import parse_tree
    from tilec.ir.exprs import map_expr
    from tilec.ir.printer import expr as show

    def bare(x):
        return map_expr(x, lambda y: replace(y, span=None))
    text = show(e)
    source = Source("expr", text)
    assert bare(build_ir(parse_tree(source, start="expr"), source)) == bare(e), text
    # the names the tuner reads from a condition's text, without the parser (its key check)
    from tilec.autotune import condition_names
    from tilec.ir.exprs import free_names
    assert condition_names(text) == free_names(e), text


@seed(20261126)
@SETTINGS
@given(_exprs(), st.fixed_dictionaries({n: st.integers(-99, 99) for n in ("A", "B", "M", "BM")}))
def test_a_condition_evaluated_as_integers_is_what_folding_gives(e, values):
    """The tuner decides a `where` condition for each candidate at a key's values by
    plain integer arithmetic (autotune._evaluator), not by folding the IR: both
    give the same value, or the evaluator a division by zero where folding
    raises its error."""
    from tilec import autotune
    from tilec.errors import SemanticError
    from tilec.ir import nodes as ir
    from tilec.ir.exprs import fold, substitute
    try:
        want = fold(substitute(e, {n: ir.Int(v) for n, v in values.items()}))
    except SemanticError:
        want = None
    try:
        got = autotune._evaluator(e)(values)
    except ZeroDivisionError:
        got = None
    if want is None:
        assert got is None, (e, values)
    else:
        assert isinstance(want, ir.Int) and got == want.value, (e, values)
