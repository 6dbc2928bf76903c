"""plan-tma: one tensor map per (tensor, box); box, element strides, swizzle and
L2 promotion; every TMA rule that is static checked here, with the copy's line.

Launch-time rules (base address, strides, dims) are checked by the host wrapper."""
from __future__ import annotations

import math
from dataclasses import replace

from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.exprs import divisor, map_body
from ..ir.printer import expr as show

NAME = "plan-tma"

MAX_BOX = 256
L2_PROMOTION = "256B"   # a hint; measured on the H100 with benchmarks/bench.py


def run(k: ir.Kernel, opts) -> ir.Kernel:
    maps: dict = {}

    def plan(s):
        if not isinstance(s, (ir.TmaLoad, ir.TmaStore)):
            return s
        tensor = k.param(s.tensor)
        buf = k.buffer(s.buffer)
        rank = len(tensor.shape)
        box = (1,) * (rank - len(buf.shape)) + tuple(buf.shape)
        _check_box(tensor, box, s)
        _check_inner_coordinate(tensor, s.coords[-1], s)
        key = (tensor.name, box)
        if key not in maps:
            n = sum(1 for t, _ in maps if t == tensor.name)
            name = f"tmap_{tensor.name}" + (f"_{n}" if n else "")
            maps[key] = ir.TensorMap(name, tensor.name, "tiled", box, (1,) * rank, "none", L2_PROMOTION, span=s.span)
        tm = maps[key]
        if isinstance(s, ir.TmaLoad):
            return replace(s, tensor_map=tm.name, bytes=tm.box_bytes(tensor.dtype))
        return replace(s, tensor_map=tm.name)

    body = map_body(k.body, plan)
    return replace(k, body=body, tensor_maps=tuple(maps.values()))


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
