"""plan-tma: one tensor map per (tensor, box); box, element strides, swizzle and
L2 promotion; every TMA rule that is static checked here, with the copy's line.

A row-major tile with a dimension over TMA's 256 elements a box is moved as
several boxes of one map, each a contiguous block of the tile (`_split`): the
innermost such dimension is cut into pieces of at most 256, the dimensions
inside it go whole and those outside it one index a box (at most
MAX_BOXES_PER_COPY boxes).

Launch-time rules (base address, strides, dims) are checked by the host wrapper."""
from __future__ import annotations

import math
from dataclasses import replace

from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir import im2col
from ..ir.tma import (CORNER_RANGE, MAX_BOX, MAX_CHANNELS_PER_PIXEL, MAX_ELEMENT_STRIDE, MAX_IM2COL_LOAD_BYTES,
                      MAX_PIXELS_PER_COLUMN)
from ..ir.exprs import divisor, fold, map_body
from ..ir.printer import expr as show
from .fold_consts import MAX_STAGES

NAME = "plan-tma"

L2_PROMOTION = "256B"   # a hint; measured on the H100 with benchmarks/bench.py
MAX_BOXES_PER_COPY = 64  # the TMA instructions one copy of a wide or tall tile may take
MAX_GROUP_BOXES = 256    # ... a patch gemm's weights in pair order, an 8-row box a group (loaded once a block)


def run(k: ir.Kernel, opts) -> ir.Kernel:
    k = _tap_chunked_tiles(k)
    maps: dict = {}

    def plan(s):
        if isinstance(s, ir.TmaLoad) and s.view:
            return _plan_im2col(k, s, maps)
        if not isinstance(s, (ir.TmaLoad, ir.TmaStore)):
            return s
        tensor = k.param(s.tensor)
        buf = k.buffer(s.buffer)
        rank = len(tensor.shape)
        shape = tuple(buf.shape)
        swizzle = buf.tma_swizzle
        strides = (1,) * rank
        if buf.phases > 1:
            if isinstance(s, ir.TmaStore):
                raise SemanticError(f"patch '{buf.name}' of a strided im2col view holds its pixel columns by "
                                    "phase: it is loaded, not stored", s.span)
            # a strided view's patch: per 8 channels, a box a column phase q, X's columns q, q + S, ... (TMA's
            # element stride S: a box PWQ * S columns wide moves PWQ of them) into chunk c * S + q
            st = buf.phases
            boxes = [((0, q, c * 8), (c * st + q) * buf.chunk_rows * 8) for c in range(shape[-1] // 8)
                     for q in range(st)]
            shape = (shape[0], buf.phase_width * st, 8)
            strides = (1,) * (rank - 2) + (st, 1)
        elif buf.swizzle or buf.layout == "cols":
            # one box per column chunk, the chunks one after another: rows of 128, 64 or 32 bytes in
            # TMA's swizzle of that size, or of 16 bytes unswizzled (what wgmma reads), or a tile of
            # several im2col filter taps
            width = buf.swizzle // tensor.dtype.size if buf.swizzle else buf.chunk
            full, shape = shape, shape[:-1] + (width,)
            parts = _row_parts(shape, width * tensor.dtype.size) if len(shape) == 2 else 1   # over MAX_BOX rows
            rows = shape[0] // parts
            # rows r * rows.. at r * rows, or a patch gemm's weights in its pairs' order: group g at position p
            places = [(r, r) for r in range(parts)]
            if buf.row_groups:
                rows, places = 8, list(enumerate(buf.row_groups))
                if len(places) * (full[-1] // width) > MAX_GROUP_BOXES:
                    raise SemanticError(f"'{buf.name}' holds its 8-row groups in the order its patch gemm reads "
                                        f"them (plan-gemm), one TMA box each: "
                                        f"{len(places) * (full[-1] // width)} boxes, over the {MAX_GROUP_BOXES} "
                                        "tilec splits such a copy into (fewer channels, or fewer columns a tile)",
                                        s.span)
            shape = (rows,) + shape[1:]
            lead = (0,) * (len(shape) - 2)          # a patch's pixel rows: whole in every box (parts is 1)
            boxes = [(lead + (g * rows, c * width), c * buf.chunk_rows * width + p * rows * width)
                     for c in range(full[-1] // width) for p, g in places]
        else:
            shape, boxes = _split(tensor, shape, s)
        box = (1,) * (rank - len(shape)) + shape
        if s.box:           # the region splits the tile's rows over several dimensions (ir.split_box)
            if len(boxes) > 1 and any(b[0][:-1] != (0,) * (len(shape) - 1) for b in boxes):
                raise SemanticError(f"a region that splits the rows of tile '{buf.name}' moves it in one box "
                                    f"per column chunk, not in {len(boxes)} boxes", s.span)
            box = s.box[:-1] + (shape[-1],)
            boxes = [((0,) * (rank - 1) + (first[-1],), offset) for first, offset in boxes]
        _check_box(tensor, box, s)
        _check_inner_coordinate(tensor, s.coords[-1], s)
        # A store map ends at the tensor's last whole 16-byte granule (TMA stores clip
        # at granules, not elements); its StoreTail writes the rest of each row.
        rounded = isinstance(s, ir.TmaStore) and not ir.rows_in_whole_granules(tensor)
        key = (tensor.name, "tiled", box, swizzle, rounded, strides)
        if key not in maps:
            n = sum(1 for t, kind, *_ in maps if t == tensor.name and kind == "tiled")
            name = _unique_name(f"tmap_{tensor.name}", n, maps)
            maps[key] = ir.TensorMap(name, tensor.name, "tiled", box, strides, swizzle, L2_PROMOTION,
                                     inner_rounded=rounded, span=s.span)
        tm = maps[key]
        copies = []
        for first, offset in boxes:
            at = (0,) * (rank - len(first)) + first
            coords = tuple(fold(ir.BinOp("+", x, ir.Int(o))) if o else x for x, o in zip(s.coords, at))
            placed = replace(s, coords=coords, tensor_map=tm.name, smem_offset=offset * tensor.dtype.size)
            copies.append(placed if isinstance(s, ir.TmaStore) else replace(placed, bytes=tm.box_bytes(tensor.dtype)))
        return copies[0] if len(copies) == 1 and isinstance(s, ir.TmaStore) else copies

    body = map_body(k.body, plan)
    return replace(k, body=body, tensor_maps=tuple(maps.values()))




def _tap_chunked_tiles(k):
    """A shared tile that an im2col copy fills with K columns that may straddle
    filter taps (a channel count C fixed at compile time that is no multiple of
    BK: 16 channels a tap in a K tile of 64, or 24, or 96) gets the 'cols' layout,
    column chunks of gcd(C, BK) channels: each chunk lies inside one tap and is
    one dense TMA box. (With C a shape symbol, the launch checks that C is a
    multiple of BK instead.) A tile that views of several such C fill gets
    chunks of the greatest common divisor of them all."""
    chunked = {}
    for s in ir.walk_stmts(k.body):
        if not (isinstance(s, ir.TmaLoad) and s.view):
            continue
        buf, x = k.buffer(s.buffer), k.param(k.view(s.view).tensor)
        bm, bk = buf.shape
        c = x.shape[-1]
        if buf.layout != "row" or not isinstance(c, ir.Int) or c.value % bk == 0:
            continue
        esize = x.dtype.size
        chunk = math.gcd(c.value, bk, chunked.get(buf.name, bk))
        if (chunk * esize) % 16 or (bm * chunk * esize) % 128:
            continue        # TMA cannot: the launch check names the rule (and the fallback runs)
        chunked[buf.name] = chunk
    if not chunked:
        return k
    # a rotating loop's copies of the tile (plan-pipeline made them, insert-barriers loads them) alike
    chunked.update({ir.stage_tile(name, j): chunk for name, chunk in list(chunked.items())
                    for j in range(1, MAX_STAGES)})
    return replace(k, buffers=tuple(replace(b, layout="cols", chunk=chunked[b.name]) if b.name in chunked else b
                                    for b in k.buffers))


def _unique_name(base: str, n: int, maps: dict) -> str:
    """A map's name: `base`, or base_n for a tensor's n-th map, and one not taken
    (tensor A's second map tmap_A_1 and tensor A_1's first are two maps)."""
    taken = {m.name for m in maps.values()}
    name = base + (f"_{n}" if n else "")
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name


def _plan_im2col(k, s, maps):
    """TMA im2col loads of a tile [BM, BK] at view coordinates (m0, k0): output
    pixels m0 .. m0+BM-1 (walking ow, then oh, then n) by view columns k0 ..
    k0+BK-1, in loads of `width` columns, each channels c0 .. c0+width-1 of filter
    tap kt / C: the whole K tile, or one column chunk of a chunked tile (a gemm
    operand's swizzled chunks; a 'cols' tile's chunks). Needs C % width == 0
    (checked at launch) so that a load never straddles two taps."""
    v = k.view(s.view)
    x = k.param(v.tensor)
    buf = k.buffer(s.buffer)
    bm, bk = buf.shape
    rank = len(x.shape)
    m0, k0 = s.origin
    esize = x.dtype.size
    swizzle, width = "none", bk
    if buf.swizzle:                 # a gemm operand: one load per swizzled chunk, each inside one tap (plan-gemm)
        width, swizzle = buf.swizzle // esize, buf.tma_swizzle
    elif buf.layout == "cols":      # several taps: one load of `chunk` channels each
        width = buf.chunk
    if width > MAX_CHANNELS_PER_PIXEL or (width * esize) % 16:
        raise SemanticError(f"an im2col load of {width} channels moves {width * esize} bytes per pixel; TMA needs "
                            f"1 .. {MAX_CHANNELS_PER_PIXEL} channels and a multiple of 16 bytes", s.span)
    if bm > MAX_PIXELS_PER_COLUMN:
        raise SemanticError(f"an im2col load of {bm} pixels; TMA loads at most {MAX_PIXELS_PER_COLUMN}", s.span)
    if bm * width * esize > MAX_IM2COL_LOAD_BYTES:
        raise SemanticError(f"an im2col load of {bm} x {width} x {esize} = {bm * width * esize} bytes; the driver "
                            f"encodes at most {MAX_IM2COL_LOAD_BYTES} bytes per im2col load", s.span)
    if divisor(k0) % bk:
        raise SemanticError(f"cannot prove the view column '{show(k0)}' is a multiple of the tile width {bk}; "
                            "an im2col K tile must start on a multiple of its width", k0.span or s.span)
    lo_limit, hi_limit = CORNER_RANGE[rank]
    lower = tuple(-p for p in v.pad)
    upper = tuple(p - d * (kk - 1) for p, d, kk in zip(v.pad, v.dilation, v.kernel))
    for c in lower + upper:
        if not lo_limit <= c <= hi_limit:
            raise SemanticError(f"im2col of a rank-{rank} tensor needs pixel-box corners in [{lo_limit}, "
                                f"{hi_limit}]; this filter, pad and dilation give {c}", v.span)
    for st in v.stride:
        if st > MAX_ELEMENT_STRIDE:
            raise SemanticError(f"an im2col stride of {st}: TMA element strides are at most {MAX_ELEMENT_STRIDE}",
                                v.span)
    n, origins = im2col.row(v, x, m0)
    key = (x.name, "im2col", v.name, bm, width, swizzle)
    if key not in maps:
        maps[key] = ir.TensorMap(_unique_name(f"tmap_{v.name}", len(maps) if any(m[2] == v.name for m in maps) else 0,
                                              maps),
                                 x.name, "im2col", (bm, width), (1, *v.stride, 1), swizzle, L2_PROMOTION,
                                 lower, upper, span=s.span)
    tm = maps[key]
    loads = []
    for t in range(bk // width):
        kt = k0 if t == 0 else fold(ir.BinOp("+", k0, ir.Int(t * width)))
        c0, offsets = im2col.column(v, x, kt)
        loads.append(replace(s, origin=(m0, kt), coords=(n, *origins, c0), offsets=offsets, tensor_map=tm.name,
                             bytes=bm * width * esize, smem_offset=t * bm * width * esize,
                             zeros_if=_past_the_end(v, x, kt, bk, width)))
    return loads


def _past_the_end(v, x, k, depth, width):
    """Where a load of `width` view columns from k on (in a K tile `depth` wide)
    lies past the view's last column (k >= KH * KW * C), or None where no K tile
    can pass the end: KH * KW * C is a multiple of `depth`, a C that is a shape
    symbol counted as a multiple of `width` (the launch checks that). Such a load
    copies zeros from global memory instead (ir.ZEROS): TMA fills the columns
    outside X with zeros as well, but an im2col load whose every pixel lies
    outside X took the 8-channel convolutions from 0.91 to 0.58 of cuDNN, and
    the copies take them to 1.25 (benchmarks/NOTES.md, session 47)."""
    end = im2col.columns(v, x)
    channels = x.shape[-1]
    multiple = divisor(end) if isinstance(channels, ir.Int) else math.prod(v.kernel) * width
    past = fold(ir.BinOp(">=", k, end))
    return None if multiple % depth == 0 or (isinstance(past, ir.Int) and past.value == 0) else past


def _split(tensor, shape, s):
    """The box of a row-major tile `shape` whose dimensions may pass MAX_BOX, and
    for each box (its first index in the tile, its offset in elements from the
    tile's start): dimension e, the innermost over MAX_BOX, in pieces of the
    largest width w <= MAX_BOX that divides it (a multiple of 16 bytes where e is
    the innermost), the dimensions inside e whole, those outside it one index a
    box. Each box is then one contiguous block of the tile, in the tile's own
    order."""
    over = [d for d, n in enumerate(shape) if n > MAX_BOX]
    if not over:
        return shape, [((0,) * len(shape), 0)]
    e = over[-1]
    step = 16 // math.gcd(16, tensor.dtype.size) if e == len(shape) - 1 else 1
    w = next((w for w in range(MAX_BOX, 0, -1) if shape[e] % w == 0 and w % step == 0), None)
    count = math.prod(shape[:e]) * (shape[e] // w if w else 0)
    if w is None or count > MAX_BOXES_PER_COPY:
        why = (f"no box width of at most {MAX_BOX} elements{' and a multiple of 16 bytes' if step > 1 else ''} "
               f"divides {shape[e]}" if w is None else
               f"this tile would take {count} boxes (tilec splits a copy into at most {MAX_BOXES_PER_COPY})")
        rank = len(tensor.shape)
        raise SemanticError(
            f"TMA box dimension {rank - len(shape) + e} of '{tensor.name}' is {shape[e]}; TMA boxes are at most "
            f"{MAX_BOX} per dimension, and {why}", s.span,
            note="use a smaller tile, or split the copy into several")
    box = (1,) * e + (w,) + tuple(shape[e + 1:])
    outer = [()]
    for n in shape[:e]:
        outer = [o + (i,) for o in outer for i in range(n)]
    firsts = [o + (j * w,) + (0,) * (len(shape) - e - 1) for o in outer for j in range(shape[e] // w)]
    return box, [(f, sum(i * math.prod(shape[d + 1:]) for d, i in enumerate(f))) for f in firsts]


def _row_parts(shape, row_bytes) -> int:
    """Into how many equal parts of at most MAX_BOX rows a column chunk of `shape`
    ([rows, width], rows of `row_bytes`) splits, each part starting where its TMA
    load may (aligned to the swizzle pattern's period when swizzled: 8 rows of
    `row_bytes`, as TMA swizzles by address bits 4.. XOR 7..; 128 bytes if not): 1
    when it fits one box (or cannot split so; _check_box then says why)."""
    rows, align = shape[0], 8 * row_bytes if row_bytes > 16 else 128
    return next((n for n in range(1, rows + 1) if rows % n == 0 and rows // n <= MAX_BOX
                 and rows // n * row_bytes % align == 0), 1)


def _check_box(tensor, box, s):
    for i, b in enumerate(box):
        if b > MAX_BOX:
            raise SemanticError(
                f"TMA box dimension {i} of '{tensor.name}' is {b}; TMA boxes are at most {MAX_BOX} per dimension",
                s.span, note="use a smaller tile, or split the copy into several")
    inner = box[-1] * tensor.dtype.size
    if inner % 16:
        raise SemanticError(
            f"the TMA box's inner dimension is {box[-1]} x {tensor.dtype.size} = {inner} bytes; "
            "TMA needs a multiple of 16 bytes", s.span)


def _check_inner_coordinate(tensor, coord, s):
    """A TMA access whose innermost coordinate is not 16-byte aligned faults the
    whole context (CUDA_ERROR_ILLEGAL_INSTRUCTION), so it must be proven here."""
    need = 16 // math.gcd(16, tensor.dtype.size)
    d = divisor(coord)
    if d != 0 and d % need:
        raise SemanticError(
            f"cannot prove the innermost coordinate '{show(coord)}' of '{tensor.name}' is a multiple of "
            f"{need} elements (16 bytes of {tensor.dtype.name}); a misaligned TMA access faults the GPU",
            coord.span or s.span, note="write the coordinate as a multiple of the tile width, e.g. bx * BN")
