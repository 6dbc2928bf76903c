"""hoist-loads: in each `pipelined` loop's body, TMA loads move up to the front,
past the statements they commute with, so that plan-pipeline can run them ahead.

plan-pipeline pipelines only the loads that start a body. A body written as

    fill(part, 0.0);                 // or a parallel, a reduce, a store of another tile
    copy(A[k * BM, 0], a);
    ...

has the same meaning with the load first when the statements before it

- neither read nor write the tile it loads, and
- write no tensor that may share memory with the one it loads from: that tensor
  itself, or one the launch may pass as that very tensor (mark-in-place's
  `in_place`; a launch whose written tensor overlaps another argument in any
  other way is refused, runtime.host.Call.check_overlaps).

Each load that passes (in the body's order, counting the loads that stay as
statements it must pass too) moves to the front; the rest keep their order. The
loads of nested blocks stay where they are. plan-pipeline's PipelineWarning for a
load that stays names the statement it cannot pass and why (`blocker`). The
thread-copy variant has no TMA loads and is left as written.

Nothing else can stand in a load's way: its start expressions read no tile
element (check-types refuses that) and bind to no `let` of the body
(fold-consts has put each let's value where it is used, and make-persistent's
lets stand outside the K loop)."""
from __future__ import annotations

from dataclasses import replace

from ..ir import nodes as ir
from ..ir.effects import deep
from ..ir.exprs import map_body

NAME = "hoist-loads"


def run(k: ir.Kernel, opts) -> ir.Kernel:
    if not opts.tma:
        return k

    def stmt(s):
        if isinstance(s, ir.For) and s.stages is not None:
            body = hoisted(k, s.body)
            if body != s.body:
                return replace(s, body=body)
        return s
    return replace(k, body=map_body(k.body, stmt))


def hoisted(k: ir.Kernel, body: tuple) -> tuple:
    """`body` with each TMA load that commutes with every statement before it moved to the front."""
    front, rest = [], []
    for s in body:
        (front if is_load(k, s) and first_blocker(k, s, rest) is None else rest).append(s)
    return tuple(front + rest)


def first_blocker(k: ir.Kernel, load: ir.Copy, before) -> tuple | None:
    """(the first statement of `before` that `load` cannot move ahead of, why), or None."""
    for x in before:
        why = blocker(k, load, x)
        if why is not None:
            return x, why
    return None


def is_load(k: ir.Kernel, s) -> bool:
    """A TMA load before lower-copies: a copy from a tensor or im2col view into a shared tile."""
    return isinstance(s, ir.Copy) and k.space(s.dst.name) == "shared" and k.space(s.src.name) in ("global", "view")


def blocker(k: ir.Kernel, load: ir.Copy, s) -> str | None:
    """Why `load` cannot move ahead of statement `s` (a phrase: "writes tile 'x'"), or None."""
    e = deep(k, s)
    t = load.dst.name                   # (no tile lies over another before lower-copies)
    if t in e.writes:
        return f"writes tile '{t}'"
    if t in e.reads:
        return f"reads tile '{t}'"
    view = k.view(load.src.name)
    source = view.tensor if view is not None else load.src.name
    if source in e.writes:
        return f"writes {source}, the tensor it loads from"
    aliases = sorted(w for (w, r), why in k.in_place if r == source and why is None and w in e.writes)
    if aliases:
        return f"writes {aliases[0]}, which a launch may pass as {source} (in place)"
    return None
