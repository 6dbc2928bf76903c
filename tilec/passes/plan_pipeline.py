"""plan-pipeline: which `pipelined` loops run on an S-stage TMA ring, and the
stages of the tiles they load.

A `for k in pipelined(n, stages = S)` whose body is TMA loads (copies from a
global tensor or an im2col view into shared tiles) followed by gemms that read
only those tiles can overlap the loads of later iterations with the gemms of
this one: the loop is marked `ring` (insert-barriers builds the ring's
full/empty barriers) and each tile it loads gets `stages = S` (plan-smem places
S copies). A `pipelined` loop (stages >= 2) of any other body that starts with
TMA loads and loads nothing after them is marked `rotate`, at any depth of
loops: each tile it loads, used nowhere else, gets S copies (`ir.stage_tile`),
iteration k using copy k % S, and insert-barriers issues each iteration's loads
S - 1 iterations ahead; where those copies would not fit the block's shared
memory, it runs as a plain loop instead. A kernel with a producer warpgroup
(`producer = 1`) rotates nothing: its consumers' one-thread blocks are not
thread 0's. Other `pipelined` loops run as plain loops (one asking for a
producer warpgroup, `producer = 1`, is an error). The thread-copy variant
has no TMA loads, so no rings."""
from __future__ import annotations

from dataclasses import replace

from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.exprs import map_body, tiles_named
from . import plan_smem

NAME = "plan-pipeline"


def run(k: ir.Kernel, opts) -> ir.Kernel:
    if not opts.tma:
        return k
    planned = _plan(k, rotate=True)
    if planned is not k and any(isinstance(s, ir.For) and s.rotate for s in ir.walk_stmts(planned.body)):
        try:
            plan_smem.place(planned, opts.arch, barriers=0)
        except SemanticError:       # the copies do not fit: plain loops, as before rotation (if that fits)
            return _plan(k, rotate=False)
    return planned


def _plan(k: ir.Kernel, rotate: bool) -> ir.Kernel:
    """k with its gemm rings planned, and (`rotate`) its rotating loops."""
    stages, copies = {}, {}
    rotate = rotate and not any(isinstance(s, ir.For) and s.producer for s in ir.walk_stmts(k.body))

    def plan(s):
        if not isinstance(s, ir.For) or s.stages is None:
            return s
        tiles = _loaded_tiles_then_gemms(k, s.body)
        if not tiles:
            if s.producer:
                raise SemanticError("producer = 1 needs a pipelined loop whose body is TMA copies into shared "
                                    "tiles followed by gemms that read them (a ring the producer can fill)", s.span)
            tiles = _rotating_tiles(k, s) if rotate else []
            if not tiles:
                return s
            copies.update({t: s.stages for t in tiles})
            return replace(s, rotate=True)
        if s.producer:
            reread = [t for t in _sources(k, s.body) if t in k.rereads]
            if reread:
                raise SemanticError(f"producer = 1: the ring loads {reread[0]}, which the kernel also writes (other "
                                    "than in place, tile by tile); a producer warpgroup loads ahead of the "
                                    "consumers' writes, so it could read what they have not yet written", s.span)
        stages.update({t: s.stages for t in tiles})
        return replace(s, ring=True)

    def block(body):
        out = []
        for s in body:
            nested = {f: block(getattr(s, f)) for f in ir.STMT_BLOCK_FIELDS.get(type(s), ())}
            out.append(plan(replace(s, **nested) if nested else s))
        return tuple(out)

    body = block(k.body)
    if not stages and not copies:
        return k
    buffers = []
    for b in k.buffers:
        buffers.append(replace(b, stages=stages.get(b.name, b.stages)))
        buffers += [replace(b, name=ir.stage_tile(b.name, j)) for j in range(1, copies.get(b.name, 1))]
    return replace(k, body=body, buffers=tuple(buffers))


def _rotating_tiles(k: ir.Kernel, loop: ir.For) -> list:
    """The tiles a rotating pipeline gives S copies: those of the TMA loads that
    start `loop`'s body, where S >= 2, nothing after them loads a tile, runs a gemm
    or nests a pipelined loop, no other statement of the kernel uses them, no
    tile lies over their memory, and the kernel writes the tensors they load
    from only as in place, tile by tile after reading each
    (not in mark-in-place's `rereads`); else none."""
    if loop.stages < 2:
        return []
    loads = []
    for s in loop.body:
        if not _is_load(k, s):
            break
        loads.append(s.dst.name)
    rest = loop.body[len(loads):]
    tiles = list(dict.fromkeys(loads))
    if not loads or len(tiles) < len(loads) or not rest:
        return []
    if any(_is_load(k, x) or isinstance(x, ir.Gemm) or (isinstance(x, ir.For) and x.stages is not None)
           for x in ir.walk_stmts(rest)):
        return []
    elsewhere = tiles_named(map_body(k.body, lambda s: [] if s == loop else s))
    if set(tiles) & elsewhere or any(b.alias in tiles or (b.name in tiles and b.alias) for b in k.buffers):
        return []
    # loads issued S - 1 iterations early must not read what an iteration before them writes
    if set(_sources(k, loop.body[:len(loads)])) & set(k.rereads):
        return []
    return tiles


def _sources(k: ir.Kernel, body) -> list:
    """The tensors the TMA loads of `body` read (an im2col view's tensor for a view)."""
    views = {v.name: v.tensor for v in k.views}
    return list(dict.fromkeys(views.get(s.src.name, s.src.name) for s in body if _is_load(k, s)))


def _is_load(k: ir.Kernel, s) -> bool:
    return isinstance(s, ir.Copy) and k.space(s.dst.name) == "shared" and k.space(s.src.name) in ("global", "view")


def _loaded_tiles_then_gemms(k: ir.Kernel, body) -> list:
    """The tiles loaded when `body` is one or more TMA loads followed by one or
    more gemms that read only loaded tiles; else none."""
    tiles = []
    for s in body:
        if not _is_load(k, s):
            break
        tiles.append(s.dst.name)
    rest = body[len(tiles):]
    ok = tiles and rest and all(isinstance(g, ir.Gemm) and {g.a, g.b} <= set(tiles) for g in rest)
    return list(dict.fromkeys(tiles)) if ok else []
