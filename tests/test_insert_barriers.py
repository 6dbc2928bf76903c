"""insert-barriers' choice of a block barrier before a loop (sync_before_loop): what
it costs the compiler in a nest of loops. The placements themselves are checked in
tests/filecheck/barrier_before_loop.tile and barrier_stays_in_loop.tile."""
import tilec.passes.insert_barriers as ib
from tilec.compiler import lower


def nest(depth: int) -> str:
    """`depth` loops, one in the other, each writing the shared tile s that the
    innermost one stores: every loop is entered with s written by threads."""
    lines = ["kernel nest(Y: f32[M, 64], n: i32) {", "    grid (bx) = (1);", "    threads 128;",
             "    shared s: f32[16, 64];", "    fill(s, 1.0);"]
    for d in range(depth):
        pad = "    " * (d + 1)
        lines += [f"{pad}for t{d} in range(n) {{",
                  f"{pad}    parallel (i, j) in (16, 64) {{ s[i, j] = s[i, j] + f32(t{d} + bx); }}"]
    lines.append("    " * (depth + 1) + "copy(s, Y[t0 * 16, 0]);")
    lines += ["    " * (d + 1) + "}" for d in reversed(range(depth))]
    return "\n".join(lines + ["}"])


def test_the_choice_does_not_nest(monkeypatch):
    """Each loop's choice dry-runs it twice; loops inside a dry run make none, else each
    level of a nest would multiply the work again (depth 5: 6.4 s when they did). A
    level costs about three times the one inside it, as the head-state fixpoint did
    before the choice existed."""
    calls = [0]
    block = ib._Inserter.block

    def counted(self, *a, **kw):
        calls[0] += 1
        return block(self, *a, **kw)

    monkeypatch.setattr(ib._Inserter, "block", counted)
    counts = []
    for depth in (3, 4):
        calls[0] = 0
        lower(nest(depth), {})
        counts.append(calls[0])
    assert counts[1] < 4 * counts[0], counts
