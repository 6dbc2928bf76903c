"""mark-in-place: which tensors the kernel writes may be passed as the very
tensor it reads (in place, `k(x, x)`), and why the others may not.

A launch whose written tensor shares memory with another argument is refused
(runtime.host.Call.check_overlaps), except one case: the written tensor W and a
tensor R the kernel only reads are the same view (one pointer, shape and
strides), and the kernel reads R only where it then writes W. That holds when

- every statement that touches R is a copy out of R (no im2col view of it), and
  every statement that writes W a copy into W;
- all of them name one tile: the same start and extent expressions, each loop
  variable counted by its loop's depth (so a `for k` that reads and a later
  `for j` that writes the same tiles agree);
- each read comes before each write in the program (a pipelined loop may then
  load the next tile early: that tile is another one, not yet written), but
  for a read and a write in the two branches of one `if`, which never both run;
- every loop around both a read and a write steps the tile by a whole tile: in
  some dim the start is `c * var + ...` with |c| at least the tile's extent
  there (make-persistent's tile loop visits each tile once), so no step reads
  a tile an earlier step wrote.

Then each tile of W is written only by the block (and the loop step) that read
it from R, after it did: distinct tiles of W are distinct memory, or the kernel
races on W whatever its arguments. The kernel is returned with `in_place`: for
each (W, R), None where W may be R, else the reason as a sentence; and with
`rereads`: the tensors it writes for which the same rule fails with the tensor on
both sides, so that some read may see the kernel's own write (a step reading a
tile an earlier step wrote). plan-pipeline loads such a tensor in no rotating
loop (an early load would read before the write), and insert-barriers orders each
read of it after the block's writes."""
from __future__ import annotations

from dataclasses import replace

from ..ir import nodes as ir
from ..ir.effects import of, written_tensors
from ..ir.exprs import free_names, linear, linear_terms, substitute
from ..ir.printer import expr as show
from . import make_persistent

NAME = "mark-in-place"


def run(k: ir.Kernel, opts) -> ir.Kernel:
    written = written_tensors(k)
    tensors = [p.name for p in k.params if isinstance(p, ir.TensorParam)]
    if not written:
        return k
    accesses = _accesses(k)
    pairs = tuple(((w, r), _why_not(k, w, r, accesses)) for w in written for r in tensors
                  if r != w and r not in written)
    rereads = tuple(t for t in tensors if t in written and _why_not(k, t, t, accesses) is not None)
    return replace(k, in_place=pairs, rereads=rereads)


class _Access:
    """One statement that reads or writes a tensor: where in the program, the loops
    around it, and the branches of `if`s it sits in ((id of the If, 0 or 1), ...)."""

    def __init__(self, s, order, loops, lets, branches=()):
        self.s, self.order, self.loops, self.lets, self.branches = s, order, loops, lets, branches

    def apart(self, other) -> bool:
        """In the two branches of one `if`: never both in one run of the block."""
        mine = dict(self.branches)
        return any(i in mine and mine[i] != b for i, b in other.branches)

    @property
    def line(self):
        return self.s.span.line if self.s.span else "?"


def _accesses(k: ir.Kernel) -> dict:
    """tensor name -> (reads, writes): the statements touching it, in program order."""
    out, order = {}, [0]
    views = {v.name: v.tensor for v in k.views}

    def walk(body, loops, lets, branches):
        lets = dict(lets)
        for s in body:
            order[0] += 1
            e = of(k, s)
            for i, names in enumerate((e.reads, e.writes)):
                for name in names:
                    name = views.get(name, name)
                    if isinstance(k.param(name), ir.TensorParam):
                        out.setdefault(name, ([], []))[i].append(_Access(s, order[0], loops, lets, branches))
            if isinstance(s, ir.Let):
                lets[s.name] = s.value
            inner = loops + ((s.var, s.span.line if s.span else '?'),) if isinstance(s, ir.For) else loops
            for which, f in enumerate(ir.STMT_BLOCK_FIELDS.get(type(s), ())):
                walk(getattr(s, f), inner, lets, branches + ((id(s), which),) if isinstance(s, ir.If) else branches)

    walk(k.body, (), {}, ())
    return out


def _tile(a: _Access, side: str):
    """The tile a copy reads or writes, as its start and extent expressions print in
    linear form (`64 * by + 8` and `8 + by * 64` agree), each loop variable named by its
    loop's depth (`for k` reading and a later `for j` at the same depth writing with j
    where k was read name one family of tiles)."""
    r = getattr(a.s, side)
    depth = {var: ir.Var(f"@{d}", "loop") for d, (var, _) in enumerate(a.loops)}
    return (tuple(show(linear(substitute(x, depth))) for x in r.starts),
            tuple(show(linear(x)) if x is not None else "" for x in r.extents))


def _whole_steps(a: _Access, var: str) -> bool:
    """Does each step of the loop over `var` read a tile of its own: some dim's start
    `c * var + rest` (rest free of var, lets seen through) with |c| at least that dim's
    extent? make-persistent's tile loop visits each tile once."""
    if var == make_persistent.TILE:
        return True
    region = a.s.src
    for start, extent in zip(region.starts, region.extents):
        terms, _ = linear_terms(start)
        coef = sum(c for x, c in terms.values() if isinstance(x, ir.Var) and x.name == var)
        other = any(var in _depends(free_names(x), a.lets) for x, _ in terms.values()
                    if not (isinstance(x, ir.Var) and x.name == var))     # var in a product, a division, a let
        if not other and isinstance(extent, ir.Int) and abs(coef) >= max(extent.value, 1):
            return True
    return False


def _lines(accesses) -> str:
    return ", ".join(str(n) for n in sorted({a.s.span.line for a in accesses if a.s.span}))


def _depends(names: set, lets: dict) -> set:
    """`names` and every name a let among them is computed from."""
    seen, todo = set(), list(names)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            if n in lets:
                todo += free_names(lets[n])
    return seen


def _why_not(k: ir.Kernel, w: str, r: str, accesses: dict):
    reads = accesses.get(r, ([], []))[0]
    writes = accesses[w][1]
    for a in reads:
        if not (isinstance(a.s, ir.Copy) and a.s.src.name == r):
            how = "through an im2col view" if any(v.tensor == r for v in k.views) else "other than by a copy"
            return f"it reads {r} {how} (line {a.line})"
    for a in writes:
        if not (isinstance(a.s, ir.Copy) and a.s.dst.name == w):
            return f"it writes {w} other than by a copy (line {a.line})"
    if not reads:
        return None
    read_tiles = {_tile(a, "src") for a in reads}
    write_tiles = {_tile(a, "dst") for a in writes}
    if read_tiles != write_tiles:
        if len(write_tiles) > 1:
            what = f"it writes {w} through more than one tile (lines {_lines(writes)})"
        elif len(read_tiles) > 1:
            what = f"it reads {r} through more than one tile (lines {_lines(reads)})"
        else:
            what = f"it reads {r} (line {reads[0].line}) and writes {w} (line {writes[0].line}) in different tiles"
        return what + f", so a block may overwrite elements of {r} that another block, or a later step, still reads"
    early = [(b, a) for b in writes for a in reads if b.order < a.order and not a.apart(b)]
    if early:
        first_write, last_read = min(early, key=lambda p: (p[0].order, -p[1].order))
        return (f"it writes {w} (line {first_write.line}) before it reads {r} (line {last_read.line}), so it "
                "would read elements it already overwrote")
    around_writes = {loop for a in writes for loop in a.loops}
    for a in reads:
        for var, line in a.loops:
            if (var, line) in around_writes and not _whole_steps(a, var):
                return (f"the loop at line {line} does not step the tile of {r} by a whole tile each time, so a "
                        "step could read what an earlier step wrote")
    return None
