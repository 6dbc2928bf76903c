"""plan-gemm: map each `gemm(a, b, acc)` onto Hopper warpgroup MMA.

The block's threads form warpgroups of 128; warpgroup g owns rows
[g * 64 * m_tiles, (g + 1) * 64 * m_tiles) of the accumulator, one
wgmma.mma_async m64nNk16 (k32 for 8-bit operands) per m64 row tile and K
step, N = the tile width.
The operands are read by wgmma from shared memory through matrix descriptors,
so `a` and `b` get the 'sw128' layout (128-byte column chunks with TMA's
128-byte swizzle, written directly by TMA); `acc` gets the 'wgmma' fragment
layout (registers)."""
from __future__ import annotations

from dataclasses import replace

from ..arch import get as get_arch
from ..errors import SemanticError
from ..ir import effects
from ..ir import nodes as ir
from ..ir.exprs import map_body

NAME = "plan-gemm"

MMA_DTYPES = ("f16", "bf16", "f8e4m3", "f8e5m2")


def run(k: ir.Kernel, opts) -> ir.Kernel:
    layouts = {}
    threads = k.threads.value
    target = get_arch(opts.arch)

    def plan(s):
        if not isinstance(s, ir.Gemm):
            return s
        if not target.wgmma:
            raise SemanticError(f"gemm needs Hopper's warpgroup MMA (wgmma.mma_async), which only sm_90a has; "
                                f"{target.name} ({target.family}) has none: compile this kernel for sm_90a",
                                s.span)
        a, b, acc = k.buffer(s.a), k.buffer(s.b), k.buffer(s.acc)
        for t, want in ((a, "shared"), (b, "shared"), (acc, "local")):
            if t.scope != want:
                raise SemanticError(f"gemm: '{t.name}' must be a {want} tile", s.span)
        if len(a.shape) != 2 or len(b.shape) != 2 or len(acc.shape) != 2:
            raise SemanticError("gemm multiplies 2-D tiles", s.span)
        m, ka = a.shape
        n, kb = (b.shape if s.transpose_b else reversed(b.shape))
        if ka != kb or tuple(acc.shape) != (m, n):
            bshape = f"[{n}, {kb}]" if s.transpose_b else f"[{kb}, {n}]"
            raise SemanticError(f"gemm shapes do not chain: a [{m}, {ka}] @ b {bshape} into acc "
                                f"{list(acc.shape)}", s.span)
        if a.dtype.name not in MMA_DTYPES or b.dtype != a.dtype:
            raise SemanticError(f"gemm takes f16, bf16, f8e4m3 or f8e5m2 operands of one dtype, not "
                                f"{a.dtype.name} and {b.dtype.name}", s.span)
        if a.dtype.size == 1 and not s.transpose_b:
            raise SemanticError(f"an {a.dtype.name} gemm reads b K-major (wgmma takes 8-bit operands in no "
                                "other order): declare b as [N, K] and write gemm(a, b, acc, transpose_b = true)",
                                s.span)
        if acc.dtype.name != "f32":
            raise SemanticError(f"gemm accumulates in f32; '{acc.name}' is {acc.dtype.name}", s.span)
        if threads % 128:
            raise SemanticError(f"gemm runs on warpgroups of 128 threads; threads is {threads}", s.span)
        wg = threads // 128
        if m % (64 * wg):
            raise SemanticError(f"gemm: {wg} warpgroups split the {m} rows of '{a.name}' into m64 tiles; "
                                f"the rows must be a multiple of {64 * wg}", s.span)
        if n % 64 or n > 256:
            raise SemanticError(f"gemm: the tile width N = {n} must be a multiple of 64 of at most 256 "
                                "(one wgmma m64nNk16, 128-byte swizzled chunks)", s.span)
        chunk = 128 // a.dtype.size
        if ka % chunk:
            raise SemanticError(f"gemm: the K depth {ka} must be a multiple of {chunk} (128-byte swizzled chunks "
                                f"of {a.dtype.name})", s.span)
        for t, lay in ((a, "sw128"), (b, "sw128"), (acc, "wgmma")):
            if layouts.get(t.name, lay) != lay:
                raise SemanticError(f"'{t.name}' is used by two gemms in different roles", s.span)
            layouts[t.name] = lay
        return replace(s, warpgroups=wg, m_tiles=m // (64 * wg))

    body = map_body(k.body, plan)
    if not layouts:
        return k
    buffers = tuple(replace(b, layout=layouts.get(b.name, b.layout)) for b in k.buffers)
    k = replace(k, body=body, buffers=buffers)
    _check_uses(k)
    return k


def _check_uses(k):
    """Swizzled operand tiles are written by TMA loads only (copies from a global
    tensor or an im2col view) and are not copied out."""
    swizzled = {b.name for b in k.buffers if b.layout == "sw128"}
    for s in ir.walk_stmts(k.body):
        e = effects.of(k, s)
        loaded = isinstance(s, ir.Copy) and k.space(s.src.name) in ("global", "view")
        copied_out = {s.src.name} if isinstance(s, ir.Copy) else set()
        for n in sorted(((set() if loaded else e.writes) | copied_out) & swizzled):
            raise SemanticError(f"'{n}' is a gemm operand (128-byte swizzled for wgmma): fill it with a TMA "
                                "copy from a global tensor, and read it with gemm only", s.span)
