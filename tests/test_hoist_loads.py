"""hoist-loads: a pipelined body's TMA loads move to its front, past the statements
they commute with, so that plan-pipeline runs them ahead. Which loads move, the
reason a load that stays gives (in the PipelineWarning), and a property test: any
body drawn from a pool of loads, element statements, a store and a `let` computes
in the interpreter, bit for bit, what the same body does as a plain `range` loop
(where nothing moves), with guarded outputs."""
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import tilec
from tilec.compiler import lower
from tilec.ir import nodes as ir

from guard import guarded

KERNEL = """
kernel body(A: f32[K, M, N], B: f32[K, M, N], Y: f32[M, N], Z: f32[K, M, N]) {{
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared a: f32[8, 32];
    shared b: f32[8, 32];
    shared c: f32[8, 32];
    local acc: f32[8, 32];
    local t: f32[8, 32];
    fill(acc, 0.0);
    fill(t, 1.0);
    fill(c, 0.0);
    for k in {loop} {{
{body}
    }}
    copy(acc, Y[by * 8, bx * 32]);
}}
"""

# the statements a body is drawn from: name -> (source, tiles it reads, tiles it writes)
POOL = {
    "load a": ("copy(A[k, by * 8, bx * 32], a);", set(), {"a"}),
    "load b": ("copy(B[k, by * 8, bx * 32], b);", set(), {"b"}),
    "let r": ("let r = (k * 7 + 3) % K;", set(), set()),
    "load b at r": ("copy(B[r, by * 8, bx * 32], b);", set(), {"b"}),
    "acc += a": ("parallel (i, j) in (8, 32) {\n    acc[i, j] = acc[i, j] + a[i, j] * t[i, j];\n}", {"a"}, set()),
    "acc += b": ("parallel (i, j) in (8, 32) {\n    acc[i, j] = acc[i, j] * 0.5 + b[i, j];\n}", {"b"}, set()),
    "t from acc": ("parallel (i, j) in (8, 32) {\n    t[i, j] = t[i, j] + acc[i, j] * 0.25;\n}", set(), set()),
    "c from a": ("parallel (i, j) in (8, 32) {\n    c[i, j] = c[i, j] + a[i, j];\n}", {"a"}, set()),
    "fill a": ("fill(a, 2.0);", set(), {"a"}),
    "store c": ("copy(c, Z[k, by * 8, bx * 32]);", set(), set()),
    "store c to A": ("copy(c, A[k, by * 8, bx * 32]);", set(), set()),
}


BODY_NAMES = {}     # source -> the pool names of its body


def source(names, loop):
    body = "\n".join("\n".join("        " + line for line in POOL[n][0].splitlines()) for n in names)
    src = KERNEL.format(loop=loop, body=body)
    BODY_NAMES[src] = tuple(names)
    return src


def loop_of(src, after="hoist-loads"):
    return next(s for s in lower(src).stages[after].body if isinstance(s, ir.For))


def order(src):
    """The body's statements after hoist-loads, as pool names (by their first line)."""
    first, line = {}, 14                        # the body's first line
    for n in BODY_NAMES.get(src, ()):
        first[line] = n
        line += len(POOL[n][0].splitlines())
    return [first[s.span.line] for s in loop_of(src).body]


def warnings_of(src):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        lower(src)
    return [str(w.message) for w in said if issubclass(w.category, tilec.PipelineWarning)]


@pytest.mark.parametrize("body, hoisted", [
    (["t from acc", "load a", "acc += a"], ["load a", "t from acc", "acc += a"]),
    (["store c", "load a", "acc += a"], ["load a", "store c", "acc += a"]),            # Z and A never overlap
    (["store c to A", "load a", "acc += a"], ["store c to A", "load a", "acc += a"]),  # A itself: stays
    (["c from a", "load a", "acc += a"], ["c from a", "load a", "acc += a"]),          # reads a: stays
    (["fill a", "load a", "acc += a"], ["fill a", "load a", "acc += a"]),              # writes a: stays
    (["let r", "load b at r", "acc += b"], ["load b at r", "acc += b"]),   # r's value is in the load
    (["load a", "acc += a", "t from acc", "load b", "acc += b"],
     ["load a", "load b", "acc += a", "t from acc", "acc += b"]),
    (["acc += b", "load a", "load b", "acc += a"], ["load a", "acc += b", "load b", "acc += a"]),
])
def test_which_loads_move(body, hoisted):
    assert order(source(body, "pipelined(K, stages = 2)")) == hoisted
    assert order(source(body, "range(K)")) == [n for n in body if n != "let r"]     # only pipelined loops


def test_a_moved_load_rotates_without_a_warning():
    src = source(["t from acc", "load a", "acc += a"], "pipelined(K, stages = 3)")
    assert warnings_of(src) == []
    assert loop_of(src, "plan-pipeline").rotate
    assert {b.name for b in lower(src).kernel.buffers} >= {"tl_a_stage1", "tl_a_stage2"}


@pytest.mark.parametrize("body, why", [
    (["c from a", "load a", "acc += a"], "line 14, which reads tile 'a'"),
    (["fill a", "load a", "acc += a"], "line 14, which writes tile 'a'"),
    (["store c to A", "load a", "acc += a"], "line 14, which writes A, the tensor it loads from"),
])
def test_a_load_that_stays_says_what_holds_it(body, why):
    said = warnings_of(source(body, "pipelined(K, stages = 2)"))
    assert len(said) == 1 and said[0].startswith("<string>:13:5: this pipelined loop (stages = 2) runs as a plain "
                                                 "loop: its body does not start with a TMA load, and the load into "
                                                 "tile "), said
    assert why + " (only loads that start the body, or can move there, run ahead)" in said[0], said


def test_a_load_after_a_moved_one_reports_the_statement_it_cannot_pass():
    said = warnings_of(source(["t from acc", "load a", "acc += a", "load a", "acc += a"], "pipelined(K, stages = 2)"))
    assert len(said) == 1 and said[0].endswith(
        "runs as a plain loop: the load into tile 'a' (line 21) cannot move ahead of line 18, which reads tile 'a' "
        "(only loads that start the body, or can move there, run ahead)"), said


def run(src, a, b, backend="interpret"):
    """(Y, Z, A) after the kernel `src` ran on (copies of) a and b (Z starts at 3.0,
    what a body without a store leaves; a body may store into A), Y and Z in guarded
    outputs; backend "interpret", or "gpu" (torch)."""
    like = "numpy" if backend == "interpret" else "torch"
    y = guarded(a.shape[1:], "f32", like=like)
    z = guarded(a.shape, "f32", like=like, fill=3.0)
    if backend == "interpret":
        a = a.copy()
        tilec.compile(src, backend="interpret")(a, b, y.view, z.view)
        outs = (y.view, z.view, a)
    else:
        import torch
        a = torch.from_numpy(a).cuda()
        with warnings.catch_warnings():
            warnings.simplefilter("error", tilec.TmaFallbackWarning)
            tilec.compile(src)(a, torch.from_numpy(b).cuda(), y.view, z.view)
        torch.cuda.synchronize()
        outs = (y.view.cpu(), z.view.cpu(), a.cpu())
    y.check(), z.check()
    return tuple(np.asarray(x).copy() for x in outs)


def operands(trips, seed, shape=(8, 32)):
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(-8, 9, (trips,) + shape).astype(np.float32) for _ in "ab")


@st.composite
def bodies(draw):
    """A body whose tiles a and b are loaded (or filled) before anything reads them,
    with `r` bound before it is used and at most once."""
    names = draw(st.lists(st.sampled_from(sorted(POOL)), min_size=2, max_size=7))
    seen = set()
    for n in names:
        _, reads, writes = POOL[n]
        assume(reads <= seen)
        assume(n != "let r" or "let r" not in seen)
        assume(n != "load b at r" or "let r" in seen)
        seen |= writes | {n}
    assume(any(n.startswith("load") for n in names))
    return names


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(bodies(), st.integers(2, 4), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_a_hoisted_body_computes_what_the_plain_loop_does(names, stages, trips, seed):
    a, b = operands(trips, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.PipelineWarning)
        want = run(source(names, "range(K)"), a, b)
        got = run(source(names, f"pipelined(K, stages = {stages})"), a, b)
    for w, g in zip(want, got):
        assert np.array_equal(w.view(np.uint32), g.view(np.uint32)), names


def test_a_load_moved_past_a_store_cannot_meet_that_store_in_memory():
    """The load from A moves ahead of the store to Z because no launch may pass one
    tensor as both (Z is stored before A is read: not in place): that launch is refused."""
    src = source(["store c", "load a", "acc += a"], "pipelined(K, stages = 2)")
    assert order(src) == ["load a", "store c", "acc += a"]
    a, b = operands(3, 0)
    y = np.zeros((8, 32), np.float32)
    with pytest.raises(tilec.LaunchError, match="arguments A and Z are one tensor .* cannot run in place"):
        tilec.compile(src, backend="interpret")(a, b, y, a)


def test_a_store_to_a_tensor_a_launch_may_pass_as_the_source_holds_the_load():
    """blocker's contract beyond what mark-in-place lets a program reach (it allows Z
    in place of A only where every read of A comes first): a store to Z stops a load
    from A once a launch may pass Z as A, and not otherwise."""
    from dataclasses import replace
    from tilec.passes import hoist_loads
    k = lower(source(["store c", "load a", "acc += a"], "pipelined(K, stages = 2)")).stages["mark-in-place"]
    store, load = next(s for s in k.body if isinstance(s, ir.For)).body[:2]
    assert hoist_loads.blocker(k, load, store) is None
    aliased = replace(k, in_place=k.in_place + ((("Z", "A"), None),))
    assert hoist_loads.blocker(aliased, load, store) == "writes Z, which a launch may pass as A (in place)"
