"""plan-gemm: map each `gemm(a, b, acc)` onto Hopper warpgroup MMA.

The block's threads form warpgroups of 128, split over M where the tile has
m64 row tiles enough, the rest over N: warpgroup g owns rows
(g / wg_cols) * 64 * m_tiles.. and columns (g % wg_cols) * N / wg_cols.. of
the accumulator, one wgmma.mma_async m64nNk16 (k32 for 8-bit operands, k8 for tf32) per
m64 row tile and K step, N = its column count.
The operands are read by wgmma from shared memory through matrix descriptors,
so `a` and `b` get a swizzled layout (column chunks whose rows are 128, 64 or
32 bytes, the widest that tiles the operand's contiguous extent, in TMA's
swizzle of that size, written directly by TMA); `acc` gets the 'wgmma'
fragment layout (registers).

A tile whose M is not a multiple of 64 (a few rows: 8, 16, 32 ...) while N
is runs swapped: wgmma computes acc^T += b^T @ a^T, N on its 64-row side and
a's M rows as its N (a multiple of 8), so no row of the m64 instruction is
padding. `acc`'s fragments then hold acc^T (`transposed`), which codegen maps
back to acc's elements. Where neither M nor N is a multiple of 64 (M one of
8), N is padded to whole m64 tiles and the gemm runs swapped (`fragment_rows`):
wgmma reads b's shared memory past its N rows (its `overrun`) into fragment rows
that hold no element, which codegen's walks skip; or M is, as is, where N's
padding would leave every thread's second fragment row padding (_orientation)."""
from __future__ import annotations

import math
from dataclasses import replace

from ..arch import get as get_arch
from ..errors import SemanticError
from ..ir import effects, printer
from ..ir import nodes as ir
from ..ir.exprs import map_body, walk_expr

NAME = "plan-gemm"

MMA_DTYPES = ("f16", "bf16", "f8e4m3", "f8e5m2", "i8", "u8")
INT_DTYPES = ("i8", "u8")                  # wgmma .s8 / .u8: products summed in i32 (not saturated), not f32


def run(k: ir.Kernel, opts) -> ir.Kernel:
    layouts, splits, fragments = {}, {}, {}     # fragments: accumulator -> f32 registers per thread
    overruns = {}                               # wgmma's b, a -> Buffer.overrun (an uneven split, padded rows)
    patched = set()                             # patches whose im2col views end in a half step of zeros
    transposed = {}                             # accumulator -> its fragments hold acc^T
    padded = {}                                 # accumulator -> Buffer.fragment_rows (rows padded to m64 tiles)
    orders = {}                                 # a patch gemm's weights -> Buffer.row_groups
    phases = {}                                 # a patch -> Buffer.phases (its views' stride)
    threads = k.threads.value
    target = get_arch(opts.arch)
    keep_rows = _rows_beside(k)                 # accumulators whose rows hold 1-D tiles: not swapped where avoidable

    def plan(s):
        if not isinstance(s, ir.Gemm):
            return s
        if not target.wgmma:
            raise SemanticError(f"gemm needs Hopper's warpgroup MMA (wgmma.mma_async), which only sm_90a has; "
                                f"{target.name} ({target.family}) has none: compile this kernel for sm_90a",
                                s.span)
        a, b, acc = k.buffer(s.a), k.buffer(s.b), k.buffer(s.acc)
        regs_a = a.scope == "local"          # a in registers: the fragments of an [M, K] tile laid out as acc's
        for t, want in ((a, "shared or local"), (b, "shared"), (acc, "local")):
            if t.scope not in want.split(" or "):
                raise SemanticError(f"gemm: '{t.name}' must be a {want} tile", s.span)
        if len(b.shape) != 2 or len(acc.shape) != 2 or not s.patch and len(a.shape) != 2:
            raise SemanticError("gemm multiplies 2-D tiles", s.span)
        m, ka = _patch_operand(a, s) if s.patch else (reversed(a.shape) if s.transpose_a else a.shape)
        zeros = ir.patch_zeros(a.name) if s.patch and _patch_items(a, s) % 2 else ""
        if zeros:
            patched.add(a.name)
        n, kb = (b.shape if s.transpose_b else reversed(b.shape))
        if ka != kb or tuple(acc.shape) != (m, n):
            ashape = f"[{ka}, {m}]" if s.transpose_a else f"[{m}, {ka}]"
            bshape = f"[{n}, {kb}]" if s.transpose_b else f"[{kb}, {n}]"
            why = ""
            if s.patch and ka != kb:
                taps = s.patch[0] * s.patch[1] * a.shape[2]
                why = (f" (a is the im2col view of patch '{a.name}': its K is {s.patch[0]} * {s.patch[1]} * "
                       f"{a.shape[2]} = {taps} columns rounded up to 16, zeros past {taps}; give b {ka} rows, zeros "
                       f"past {taps})")
            raise SemanticError(f"gemm shapes do not chain: a {ashape} @ b {bshape} into acc "
                                f"{list(acc.shape)}{why}", s.span)
        _check_operand_dtypes(a, b, s)
        esize = a.dtype.size
        if esize != 2 and (s.transpose_a or not s.transpose_b):
            what = "tf32 operands" if s.tf32 else "8-bit operands"
            raise SemanticError(f"a{'' if s.tf32 else 'n'} {'tf32' if s.tf32 else a.dtype.name} gemm reads a and b "
                                f"K-major (wgmma takes {what} in no other order): declare a as [M, K] and b as "
                                f"[N, K] and write gemm(a, b, acc, transpose_b = true{', tf32 = true' * s.tf32})",
                                s.span)
        want = "i32" if a.dtype.name in INT_DTYPES else "f32"
        if acc.dtype.name != want:
            raise SemanticError(f"gemm accumulates {a.dtype.name} products in {want}; '{acc.name}' is "
                                f"{acc.dtype.name}", s.span)
        if threads % 128:
            raise SemanticError(f"gemm runs on warpgroups of 128 threads; threads is {threads}", s.span)
        wg = threads // 128
        # M not a multiple of 64 (a few rows): wgmma computes acc^T += b^T @ a^T, b's N on its 64-row side;
        # neither a multiple of 64: N padded to m64 tiles, swapped (its rows past N read from b's memory past
        # it), or M so, as is, where N's padding would leave every thread's second fragment row empty
        swap, pm, pn, rows, cols = _orientation(wg, m, n, s, acc.name in keep_rows)
        real = n if swap else m                     # the product's rows that are the tile's (the rest padding)
        kstep = 32 // esize
        if ka % kstep:
            raise SemanticError(f"gemm: the K depth {ka} must be a multiple of {kstep} (one wgmma reads 32 bytes "
                                f"of K: {kstep} {a.dtype.name} elements)", s.span)
        if regs_a:
            _check_register_a(a, acc, esize, swap, pm > real, cols, s)
        # wgmma's operands: [pm, K] (M-major when transposed) and [K, pn] (K-major when transposed)
        wa, ta, wb, tb = (b, not s.transpose_b, a, not s.transpose_a) if swap else \
            (a, s.transpose_a, b, s.transpose_b)
        # each operand's swizzle: the widest (128, 64, 32 bytes) whose chunks tile its contiguous extent, or
        # 16-byte chunks not swizzled (a warpgroup's 8, 24, ... M/N-major columns; a K-major operand's chunks
        # tile its im2col taps too); 16-bit M/N-major operands only, a warpgroup's share a multiple of 8 (_split)
        a_sw = 0 if regs_a else 16 if s.patch else _swizzle(math.gcd(real, pm // rows), esize) if ta else \
            _k_major_swizzle(k, wa, ka, esize)
        b_sw = _k_major_swizzle(k, wb, ka, esize) if tb else _swizzle(math.gcd(pn, ir.split_width(pn, cols)), esize)
        if s.patch:     # the weights' 8-row groups in the order of the k16 steps' item pairs
            b_order = _pair_order(replace(a, layout="sw16", phases=s.patch_stride), b, s)
            if phases.get(a.name, s.patch_stride) != s.patch_stride:
                raise SemanticError(f"patch '{a.name}' is read by im2col views of two strides", s.span)
            phases[a.name] = s.patch_stride
            if orders.get(b.name, b_order) != b_order:
                raise SemanticError(f"'{b.name}' is the weights of two patch gemms that read K in different "
                                    "orders", s.span)
            orders[b.name] = b_order
        for t, lay in ((wa, "wgmma" if regs_a else f"sw{a_sw}"), (wb, f"sw{b_sw}"), (acc, "wgmma")):
            if layouts.get(t.name, lay) != lay:
                raise SemanticError(f"'{t.name}' is used by two gemms in different roles or layouts", s.span)
            layouts[t.name] = lay
        # an uneven split's last warpgroup reads as many columns as the others, past wgmma's b's N: that many
        # more 8-column chunks ([K, N]) or rows of its last chunk ([N, K]) must be shared memory
        extra = ir.split_width(pn, cols) * cols - pn
        over = extra * (b_sw if tb else wb.shape[0] * esize)
        overruns[wb.name] = max(overruns.get(wb.name, 0), over)
        if pm > real:               # rows padded to m64 tiles: as many more rows of each chunk ([M, K]) or chunks
            over = (pm - real) * (a_sw if not ta else wa.shape[0] * esize)     # of M columns ([K, M]) of a
            overruns[wa.name] = max(overruns.get(wa.name, 0), over)
            padded[acc.name] = pm
        transposed[acc.name] = swap        # the same for every gemm into acc: it follows from acc's shape
        splits[acc.name] = cols
        if regs_a:      # its f16 / bf16 elements in pairs, one register each, as the wgmmas read them
            transposed[a.name], splits[a.name], fragments[a.name] = False, 1, a.elements // threads // 2
        fragments[acc.name] = ir.fragment_regs(replace(acc, wg_cols=cols, transposed=swap,
                                                       fragment_rows=padded.get(acc.name, 0)), threads)
        _check_registers(fragments, threads, k.producer_warpgroup, s)
        return replace(s, warpgroups=wg, m_tiles=pm // (64 * rows), wg_cols=cols, swapped=swap, a_in_registers=regs_a,
                       zeros=zeros)

    body = _fold_zero_fills(map_body(k.body, plan))
    if not layouts:
        _place_rows(k)
        _check_reduces(k)
        return k
    buffers = tuple(replace(b, layout=layouts.get(b.name, b.layout), wg_cols=splits.get(b.name, b.wg_cols),
                            transposed=transposed.get(b.name, b.transposed),
                            row_groups=orders.get(b.name, b.row_groups), phases=phases.get(b.name, b.phases),
                            overrun=overruns.get(b.name, b.overrun),
                            fragment_rows=padded.get(b.name, b.fragment_rows))
                    for b in k.buffers)
    if patched:     # each such patch's zeros right after it (so a descriptor reaches them forwards), zeroed first
        buffers = tuple(x for b in buffers for x in ((b, _zeros(b)) if b.name in patched else (b,)))
        body = tuple(ir.Fill(ir.patch_zeros(n), ir.Int(0)) for n in sorted(patched)) + body
    k = _spread_fragments(replace(k, body=body, buffers=buffers))
    spread = {b.name: ir.fragment_regs(b, threads) for b in k.buffers
              if b.layout == "wgmma" and b.name not in fragments}
    if spread:
        _check_registers({**fragments, **spread}, threads, k.producer_warpgroup, next(
            s for s in ir.walk_stmts(k.body) if isinstance(s, ir.Gemm)))
    k = _place_rows(k)
    _check_uses(k)
    _check_reduces(k)
    return k


def _check_operand_dtypes(a, b, s):
    """f16, bf16, f8e4m3 or f8e5m2 operands of one dtype, i8 / u8 ones (either on
    either side), or f32 ones where the gemm says `tf32 = true`: the tensor cores read f32 as tf32 (8 exponent bits
    and 10 of mantissa, the lower 13 of each element ignored), as torch's
    allow_tf32 and Triton's default tl.dot of f32 do."""
    ints = a.dtype.name in INT_DTYPES and b.dtype.name in INT_DTYPES       # s8 x u8 mixes are wgmma's too
    if b.dtype != a.dtype and not ints or a.dtype.name not in MMA_DTYPES + ("f32",):
        raise SemanticError(f"gemm takes f16, bf16, f8e4m3 or f8e5m2 operands of one dtype, i8 or u8 ones, or f32 "
                            f"ones with tf32 = true; not {a.dtype.name} and {b.dtype.name}", s.span)
    if a.dtype.name == "f32" and not s.tf32:
        raise SemanticError("gemm of f32 operands runs on the tensor cores in tf32 (10 bits of mantissa, the "
                            "lower 13 of each element ignored; f32 accumulation): say so with "
                            "gemm(a, b, acc, transpose_b = true, tf32 = true), or convert the operands to f16 "
                            "or bf16", s.span)
    if s.tf32 and a.dtype.name != "f32":
        raise SemanticError(f"gemm: tf32 = true reads f32 operands as tf32; '{a.name}' and '{b.name}' are "
                            f"{a.dtype.name}", s.span)


def _patch_items(a, s) -> int:
    """The (filter tap, 8 channels) items of an im2col view of patch `a`: its K in 16-byte units."""
    return s.patch[0] * s.patch[1] * a.shape[2] // 8


def _patch_operand(a, s) -> tuple:
    """(M, K) of gemm `s`'s im2col view of shared patch `a` [PH, PW, C], after its
    rules: 16-bit channels in whole 16-byte chunks (the patch's layout: each chunk
    all PH x PW pixels, 16 bytes each, what wgmma's interleaved layout reads; with
    a stride S, S chunks of PH x ceil(PW / S), one a column phase, so that a
    tap's S-apart pixels lie 16 bytes apart), 8 output pixels a row (an m64
    tile's 8-row core matrices are then 8 pixels of one patch row, S patch rows
    apart), the patch exactly the filter windows' extent; a k16 step's two (tap,
    chunk) items must ascend in the patch, which _pair_order arranges. K: KH * KW
    * C rounded up to 16, the columns past the taps zeros."""
    (kh, kw), (ph, pw, c), st = s.patch, a.shape, s.patch_stride
    oh, ow = (ph - kh) // st + 1, (pw - kw) // st + 1
    stride = f", stride {st}" if st > 1 else ""
    view = (f"the im2col view of patch '{a.name}' ({ph} x {pw} pixels, {kh} x {kw} filter{stride}: {oh} x {ow} "
            "outputs)")
    if s.transpose_a:
        raise SemanticError(f"gemm: {view} is [M, K]; transpose_a does not apply", s.span)
    if a.dtype.size != 2:
        raise SemanticError(f"gemm: {view} takes f16 or bf16 channels, not {a.dtype.name}", s.span)
    if c % 8:
        raise SemanticError(f"gemm: {view}: its {c} channels must be a multiple of 8 (the patch holds 16-byte "
                            f"chunks of 8 channels, two of them a wgmma K step)", s.span)
    if ow != 8 or (pw - kw) % st:
        wide = f"KW + 7 * S = {kw + 7 * st}" if st > 1 else f"KW + 7 = {kw + 7}"
        raise SemanticError(f"gemm: {view}: a row of outputs must be 8 pixels (an m64 tile is 8 rows of 8 "
                            f"pixels), so the patch is {wide} pixels wide, not {pw}", s.span)
    if oh % 8 or (ph - kh) % st:
        high = "KH + S * (a multiple of 8, less 1)" if st > 1 else "KH - 1 + a multiple of 8"
        raise SemanticError(f"gemm: {view}: its rows of outputs must come in 8s (an m64 tile is 8 rows of 8 "
                            f"pixels), so the patch is {high} pixels high, not {ph}", s.span)
    return oh * ow, -(-_patch_items(a, s) // 2) * 16


def _pair_order(a: ir.Buffer, b: ir.Buffer, s: ir.Gemm) -> tuple:
    """The order in which gemm `s` on the im2col view of patch `a` reads the view's
    (tap, 8 channels) items, as Buffer.row_groups of its weights `b` (one item an
    8-row group of b): () for K order, where each k16 step's two items ascend in
    the patch (a descriptor's leading byte offset is unsigned): 8 channels (taps
    t, t + 1) or a multiple of 16 (two chunks of one tap). Else (24, 40, ...
    channels, where a step pairs a tap's last chunk with the next tap's first) the
    items in address order, each step's two then ascending, a lone last item with
    the zeros after the patch; b's rows past the items (zero weights) stay last."""
    items = _patch_items(a, s)
    at = [ir.patch_item_offset(a, s.patch, i) for i in range(items)]
    if all(at[i] < at[i + 1] for i in range(0, items - 1, 2)):
        return ()
    if s.transpose_b:
        raise SemanticError(f"gemm: the im2col view of patch '{a.name}' ({a.shape[2]} channels) reads K in pairs "
                            f"of items that are not in K order, so the weights' rows are reordered as they load: "
                            f"declare '{b.name}' as [K, N], without transpose_b", s.span)
    return tuple(sorted(range(items), key=at.__getitem__)) + tuple(range(items, b.shape[0] // 8))


def _zeros(patch: ir.Buffer) -> ir.Buffer:
    """The zeros an im2col view of `patch` reads past its taps: one 16-byte chunk of its pixels (of a
    column phase's)."""
    return ir.Buffer(ir.patch_zeros(patch.name), "shared", patch.dtype, (patch.shape[0], patch.phase_width, 8),
                     span=patch.span)


def _check_register_a(a, acc, esize, swapped, padded, wg_cols, s):
    """A local a is wgmma's A from registers: each thread's fragments of a's [M, K] are
    those an [M, K] accumulator would have (a row's K columns in one warpgroup), which
    is the A fragment layout of a 16-bit wgmma, k16 slice by k16 slice. So a's rows are
    acc's, split over warpgroups the same way and not over N."""
    if esize != 2:
        raise SemanticError(f"gemm: a local a ('{a.name}', wgmma's A from registers) must be f16 or bf16: "
                            f"{'a tf32' if s.tf32 else 'an 8-bit'} A's register fragments are not an accumulator's "
                            f"layout; make '{a.name}' a shared tile", s.span)
    if s.transpose_a or swapped or padded:
        why = "transpose_a" if s.transpose_a else f"{acc.shape[0]} rows, not a multiple of 64 " + \
            ("(a swapped gemm)" if swapped else "(padded to m64 tiles)")
        raise SemanticError(f"gemm: a local a ('{a.name}', wgmma's A from registers) is read K-major, as an "
                            f"[M, K] accumulator's fragments, and cannot be used with {why}", s.span)
    if wg_cols != 1:
        raise SemanticError(f"gemm: a local a ('{a.name}', wgmma's A from registers) needs each warpgroup to own "
                            f"whole rows of '{acc.name}', but its {acc.shape[1]} columns are split over {wg_cols} "
                            "warpgroups side by side: use fewer threads or more rows", s.span)


def _fold_zero_fills(body) -> tuple:
    """`fill(acc, 0); gemm(a, b, acc)` as one gemm with `zero` (acc = a @ b): its
    first wgmmas ignore acc instead of threads zeroing its registers first."""
    out = []
    for s in body:
        nested = {f: _fold_zero_fills(getattr(s, f)) for f in ir.STMT_BLOCK_FIELDS.get(type(s), ())}
        s = replace(s, **nested) if nested else s
        before = out[-1] if out else None
        if isinstance(s, ir.Gemm) and isinstance(before, ir.Fill) and before.buffer == s.acc and \
                isinstance(before.value, (ir.Int, ir.Float)) and before.value.value == 0 and \
                math.copysign(1.0, before.value.value) > 0:     # (-0.0 + a product of -0.0 is -0.0)
            out[-1] = replace(s, zero=True)
        else:
            out.append(s)
    return tuple(out)


def _spread_fragments(k: ir.Kernel) -> ir.Kernel:
    """A local tile that a `parallel` body or a copy uses beside a gemm accumulator
    (of the same shape: check-types allows no other in a parallel) takes the
    accumulator's fragment layout, so that one thread holds element (i, j) of both
    (`out[i, j] = acc[i, j] * 2`); and so on, to a fixpoint. (Accumulators of one
    shape have one layout: the split and the swap follow from the shape and the
    block's threads.)"""
    bufs = {b.name: b for b in k.buffers}
    uses = []
    for s in ir.walk_stmts(k.body):
        if isinstance(s, (ir.Parallel, ir.Copy)):
            e = effects.deep(k, s)
            uses.append(sorted(n for n in e.reads | e.writes if n in bufs and bufs[n].scope == "local"))
    changed = True
    while changed:
        changed = False
        for names in uses:
            acc = next((bufs[n] for n in names if bufs[n].layout == "wgmma"), None)
            if acc is None:
                continue
            for n in names:
                if bufs[n].layout == "row" and tuple(bufs[n].shape) == tuple(acc.shape):
                    bufs[n] = replace(bufs[n], layout="wgmma", wg_cols=acc.wg_cols, transposed=acc.transposed,
                                      fragment_rows=acc.fragment_rows)
                    changed = True
    return replace(k, buffers=tuple(bufs[b.name] for b in k.buffers))


def _place_rows(k: ir.Kernel) -> ir.Kernel:
    """A 1-D local tile of M elements that lives in an accumulator's rows (layout
    'rows': element i on the 4 lanes of the quad that holds fragment row i, the
    same value on each) where a `parallel` over an [M, N] accumulator reads it at
    [i] (it must), or where a reduce of such an accumulator's rows writes it (it may:
    a shuffle instead of shared memory and two block barriers). 1-D tiles that a
    `parallel` over (M) uses together share a layout. Their other uses must work on
    such a tile: fills, reduces of an accumulator's rows, `parallel` bodies (each row
    runs on the 4 lanes of its quad, so such a body may write a shared tile, from
    one lane, only where it reads none it writes). With warpgroups side by side over N
    (`wg_cols`), each of them holds the rows of its row of warpgroups. A tile that must
    live in rows and has another use is an error at that use; so is one whose
    accumulator keeps its rows elsewhere (holding acc^T, beside a producer warpgroup)."""
    bufs = {b.name: b for b in k.buffers}
    ones = [n for n, b in bufs.items() if b.scope == "local" and len(b.shape) == 1]
    if not ones:
        return k
    group = {n: n for n in ones}

    def root(n):
        while group[n] != n:
            n = group[n]
        return n

    needs, refusals = {}, {}      # tile -> (span, why it lives in rows); -> (span, why it cannot)
    prefers = set()               # tiles reduced into from an accumulator's rows: there, where nothing refuses
    split = {}                    # rows M -> the warpgroups side by side over N of an accumulator of M rows
    padding = {}                  # rows M -> such an accumulator's fragment_rows

    def accumulator_rows(acc, length):
        """Why an accumulator's rows cannot hold a tile of `length` (None: they can)."""
        if acc.layout != "wgmma":
            return f"'{acc.name}' is no gemm accumulator, so the rows of its elements are spread at e % threads"
        if acc.transposed:
            return f"the fragments of '{acc.name}' hold its transpose (a swapped gemm of {acc.shape[0]} rows)"
        if k.producer_warpgroup:
            return "the block has a producer warpgroup"
        if acc.shape[0] != length:
            return f"'{acc.name}' has {acc.shape[0]} rows"
        split[length] = acc.wg_cols       # accumulators of M rows: one split over N (plan-gemm's _split)
        padding[length] = acc.fragment_rows     # and one padding to m64 tiles
        return None

    def visit(body):
        for s in body:
            if isinstance(s, ir.Parallel):
                parallel(s)
            elif isinstance(s, ir.Reduce) and s.dst in group:
                src = bufs[s.src]
                why = accumulator_rows(src, bufs[s.dst].shape[0]) if s.axis == 1 else \
                    f"it reduces the columns of '{src.name}'"
                if why:
                    refusals.setdefault(s.dst, (s.span, why))
                else:
                    prefers.add(s.dst)
            elif not isinstance(s, ir.Fill):
                for f in ir.STMT_BLOCK_FIELDS.get(type(s), ()):
                    visit(getattr(s, f))
                if not ir.STMT_BLOCK_FIELDS.get(type(s)):
                    e = effects.of(k, s)
                    for n in (e.reads | e.writes) & group.keys():
                        refusals.setdefault(n, (s.span, f"a {type(s).__name__.lower()} cannot move it"))

    def parallel(s):
        e = effects.deep(k, s)
        used = sorted((e.reads | e.writes) & group.keys())
        if len(s.extents) == 1:
            for n in used[1:]:
                group[root(n)] = root(used[0])
            clash = sorted(n for n in e.writes & e.reads if bufs[n].scope == "shared")
            for n in used if clash else ():
                refusals.setdefault(n, (s.span, f"a parallel over it runs each row on the 4 lanes of a quad, so it "
                                                f"cannot both read and write the shared tile '{clash[0]}'"))
            return
        acc = next((bufs[n] for n in sorted(e.reads | e.writes) if n in bufs and bufs[n].layout == "wgmma"), None)
        for n in used:
            span = next((x.span for ex in e.exprs for x in walk_expr(ex) if isinstance(x, ir.Subscript) and
                         x.name == n), s.span)
            why = accumulator_rows(acc, bufs[n].shape[0]) if acc is not None else \
                "the parallel walks no gemm accumulator whose rows it could be kept in"
            where = f"beside '{acc.name}'" if acc is not None else \
                f"in a parallel over ({', '.join(s.vars)}) in ({', '.join(printer.expr(x) for x in s.extents)})"
            needs.setdefault(n, (span, f"line {span.line} reads {n}[{s.vars[0]}] {where}", n))
            if why:
                refusals.setdefault(n, (span, why))

    visit(k.body)
    placed = set()
    for n in ones:
        members = [m for m in ones if root(m) == root(n)]
        need = next((needs[m] for m in members if m in needs), None)
        order = ([need[2]] if need else []) + members       # the needing tile's own refusal first
        refusal = next((refusals[m] + (m,) for m in order if m in refusals), None)
        if need is None and (refusal is not None or not prefers.intersection(members)):
            continue
        if refusal is not None:
            span, why, m = refusal
            beside = "" if m == need[2] else f", as '{need[2]}' must, which a parallel over them uses with it"
            raise SemanticError(f"local tile '{m}' must live in an accumulator's rows{beside} ({need[1]}), but "
                                f"here {why}", span,
                                note="a 1-D local tile read at [i] in a parallel over a gemm accumulator, or "
                                     "reduced into from its rows, lives on the 4 lanes of each quad that holds "
                                     "its row (language.md §12); use a shared tile where it must go elsewhere")
        placed.add(n)
    if not placed:
        return k
    return replace(k, buffers=tuple(replace(b, layout="rows", wg_cols=split[b.shape[0]],
                                            fragment_rows=padding[b.shape[0]]) if b.name in placed else b
                                    for b in k.buffers))


def _check_reduces(k):
    """A local tile is reduced where it lies: in wgmma's fragments (any accumulator
    layout), or at e % threads with its rows evenly on the threads
    (ir.local_reduce_spread)."""
    threads = k.threads.value
    for s in ir.walk_stmts(k.body):
        if not isinstance(s, ir.Reduce):
            continue
        src = k.buffer(s.src)
        if src.scope != "local" or src.layout == "wgmma" or ir.local_reduce_spread(threads, src.shape, s.axis):
            continue
        m, n = src.shape
        raise SemanticError(f"reduce cannot read the local tile '{src.name}' ({src.dtype.name}[{m}, {n}]) where it "
                            f"lies: with {threads} threads its rows of {n} element{'s' if n > 1 else ''} must each "
                            f"sit on all the threads ({n} a multiple of {threads}) or on whole groups of threads "
                            f"({n} dividing {threads} and 32, or a multiple of 32 dividing {threads}, with {m} x {n} "
                            f"a multiple of {threads}); copy it into a shared tile and reduce that", s.src_span)


def _check_uses(k):
    """Swizzled operand tiles are not copied out (TMA loads, thread copies into
    them, fills and element assignments write them through their swizzle, and
    `parallel` bodies read their elements through it)."""
    swizzled = {b.name for b in k.buffers if b.swizzle}
    for s in ir.walk_stmts(k.body):
        if isinstance(s, ir.Copy) and s.src.name in swizzled:
            raise SemanticError(f"'{s.src.name}' is a gemm operand (swizzled for wgmma): it cannot be copied "
                                "out; read its elements in a parallel body instead", s.span)


# Registers a thread needs beside its accumulator fragments to issue a wgmma
# (descriptors, addresses): ptxas's C7602 asks for a register target of 154 for
# the m64n256 instruction's 128 accumulator registers, 138 for m64n224's 112.
WGMMA_REGISTER_OVERHEAD = 26


def _check_registers(fragments: dict, threads: int, producer: bool, s: ir.Gemm):
    """The accumulators' fragments (all live at once) and a wgmma's operands must
    fit the registers a thread of this block can have: 64K per SM over `threads`,
    in steps of 8, at most 255; a producer warpgroup's threads count too
    (ir.thread_registers)."""
    limit = ir.thread_registers(threads, producer)
    block = f"a {threads}-thread block beside a producer warpgroup" if producer else f"a {threads}-thread block"
    need = sum(fragments.values()) + WGMMA_REGISTER_OVERHEAD
    if need > limit:
        held = ", ".join(f"{r} for '{n}'" for n, r in fragments.items())
        raise SemanticError(f"gemm: the accumulator fragments take {sum(fragments.values())} registers per thread "
                            f"({held}) and a wgmma needs about {WGMMA_REGISTER_OVERHEAD} more, over the {limit} a "
                            f"thread of {block} can have: use fewer columns per "
                            "warpgroup (a smaller N tile) or fewer threads", s.span)


def _orientation(wg, m, n, s, keep_rows=False) -> tuple:
    """(swapped, the product's rows and columns, warpgroups over them) of gemm `s`
    on a tile of m x n: as is where m is a multiple of 64. Else (m one of 8)
    swapped, acc^T = b^T @ a^T, n rows padded to m64 tiles where n is no multiple
    of 64 (on the H100 0.5-15% faster than m padded in every shape measured,
    benchmarks/NOTES.md session 54); or as is, m padded, where that cannot be:
    where the padding would leave the last m64 tile 8 rows on one warpgroup row
    (the second row of every thread's fragments, lane / 4 + 8, is then padding in
    all of them, and ptxas serializes the wgmmas: C7511), or m cannot be split
    over the warpgroups' columns. `keep_rows` (1-D tiles live in the
    accumulator's rows, which acc^T's fragments do not hold): m padded first."""
    if m % 64 == 0 or m % 8:
        return (False, m, n) + _split(wg, m, n, s.span)

    def plan(swap):
        """The plan with the product's rows (n swapped, else m) padded to m64 tiles, or
        None where the last would hold 8 rows on one warpgroup row."""
        real, other = (n, m) if swap else (m, n)
        rows_to = -(-real // 64) * 64
        rows, cols = _split(wg, rows_to, other, s.span, _swapped_note(m, n) if swap else "")
        if rows_to > real and rows == 1 and real % 64 == 8:
            return None
        return swap, rows_to, other, rows, cols

    order = (False, True) if keep_rows else (True, False)
    errors = {}
    for swap in order if n % 8 == 0 else (False,):      # (N no multiple of 8: _split refuses it as is)
        try:
            got = plan(swap)
        except SemanticError as e:          # m or n over the warpgroups' columns: the last would own none ...
            errors[swap] = e
            continue
        if got:
            return got
    if errors:                              # the error of the way this tile ran before padding came
        raise errors.get(n % 64 == 0, next(iter(errors.values())))
    raise SemanticError(f"gemm: neither the tile's {m} rows nor its N = {n} columns are a multiple of 64, and "
                        "padded to m64 tiles either way round, the last m64 tile's 8 rows leave the second row of "
                        "each fragment (lane / 4 + 8) padding in every thread, which makes ptxas serialize the "
                        "wgmmas: make one side 16 more or fewer, or a multiple of 64", s.span)


def _rows_beside(k: ir.Kernel) -> set:
    """The gemm accumulators whose rows 1-D tiles will live in (_place_rows): those of
    the shape of a 2-D local tile that a `parallel` over it walks with a 1-D local tile
    of its rows (the tile itself, or one that takes the accumulator's layout beside it,
    as acc does beside a gemm into `part`: _spread_fragments)."""
    bufs = {b.name: b for b in k.buffers}
    shapes = set()
    for s in ir.walk_stmts(k.body):
        if isinstance(s, ir.Parallel) and len(s.extents) > 1:
            e = effects.deep(k, s)
            local = [bufs[n] for n in (e.reads | e.writes) & bufs.keys() if bufs[n].scope == "local"]
            ones = {b.shape[0] for b in local if len(b.shape) == 1}
            shapes |= {tuple(b.shape) for b in local if len(b.shape) == 2 and b.shape[0] in ones}
    return {s.acc for s in ir.walk_stmts(k.body) if isinstance(s, ir.Gemm) and tuple(bufs[s.acc].shape) in shapes}


def _swapped_note(m, n) -> str:
    """How an error about a swapped gemm begins: what wgmma computes instead."""
    return (f"gemm: the tile's {m} rows are not a multiple of 64, so wgmma computes acc^T = b^T @ a^T, "
            f"{n} rows by {m} columns; ")


def _split(wg, m, n, span, swapped=""):
    """(warpgroups over M, warpgroups over N): over M while each keeps whole m64
    tiles (what the m64nNk16 instruction computes), the rest over N: each
    warpgroup takes N / cols columns rounded up to a multiple of 8 (at most 256:
    one wgmma), the last what is left (N = 24 over two: 16 and 8; ir.split_width).
    `swapped`: m and n are those of acc^T, and the errors begin so."""
    rows = wg
    while rows > 1 and m % (64 * rows):
        rows -= 1
    while wg % rows:
        rows -= 1
    cols = wg // rows
    if m % 64:
        raise SemanticError(f"gemm: the {m} rows of the tile must be a multiple of 8 (wgmma computes m64 tiles: "
                            "of rows a multiple of 64, or padded to them in 8-row groups, or with the tile's N a "
                            "multiple of 64 acc^T = b^T @ a^T)", span)
    first = swapped or "gemm: "
    if n % 8 or ir.split_width(n, cols) > 256:
        if cols == 1:
            raise SemanticError(f"{first}the tile width N = {n} must be a multiple of 8 of at most 256 (one wgmma "
                                "m64nNk16 per warpgroup)", span)
        raise SemanticError(f"{first}{wg} warpgroups over {m} rows are {rows} over M and {cols} over N: the N = {n} "
                            f"columns must be a multiple of 8, and each warpgroup's share (N / {cols} rounded up to "
                            "a multiple of 8) at most 256 (one wgmma m64nNk16 per warpgroup)", span)
    if ir.split_last(n, cols) <= 0:
        width = ir.split_width(n, cols)
        raise SemanticError(f"{first}{wg} warpgroups over {m} rows are {rows} over M and {cols} over N, but the "
                            f"N = {n} columns in steps of 8 ({width} a warpgroup) leave the last warpgroup none: "
                            f"use fewer threads or a wider tile", span)
    return rows, cols


def _swizzle(extent, esize, widest=128) -> int:
    """The widest swizzle (128, 64 or 32 bytes, or 16: rows of 16 bytes, not swizzled;
    at most `widest`) whose rows tile `extent` elements; 0 if none."""
    return next((sw for sw in (128, 64, 32, 16) if sw <= widest and extent * esize % sw == 0), 0)


def _k_major_swizzle(k: ir.Kernel, tile: ir.Buffer, kdepth: int, esize: int) -> int:
    """A K-major operand's swizzle: the widest whose chunks tile its K depth and,
    for each im2col copy that fills the tile from a tensor of C channels fixed at
    compile time, tile C too: each chunk then lies inside one filter tap of every
    view and is one TMA load (plan-tma). E.g. 32 bytes for views of 16 and 32 f16
    channels, 64 for 96 channels, 16 (chunks not swizzled, wgmma's interleaved
    layout) for 8 or 24. Taps that are no multiple of 16 bytes narrow nothing: TMA
    cannot load them, and the launch check sends such a tensor to the thread-copy
    variant. (With C a shape symbol, the launch checks that C is a multiple of
    the chunk.)"""
    widest = 128
    for s in ir.walk_stmts(k.body):
        v = k.view(s.src.name) if isinstance(s, ir.Copy) and s.dst.name == tile.name else None
        c = k.param(v.tensor).shape[-1] if v is not None else None
        if isinstance(c, ir.Int):
            widest = _swizzle(c.value, esize, widest) or widest
    return _swizzle(kdepth, esize, widest)
