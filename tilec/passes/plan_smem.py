"""plan-smem: place shared tiles in dynamic shared memory (128-byte aligned, as
TMA destinations need) and size it; the host opts in above 48 KB."""
from __future__ import annotations

from dataclasses import replace

from ..errors import SemanticError
from ..ir import nodes as ir

NAME = "plan-smem"

ALIGN = 128
SWIZZLE_ALIGN = 1024            # the 128-byte swizzle pattern follows address bits 7-9
MAX_DYNAMIC_SMEM = 232448       # 227 KB per block on Hopper


def run(k: ir.Kernel, opts) -> ir.Kernel:
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
            align = SWIZZLE_ALIGN if b.layout == "sw128" else ALIGN
            offset = -(-offset // align) * align
            b = replace(b, smem_offset=offset)
            offset += b.ring_bytes
        buffers.append(b)
    if offset > MAX_DYNAMIC_SMEM - 8 * len(k.barriers):
        big = max((b for b in buffers if b.scope == "shared"), key=lambda b: b.bytes)
        raise SemanticError(f"shared tiles need {offset} bytes; a Hopper block has at most "
                            f"{MAX_DYNAMIC_SMEM} bytes of shared memory", big.span)
    if any(b.layout == "sw128" for b in buffers):
        offset += SWIZZLE_ALIGN     # room to align the dynamic smem base to 1024 bytes at run time
    return replace(k, buffers=tuple(buffers), smem_bytes=offset)
