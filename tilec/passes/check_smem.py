"""check-smem: refuse a kernel whose shared tiles (rings at their stage counts,
epilogue staging included) cannot fit the target's shared memory per block,
before insert-barriers and check-barriers run: plan-smem places them, with the
mbarriers' bytes, at the end of the pipeline, but check-barriers is the
costliest pass (seconds for a producer ring of 8 stages), and a tune space's
candidates with too many stages for their tiles would pay it before being
refused. The same placement and message as plan-smem's (plan_smem.place);
the kernel is returned unchanged."""
from __future__ import annotations

from ..ir import nodes as ir
from . import plan_smem

NAME = "check-smem"


def run(k: ir.Kernel, opts) -> ir.Kernel:
    plan_smem.place(k, opts.arch, barriers=0)
    return k
