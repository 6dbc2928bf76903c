"""plan-smem: place shared tiles in dynamic shared memory (128-byte aligned, as
TMA destinations need) and size it, within the target's limit per block
(tilec.arch) beside the mbarriers' static bytes; the host opts in to all of it. A warp-specialised kernel's
launch bounds ask for as many blocks per SM as its shared memory and its
accumulators' registers allow (a producer warpgroup's 128 threads would
otherwise leave ptxas room for registers that cost the SM its second block),
and its setmaxnreg counts follow."""
from __future__ import annotations

from dataclasses import replace

from ..arch import get as get_arch
from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.exprs import map_body
from .plan_gemm import WGMMA_REGISTER_OVERHEAD

NAME = "plan-smem"

ALIGN = 128
SWIZZLE_ALIGN = 1024            # the 128-byte swizzle pattern follows address bits 7-9
DYNAMIC_BASE_ALIGN = 1024       # codegen's `extern __shared__ __align__(1024)`: static bytes count in these steps


def run(k: ir.Kernel, opts) -> ir.Kernel:
    slots = max((ir.reduce_slots(k, s) for s in ir.walk_stmts(k.body) if isinstance(s, ir.Reduce)), default=0)
    if slots:
        # where a reduce's groups of lanes meet in shared memory (codegen's reduce_in_lanes, reduce_local)
        k = replace(k, buffers=k.buffers + (ir.Buffer(ir.REDUCE_WARPS, "shared", ir.DTYPES["u64"], (slots,)),))
    buffers, dynamic = place(k, opts.arch, barriers=barrier_count(k))
    k = replace(k, buffers=tuple(buffers), smem_bytes=dynamic)
    if not any(isinstance(s, ir.Specialized) for s in ir.walk_stmts(k.body)):
        return k
    return replace(k, body=map_body(k.body, lambda s: _blocks_per_sm(k, s)))


def barrier_count(k: ir.Kernel) -> int:
    return sum(b.count if b.array else 1 for b in k.barriers)


def static_bytes(barriers: int) -> int:
    """The static shared memory of a kernel with `barriers` mbarriers, as the driver
    counts it against the block's limit: 8 bytes each, rounded up to the alignment
    of the dynamic base that follows them (codegen's `extern __shared__
    __align__(1024)`). Measured on the H200 (NOTES.md session 33): 1 to 128
    barriers count 1024 bytes, 200 count 2048; the 1 KB the driver reserves per
    block comes on top of the limit, not out of it."""
    return -(-8 * barriers // DYNAMIC_BASE_ALIGN) * DYNAMIC_BASE_ALIGN


def place(k: ir.Kernel, arch: str, barriers: int) -> tuple:
    """(the buffers at their offsets, the dynamic shared memory they take: the bytes
    they span, and SWIZZLE_ALIGN more where swizzled tiles need their base aligned
    at run time), or the error at the largest tile's line when that and the
    static bytes of `barriers` mbarriers do not fit `arch`'s shared memory per
    block (the driver would refuse the launch). check-smem calls it before the
    barriers exist (0 of them: a lower bound, so a refusal there stands)."""
    offset = 0
    buffers = []
    for b in k.buffers:
        under = next((x for x in buffers if x.name == b.alias), None) if b.alias else None
        if under is not None and under.ring_bytes >= b.bytes:
            buffers.append(replace(b, smem_offset=under.smem_offset))   # reuses a ring done with
            continue
        if b.alias:
            b = replace(b, alias="")
        if b.scope == "shared":
            align = SWIZZLE_ALIGN if b.swizzle else ALIGN
            offset = -(-offset // align) * align
            b = replace(b, smem_offset=offset)
            offset += b.ring_bytes
        buffers.append(b)
    target = get_arch(arch)
    pad = SWIZZLE_ALIGN if any(b.swizzle for b in buffers) else 0    # as codegen aligns the base
    static = static_bytes(barriers)
    if offset + pad + static > target.smem_per_block:
        big = max((b for b in buffers if b.scope == "shared" and not b.alias), key=lambda b: b.ring_bytes)
        more = f", {pad} more to align swizzled tiles" if pad else ""
        if static:
            more += f", and {static} more for {barriers} mbarrier{'s' if barriers > 1 else ''} (static shared " \
                    f"memory counts in {DYNAMIC_BASE_ALIGN}-byte steps)"
        raise SemanticError(f"shared tiles need {offset} bytes{more}; {target.block} has at most "
                            f"{target.smem_per_block} bytes of shared memory", big.span)
    return buffers, offset + pad


SMEM_PER_SM = 233472            # Hopper: 228 KB per SM, 1 KB of it reserved per block
SMEM_RESERVED_PER_BLOCK = 1024
THREADS_PER_SM = 2048


def _blocks_per_sm(k: ir.Kernel, s):
    if not isinstance(s, ir.Specialized):
        return s
    threads = k.launch_threads
    acc = sum(ir.fragment_regs(b, k.threads.value) for b in k.buffers if b.layout == "wgmma")
    need = -(-(acc + WGMMA_REGISTER_OVERHEAD) // 8) * 8
    blocks = min(SMEM_PER_SM // (k.smem_bytes + static_bytes(barrier_count(k)) + SMEM_RESERVED_PER_BLOCK),
                 65536 // (need * threads), THREADS_PER_SM // threads)
    blocks = max(1, blocks)
    producer_regs, consumer_regs = ir.specialized_registers(k.threads.value, blocks)
    return replace(s, blocks_per_sm=blocks, producer_regs=producer_regs, consumer_regs=consumer_regs)
