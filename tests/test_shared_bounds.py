"""A shared tile's element index that a parallel's own index space takes past the
tile (found by session 42's fuzzing: `o[i, j, l]` over j < 4096 on a tile of 2 in
that dim compiled, and wrote 4 KB past it on the GPU, where shared memory is not
bounds-checked). check-types evaluates each index lane by lane where it reads only
the lanes' indices and integers, and refuses one that leaves the tile; an access
under an `if`, in a select arm or right of `&&` / `||` is left alone."""
import itertools

import pytest
from hypothesis import given, settings, strategies as st

from tilec import SemanticError
from tilec.compiler import lower
from tilec.errors import Source
from tilec.passes.check_types import _index_range
from tilec.frontend import parse

from test_legality import evaluate

BODY = """kernel t(X: f32[64, 64], Y: f32[64, 64]) {{
    grid (bx) = (1);
    threads 128;
    shared s: f32[64, 64];
    shared o: f32[64, 64];
    copy(X, s);
    parallel (i, j) in ({ext}) {{
        {stmt}
    }}
    copy(o, Y);
}}
"""


def program(stmt, ext="64, 64"):
    return BODY.format(stmt=stmt, ext=ext)


def error(text):
    with pytest.raises(SemanticError) as e:
        lower(Source("t.tile", text), {})
    return e.value.render().splitlines()[0]


def test_a_read_past_the_last_row():
    assert error(program("o[i, j] = s[i + 1, j];")) == (
        "t.tile:8:21: error: this read of s[i + 1, j] goes past dimension 0 of shared tile 's' (0 to 63): over "
        "this parallel (i < 64, j < 64) the index runs from 1 to 64; shared memory is not bounds-checked on the "
        "GPU, so it would read other bytes (an access that only some lanes make goes under an if, or in a select "
        "arm)")


def test_a_write_past_a_dimension():
    assert error(program("o[i, j] = s[i, j];", "64, 128")).startswith(
        "t.tile:8:14: error: this write of o[i, j] goes past dimension 1 of shared tile 'o' (0 to 63): over this "
        "parallel (i < 64, j < 128) the index runs from 0 to 127;")


@pytest.mark.parametrize("stmt, col", [("if j > 7 { o[i, j] = s[i, 64]; }", 35),
                                       ("o[i, j] = select(j > 7, s[i - 64, j], 0.0);", 35)])
def test_an_index_outside_on_every_lane_is_refused_under_a_condition_too(stmt, col):
    """A condition may keep a lane-dependent index in, not one that no lane has inside
    (session 42's second fuzz: x[i, 64] of a 64-column tile under an if compiled)."""
    message = error(program(stmt))
    assert message.startswith(f"t.tile:8:{col}: error: this read of ") and message.endswith(
        "(no lane's index is inside the tile, whatever the condition around it)"), message


@pytest.mark.parametrize("stmt", [
    "o[i, j] = s[63 - i, (j + 7) % 64] + s[i / 2, min(j + 3, 63)] + s[i - i / 2, j * 3 % 64];",
    "o[i, j] = select(i + 1 < 64, s[i + 1, j], 0.0);",
    "if i > 0 { o[i, j] = s[i - 1, j]; }",
    "if i > 0 && s[i - 1, j] > 0.0 { o[i, j] = 1.0; }",
    "o[i, j] = s[i, j + bx];",          # reads a block index: not known here, not refused
])
def test_indices_that_stay_in_or_are_guarded_compile(stmt):
    lower(Source("t.tile", program(stmt)), {})


def index_exprs():
    leaf = st.one_of(st.sampled_from(["i", "j"]), st.integers(-9, 70).map(str))

    def grow(sub):
        return st.one_of(st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
                         st.tuples(sub, st.sampled_from(["/", "%"]), st.integers(1, 9)).map(
                             lambda t: f"({t[0]} {t[1]} {t[2]})"),
                         st.tuples(st.sampled_from(["min", "max"]), sub, sub).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
                         sub.map(lambda x: f"-{x}"), sub.map(lambda x: f"abs({x})"))
    return st.recursive(leaf, grow, max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(index_exprs(), st.integers(1, 9), st.integers(1, 9))
def test_the_range_is_each_lanes_value_at_its_extremes(text, ni, nj):
    """_index_range against C++'s arithmetic, lane by lane: the least and greatest value
    exactly (so an index refused really leaves the tile on some lane, and one kept
    stays in on every lane)."""
    k = parse(Source("t.tile", program(f"o[i, j] = s[{text}, j];", f"{ni}, {nj}")))
    par = next(s for s in k.body if type(s).__name__ == "Parallel")
    index = par.body[0].value.indices[0]
    values = [evaluate(index, dict(i=i, j=j)) for i, j in itertools.product(range(ni), range(nj))]
    assert _index_range(dict(i=ni, j=nj), index) == (min(values), max(values))
    refused = False
    try:
        lower(Source("t.tile", program(f"o[i, j] = s[{text}, j];", f"{ni}, {nj}")), {})
    except SemanticError as e:
        assert "goes past dimension 0 of shared tile 's'" in str(e), str(e)
        refused = True
    assert refused == (min(values) < 0 or max(values) > 63)


def test_a_huge_index_space_is_not_evaluated():
    from tilec.ir import nodes as ir
    assert _index_range({"i": 4096, "j": 4096}, ir.Var("i")) is None
    assert _index_range({"i": 1024, "j": 1024}, ir.Var("i")) == (0, 1023)
