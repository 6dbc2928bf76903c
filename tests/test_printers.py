"""The printers against the languages they print. Random integer expressions and tile
element indices, printed by codegen/cuda.py, compiled by the host C++ compiler and run, must
give what C++ semantics say (a small evaluator here: truncating / and %, 0/1 comparisons)
and row-major flattening; the host wrapper's Python (codegen/host.py) and tilec export's C++
(codegen/export.py) must give the host's rule (/ and % floor). Session 23 found
`a[3 - i, j]` printed as a[3 - i * 16 + j], `5 && 6` as Python's 6, `- -x` as C++'s --x.
The C++ tests skip without a host C++ compiler."""
import random
import re
import shutil
import subprocess

import pytest

from tilec.codegen import cuda
from tilec.compiler import lower
from tilec.ir import nodes as ir

CXX = shutil.which("g++") or shutil.which("clang++") or shutil.which("c++")
SOURCE = """
kernel k(A: i32[N]) {
    grid (bx) = (cdiv(N, 64));
    threads 64;
    shared s: i32[4, 8, 16];
    shared t: i32[16];
    copy(A[bx * 16], t);
    parallel (i, j, l) in (4, 8, 16) {
        s[i, j, l] = t[l];
    }
}
"""
VARS = ("i", "j", "l")
POINTS = [(i, j, l) for i in range(-3, 4) for j in (-5, 0, 2, 7) for l in (-9, 1, 6)]


def tdiv(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def c_eval(e, env, floor=False):
    """An int expression's value: C++'s (truncating / and %), or with `floor` the host's
    rule (Python's // and %, cdiv the exact ceiling: docs/language.md §13)."""
    if isinstance(e, ir.Int):
        return e.value
    if isinstance(e, ir.Var):
        return env[e.name]
    div = (lambda a, b: a // b) if floor else tdiv
    if isinstance(e, ir.UnaryOp):
        v = c_eval(e.operand, env, floor)
        return -v if e.op == "-" else int(v == 0)
    if isinstance(e, ir.Call):
        a = [c_eval(x, env, floor) for x in e.args]
        return {"min": lambda: min(a), "max": lambda: max(a), "abs": lambda: abs(a[0]),
                "select": lambda: a[1] if a[0] else a[2],
                "cdiv": lambda: div(a[0], a[1]) + (a[0] - a[1] * div(a[0], a[1]) > 0)}[e.func]()
    a, b = c_eval(e.lhs, env, floor), c_eval(e.rhs, env, floor)
    ops = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: div(a, b),
           "%": lambda: a - b * div(a, b), "==": lambda: int(a == b), "!=": lambda: int(a != b),
           "<": lambda: int(a < b), "<=": lambda: int(a <= b), ">": lambda: int(a > b),
           ">=": lambda: int(a >= b), "&&": lambda: int(bool(a) and bool(b)), "||": lambda: int(bool(a) or bool(b))}
    return ops[e.op]()


def random_expr(rng, depth):
    """Small values only (no 32-bit overflow at POINTS); divisors are nonzero constants."""
    if depth == 0 or rng.random() < 0.25:
        return ir.Var(rng.choice(VARS), kind="lane") if rng.random() < 0.6 else ir.Int(rng.randint(-9, 9))
    r = rng.random()
    if r < 0.55:
        op = rng.choice(["+", "-", "*", "/", "%", "+", "-", "==", "!=", "<", "<=", ">", ">=", "&&", "||"])
        rhs = ir.Int(rng.choice([-7, -3, -2, 2, 3, 5])) if op in "/%" else random_expr(rng, depth - 1)
        return ir.BinOp(op, random_expr(rng, depth - 1), rhs)
    if r < 0.7:
        return ir.UnaryOp(rng.choice("-!"), random_expr(rng, depth - 1))
    f = rng.choice(["min", "max", "abs", "select", "cdiv"])
    if f == "abs":
        return ir.Call(f, (random_expr(rng, depth - 1),))
    if f == "select":
        return ir.Call(f, tuple(random_expr(rng, depth - 1) for _ in range(3)))
    if f == "cdiv":
        return ir.Call(f, (random_expr(rng, depth - 1), ir.Int(rng.choice([2, 3, 7]))))
    return ir.Call(f, (random_expr(rng, depth - 1), random_expr(rng, depth - 1)))


def run_cxx(tmp_path, printer, bodies, extra=()):
    """Each body a C++ expression over int i, j, l: its values at POINTS."""
    lines = ["#include <cstdio>", *extra, "#define __device__", "#define __forceinline__ inline",
             "template <class A, class B> auto tl_min(A a, B b) { return a < b ? a : b; }",
             "template <class A, class B> auto tl_max(A a, B b) { return a < b ? b : a; }",
             "template <class A, class B> auto tl_cdiv(A a, B b) { return a / b + (a % b > 0); }",
             "template <class A> A tl_abs(A a) { return a < 0 ? -a : a; }"]
    lines += [f"static long long f{n}(int i, int j, int l) {{ return (long long)({b}); }}" for n, b in enumerate(bodies)]
    lines += ["int main() {", f"  const int P[][3] = {{{', '.join('{%d, %d, %d}' % p for p in POINTS)}}};",
              "  for (const auto& p : P) {", *[f'    printf("%lld\\n", f{n}(p[0], p[1], p[2]));'
                                               for n in range(len(bodies))], "  }", "  return 0;", "}"]
    (tmp_path / "t.cpp").write_text("\n".join(lines) + "\n")
    subprocess.run([CXX, "-std=c++17", "-O0", "-w", "-o", str(tmp_path / "t"), str(tmp_path / "t.cpp")], check=True)
    out = [int(x) for x in subprocess.run([str(tmp_path / "t")], capture_output=True, text=True,
                                          check=True).stdout.split()]
    return [[out[p * len(bodies) + n] for p in range(len(POINTS))] for n in range(len(bodies))]


@pytest.fixture(scope="module")
def printer():
    return cuda._Printer(lower(SOURCE).kernel)


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
def test_integer_expressions_print_as_cxx_computes_them(tmp_path, printer):
    rng = random.Random(20261127)
    exprs = [random_expr(rng, 3) for _ in range(400)]
    got = run_cxx(tmp_path, printer, [printer.expr(e) for e in exprs])
    for e, values in zip(exprs, got):
        want = [c_eval(e, dict(zip(VARS, p))) for p in POINTS]
        assert values == want, f"{printer.expr(e)}: C++ gives {values[:8]}..., C semantics {want[:8]}..."


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
def test_tile_element_indices_flatten_row_major(tmp_path, printer):
    """s[e0, e1, e2] of the [4, 8, 16] tile is element e0 * 128 + e1 * 16 + e2, whatever
    the index expressions (values outside the tile too: the arithmetic is what is checked)."""
    rng = random.Random(23)
    s = printer.k.buffer("s")
    cases = [tuple(random_expr(rng, 2) for _ in range(3)) for _ in range(300)]
    refs = [printer.element(s, idx) for idx in cases]
    assert all(r.startswith("s[") and r.endswith("]") for r in refs)
    got = run_cxx(tmp_path, printer, [r[2:-1] for r in refs])
    for idx, ref, values in zip(cases, refs, got):
        want = [sum(c_eval(x, dict(zip(VARS, p))) * st for x, st in zip(idx, (128, 16, 1))) for p in POINTS]
        assert values == want, f"{ref}: C++ gives {values[:8]}..., row-major {want[:8]}..."


# ---------------------------------------------------------------- the host printers

def floor_eval(e, env):
    """A host expression's value (the grid, requires, shapes)."""
    return c_eval(e, env, floor=True)


def test_host_expressions_print_as_python_computes_them(printer):
    """The host wrapper's Python (codegen/host.py py_expr) of the grid, requires and shapes."""
    from tilec.codegen.host import py_expr
    from tilec.runtime.host import cdiv
    rng = random.Random(11)
    for _ in range(400):
        e = random_expr(rng, 3)
        text = py_expr(e)
        for p in POINTS:
            env = dict(zip(VARS, p))
            got = eval(text, {"tl_rt": type("rt", (), {"cdiv": staticmethod(cdiv)})}, env)
            assert got == floor_eval(e, env), f"{text} at {env}: Python gives {got}, the host's rule {floor_eval(e, env)}"


@pytest.mark.skipif(CXX is None, reason="no host C++ compiler")
def test_host_expressions_print_as_the_exported_cxx_computes_them(tmp_path, printer):
    """tilec export's C++ (codegen/export.py _HostExpr) of the same expressions."""
    from tilec._resources import resource
    from tilec.codegen.export import _HostExpr
    host = _HostExpr(printer.k)
    rng = random.Random(12)
    exprs = [e for e in (random_expr(rng, 3) for _ in range(400)) if not any(
        isinstance(x, ir.Call) and x.func == "select" for x in _walk(e))]
    bodies = [host(e) for e in exprs]
    template = (resource("templates") / "export.cc.j2").read_text()     # the helpers an export defines
    helpers = re.findall(r"^long long tl_(?:cdiv|floordiv|floormod)\(.*?^}", template, re.M | re.S)
    assert len(helpers) == 3, helpers
    got = run_cxx(tmp_path, printer, bodies, ["#include <algorithm>", "#include <cstdlib>", *helpers])
    for e, text, values in zip(exprs, bodies, got):
        want = [floor_eval(e, dict(zip(VARS, p))) for p in POINTS]
        assert values == want, f"{text}: C++ gives {values[:8]}..., the host's rule {want[:8]}..."


def _walk(e):
    yield e
    for f in ("lhs", "rhs", "operand"):
        if hasattr(e, f):
            yield from _walk(getattr(e, f))
    for a in getattr(e, "args", ()):
        yield from _walk(a)


def test_ir_expressions_parse_back_to_what_they_compute():
    """`tilec emit --emit ir` prints expressions in the language's syntax (ir/printer.py):
    parsed back by the front end, each computes what it printed (C++ rules, as in a kernel body)."""
    from tilec.errors import Source
    from tilec.frontend.build import build_ir
    from tilec.frontend.parse import parse_tree
    from tilec.ir.printer import expr as ir_expr
    rng = random.Random(13)
    for _ in range(400):
        e = random_expr(rng, 3)
        text = ir_expr(e)
        source = Source("printed", text)
        back = build_ir(parse_tree(source, start="expr"), source)
        for p in POINTS:
            env = dict(zip(VARS, p))
            assert c_eval(back, env) == c_eval(e, env), f"{text} parses to {ir_expr(back)} at {env}"


def test_constant_folding_agrees_with_where_the_code_runs():
    """exprs.fold of constant expressions: "trunc" (kernel bodies) gives C++'s value, "floor"
    (host expressions) the host's rule, "exact" (lets) either value or leaves a / or % of a
    negative operand unfolded, so that the use site decides (session 23: (-1 * 1) / 2 in a
    parallel body folded to -1, where the device computes 0)."""
    from tilec.ir.exprs import fold
    rng = random.Random(14)
    seen_exact_partial = 0
    for _ in range(2000):
        e = random_expr(rng, 3)
        env = {v: rng.randint(-9, 9) for v in VARS}
        const = _substitute(e, env)
        truncated, floored, exact = fold(const, "trunc"), fold(const, "floor"), fold(const, "exact")
        assert isinstance(truncated, ir.Int) and truncated.value == c_eval(e, env), _show(e, env)
        assert isinstance(floored, ir.Int) and floored.value == floor_eval(e, env), _show(e, env)
        if isinstance(exact, ir.Int):
            assert exact.value == c_eval(e, env) == floor_eval(e, env), _show(e, env)
        else:
            seen_exact_partial += 1
            assert fold(exact, "trunc").value == c_eval(e, env), _show(e, env)
            assert fold(exact, "floor").value == floor_eval(e, env), _show(e, env)
    assert seen_exact_partial > 50


def _substitute(e, env):
    from tilec.ir.exprs import map_expr
    return map_expr(e, lambda x: ir.Int(env[x.name]) if isinstance(x, ir.Var) else x)


def _show(e, env):
    from tilec.ir.printer import expr as ir_expr
    return f"{ir_expr(e)} at {env}"
