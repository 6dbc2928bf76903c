"""The pass pipeline, in order. This list is the only place that orders passes."""
from __future__ import annotations

from dataclasses import dataclass, field

from . import (check_barriers, check_smem, check_types, fold_consts, hoist_loads, insert_barriers, lower_copies,
               lower_ranges, make_persistent, mark_in_place, plan_gemm, plan_pipeline, plan_smem, plan_tma)

PIPELINE = (
    fold_consts,        # consts, lets, shape symbols, name kinds
    lower_ranges,       # range(start, stop, step) -> a loop from 0
    make_persistent,    # grid ..., persistent = 1: resident blocks looping over the tiles
    check_types,        # memory spaces, ranks, dtypes, where names may be used
    mark_in_place,      # which written tensors may be passed as a tensor the kernel reads
    plan_gemm,          # gemm -> wgmma warpgroups; operand and accumulator layouts
    hoist_loads,        # a pipelined body's TMA loads to its front, past statements they commute with
    plan_pipeline,      # which pipelined loops become TMA rings or rotate; their tiles' stages or copies
    lower_copies,       # copy -> TMA load / TMA store / thread copy
    plan_tma,           # tensor maps, boxes, expect-tx bytes, static TMA rules
    check_smem,         # the shared tiles fit (before the costly barrier passes; plan-smem places them)
    insert_barriers,    # mbarriers, parities, fences, block barriers, bulk groups
    check_barriers,     # proves the barrier protocol on every path (or reports the line)
    plan_smem,          # shared-memory offsets and size
)

PASS_NAMES = ("parse",) + tuple(p.NAME for p in PIPELINE)


@dataclass(frozen=True)
class Options:
    consts: dict = field(default_factory=dict)   # const overrides
    tma: bool = True                             # False: the thread-copy fallback variant, and every
                                                 # kernel for an architecture without TMA (compiler.lower)
    expect_tx_skew: int = 0                      # test hook: a deliberately wrong expect-tx
    arch: str = "sm_90a"                         # the target (tilec.arch.NAMES)
