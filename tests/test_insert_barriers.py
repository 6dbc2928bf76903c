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


def test_a_nest_costs_a_walk_per_level(monkeypatch):
    """Each loop's choice dry-runs it twice, and its head state is a fixpoint of dry
    trips through its body; a nest asks for the same dry runs again at every level.
    With the memo of dry runs (by loop and head state) the block walks grow by a
    constant per level: without it each level cost ~3x the one inside it (820 walks
    at depth 3, 7381 at depth 4, 6.4 s to lower depth 5 before loops inside a dry run
    stopped making choices of their own)."""
    calls = [0]
    block = ib._Inserter.block

    def counted(self, *a, **kw):
        calls[0] += 1
        return block(self, *a, **kw)

    monkeypatch.setattr(ib._Inserter, "block", counted)
    counts = {}
    for depth in (3, 4, 8):
        calls[0] = 0
        lower(nest(depth), {})
        counts[depth] = calls[0]
    step = counts[4] - counts[3]
    assert 0 < step <= 10 and counts[8] == counts[3] + 5 * step, counts
