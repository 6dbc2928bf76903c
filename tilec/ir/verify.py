"""The IR verifier, run after every pass: structural facts every later stage
relies on. A failure here is a tilec bug, reported with the pass that broke it."""
from __future__ import annotations

from . import nodes as ir
from .exprs import walk_expr


class VerifyError(AssertionError):
    pass


def verify(k: ir.Kernel, after: str) -> None:
    def fail(msg):
        raise VerifyError(f"IR verifier after {after}: {msg}")

    names = [p.name for p in k.params] + [b.name for b in k.buffers] + list(k.grid_vars)
    if len(names) != len(set(names)):
        fail("duplicate declaration")
    if len(k.grid) != len(k.grid_vars) or not 1 <= len(k.grid) <= 3:
        fail("grid and its names disagree")
    bars = {b.name for b in k.barriers}
    maps = {t.name for t in k.tensor_maps}
    folded = after != "parse"
    ranged = after in ("parse", "fold-consts")      # range(start, stop, step) until lower-ranges
    for s in ir.walk_stmts(k.body):
        if isinstance(s, ir.For) and not ranged and (s.start is not None or s.step is not None):
            fail(f"loop '{s.var}' still has a range start or step")
        if isinstance(s, ir.Let) and not s.index and folded:
            fail(f"block let '{s.name}' was not substituted")
        if isinstance(s, ir.TmaLoad):
            if k.buffer(s.buffer) is None or k.buffer(s.buffer).scope != "shared":
                fail(f"TMA load into '{s.buffer}', which is not a shared tile")
            if s.tensor_map and s.tensor_map not in maps:
                fail(f"TMA load uses unknown tensor map {s.tensor_map}")
            if s.barrier and s.barrier not in bars:
                fail(f"TMA load signals unknown barrier {s.barrier}")
        if isinstance(s, ir.TmaStore) and s.tensor_map and s.tensor_map not in maps:
            fail(f"TMA store uses unknown tensor map {s.tensor_map}")
        if isinstance(s, (ir.ArriveExpectTx, ir.MbarrierWait, ir.FlipPhase)) and s.barrier not in bars:
            fail(f"{type(s).__name__} on unknown barrier {s.barrier}")
        if isinstance(s, ir.For) and s.ring:
            for x in ir.walk_stmts(s.body):
                name = x.buffer if isinstance(x, ir.TmaLoad) else x.dst.name if isinstance(x, ir.Copy) else None
                b = k.buffer(name) if name is not None else None
                if b is not None and b.scope == "shared" and b.stages < s.stages:
                    fail(f"a ring of {s.stages} stages loads '{name}', which has {b.stages}")
        if isinstance(s, ir.ArriveExpectTx) and not 0 < s.bytes < (1 << 20):
            fail(f"expect-tx of {s.bytes} bytes is outside TMA's 1..2^20-1")
        if folded:
            for f in ("extent", "cond", "value"):
                e = getattr(s, f, None)
                if isinstance(e, ir.Expr):
                    for x in walk_expr(e):
                        if isinstance(x, ir.Var) and not x.kind:
                            fail(f"unresolved name '{x.name}'")
    for b in k.buffers:
        if b.smem_offset is not None and b.smem_offset % 128:
            fail(f"shared tile '{b.name}' at offset {b.smem_offset}, not 128-byte aligned")
