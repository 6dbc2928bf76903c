"""lower-copies: pick each copy's lowering from its pair of memory spaces.

    global -> shared   TmaLoad   (cp.async.bulk.tensor .tile, completes on an mbarrier)
    im2col -> shared   TmaLoad with `view` set (cp.async.bulk.tensor .im2col)
    shared -> global   TmaStore  (cp.async.bulk.tensor .tile .bulk_group)
    anything with a local side, shared -> shared: ThreadCopy (all threads, bounds-checked)

With `opts.tma` off (the fallback variant, run when an argument breaks a TMA
rule at launch) global <-> shared copies become thread copies too.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import nodes as ir
from ..ir.exprs import map_body
from .check_types import space

NAME = "lower-copies"


def run(k: ir.Kernel, opts) -> ir.Kernel:
    def lower(s):
        if not isinstance(s, ir.Copy):
            return s
        src, dst = space(k, s.src.name), space(k, s.dst.name)
        if src == "view" and opts.tma:
            return ir.TmaLoad(k.view(s.src.name).tensor, s.dst.name, (), view=s.src.name,
                              origin=s.src.starts, span=s.span)
        if (src, dst) == ("global", "shared") and opts.tma:
            return ir.TmaLoad(s.src.name, s.dst.name, s.src.starts, span=s.span)
        if (src, dst) == ("shared", "global") and opts.tma:
            return ir.TmaStore(s.src.name, s.dst.name, s.dst.starts, span=s.span)
        tile = k.buffer(s.src.name) or k.buffer(s.dst.name)
        return ir.ThreadCopy(s.src, s.dst, tile.shape, span=s.span)
    return replace(k, body=map_body(k.body, lower))
