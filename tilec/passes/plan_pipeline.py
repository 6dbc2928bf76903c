"""plan-pipeline: which `pipelined` loops run on an S-stage TMA ring, and the
stages of the tiles they load.

A `for k in pipelined(n, stages = S)` whose body is TMA loads (copies from a
global tensor or an im2col view into shared tiles) followed by gemms that read
only those tiles can overlap the loads of later iterations with the gemms of
this one: the loop is marked `ring` (insert-barriers builds the ring's
full/empty barriers) and each tile it loads gets `stages = S` (plan-smem places
S copies; the most stages of the rings that load it; a ring in no loop, which runs
once, over a trip count n known at compile time, at most n + 1: its prologue then
issues every iteration). A `pipelined` loop
(stages >= 2) of any other body that starts with TMA loads and loads nothing
after them is marked `rotate`, at any depth of
loops: each tile it loads gets S copies (`ir.stage_tile`; the most stages of
the loops that share it), iteration k using copy k % S, and insert-barriers
issues each iteration's loads S - 1 iterations ahead; where those copies would
not fit the block's shared memory, it runs as a plain loop instead. A kernel
with a producer warpgroup (`producer = 1`) rotates nothing: its consumers'
one-thread blocks are not thread 0's. Other `pipelined` loops run as plain
loops (one asking for a producer warpgroup, `producer = 1`, is an error);
where one asked for 2 or more stages, the kernel's `pipeline_notes` say which
and why (tilec.PipelineWarning at every compile). The thread-copy variant has
no TMA loads, so no rings."""
from __future__ import annotations

from dataclasses import replace

from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.exprs import tiles_named
from . import plan_smem
from .hoist_loads import first_blocker, is_load

NAME = "plan-pipeline"


def run(k: ir.Kernel, opts) -> ir.Kernel:
    if not opts.tma:
        return k
    planned = _plan(k)
    if any(isinstance(s, ir.For) and s.rotate for s in ir.walk_stmts(planned.body)):
        try:
            plan_smem.place(planned, opts.arch, barriers=1)     # a rotating loop has its copies' mbarriers
        except SemanticError as e:  # the copies do not fit: plain loops, as before rotation (if that fits)
            return _plan(k, no_rotation="the stages' copies of the tiles it loads do not fit in shared memory ("
                                        + e.message.rstrip(".") + ")")
    return planned


def _plan(k: ir.Kernel, no_rotation: str | None = None) -> ir.Kernel:
    """k with its gemm rings planned, and its rotating loops unless `no_rotation`
    says why not; a note for each loop of 2 or more stages that runs plain."""
    stages, copies, notes = {}, {}, []
    if no_rotation is None and any(isinstance(s, ir.For) and s.producer for s in ir.walk_stmts(k.body)):
        no_rotation = "a kernel with a producer warpgroup (producer = 1) rotates no other loop"

    def plan(s, looped):
        if not isinstance(s, ir.For) or s.stages is None:
            return s
        tiles = _loaded_tiles_then_gemms(k, s.body)
        if not tiles:
            if s.producer:
                raise SemanticError("producer = 1 needs a pipelined loop whose body is TMA copies into shared "
                                    "tiles followed by gemms that read them (a ring the producer can fill)", s.span)
            if s.stages < 2:
                return s
            tiles, why = _rotating_tiles(k, s)
            if tiles and no_rotation is not None:
                tiles, why = [], no_rotation
            if not tiles:
                where = f"{s.span}: " if s.span is not None else ""
                notes.append(f"{where}this pipelined loop (stages = {s.stages}) runs as a plain loop: {why}")
                return s
            copies.update({t: max(s.stages, copies.get(t, 1)) for t in tiles})     # loops may share a tile
            return replace(s, rotate=True)
        if s.producer:
            reread = [t for t in _sources(k, s.body) if t in k.rereads]
            if reread:
                raise SemanticError(f"producer = 1: the ring loads {reread[0]}, which the kernel also writes (other "
                                    "than in place, tile by tile); a producer warpgroup loads ahead of the "
                                    "consumers' writes, so it could read what they have not yet written", s.span)
        if not looped and isinstance(s.extent, ir.Int) and s.extent.value + 1 < s.stages:
            # a ring run once: its prologue issues every trip with n + 1 stages; more only take shared memory
            s = replace(s, stages=max(s.extent.value + 1, 2))
        stages.update({t: max(s.stages, stages.get(t, 1)) for t in tiles})     # rings may share a tile
        return replace(s, ring=True)

    def block(body, looped):
        """`looped`: inside a loop (a persistent kernel's over its tiles, too)."""
        out = []
        for s in body:
            nested = {f: block(getattr(s, f), looped or isinstance(s, ir.For))
                      for f in ir.STMT_BLOCK_FIELDS.get(type(s), ())}
            out.append(plan(replace(s, **nested) if nested else s, looped))
        return tuple(out)

    body = block(k.body, False)
    if notes:
        k = replace(k, pipeline_notes=tuple(notes))
    if not stages and not copies:
        return k
    buffers = []
    for b in k.buffers:
        buffers.append(replace(b, stages=stages.get(b.name, b.stages)))
        buffers += [replace(b, name=ir.stage_tile(b.name, j)) for j in range(1, copies.get(b.name, 1))]
    return replace(k, body=body, buffers=tuple(buffers))


def _rotating_tiles(k: ir.Kernel, loop: ir.For) -> tuple:
    """(the tiles a rotating pipeline gives S copies, "") or ([], why not): those of
    the TMA loads that start `loop`'s body (S >= 2), where nothing after them loads
    a tile or nests a pipelined loop (a gemm may: insert-barriers waits for it in
    full, so its operands' copies are free again by the next refill), no other
    statement of the kernel uses them except in loops that load them first
    (`_use_apart`), no tile lies over their memory, and the kernel writes the
    tensors they load from only as in place, tile by tile after reading each (not
    in mark-in-place's `rereads`)."""
    loads = _leading_loads(k, loop.body)
    rest = loop.body[len(loads):]
    tiles = list(dict.fromkeys(loads))
    if not loads:
        later = next((x for x in rest if is_load(k, x)), None)
        inner = next((x for x in ir.walk_stmts(rest) if isinstance(x, ir.For) and x.stages is not None), None)
        if later is None and inner is not None:
            at = f" (line {inner.span.line})" if inner.span is not None else ""
            return [], f"its body does not start with a TMA load, and it holds another pipelined loop{at}"
        if later is None:
            return [], "its body does not start with a TMA load (a copy from a tensor into a shared tile)"
        return [], f"its body does not start with a TMA load, and {_stays(k, later, rest)}"
    if len(tiles) < len(loads):
        return [], f"it loads tile '{next(t for t in tiles if loads.count(t) > 1)}' more than once"
    if not rest:
        return [], "nothing follows its loads"
    for x in ir.walk_stmts(rest):
        at = f" (line {x.span.line})" if x.span is not None else ""
        if is_load(k, x):
            if any(x is r for r in rest):
                return [], _stays(k, x, rest)
            return [], f"a load into tile '{x.dst.name}'{at} sits in a nested block (only the loads that start " \
                       "the body can run ahead)"
        if isinstance(x, ir.For) and x.stages is not None:
            return [], f"it holds another pipelined loop{at}"
    for t in tiles:
        use = _use_apart(k, loop, t)
        if use is not None:
            at = f" (line {use.span.line})" if use.span is not None else ""
            return [], f"tile '{t}', which it loads, is used outside the loop as well{at}, where it could read " \
                       "what the loop leaves in it (elsewhere it may be used only in loops whose bodies start by " \
                       "loading it and hold no gemm)"
        if any(b.alias == t or (b.name == t and b.alias) for b in k.buffers):
            return [], f"tile '{t}', which it loads, shares its memory with another tile"
    # loads issued S - 1 iterations early must not read what an iteration before them writes
    reread = [t for t in _sources(k, loop.body[:len(loads)]) if t in k.rereads]
    if reread:
        return [], f"it loads from {reread[0]}, which the kernel also writes other than in place (a load issued " \
                   "early could read what an earlier iteration has not written yet)"
    return tiles, ""


def _stays(k: ir.Kernel, load: ir.Copy, rest: tuple) -> str:
    """Why `load`, a statement of `rest`, did not move to the front (hoist-loads)."""
    at = f" (line {load.span.line})" if load.span is not None else ""
    found = first_blocker(k, load, rest[:next(i for i, r in enumerate(rest) if r is load)])
    assert found is not None, "hoist-loads left a load it could move"
    x, why = found
    line = f"line {x.span.line}" if x.span is not None else "a statement"
    return f"the load into tile '{load.dst.name}'{at} cannot move ahead of {line}, which {why} (only " \
           "loads that start the body, or can move there, run ahead)"


def _sources(k: ir.Kernel, body) -> list:
    """The tensors the TMA loads of `body` read (an im2col view's tensor for a view)."""
    views = {v.name: v.tensor for v in k.views}
    return list(dict.fromkeys(views.get(s.src.name, s.src.name) for s in body if is_load(k, s)))


def _loaded_tiles_then_gemms(k: ir.Kernel, body) -> list:
    """The tiles loaded when `body` is one or more TMA loads followed by one or
    more gemms that read only loaded tiles; else none."""
    tiles = _leading_loads(k, body)
    rest = body[len(tiles):]
    ok = tiles and rest and all(isinstance(g, ir.Gemm) and {g.a, g.b} <= set(tiles) for g in rest)
    return list(dict.fromkeys(tiles)) if ok else []


def _leading_loads(k: ir.Kernel, body) -> list:
    """The tiles of the TMA loads that start `body`, in order (a tile loaded twice appears twice)."""
    tiles = []
    for s in body:
        if not is_load(k, s):
            break
        tiles.append(s.dst.name)
    return tiles


def _use_apart(k: ir.Kernel, loop: ir.For, t: str):
    """The first statement outside `loop` that uses tile t, other than in the body
    of a loop apart from `loop` (neither holds the other) and without gemms whose
    body starts with loads that include one into t: such a loop's every
    iteration overwrites the whole tile before anything reads it, so it never
    sees which copy of t `loop`'s last iteration used, nor `loop` what it left
    there; and other than a TMA load into t and the statements after it in its
    block, up to the first that holds a loop or a gemm: they read the load, not
    what a loop left. None if no statement does."""
    def first(body):
        fresh = False       # a load into t came earlier in this block, and no loop since
        for s in body:
            if s == loop:
                fresh = False
                continue
            if isinstance(s, ir.For) and t in _leading_loads(k, s.body) and \
                    not any(x == loop or isinstance(x, ir.Gemm) for x in ir.walk_stmts(s.body)):
                fresh = False
                continue
            inner = list(ir.walk_stmts((s,)))
            if any(isinstance(x, (ir.For, ir.Gemm)) for x in inner):
                fresh = False
            elif is_load(k, s) and s.dst.name == t or fresh:
                fresh = True
                continue
            nested = ir.STMT_BLOCK_FIELDS.get(type(s), ())
            if t in tiles_named([replace(s, **{f: () for f in nested})]):
                return s
            for f in nested:
                found = first(getattr(s, f))
                if found is not None:
                    return found
        return None
    return first(k.body)
