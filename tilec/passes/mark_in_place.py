"""mark-in-place: which tensors the kernel writes may be passed as the very
tensor it reads (in place, `k(x, x)`), and why the others may not.

A launch whose written tensor shares memory with another argument is refused
(runtime.host.Call.check_overlaps), except one case: the written tensor W and a
tensor R the kernel only reads are the same view (one pointer, shape and
strides), and the kernel reads R only where it then writes W. That holds when

- every statement that touches R is a copy out of R (no im2col view of it), and
  every statement that writes W a copy into W;
- all of them name one tile: the same start and extent expressions;
- each read comes before each write in the program (a pipelined loop may then
  load the next tile early: that tile is another one, not yet written);
- every loop around both a read and a write steps the tile: its variable (or a
  let computed from it) is in the tile's starts, so no step reads a tile an
  earlier step wrote.

Then each tile of W is written only by the block (and the loop step) that read
it from R, after it did: distinct tiles of W are distinct memory, or the kernel
races on W whatever its arguments. The kernel is returned with `in_place`: for
each (W, R), None where W may be R, else the reason as a sentence."""
from __future__ import annotations

from dataclasses import replace

from ..ir import nodes as ir
from ..ir.effects import of, written_tensors
from ..ir.exprs import free_names
from ..ir.printer import expr as show

NAME = "mark-in-place"


def run(k: ir.Kernel, opts) -> ir.Kernel:
    written = written_tensors(k)
    tensors = [p.name for p in k.params if isinstance(p, ir.TensorParam)]
    if not written:
        return k
    accesses = _accesses(k)
    pairs = tuple(((w, r), _why_not(k, w, r, accesses)) for w in written for r in tensors
                  if r != w and r not in written)
    return replace(k, in_place=pairs)


class _Access:
    """One statement that reads or writes a tensor: where in the program, and the loops around it."""

    def __init__(self, s, order, loops, lets):
        self.s, self.order, self.loops, self.lets = s, order, loops, lets

    @property
    def line(self):
        return self.s.span.line if self.s.span else "?"


def _accesses(k: ir.Kernel) -> dict:
    """tensor name -> (reads, writes): the statements touching it, in program order."""
    out, order = {}, [0]
    views = {v.name: v.tensor for v in k.views}

    def walk(body, loops, lets):
        lets = dict(lets)
        for s in body:
            order[0] += 1
            e = of(k, s)
            for i, names in enumerate((e.reads, e.writes)):
                for name in names:
                    name = views.get(name, name)
                    if isinstance(k.param(name), ir.TensorParam):
                        out.setdefault(name, ([], []))[i].append(_Access(s, order[0], loops, lets))
            if isinstance(s, ir.Let):
                lets[s.name] = s.value
            inner = loops + ((s.var, s.span.line if s.span else '?'),) if isinstance(s, ir.For) else loops
            for f in ir.STMT_BLOCK_FIELDS.get(type(s), ()):
                walk(getattr(s, f), inner, lets)

    walk(k.body, (), {})
    return out


def _tile(a: _Access, side: str):
    """The tile a copy reads or writes, as its start and extent expressions print."""
    r = getattr(a.s, side)
    return tuple(show(x) for x in r.starts), tuple(show(x) if x is not None else "" for x in r.extents)


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
    last_read = max(reads, key=lambda a: a.order)
    first_write = min(writes, key=lambda a: a.order)
    if first_write.order < last_read.order:
        return (f"it writes {w} (line {first_write.line}) before it reads {r} (line {last_read.line}), so it "
                "would read elements it already overwrote")
    around_writes = {loop for a in writes for loop in a.loops}
    for a in reads:
        used = _depends(set().union(*(free_names(x) for x in a.s.src.starts)), a.lets)
        for var, line in a.loops:
            if (var, line) in around_writes and var not in used:
                return (f"the loop at line {line} reads and writes the same tile of {r} in each step, so a step "
                        "would read what an earlier step wrote")
    return None
