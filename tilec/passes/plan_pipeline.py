"""plan-pipeline: which `pipelined` loops run on an S-stage TMA ring, and the
stages of the tiles they load.

A `for k in pipelined(n, stages = S)` whose body is TMA loads (copies from a
global tensor or an im2col view into shared tiles) followed by gemms that read
only those tiles can overlap the loads of later iterations with the gemms of
this one: the loop is marked `ring` (insert-barriers builds the ring's
full/empty barriers) and each tile it loads gets `stages = S` (plan-smem places
S copies). Other `pipelined` loops run as plain loops (one asking for a
producer warpgroup, `producer = 1`, is an error). The thread-copy variant
has no TMA loads, so no rings."""
from __future__ import annotations

from dataclasses import replace

from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.exprs import map_body

NAME = "plan-pipeline"


def run(k: ir.Kernel, opts) -> ir.Kernel:
    if not opts.tma:
        return k
    stages = {}

    def plan(s):
        if not isinstance(s, ir.For) or s.stages is None:
            return s
        tiles = _loaded_tiles_then_gemms(k, s.body)
        if not tiles:
            if s.producer:
                raise SemanticError("producer = 1 needs a pipelined loop whose body is TMA copies into shared "
                                    "tiles followed by gemms that read them (a ring the producer can fill)", s.span)
            return s
        stages.update({t: s.stages for t in tiles})
        return replace(s, ring=True)

    body = map_body(k.body, plan)
    if not stages:
        return k
    return replace(k, body=body, buffers=tuple(replace(b, stages=stages.get(b.name, b.stages)) for b in k.buffers))


def _loaded_tiles_then_gemms(k: ir.Kernel, body) -> list:
    """The tiles loaded when `body` is one or more TMA loads followed by one or
    more gemms that read only loaded tiles; else none."""
    tiles = []
    for s in body:
        if not (isinstance(s, ir.Copy) and k.space(s.dst.name) == "shared" and
                k.space(s.src.name) in ("global", "view")):
            break
        tiles.append(s.dst.name)
    rest = body[len(tiles):]
    ok = tiles and rest and all(isinstance(g, ir.Gemm) and {g.a, g.b} <= set(tiles) for g in rest)
    return list(dict.fromkeys(tiles)) if ok else []
