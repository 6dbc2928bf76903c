"""check-barriers: prove the mbarrier protocol of the lowered kernel, or report
the first violation with the barrier and the .tile line.

The kernel is run abstractly, as two classes of threads in block-synchronous
program order: thread 0 (which also runs `one_thread` blocks) and the rest.
Loops run 0, 1, 2 and 3 times (trip counts are not known at compile time, and
small ones are where tails go wrong); both sides of every `if` are explored.
On every path it checks that

  (a) each phase's expect-tx equals the full-box bytes of the TMA loads that
      signal it;
  (b) every wait finds a phase that is armed on that path with the parity it
      waits on (no wait without an arrive, no stale phase bit), and no phase is
      left armed or store left unwaited at exit;
  (c) no TMA load overwrites a tile whose previous load is still unwaited,
      whose TMA store may still be reading it, or that threads used since the
      last block barrier; no thread touches a tile whose load it has not waited;
  (d) a TMA store of thread-written smem follows a proxy fence and a block
      barrier.

It does not prove index arithmetic in bounds, nor anything about global memory
written by one block and read by another."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.printer import expr as show
from ..ir.effects import shared_accesses

_C_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
          "/": lambda a, b: int(a / b) if b else None, "%": lambda a, b: a - int(a / b) * b if b else None,
          "<": lambda a, b: int(a < b), "<=": lambda a, b: int(a <= b), ">": lambda a, b: int(a > b),
          ">=": lambda a, b: int(a >= b), "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b),
          "&&": lambda a, b: int(bool(a and b)), "||": lambda a, b: int(bool(a or b))}


def _unknown_atoms(e, env):
    """The names and calls whose value `e` needs but the path does not fix."""
    if evaluate(e, env) is not None:
        return []
    if isinstance(e, (ir.Var, ir.Call)):
        return [show(e)]
    out = []
    for child in (getattr(e, "lhs", None), getattr(e, "rhs", None), getattr(e, "operand", None)):
        if child is not None:
            out += [a for a in _unknown_atoms(child, env) if a not in out]
    return out


def evaluate(e, env):
    """The integer value of `e` on a path (C semantics), or None where it depends
    on something the path does not fix (a shape, a block index)."""
    if e is None:
        return None
    key = show(e)
    if key in env:
        return env[key]
    if isinstance(e, ir.Int):
        return e.value
    if isinstance(e, ir.BinOp):
        a, b = evaluate(e.lhs, env), evaluate(e.rhs, env)
        return None if a is None or b is None else _C_OPS[e.op](a, b)
    if isinstance(e, ir.UnaryOp):
        a = evaluate(e.operand, env)
        return None if a is None else (-a if e.op == "-" else int(not a))
    return None

NAME = "check-barriers"

TRIP_COUNTS = (0, 1, 2, 3)
MAX_PATHS = 4096
T0, REST = "thread 0", "the other threads"


class BarrierBug(SemanticError):
    """The lowered kernel breaks the mbarrier protocol (a tilec bug if the IR came
    from tilec's own passes)."""


@dataclass
class _Bar:
    armed: bool = False
    expect: int = 0
    loaded: int = 0
    tiles: set = field(default_factory=set)
    completed: int = 0
    seen: dict = field(default_factory=lambda: {T0: -1, REST: -1})   # last phase index each class observed
    counted: bool = False                               # completed by arrivals alone (a pipeline's empty)


@dataclass
class _State:
    bars: dict = field(default_factory=dict)
    phase: dict = field(default_factory=dict)          # (barrier, class) -> phase register
    unwaited: dict = field(default_factory=dict)       # tile -> barrier of its load, until a wait
    visible: dict = field(default_factory=dict)        # TMA-loaded tile -> classes that may read its data
    touched: set = field(default_factory=set)          # tiles used by threads since the last block barrier
    written: set = field(default_factory=set)          # thread-written since the last proxy fence + barrier
    fenced: set = field(default_factory=set)           # ... fenced, barrier still to come
    storing: set = field(default_factory=set)          # read by TMA stores not waited for
    env: dict = field(default_factory=dict)            # loop variables and loop extents on this path
    wgmma: list = field(default_factory=list)          # tiles read by each wgmma group still in flight
    released: dict = field(default_factory=dict)       # tile@stage -> (empty barrier, phase) that frees it


def _fail(msg, span):
    raise BarrierBug(msg, span, note="this kernel would hang or read stale data on the GPU")


class _Checker:
    def __init__(self, k: ir.Kernel):
        self.k = k
        self.shared = {b.name for b in k.buffers if b.scope == "shared"}
        self.paths = 0

    # ---- running blocks over sets of states
    def run(self, body, states, classes):
        for s in body:
            nxt = []
            for st in states:
                nxt += self.stmt(s, st, classes)
            states = nxt
            self.paths = max(self.paths, len(states))
            if len(states) > MAX_PATHS:
                states = states[:MAX_PATHS]
        return states

    def stmt(self, s, st, classes):
        if isinstance(s, ir.OneThread):
            return self.run(s.body, [st], (T0,))
        if isinstance(s, ir.For):
            out = []
            extent = show(s.extent)
            for n in TRIP_COUNTS if s.stages is None else range(0, s.stages + 3):
                if st.env.get(extent, n) != n:
                    continue            # the same extent is already fixed on this path
                cur = [copy.deepcopy(st)]
                for c in cur:
                    c.env[extent] = n
                for i in range(n):
                    for c in cur:
                        c.env[s.var] = i
                    cur = self.run(s.body, cur, classes)
                out += cur
            return out
        if isinstance(s, ir.StoreTail):
            # in blocks whose tile crosses the last whole granule: barrier, reads, barrier
            tail = copy.deepcopy(st)
            for x in (ir.SyncThreads(span=s.span), s, ir.SyncThreads(span=s.span)):
                self.step(x, tail, classes)
            return [tail, st]
        if isinstance(s, ir.If):
            cond = evaluate(s.cond, st.env)
            if cond is not None:
                return self.run(s.then if cond else s.orelse, [st], classes)
            atoms = _unknown_atoms(s.cond, st.env)
            if len(atoms) == 1:
                # e.g. `j < cdiv(K, 64)` before a pipelined loop: try small trip counts, and
                # keep the value on the path so the loop runs exactly that many times
                out = []
                for v in range(0, 8):
                    fork = copy.deepcopy(st)
                    fork.env[atoms[0]] = v
                    out += self.stmt(s, fork, classes)
                return out
            return self.run(s.then, [copy.deepcopy(st)], classes) + self.run(s.orelse, [copy.deepcopy(st)], classes)
        self.step(s, st, classes)
        return [st]

    # ---- one statement
    def step(self, s, st, classes):
        if isinstance(s, ir.MbarrierInit):
            for b in s.barriers:
                for i in range(b.count):
                    name = f"{b.name}[{i}]" if b.array else b.name
                    st.bars[name] = _Bar(counted=b.completes == "arrivals")
                    st.phase[(name, T0)] = st.phase[(name, REST)] = 0
        elif isinstance(s, ir.ArriveExpectTx):
            name = self.bar_name(st, s.barrier, s.index, s)
            bar = self.bar(st, name, s)
            if bar.armed:
                _fail(f"mbarrier {name} is armed again before its phase {bar.completed} was waited on", s.span)
            bar.armed, bar.expect, bar.loaded, bar.tiles = True, s.bytes, 0, set()
        elif isinstance(s, ir.MbarrierArrive):
            name = self.bar_name(st, s.barrier, s.index, s)
            bar = self.bar(st, name, s)
            stage = evaluate(s.index, st.env)
            for t in list(st.touched):
                if t.endswith(f"@{stage}"):
                    if any(t in group for group in st.wgmma):
                        _fail(f"stage {stage} is released on mbarrier {name} while a wgmma may still read '{t}'",
                              s.span)
                    st.released[t] = (name, bar.completed)
            bar.completed += 1
        elif isinstance(s, ir.WgmmaWait):
            del st.wgmma[:max(0, len(st.wgmma) - s.pending)]
        elif isinstance(s, ir.TmaLoad):
            self.tma_load(s, st)
        elif isinstance(s, ir.MbarrierWait):
            for c in classes:
                self.wait(s, st, c)
        elif isinstance(s, ir.Gemm):
            self.thread_access(s, st, classes)
            st.wgmma.append({self.tile(st, t, s.stage) for t in (s.a, s.b)})
        elif isinstance(s, ir.FlipPhase):
            for c in classes:
                st.phase[(s.barrier, c)] ^= 1
        elif isinstance(s, ir.RingAdvance):
            st.env[s.var] = st.env[s.var] + evaluate(s.by, st.env)  # the trip count is fixed on this path
        elif isinstance(s, ir.SyncThreads):
            if classes != (T0, REST):
                _fail("a block barrier inside a one-thread block deadlocks", s.span)
            st.touched.clear()
            st.written -= st.fenced
            st.fenced.clear()
            for t, seen in st.visible.items():
                if seen:
                    st.visible[t] = {T0, REST}
        elif isinstance(s, ir.ProxyFence):
            st.fenced |= st.written
        elif isinstance(s, ir.TmaStore):
            t = s.buffer
            if t in st.unwaited or (t in st.visible and T0 not in st.visible[t]):
                _fail(f"TMA store of '{t}' before its load on mbarrier {st.unwaited[t]} was waited on", s.span)
            if t in st.written:
                _fail(f"TMA store of '{t}', which threads wrote, without fence.proxy.async and a block barrier "
                      "after the writes", s.span)
            st.storing.add(t)
        elif isinstance(s, ir.BulkWait):
            st.storing.clear()
        elif shared_accesses(self.k, s) != (set(), set()):
            self.thread_access(s, st, classes)      # threads touching tiles (copies, fill, parallel, tails, ...)

    def bar_name(self, st, name, index, s):
        if index is None:
            return name
        i = evaluate(index, st.env)
        if i is None:
            _fail(f"cannot tell which barrier of {name} '{show(index)}' picks on this path", s.span)
        return f"{name}[{i}]"

    @staticmethod
    def tile(st, name, stage):
        return name if stage is None else f"{name}@{evaluate(stage, st.env)}"

    def bar(self, st, name, s):
        if name not in st.bars:
            _fail(f"mbarrier {name} is used before mbarrier.init", s.span)
        return st.bars[name]

    def tma_load(self, s, st):
        bname = self.bar_name(st, s.barrier, s.barrier_index, s)
        bar = self.bar(st, bname, s)
        t = self.tile(st, s.buffer, s.stage)
        if not bar.armed:
            _fail(f"TMA load into '{t}' signals mbarrier {bname}, which has no arrive.expect_tx for it", s.span)
        if t in st.unwaited and st.unwaited[t] != bname:
            _fail(f"TMA load overwrites '{t}' while its previous load (mbarrier {st.unwaited[t]}) is unwaited",
                  s.span)
        if t in st.storing:
            _fail(f"TMA load overwrites '{t}' while a TMA store may still be reading it (no wait_group.read)",
                  s.span)
        if t in st.touched:
            _fail(f"TMA load overwrites '{t}', which threads used, without a block barrier in between", s.span)
        bar.loaded += s.bytes
        bar.tiles.add(t)
        st.unwaited[t] = bname
        st.visible[t] = set()

    def wait(self, s, st, c):
        name = self.bar_name(st, s.barrier, s.index, s)
        bar = self.bar(st, name, s)
        if s.parity is None:
            parity = st.phase[(name, c)]
        elif isinstance(s.parity, int):
            parity = s.parity
        else:
            parity = evaluate(s.parity, st.env)
            if parity is None:
                _fail(f"cannot evaluate the parity '{show(s.parity)}' of mbarrier {name} on this path", s.span)
        if bar.counted:
            # completed by arrivals: a wait on parity p passes once the phase of parity p is done
            if (bar.completed & 1) == parity:
                _fail(f"{c} waits on mbarrier {name} (parity {parity}) for a release that no path makes before "
                      "it: it would hang", s.span)
            for t, (rel, phase) in list(st.released.items()):
                if rel == name and phase <= bar.completed - 1:
                    st.touched.discard(t)
                    del st.released[t]
            return
        if bar.armed and parity == bar.completed & 1:
            if bar.loaded != bar.expect:
                _fail(f"mbarrier {name}: expect-tx is {bar.expect} bytes but its TMA loads bring "
                      f"{bar.loaded}; the phase would {'never complete' if bar.expect > bar.loaded else 'complete early'}",
                      s.span)
            bar.armed = False
            bar.completed += 1
            self._observe(st, bar, c)
        elif not bar.armed and bar.completed and parity == (bar.completed - 1) & 1 and \
                bar.seen[c] < bar.completed - 1:
            self._observe(st, bar, c)                # a phase another class completed
        elif bar.armed:
            _fail(f"{c} waits on mbarrier {name} with parity {parity}, but the phase in flight has parity "
                  f"{bar.completed & 1} (a phase bit that was not flipped)", s.span)
        else:
            _fail(f"{c} waits on mbarrier {name} (parity {parity}) with no arrive on this path: it would hang",
                  s.span)

    @staticmethod
    def _observe(st, bar, c):
        bar.seen[c] = bar.completed - 1
        for t in bar.tiles:
            st.unwaited.pop(t, None)
            st.visible.setdefault(t, set()).add(c)

    def thread_access(self, s, st, classes):
        reads, writes = shared_accesses(self.k, s)
        stage = getattr(s, "stage", None)
        if stage is not None:
            reads = {self.tile(st, t, stage) for t in reads}
            writes = {self.tile(st, t, stage) for t in writes}
        for t in sorted(reads | writes):
            if t in st.visible and set(classes) - st.visible[t]:
                _fail(f"threads use '{t}' before waiting for its TMA load", s.span)
        for t in writes:
            if t in st.storing:
                _fail(f"threads write '{t}' while a TMA store may still be reading it", s.span)
        if isinstance(s, ir.Gemm):
            for t in reads & st.written:
                _fail(f"gemm reads '{t}', which threads wrote, without fence.proxy.async and a block barrier "
                      "after the writes", s.span)
        st.touched |= reads | writes
        st.written |= writes
        st.fenced -= writes


def run(k: ir.Kernel, opts) -> ir.Kernel:
    if opts.expect_tx_skew:
        return k    # test hook: a deliberately wrong expect-tx must reach the GPU (debug-mode tests)
    ch = _Checker(k)
    start = _State()
    for s in ir.walk_stmts(k.body):
        if isinstance(s, ir.RingAdvance):
            start.env[s.var] = 0        # a nested ring's count of earlier iterations
    for st in ch.run(k.body, [start], (T0, REST)):
        for name, bar in st.bars.items():
            if bar.armed:
                span = next((s.span for s in ir.walk_stmts(k.body)
                             if isinstance(s, ir.ArriveExpectTx) and s.barrier == name), None)
                _fail(f"mbarrier {name} is armed at the end of the kernel and never waited on", span)
        if st.storing:
            span = next((s.span for s in ir.walk_stmts(k.body) if isinstance(s, ir.TmaStore)), None)
            _fail("the kernel can exit while a TMA store still reads shared memory (no wait_group)", span)
    return k
