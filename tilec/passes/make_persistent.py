"""make-persistent: `grid (bx, by) = (GX, GY), persistent = 1` becomes a
launch of as many blocks as the GPU holds at once (the host clamps the grid to
them: rt's resident blocks), each looping over the output tiles its index
picks, in the order a one-block-per-tile launch numbers them:

    grid (tl_block) = (GX * GY)
    for tl_tile in range(cdiv(GX * GY - tl_block, tl_blocks)) {
        // the body, with bx = t % GX and by = t / GX, t = tl_block + tl_tile * tl_blocks
    }

With `group = G` the block indices are lets at the top of the body instead,
tiles numbered in groups of G rows of `by` (_grouped); `group = G` without
`persistent` makes the same 1-dim grid and lets from t = tl_block, no loop.

`tl_blocks` is the number of blocks launched (gridDim.x). A pipelined loop in
the body keeps its ring, and its barriers' phases, from one tile to the next
(insert-barriers), so a producer warpgroup runs on into the next tile while the
consumers store this one.

With `stream_k = 1` as well, the tiles that would make the last, partial wave
(the tiles' count modulo the blocks; one wave more when that remainder is under
half a wave) are not given whole to some blocks: their K steps, laid end to
end, are cut into one even range per block (stream-K). With fewer tiles than
blocks (the host launches every resident block for stream-K, however few the
tiles: runtime.host.persistent_blocks) each tile's K steps are cut into s equal
pieces, one per block, s as many as the blocks per tile allow but no piece
under SK_MIN_STEPS; the other blocks have nothing to do. Each block first works
through its range, tile by tile, from its last tile back to its first, then
takes whole tiles as above. A unit of work is (tile, K steps lo..hi):

    fill(acc, 0); for k in pipelined(hi - lo) { body with k + lo }
    if hi < steps:  partial_store(acc) -> the block's workspace slot
    else:           partial_add(acc) <- the slot of each earlier block that did
                    steps of this tile; then the statements after the loop

A block's range ends with the head of its last tile (a partial, stored first)
and starts with the tail of its first tile (finished last), so a block waits
only for lower-numbered blocks, and only for a partial that block stored before
anything else: no cycle, whatever the blocks' speeds. The schedule needs the
kernel's shape: statements, then the one pipelined loop, whose locals are
accumulators that gemm adds to (filled with 0 before it), then statements."""
from __future__ import annotations

from dataclasses import replace

from ..errors import SemanticError
from ..ir import effects, nodes as ir
from ..ir.exprs import free_names, substitute_body

NAME = "make-persistent"

BLOCK, TILE, BLOCKS = "tl_block", "tl_tile", "tl_blocks"
# The shortest piece of a tile's K steps stream-K gives a block when there are fewer tiles
# than blocks. On the H100 (benchmarks/probes/sk_small_probe.py; benchmarks/NOTES.md,
# session 15) 8 and 16 ran level on the few-row shapes the tuner would pick them for, 16
# ahead for 128x256 tiles at K = 4096 (at most 4 pieces of 64 steps), 32 behind there.
SK_MIN_STEPS = 16
UNIT, PART = "tl_unit", "tl_part"


def run(k: ir.Kernel, opts) -> ir.Kernel:
    if not k.persistent and k.group == 1:
        return k
    span = k.grid[0].span
    tiles = k.grid[0]
    for g in k.grid[1:]:
        tiles = ir.BinOp("*", tiles, g, span=span)
    block, blocks = _var(BLOCK, "block", span), _var(BLOCKS, "block", span)
    if not k.persistent:        # group = G alone: one block per tile, numbered in groups
        body = _at_tile(k, k.body, block)
    elif k.stream_k:
        body = _stream_k(k, tiles, block, blocks, span)
    else:
        t = ir.BinOp("+", block, ir.BinOp("*", _var(TILE, "loop", span), blocks, span=span), span=span)
        extent = ir.Call("cdiv", (ir.BinOp("-", tiles, block, span=span), blocks), span=span)
        once, rest = _invariant_loads(k)
        body = once + (ir.For(TILE, extent, None, _at_tile(k, rest, t), span=span),)
    return replace(k, grid_vars=(BLOCK,), grid=(tiles,), body=body)


def _invariant_loads(k: ir.Kernel) -> tuple:
    """(the body's leading copies that every tile would repeat, the rest): copies
    from a tensor the kernel does not write, at a region that names no block
    index, into a shared tile that nothing else in the body writes (a conv's
    weights, loaded once a block instead of once a tile). They run before the
    tile loop; insert-barriers waits for them at their first use as for any load."""
    writes = [effects.deep(k, s).writes for s in k.body]
    written = set().union(*writes)
    once = []
    for i, s in enumerate(k.body):
        dst = k.buffer(s.dst.name) if isinstance(s, ir.Copy) else None
        if dst is None or dst.scope != "shared" or k.param(s.src.name) is None or s.src.name in written:
            break
        names = set().union(*(free_names(e) for e in s.src.starts + s.src.extents if e is not None))
        others = set().union(*writes[:i], *writes[i + 1:])
        if names & set(k.grid_vars) or dst.name in others:
            break
        once.append(s)
    return tuple(once), k.body[len(once):]


def _var(name, kind, span):
    return ir.Var(name, kind, span=span)


class _At:
    """Expressions and lets at one span (the grid's): the schedules' index math."""

    def __init__(self, span):
        self.span = span

    def op(self, o, a, b):
        return ir.BinOp(o, a, b, span=self.span)

    def v(self, name):
        return _var(name, "let", self.span)

    def num(self, n):
        return ir.Int(n, span=self.span)

    def call(self, f, *args):
        return ir.Call(f, tuple(args), span=self.span)

    def wide(self, e):
        return ir.Cast(ir.DTYPES["i64"], e, span=self.span)

    def let(self, name, value, wide=False):
        return ir.Let(name, value, wide, index=True, span=self.span)


def _at_tile(k: ir.Kernel, body, t) -> tuple:
    """`body` with the grid's block indices computed from tile number `t`: in
    the order a one-block-per-tile launch numbers its blocks (x fastest), or
    with `group = G` (_grouped) as lets at the top of the body."""
    if k.group > 1:
        lets = _grouped(k, t)
        index = {name: _var(name, "let", t.span) for name in k.grid_vars}
        return tuple(lets) + substitute_body(body, index)
    index, below = {}, t
    for d, (name, g) in enumerate(zip(k.grid_vars, k.grid)):
        last = d == len(k.grid) - 1
        index[name] = below if last else ir.BinOp("%", below, g, span=g.span)
        below = ir.BinOp("/", below, g, span=g.span)
    return substitute_body(body, index)


def _grouped(k: ir.Kernel, t) -> list:
    """Tile number `t` as block indices, tiles numbered in groups of G rows (the
    grid's second index), the first index slowest and the second fastest inside
    a group, so the blocks running at once share G rows of one operand and a
    few columns of the other (Triton's GROUP_M); the last group may have fewer
    rows. A third index, if any, is outermost."""
    at = _At(t.span)
    op, v, let, g = at.op, at.v, at.let, at.num(k.group)
    (x, y), (gx, gy) = k.grid_vars[:2], k.grid[:2]
    per_group = op("*", g, gx)
    lets = [let("tl_t", t)] if not isinstance(t, ir.Var) else []
    t = v("tl_t") if lets else t
    if len(k.grid) == 3:
        plane = op("*", gx, gy)
        lets += [let(k.grid_vars[2], op("/", t, plane)), let("tl_in_plane", op("%", t, plane))]
        t = v("tl_in_plane")
    lets += [let("tl_group_row", op("*", op("/", t, per_group), g)),
             let("tl_group_rows", at.call("min", op("-", gy, v("tl_group_row")), g)),
             let(y, op("+", v("tl_group_row"), op("%", op("%", t, per_group), v("tl_group_rows")))),
             let(x, op("/", op("%", t, per_group), v("tl_group_rows")))]
    return lets


# ---------------------------------------------------------------- stream-K

def _stream_k(k: ir.Kernel, tiles, block, blocks, span) -> tuple:
    loop_at = _the_pipelined_loop(k, span)
    loop = k.body[loop_at]
    before, after = k.body[:loop_at], k.body[loop_at + 1:]
    accs = _accumulators(k, before, loop)

    at = _At(span)
    v, op, call, wide, num, let = at.v, at.op, at.call, at.wide, at.num, at.let

    steps, rem, parts = v("tl_steps"), v("tl_sk_rem"), v("tl_sk_parts")
    sk_tiles, sk_steps = v("tl_sk_tiles"), v("tl_sk_steps")
    begin, end, units = v("tl_sk_begin"), v("tl_sk_end"), v("tl_sk_units")
    unit, in_sk, t, lo, hi = _var(UNIT, "loop", span), v("tl_in_sk"), v("tl_t"), v("tl_k_lo"), v("tl_k_hi")
    first = v("tl_first_block")
    # one wave more when the remainder is under half a wave: ranges of at least a tile's K steps
    small = op("&&", op("&&", op(">", rem, num(0)), op("<", op("*", rem, num(2)), blocks)),
               op(">=", v("tl_tiles"), op("+", rem, blocks)))
    per_block = [
        let("tl_tiles", tiles),
        let("tl_steps", loop.extent),
        # no K steps (K = 0): no tile in stream-K's share, or no unit would store those tiles
        let("tl_sk_rem", call("select", op(">", steps, num(0)), op("%", v("tl_tiles"), blocks), num(0))),
        let("tl_sk_tiles", call("select", small, op("+", rem, blocks), rem)),
        let("tl_sk_steps", op("*", wide(sk_tiles), steps), wide=True),
        # the blocks that share those K steps: all of them, or with fewer tiles than blocks each
        # tile's K steps cut into as many equal pieces as there are blocks per tile, but no
        # piece under SK_MIN_STEPS: tiles * s blocks, no piece across two tiles
        let("tl_sk_parts", call("select", op("<", v("tl_tiles"), blocks),
                                op("*", v("tl_tiles"), call("max", num(1), call("min", op("/", blocks, v("tl_tiles")),
                                                                                op("/", steps, num(SK_MIN_STEPS))))),
                                blocks)),
        let("tl_sk_begin", op("/", op("*", wide(call("min", block, parts)), sk_steps), parts), wide=True),
        let("tl_sk_end", op("/", op("*", wide(call("min", op("+", block, num(1)), parts)), sk_steps), parts),
            wide=True),
        let("tl_sk_units", call("select", op(">", end, begin),
                                op("+", op("-", op("/", op("-", end, num(1)), steps), op("/", begin, steps)),
                                   num(1)), num(0))),
    ]
    tile_start = op("*", wide(t), steps)
    per_unit = [
        let("tl_in_sk", op("<", unit, units)),
        let("tl_t", call("select", in_sk, op("-", op("/", op("-", end, num(1)), steps), unit),
                         op("+", op("+", sk_tiles, block), op("*", op("-", unit, units), blocks)))),
        let("tl_k_lo", call("select", in_sk, call("max", op("-", begin, tile_start), num(0)), num(0))),
        let("tl_k_hi", call("select", in_sk, call("min", op("-", end, tile_start), steps), steps)),
        let("tl_k_steps", op("-", hi, lo)),     # one name: check-barriers fixes it per path
    ]
    shifted = substitute_body(loop.body, {loop.var: op("+", _var(loop.var, "loop", span), lo)})
    part = replace(loop, extent=v("tl_k_steps"), body=shifted)
    # the first block whose range holds this tile's first K step: the largest b with begin(b) <= X
    # is min(parts, cdiv((X + 1) * parts, sk_steps)) - 1, X = t * steps
    owner = op("-", call("min", wide(parts), call("cdiv", op("*", op("+", tile_start, num(1)), parts),
                                                   call("max", sk_steps, num(1)))), num(1))
    partials = ir.For(PART, op("-", block, first), None,
                      (ir.PartialAdd(accs, op("-", op("-", block, num(1)), _var(PART, "loop", span)), span=span),),
                      span=span)
    finish = (let("tl_first_block", call("select", op(">", lo, num(0)), owner, block)), partials) \
        + tuple(after)
    tail = ir.If(op("<", hi, steps), (ir.PartialStore(accs, block, span=span),), finish, span=span)
    unit_body = tuple(per_unit) + _at_tile(k, tuple(before) + (part, tail), t)
    count = op("+", units, call("cdiv", op("-", op("-", v("tl_tiles"), sk_tiles), block), blocks))
    return tuple(per_block) + (ir.For(UNIT, count, None, unit_body, span=span),)


def _the_pipelined_loop(k: ir.Kernel, span) -> int:
    where = [i for i, s in enumerate(k.body) if isinstance(s, ir.For) and s.stages is not None]
    nested = [s for s in ir.walk_stmts(k.body) if isinstance(s, ir.For) and s.stages is not None
              and not any(s is k.body[i] for i in where)]
    if len(where) != 1 or nested:
        raise SemanticError("stream_k = 1 splits the K steps of one pipelined loop in the kernel's body; this kernel "
                            f"has {len(where)} there" + (" and more inside other statements" if nested else ""),
                            (nested[0].span if nested else k.body[where[1]].span if len(where) > 1 else span))
    loop = k.body[where[0]]
    grid_names = set(k.grid_vars) & free_names(loop.extent)
    if grid_names:
        raise SemanticError(f"stream_k = 1: the pipelined loop's extent depends on {', '.join(sorted(grid_names))}; "
                            "every tile must have the same K steps", loop.extent.span or loop.span)
    return where[0]


def _accumulators(k: ir.Kernel, before, loop: ir.For) -> tuple:
    """The local tiles the pipelined loop writes: each must be a gemm's accumulator
    (adding partial sums is then exact) filled with 0 before the loop; nothing
    in the loop may write a tensor (each block would write its share twice)."""
    accs = []
    for s in ir.walk_stmts(loop.body):
        if isinstance(s, ir.Gemm):
            accs.append(s.acc)
            continue
        for name in sorted(effects.of(k, s).writes):
            if k.space(name) == "local":
                raise SemanticError(f"stream_k = 1: '{name}' is written here inside the pipelined loop; the loop "
                                    "may change local tiles only as gemm accumulators (their partial sums add up)",
                                    s.span)
            if k.space(name) == "global":
                raise SemanticError(f"stream_k = 1: the pipelined loop writes tensor '{name}'; its K steps run "
                                    "on several blocks, so it may only load", s.span)
    accs = tuple(dict.fromkeys(accs))
    if not accs:
        raise SemanticError("stream_k = 1: the pipelined loop has no gemm accumulator to split", loop.span)
    zeroed = {s.buffer for s in before
              if isinstance(s, ir.Fill) and isinstance(s.value, (ir.Int, ir.Float)) and s.value.value == 0}
    for a in accs:
        if a not in zeroed:
            raise SemanticError(f"stream_k = 1: fill '{a}' with 0 before the pipelined loop, where every block "
                                "starts its share of a tile's K steps", loop.span)
    return accs
