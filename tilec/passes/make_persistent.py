"""make-persistent: `grid (bx, by) = (GX, GY), persistent = 1` becomes a
launch of as many blocks as the GPU holds at once (the host clamps the grid to
them: rt's resident blocks), each looping over the output tiles its index
picks, in the order a one-block-per-tile launch numbers them:

    grid (tl_block) = (GX * GY)
    for tl_tile in range(cdiv(GX * GY - tl_block, tl_blocks)) {
        // the body, with bx = t % GX and by = t / GX, t = tl_block + tl_tile * tl_blocks
    }

`tl_blocks` is the number of blocks launched (gridDim.x). A pipelined loop in
the body keeps its ring, and its barriers' phases, from one tile to the next
(insert-barriers), so a producer warpgroup runs on into the next tile while the
consumers store this one."""
from __future__ import annotations

from dataclasses import replace

from ..ir import nodes as ir
from ..ir.exprs import map_body, map_stmt_exprs, substitute

NAME = "make-persistent"

BLOCK, TILE, BLOCKS = "tl_block", "tl_tile", "tl_blocks"


def run(k: ir.Kernel, opts) -> ir.Kernel:
    if not k.persistent:
        return k
    span = k.grid[0].span
    sizes = list(k.grid)
    tiles = sizes[0]
    for g in sizes[1:]:
        tiles = ir.BinOp("*", tiles, g, span=span)
    block, blocks = ir.Var(BLOCK, "block", span=span), ir.Var(BLOCKS, "block", span=span)
    t = ir.BinOp("+", block, ir.BinOp("*", ir.Var(TILE, "loop", span=span), blocks, span=span), span=span)
    index, below = {}, t
    for d, (name, g) in enumerate(zip(k.grid_vars, sizes)):
        last = d == len(sizes) - 1
        index[name] = below if last else ir.BinOp("%", below, g, span=span)
        below = ir.BinOp("/", below, g, span=span)

    def tile_indices(s):
        return map_stmt_exprs(s, lambda e: substitute(e, index))

    extent = ir.Call("cdiv", (ir.BinOp("-", tiles, block, span=span), blocks), span=span)
    loop = ir.For(TILE, extent, None, map_body(k.body, tile_indices), span=span)
    return replace(k, grid_vars=(BLOCK,), grid=(tiles,), body=(loop,))
