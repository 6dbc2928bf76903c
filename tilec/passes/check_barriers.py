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
from .insert_barriers import tile_accesses

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
            for n in TRIP_COUNTS:
                cur = [copy.deepcopy(st)]
                for _ in range(n):
                    cur = self.run(s.body, cur, classes)
                out += cur
            return out
        if isinstance(s, ir.If):
            return self.run(s.then, [copy.deepcopy(st)], classes) + self.run(s.orelse, [copy.deepcopy(st)], classes)
        self.step(s, st, classes)
        return [st]

    # ---- one statement
    def step(self, s, st, classes):
        if isinstance(s, ir.MbarrierInit):
            for b in s.barriers:
                st.bars[b.name] = _Bar()
                st.phase[(b.name, T0)] = st.phase[(b.name, REST)] = 0
        elif isinstance(s, ir.ArriveExpectTx):
            bar = self.bar(st, s.barrier, s)
            if bar.armed:
                _fail(f"mbarrier {s.barrier} is armed again before its phase {bar.completed} was waited on", s.span)
            bar.armed, bar.expect, bar.loaded, bar.tiles = True, s.bytes, 0, set()
        elif isinstance(s, ir.TmaLoad):
            self.tma_load(s, st)
        elif isinstance(s, ir.MbarrierWait):
            for c in classes:
                self.wait(s, st, c)
        elif isinstance(s, ir.FlipPhase):
            for c in classes:
                st.phase[(s.barrier, c)] ^= 1
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
        elif isinstance(s, (ir.ThreadCopy, ir.Parallel, ir.Fill, ir.Gemm)):
            self.thread_access(s, st, classes)

    def bar(self, st, name, s):
        if name not in st.bars:
            _fail(f"mbarrier {name} is used before mbarrier.init", s.span)
        return st.bars[name]

    def tma_load(self, s, st):
        bar = self.bar(st, s.barrier, s)
        t = s.buffer
        if not bar.armed:
            _fail(f"TMA load into '{t}' signals mbarrier {s.barrier}, which has no arrive.expect_tx for it", s.span)
        if t in st.unwaited and st.unwaited[t] != s.barrier:
            _fail(f"TMA load overwrites '{t}' while its previous load (mbarrier {st.unwaited[t]}) is unwaited",
                  s.span)
        if t in st.storing:
            _fail(f"TMA load overwrites '{t}' while a TMA store may still be reading it (no wait_group.read)",
                  s.span)
        if t in st.touched:
            _fail(f"TMA load overwrites '{t}', which threads used, without a block barrier in between", s.span)
        bar.loaded += s.bytes
        bar.tiles.add(t)
        st.unwaited[t] = s.barrier
        st.visible[t] = set()

    def wait(self, s, st, c):
        bar = self.bar(st, s.barrier, s)
        parity = st.phase[(s.barrier, c)] if s.parity is None else s.parity
        if bar.armed and parity == bar.completed & 1:
            if bar.loaded != bar.expect:
                _fail(f"mbarrier {s.barrier}: expect-tx is {bar.expect} bytes but its TMA loads bring "
                      f"{bar.loaded}; the phase would {'never complete' if bar.expect > bar.loaded else 'complete early'}",
                      s.span)
            bar.armed = False
            bar.completed += 1
            self._observe(st, bar, c)
        elif not bar.armed and bar.completed and parity == (bar.completed - 1) & 1 and \
                bar.seen[c] < bar.completed - 1:
            self._observe(st, bar, c)                # a phase another class completed
        elif bar.armed:
            _fail(f"{c} waits on mbarrier {s.barrier} with parity {parity}, but the phase in flight has parity "
                  f"{bar.completed & 1} (a phase bit that was not flipped)", s.span)
        else:
            _fail(f"{c} waits on mbarrier {s.barrier} (parity {parity}) with no arrive on this path: it would hang",
                  s.span)

    @staticmethod
    def _observe(st, bar, c):
        bar.seen[c] = bar.completed - 1
        for t in bar.tiles:
            st.unwaited.pop(t, None)
            st.visible.setdefault(t, set()).add(c)

    def thread_access(self, s, st, classes):
        reads, writes = tile_accesses(self.k, s)
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
    for st in ch.run(k.body, [_State()], (T0, REST)):
        for name, bar in st.bars.items():
            if bar.armed:
                span = next((s.span for s in ir.walk_stmts(k.body)
                             if isinstance(s, ir.ArriveExpectTx) and s.barrier == name), None)
                _fail(f"mbarrier {name} is armed at the end of the kernel and never waited on", span)
        if st.storing:
            span = next((s.span for s in ir.walk_stmts(k.body) if isinstance(s, ir.TmaStore)), None)
            _fail("the kernel can exit while a TMA store still reads shared memory (no wait_group)", span)
    return k
