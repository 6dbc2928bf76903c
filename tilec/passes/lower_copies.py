"""lower-copies: pick each copy's lowering from its pair of memory spaces.

    global -> shared   TmaLoad   (cp.async.bulk.tensor .tile, completes on an mbarrier)
    im2col -> shared   TmaLoad with `view` set (cp.async.bulk.tensor .im2col)
    shared -> global   TmaStore  (cp.async.bulk.tensor .tile .bulk_group), and a StoreTail
                       when the tensor's rows may end inside a 16-byte granule; a
                       ThreadCopy where a coordinate may be negative (TMA faults there)
    anything with a local side, shared -> shared: ThreadCopy (all threads, bounds-checked)

A gemm accumulator's copy to global memory (the epilogue) goes through shared
memory: a thread copy of the fragments (converting) into a 128-byte swizzled
tile placed over a pipeline ring that is no longer used, then a TMA store.
Where the staging tile needs memory of its own (a loop over output tiles with a
producer warpgroup), it is two tiles of one 128-byte column chunk each, used in
turn: chunk c of the accumulator is staged in tile c % 2 and stored while the
threads stage chunk c + 1 in the other; where even that does not fit beside the
kernel's tiles, the copy stays a thread copy.

With `opts.tma` off (the fallback variant, run when an argument breaks a TMA
rule at launch) global <-> shared copies become thread copies too.
"""
from __future__ import annotations

from dataclasses import replace

from ..arch import get as get_arch
from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.effects import deep
from ..ir.exprs import map_body, non_negative
from .plan_smem import place

NAME = "lower-copies"

# output dtypes the epilogue stages (codegen converts their column pairs together); i32 from an i32
# accumulator only (its registers as they are; a float one's would need a saturating conversion)
STAGED_DTYPES = ("f16", "bf16", "f32", "i32")
OWN_STAGING_SHARE = 2           # an epilogue's staging tile of its own: where all shared tiles stay within
                                # half of a block's shared memory (two blocks an SM still fit)


def run(k: ir.Kernel, opts) -> ir.Kernel:
    staged = {}                 # epilogue tiles, each over a ring that is free by then
    lets = {s.name: s for s in ir.walk_stmts(k.body) if isinstance(s, ir.Let)}
    grid_scalars = frozenset(g.name for g in k.grid if isinstance(g, ir.Var) and g.kind == "scalar")
    if opts.tma:
        k = _epilogue_tiles(k, staged, lets, grid_scalars, opts.arch)

    def lower(s):
        if not isinstance(s, ir.Copy):
            return s
        src, dst = k.space(s.src.name), k.space(s.dst.name)
        if src == "view" and opts.tma:
            return ir.TmaLoad(k.view(s.src.name).tensor, s.dst.name, (), view=s.src.name,
                              origin=s.src.starts, span=s.span)
        if (src, dst) == ("global", "shared") and opts.tma:
            box = ir.split_box(s.src, len(k.buffer(s.dst.name).shape))
            return ir.TmaLoad(s.src.name, s.dst.name, s.src.starts, box=box, span=s.span)
        if (src, dst) == ("shared", "global") and opts.tma and stores_at_non_negative(s.dst, lets, grid_scalars):
            return tma_store(k, k.buffer(s.src.name), s.dst, s.span)
        if id(s) in staged:
            return _staged_store(k, s, staged[id(s)])
        tile = k.buffer(s.src.name) or k.buffer(s.dst.name)
        return ir.ThreadCopy(s.src, s.dst, tile.shape, span=s.span)
    return replace(k, body=map_body(k.body, lower))


def stores_at_non_negative(dst: ir.Region, lets: dict, grid_scalars: frozenset) -> bool:
    """Whether a store's coordinates are proven never negative (ir.exprs.non_negative).
    A TMA store at a negative coordinate faults (CUDA_ERROR_ILLEGAL_INSTRUCTION on the
    H100, any dtype, benchmarks/NOTES.md session 22), where a load there reads zeros:
    such a store is a thread copy, which drops the elements outside the tensor."""
    return all(non_negative(c, lets, grid_scalars) for c in dst.starts)


def tma_store(k: ir.Kernel, tile: ir.Buffer, dst: ir.Region, span, chunk=0, chunks=1) -> list:
    """A TMA store of `tile` at region `dst`, and its StoreTail when the tensor's rows
    may end inside a 16-byte granule (TMA stores clip at granules, not elements)."""
    box = ir.split_box(dst, len(tile.shape))
    if box and len(tile.shape) > 1:     # a column chunk of the accumulator: its own columns
        box = box[:-1] + (tile.shape[-1],)
    out = [ir.TmaStore(tile.name, dst.name, dst.starts, box=box, span=span)]
    if not ir.rows_in_whole_granules(k.param(dst.name)):
        out.append(ir.StoreTail(tile.name, dst.name, dst.starts, tuple(tile.shape), chunk, chunks, span=span))
    return out


def _epilogue_tiles(k: ir.Kernel, staged: dict, lets: dict, grid_scalars: frozenset, arch: str) -> ir.Kernel:
    """For each copy from a wgmma accumulator to a global tensor whose rows come
    in 128-byte chunks, a shared staging tile (layout sw128, the tensor's dtype)
    over a gemm operand ring that no later statement uses and that is large
    enough. Without such a ring the tile has memory of its own where the kernel's
    shared tiles and it take at most half of a block's shared memory (a conv
    over a patch and resident weights, 36-76 KB); else the copy stays a thread
    copy (a tile of its own would cost the kernel its second block per SM).
    Inside a loop (one trip per output tile) the ring is reused by the next trip, whose pipeline meets the
    stores first (insert-barriers), unless the loop that holds the store is itself pipelined (a TMA ring or
    a rotating body): its loads for later trips run before this trip's store, into the very memory (a patch
    conv of 48 channels or more over 3 or more row tiles computed garbage from its third tile on, session
    54); but with a producer warpgroup the next
    trip's loads run while the consumers stage this one, so there the staging
    tile gets memory of its own: two tiles of one 128-byte column chunk each,
    when the accumulator has more chunks than one and each warpgroup holds
    all of its columns (then a chunk is a compile-time set of registers) and
    the fragments are not acc^T's (whose columns are spread over the threads),
    where the block's shared memory holds it beside the rings (else the copy
    stays a thread copy: a kernel that fits as written is not refused for it)."""
    small = get_arch(arch).smem_per_block // OWN_STAGING_SHARE
    rings = {}                                  # operand tile -> bytes of its ring
    for s in ir.walk_stmts(k.body):
        if isinstance(s, ir.For):
            for inner in ir.walk_stmts(s.body):
                if isinstance(inner, ir.Copy) and k.space(inner.dst.name) == "shared":
                    b = k.buffer(inner.dst.name)
                    if b.swizzle:
                        rings[b.name] = b.ring_bytes
    new = []
    copies = {}                                 # accumulator -> its copies staged so far

    def visit(body, after, in_loop, ahead):
        """`after`: the statements that run after this body, outside it; `ahead`: the
        tiles that enclosing pipelined loops load for later trips while this one runs."""
        for i, s in enumerate(body):
            rest = tuple(body[i + 1:]) + after
            if isinstance(s, ir.For):
                loaded = deep(k, s).writes if s.ring or s.rotate else frozenset()
                visit(s.body, rest, True, ahead | loaded)
            elif isinstance(s, ir.If):
                visit(s.then, rest, in_loop, ahead)
                visit(s.orelse, rest, in_loop, ahead)
            elif isinstance(s, ir.Copy):
                stage(s, rest, in_loop, ahead)

    def stage(s, rest, in_loop, ahead):
        acc, t = k.buffer(s.src.name), k.param(s.dst.name)
        if acc is None or acc.layout != "wgmma" or not isinstance(t, ir.TensorParam) or \
                not stores_at_non_negative(s.dst, lets, grid_scalars):
            return
        width = 128 // t.dtype.size
        if t.dtype.name not in STAGED_DTYPES or acc.shape[1] % width or \
                (t.dtype.name == "i32") != (acc.dtype.name == "i32"):
            return
        later = set().union(*(e.reads | e.writes for e in (deep(k, x) for x in rest)))
        nbytes = acc.elements * t.dtype.size
        # the accumulator's first staged copy names its tiles tl_acc_out (or tl_acc_out0 and tl_acc_out1), a
        # second one tl_acc_out2 (tl_acc_out2_0 and tl_acc_out2_1)
        n = copies.get(acc.name, 0) + 1
        name = f"tl_{acc.name}_out" + (f"{n}" if n > 1 else "")
        if in_loop and k.producer_warpgroup:
            if acc.shape[1] > width and acc.wg_cols == 1 and not acc.transposed:
                chunk = name + ("_" if n > 1 else "")
                tiles = tuple(_tile(f"{chunk}{i}", t, (acc.shape[0], width), "", s.span) for i in range(2))
            else:
                tiles = (_tile(name, t, acc.shape, "", s.span),)       # memory of its own
            if not _fits(replace(k, buffers=k.buffers + tuple(new) + tiles), arch):
                return
            new.extend(tiles)
            staged[id(s)] = tiles
            copies[acc.name] = n
            return
        free = [r for r, size in rings.items() if r not in later and r not in ahead and size >= nbytes
                and not any(b.alias == r for b in new)]
        shared = sum(b.ring_bytes for b in k.buffers + tuple(new) if b.scope == "shared" and not b.alias)
        if not free and shared + nbytes > small:
            return
        alias = max(free, key=rings.get) if free else ""        # else memory of its own
        tile = _tile(name, t, acc.shape, alias, s.span)
        new.append(tile)
        staged[id(s)] = (tile,)
        copies[acc.name] = n

    visit(k.body, (), False, frozenset())
    return replace(k, buffers=k.buffers + tuple(new)) if new else k


def _fits(k: ir.Kernel, arch: str) -> bool:
    """Whether `k`'s shared tiles fit a block of `arch` beside at least one mbarrier
    (plan-smem's count; insert-barriers adds the barriers later)."""
    try:
        place(k, arch, barriers=1)
    except SemanticError:
        return False
    return True


def _tile(name: str, t: ir.TensorParam, shape, alias, span) -> ir.Buffer:
    return ir.Buffer(name, "shared", t.dtype, tuple(shape), layout="sw128", alias=alias, span=span)


def _staged_store(k: ir.Kernel, s: ir.Copy, tiles: tuple) -> list:
    """The epilogue through its staging tile, or with two tiles chunk c of the
    accumulator's columns through tiles[c % 2]."""
    if len(tiles) == 1:
        return [ir.ThreadCopy(s.src, ir.Region(tiles[0].name, (), (), span=s.span), tiles[0].shape, span=s.span),
                *tma_store(k, tiles[0], s.dst, s.span)]
    width = tiles[0].shape[1]
    *rows, x = s.dst.starts
    out, chunks = [], k.buffer(s.src.name).shape[1] // width
    for c in range(chunks):
        tile, col = tiles[c % 2], ir.Int(c * width)
        src = ir.Region(s.src.name, (ir.Int(0), col), (None, None), span=s.span)
        dst = replace(s.dst, starts=(*rows, ir.BinOp("+", x, col, span=s.span) if c else x))
        out += [ir.ThreadCopy(src, ir.Region(tile.name, (), (), span=s.span), tile.shape, span=s.span),
                *tma_store(k, tile, dst, s.span, c, chunks)]
    return out
