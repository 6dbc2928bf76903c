"""What each statement reads and writes: the one table every walker asks.

Every statement type registers a rule here. A rule gives the tiles, tensors
and im2col views whose elements the statement reads and writes, every
expression it evaluates, and its part in the mbarrier protocol. Passes and
printers ask `of` (the statement alone) or `deep` (with the blocks it nests);
a statement type with no rule is refused loudly, so a new op cannot slip past
the barrier inserter and its checker unnoticed."""
from __future__ import annotations

from dataclasses import dataclass

from . import nodes as ir
from .exprs import walk_expr


@dataclass(frozen=True)
class Effects:
    reads: frozenset = frozenset()      # tiles, tensors and views whose elements it reads
    writes: frozenset = frozenset()     # ... and writes
    exprs: tuple = ()                   # every expression it evaluates
    barrier: str = ""                   # its part in the mbarrier protocol (below), or ""

    def __or__(self, other: "Effects") -> "Effects":
        return Effects(self.reads | other.reads, self.writes | other.writes, self.exprs + other.exprs,
                       self.barrier or other.barrier)


# barrier parts: init (mbarrier.init), arm (arrive.expect_tx), complete (a TMA load's
# complete_tx), wait (try_wait.parity), arrive (a consumer's arrival), flip (a phase register or a ring's count)
_RULES = {}


def rule(*types):
    """Register the effects of statement types: `@rule(ir.Fill) def _(k, s): ...`."""
    def register(fn):
        for t in types:
            _RULES[t] = fn
        return fn
    return register


def of(k: ir.Kernel, s) -> Effects:
    """The effects of statement `s` itself (not of the blocks it nests)."""
    fn = _RULES.get(type(s))
    if fn is None:
        raise TypeError(f"statement type {type(s).__name__} has no effects rule: register what it reads and "
                        "writes in tilec/ir/effects.py (docs/internals.md, 'Adding an op')")
    return fn(k, s)


def deep(k: ir.Kernel, s) -> Effects:
    """The effects of `s` and of every statement it nests."""
    out = Effects()
    for x in ir.walk_stmts((s,)):
        out = out | of(k, x)
    return out


def subscripted(exprs) -> frozenset:
    """Tiles read through `t[i, j]` in expressions."""
    return frozenset(x.name for e in exprs for x in walk_expr(e) if isinstance(x, ir.Subscript))


def _effects(reads=(), writes=(), exprs=(), barrier=""):
    exprs = tuple(e for e in exprs if isinstance(e, ir.Expr))
    return Effects(frozenset(reads) | subscripted(exprs), frozenset(writes), exprs, barrier)


def _region_exprs(*regions):
    return tuple(e for r in regions for e in r.starts + tuple(x for x in r.extents if x is not None))


@rule(ir.Copy, ir.ThreadCopy)
def _copy(k, s):
    return _effects({s.src.name}, {s.dst.name}, _region_exprs(s.src, s.dst))


@rule(ir.Fill)
def _fill(k, s):
    return _effects((), {s.buffer}, (s.value,))


@rule(ir.Reduce)
def _reduce(k, s):
    return _effects({s.src}, {s.dst})


@rule(ir.Assign)
def _assign(k, s):
    return _effects((), {s.buffer}, (s.value,) + tuple(s.indices))


@rule(ir.Gemm)
def _gemm(k, s):
    return _effects({s.a, s.b, s.acc} | ({s.zeros} if s.zeros else set()), {s.acc}, (s.stage,))


@rule(ir.Parallel)
def _parallel(k, s):
    return _effects(exprs=s.extents)


@rule(ir.For)
def _for(k, s):
    return _effects(exprs=(s.extent,))


@rule(ir.If)
def _if(k, s):
    return _effects(exprs=(s.cond,))


@rule(ir.Let)
def _let(k, s):
    return _effects(exprs=(s.value,))


@rule(ir.PartialStore)
def _partial_store(k, s):
    """Its workspace is the launch's, not a tile of the kernel: only the accumulators count."""
    return _effects(set(s.buffers), (), (s.slot,))


@rule(ir.PartialAdd)
def _partial_add(k, s):
    return _effects(set(s.buffers), set(s.buffers), (s.slot,))


@rule(ir.TmaLoad)
def _tma_load(k, s):
    return _effects({s.view or s.tensor}, {s.buffer}, s.coords + s.origin + s.offsets + (s.stage, s.barrier_index),
                    "complete")


@rule(ir.TmaStore, ir.StoreTail)
def _tma_store(k, s):
    return _effects({s.buffer}, {s.tensor}, s.coords)


@rule(ir.MbarrierInit)
def _init(k, s):
    return _effects(barrier="init")


@rule(ir.ArriveExpectTx)
def _arm(k, s):
    return _effects(exprs=(s.index,), barrier="arm")


@rule(ir.MbarrierWait)
def _wait(k, s):
    return _effects(exprs=(s.parity, s.index), barrier="wait")


@rule(ir.MbarrierArrive)
def _arrive(k, s):
    return _effects(exprs=(s.index,), barrier="arrive")


@rule(ir.FlipPhase)
def _flip(k, s):
    return _effects(barrier="flip")


@rule(ir.RingAdvance)
def _ring(k, s):
    return _effects(exprs=(s.by,), barrier="flip")


@rule(ir.OneThread, ir.Specialized, ir.WgmmaWait, ir.ProxyFence, ir.SyncThreads, ir.BulkCommit, ir.BulkWait)
def _order_only(k, s):
    """Block structure and ordering: no elements of their own."""
    return Effects()


def shared_accesses(k: ir.Kernel, s):
    """(reads, writes): the shared tiles `s` and what it nests touch."""
    shared = {b.name for b in k.buffers if b.scope == "shared"}
    e = deep(k, s)
    return e.reads & shared, e.writes & shared


def names_used(k: ir.Kernel, body, kind: str) -> set:
    """Names of `kind` (symbol, scalar, ...) that statements of `body` evaluate."""
    found = set()
    for s in ir.walk_stmts(body):
        for e in of(k, s).exprs:
            found |= {x.name for x in walk_expr(e) if isinstance(x, ir.Var) and x.kind == kind}
    return found


def written_tensors(k: ir.Kernel) -> tuple:
    """Tensor parameters the kernel writes, in the order of their first write."""
    out = []
    for s in ir.walk_stmts(k.body):
        for name in sorted(of(k, s).writes):
            if isinstance(k.param(name), ir.TensorParam) and name not in out:
                out.append(name)
    return tuple(out)
