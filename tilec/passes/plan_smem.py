"""plan-smem: place shared tiles in dynamic shared memory (128-byte aligned, as
TMA destinations need) and size it; the host opts in above 48 KB."""
from __future__ import annotations

from dataclasses import replace

from ..errors import SemanticError
from ..ir import nodes as ir

NAME = "plan-smem"

ALIGN = 128
MAX_DYNAMIC_SMEM = 232448       # 227 KB per block on Hopper


def run(k: ir.Kernel, opts) -> ir.Kernel:
    offset = 0
    buffers = []
    for b in k.buffers:
        if b.scope == "shared":
            offset = -(-offset // ALIGN) * ALIGN
            b = replace(b, smem_offset=offset)
            offset += b.bytes
        buffers.append(b)
    if offset > MAX_DYNAMIC_SMEM - 8 * len(k.barriers):
        big = max((b for b in buffers if b.scope == "shared"), key=lambda b: b.bytes)
        raise SemanticError(f"shared tiles need {offset} bytes; a Hopper block has at most "
                            f"{MAX_DYNAMIC_SMEM} bytes of shared memory", big.span)
    return replace(k, buffers=tuple(buffers), smem_bytes=offset)
