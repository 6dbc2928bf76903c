"""insert-barriers: the TMA mbarrier protocol and the block-level ordering
around every shared tile.

- Consecutive TMA loads share one mbarrier; thread 0 arrives with
  `expect_tx` = the sum of their full boxes, then issues them.
- The first consumer of a loaded tile waits with `try_wait.parity`: all
  threads before a thread access, thread 0 alone before a TMA store. A barrier
  used in a loop keeps its phase in a register that flips after each wait;
  elsewhere each barrier completes once and waits on parity 0.
- Loads still in flight are waited for before a loop or an `if`, at the end of
  a loop body or branch, and at the end of the kernel, so every phase that is
  armed is waited on exactly once on every path. A gemm's pipelined loop
  becomes a ring of full/empty barriers (`pipeline`); a rotating one (For.rotate)
  a loop unrolled over its tiles' copies, each loaded S - 1 iterations ahead
  (`rotate`).
- Threads that wrote a tile fence (`fence.proxy.async.shared::cta`) and meet
  at a block barrier before TMA reads it or overwrites it; a TMA store is
  followed by `commit_group`, and by `wait_group.read 0` before its tile is
  written again and before the kernel exits. Its StoreTail (the columns past
  the tensor's last whole 16-byte granule) brings its own block barriers.
- Where what threads did before a loop would put a block barrier in every trip
  of it (a tile they wrote that the body only reads), one barrier goes before
  the loop instead (`sync_before_loop`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, replace

from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.effects import deep, shared_accesses
from ..ir.exprs import fold, free_names, map_stmt_exprs, rename_tiles, substitute, substitute_body

NAME = "insert-barriers"


# wgmma groups a pipelined loop leaves in flight at the end of an iteration (0 or 1):
# with 1, stage k is released at iteration k + 1 and refilled S - 1 iterations ahead.
WGMMA_GROUPS_IN_FLIGHT = 1


@dataclass(frozen=True)
class _InFlight:
    """Asynchronous groups not waited for yet, each named by what it uses (a frozenset:
    the tile a TMA store reads; a gemm's accumulator and operand tiles), each once, in
    the order of its last issue, so a wait for some of them leaves the later groups in
    flight (wait_group N). Forgetting an earlier issue of the same group is safe: the
    wait that retires the later one retires it too. Where paths that issued them in
    different orders meet, only which is known (`ordered` off), and a wait waits for
    all."""
    groups: tuple = ()
    ordered: bool = True

    def __bool__(self):
        return bool(self.groups)

    def touching(self, names) -> bool:
        return any(g & names for g in self.groups)

    def names(self) -> set:
        return set().union(*self.groups)

    def add(self, names) -> "_InFlight":
        g = frozenset(names)
        return _InFlight(tuple(x for x in self.groups if x != g) + (g,), self.ordered)

    def wait(self, names):
        """(how many groups may stay in flight so that those using `names` are done,
        the groups that wait retires, what is left in flight)."""
        last = max(i for i, g in enumerate(self.groups) if g & names)
        left = _InFlight(self.groups[last + 1:]) if self.ordered else _InFlight()
        return len(left.groups), self.groups[:last + 1] if self.ordered else self.groups, left

    def join(self, other) -> "_InFlight":
        for a, b in ((self, other), (other, self)):
            if a.ordered and b.ordered and a.groups[len(a.groups) - len(b.groups):] == b.groups:
                return a        # b's groups are a's last ones: a wait computed on a is right on b
        return _InFlight(tuple(sorted(set(self.groups) | set(other.groups), key=sorted)), False)


@dataclass
class _State:
    pending: dict = field(default_factory=dict)       # tile -> barrier of a load not yet waited
    thread_read: set = field(default_factory=set)     # tiles read by threads since the last block barrier
    thread_written: set = field(default_factory=set)  # ... written by threads since the last block barrier
    unfenced: set = field(default_factory=set)        # written by threads since the last proxy fence
    storing: _InFlight = _InFlight()                  # read by a TMA store not yet waited for
    wgmma: _InFlight = _InFlight()                    # a gemm's accumulator and operands, its wgmmas in flight
    one_thread_seen: set = field(default_factory=set)  # waited by thread 0 only: others need a barrier
    observed: set = field(default_factory=set)        # its load's phase was waited on by every thread
    # Kernel.rereads tensors: TMA-stored, the stores not known complete; written by threads since
    # the last block barrier; ... since the last global proxy fence
    stored_global: set = field(default_factory=set)
    written_global: set = field(default_factory=set)
    unfenced_global: set = field(default_factory=set)

    def copy(self):
        return _State(dict(self.pending), set(self.thread_read), set(self.thread_written),
                      set(self.unfenced), self.storing, self.wgmma, set(self.one_thread_seen), set(self.observed),
                      set(self.stored_global), set(self.written_global), set(self.unfenced_global))

    def key(self) -> tuple:
        """The state as a dictionary key (a dry run's memo): every field, so a field added
        later cannot make two different states one key."""
        def frozen(v):
            return frozenset(v.items()) if isinstance(v, dict) else frozenset(v) if isinstance(v, set) else v
        return tuple(frozen(getattr(self, f.name)) for f in fields(self))

    def join(self, other):
        assert not self.pending and not other.pending
        return _State({}, self.thread_read | other.thread_read, self.thread_written | other.thread_written,
                      self.unfenced | other.unfenced, self.storing.join(other.storing), self.wgmma.join(other.wgmma),
                      self.one_thread_seen | other.one_thread_seen, self.observed | other.observed,
                      self.stored_global | other.stored_global, self.written_global | other.written_global,
                      self.unfenced_global | other.unfenced_global)


MAX_TX_BYTES = 2**20 - 1       # an mbarrier's transaction count


def _expect_tx(loads) -> int:
    """The bytes the TMA loads on one barrier bring, which its expect-tx must hold."""
    total = sum(x.bytes for x in loads)
    if total > MAX_TX_BYTES:
        raise SemanticError(f"these TMA loads bring {total} bytes to one mbarrier, whose transaction count "
                            f"holds at most {MAX_TX_BYTES} (and shared memory far less): use smaller tiles",
                            loads[0].span)
    return total


class _Inserter:
    def __init__(self, k: ir.Kernel, skew: int = 0):
        self.k = k
        self.skew = skew
        self.views = {v.name: v.tensor for v in k.views}
        self.rereads = set(k.rereads)
        self.barriers = []
        self.bar_tiles = {}
        self.producer_loops = {}    # id of a ring's For with producer = 1 -> the producer warpgroup's statements
        # local tiles the wgmmas use: accumulators (written) and register A operands (read)
        self.register_a = ir.register_a_tiles(k.body)
        self.accumulators = {b.name for b in k.buffers if b.layout == "wgmma"} - self.register_a
        self.is_dry = False
        # What a dry run of a loop gives from a head state, and a loop's head state from
        # what enters it: both depend on nothing else, and a nest of loops asks for the
        # same ones again at every level (without it, each level costs ~3x the one inside).
        self.memo = {}

    def dry(self) -> "_Inserter":
        """An inserter for a dry run (a loop's head state, sync_before_loop's choice), whose
        output is dropped. Its loops keep every barrier in their bodies: a state that is
        dirtier than the real run's is safe at a loop's head, and the choices nest no
        further (each would dry-run its loop again, at every level of a nest)."""
        dry = copy.copy(self)
        dry.barriers, dry.bar_tiles, dry.producer_loops = list(self.barriers), dict(self.bar_tiles), {}
        dry.is_dry = True
        return dry

    def new_barrier(self, tiles, in_loop, span, count=1, arrivals=1, prefix="bar", array=False, completes="tx",
                    releases=()):
        name = f"{prefix}{len(self.barriers)}"
        self.barriers.append(ir.Mbarrier(name, arrivals, in_loop, count, array, completes, span=span,
                                         releases=tuple(releases)))
        self.bar_tiles[name] = tuple(tiles)
        return self.barriers[-1]

    # ---- the waits
    def wait(self, st, bar_name, out, one_thread=False, span=None):
        bar = next(b for b in self.barriers if b.name == bar_name)
        w = [ir.MbarrierWait(bar.name, None if bar.in_loop else 0, span=span)]
        if bar.in_loop:
            w.append(ir.FlipPhase(bar.name))
        tiles = self.bar_tiles[bar.name]
        if one_thread:
            out.append(ir.OneThread(tuple(w)))
            st.one_thread_seen |= set(tiles)
        else:
            out.extend(w)
            # Every thread observed this phase; the next arrival on the barrier
            # must come after a block barrier, or a slow thread could miss a phase.
            st.observed |= set(tiles)
        for t in tiles:
            st.pending.pop(t, None)

    def flush(self, st, out, span=None):
        for bar in dict.fromkeys(st.pending.values()):
            self.wait(st, bar, out, span=span)

    def sync(self, st, out, fence, span):
        if fence:
            out.append(ir.ProxyFence(span=span))
            st.unfenced.clear()
        out.append(ir.SyncThreads(span=span))
        st.written_global.clear()
        # a tile a wgmma in flight reads stays read: the barrier that lets threads or TMA
        # overwrite it comes after every warpgroup's wait for that wgmma
        st.thread_read &= st.wgmma.names()
        st.thread_written.clear()
        st.one_thread_seen.clear()
        st.observed.clear()

    # ---- statements
    def block(self, body, st, in_loop):
        out = []
        i = 0
        while i < len(body):
            s = body[i]
            if isinstance(s, ir.TmaLoad):
                run = [s]
                while i + 1 < len(body) and isinstance(body[i + 1], ir.TmaLoad) and \
                        (body[i + 1].buffer, body[i + 1].smem_offset) not in {(r.buffer, r.smem_offset) for r in run}:
                    i += 1
                    run.append(body[i])
                self.loads(run, st, out, in_loop)
            elif isinstance(s, ir.TmaStore):
                run = [s]       # the boxes of one tile's store: one bulk group
                while i + 1 < len(body) and isinstance(body[i + 1], ir.TmaStore) and body[i + 1].buffer == s.buffer:
                    i += 1
                    run.append(body[i])
                self.store(run, st, out)
            elif isinstance(s, ir.StoreTail):
                # It meets at a block barrier before its reads (so what thread 0 waited
                # for, or threads wrote, is visible) and after them (so no later write
                # can overtake them), in the blocks that run it: it needs nothing here,
                # but its threads' writes of a reread tensor wait for a global proxy fence.
                out.append(s)
                st.unfenced_global |= self.reread({s.tensor})
            elif isinstance(s, ir.For):
                self.flush(st, out, s.span)
                self.sync_before_loop(s, st, out, in_loop)
                self.loop(s, st, out, in_loop)
            elif isinstance(s, ir.If):
                self.flush(st, out, s.span)
                self.wgmma_used_in(s, st, out)
                then = self.block(s.then, st.copy(), in_loop)
                then_state = self._last_state
                orelse = self.block(s.orelse, st.copy(), in_loop)
                else_state = self._last_state
                out.append(replace(s, then=then, orelse=orelse))
                self._assign(st, then_state.join(else_state))
            else:
                self.thread_access(s, st, out)
            i += 1
        self.flush(st, out)
        self._last_state = st
        return tuple(out)

    def loop(self, s: ir.For, st, out, in_loop):
        """A `for`: a ring (`pipeline`), a rotating loop (`rotate`) or a plain loop from
        its head state. A dry run of it from a state met before is the one remembered."""
        if not self.is_dry:
            return self._loop(s, st, out, in_loop)
        def run():
            body, after = [], st.copy()
            self._loop(s, after, body, in_loop)
            return tuple(body), after
        body, after = self.recall(("loop", id(s), in_loop, st.key()), s, run)
        out.extend(body)
        self._assign(st, after.copy())

    def recall(self, key, node, compute):
        """What `compute()` gave for `key` (which holds id(node)), computed once; checked
        by identity, since an id can outlive its object."""
        hit = self.memo.get(key)
        if hit is None or hit[0] is not node:
            hit = self.memo[key] = node, compute()
        return hit[1]

    def _loop(self, s: ir.For, st, out, in_loop):
        if s.ring:
            if st.wgmma:        # a ring counts its own groups in flight
                self.wait_wgmma(st, st.wgmma.names(), out, s.span)
            self.pipeline(s, st, out, in_loop)
        elif s.rotate:
            self.rotate(s, st, out)
        else:
            self.wgmma_used_in(s, st, out)
            entry = self.back_edge_state(s.body, st)
            body_out = self.block(s.body, entry.copy(), True)
            exit_state = self._last_state
            out.append(replace(s, body=body_out))
            self._assign(st, entry.join(exit_state))

    def sync_before_loop(self, s: ir.For, st, out, in_loop):
        """Tiles that threads used before loop `s` and that its body touches keep the
        loop's head state (what enters it joined with what a trip leaves) dirty, so the
        barriers they need are placed in the body and run on every trip. Where the body,
        entered after one block barrier, needs fewer barriers, that barrier comes before
        the loop instead (after a proxy fence where the loop fences a tile that threads
        wrote before it: TMA or a wgmma reads it)."""
        reads, writes = shared_accesses(self.k, s)
        touched = reads | writes
        dirty = st.thread_written | st.thread_read | st.unfenced | st.one_thread_seen | st.observed
        if self.is_dry or not touched & dirty:
            return

        def dry_run(head):
            body = []
            self.dry().loop(s, head, body, in_loop)
            return list(ir.walk_stmts(body))

        def barriers(stmts):
            return sum(isinstance(x, ir.SyncThreads) for x in stmts)

        as_is = dry_run(st.copy())
        fence = bool(touched & st.unfenced) and any(isinstance(x, ir.ProxyFence) and x.space == "shared"
                                                     for x in as_is)
        clean = st.copy()
        self.sync(clean, [], fence, s.span)
        if barriers(dry_run(clean)) < barriers(as_is):
            self.sync(st, out, fence, s.span)

    @staticmethod
    def _assign(st, new):
        st.pending, st.thread_read, st.thread_written = new.pending, new.thread_read, new.thread_written
        st.unfenced, st.storing, st.one_thread_seen = new.unfenced, new.storing, new.one_thread_seen
        st.wgmma = new.wgmma
        st.observed, st.stored_global, st.written_global = new.observed, new.stored_global, new.written_global
        st.unfenced_global = new.unfenced_global

    # ---- pipelined loops
    def pipeline(self, s: ir.For, st, out, in_loop=False):
        """An S-stage ring: stage k % S of every loaded tile holds iteration k.
        full[k % S] completes when iteration k's TMA bytes land (consumers wait
        parity (k / S) % 2); every warpgroup arrives on empty[k % S] once the
        wgmma reading it has retired, and the producer (thread 0) waits for that
        before refilling the stage (parity (j / S - 1) % 2 for iteration j).
        With S >= 2 one wgmma group stays in flight (refill distance S - 1).

        Inside another loop (a loop over output tiles, a batch) the ring goes on
        where the previous trip left it: iteration k is ring iteration g = base +
        k, with `base` (RingAdvance) the iterations of earlier trips; stages and
        parities follow g, a load waits on `empty` whenever g >= S, and after
        the loop the last iteration's stage is released and base += trips."""
        stages = s.stages
        loads = [x for x in s.body if isinstance(x, ir.TmaLoad)]
        gemms = list(s.body[len(loads):])
        lag = WGMMA_GROUPS_IN_FLIGHT if stages >= 2 else 0
        # loads in flight ahead of the consumers (measured: deeper beats refilling
        # a stage released an iteration earlier)
        ahead = stages - lag
        warpgroups = gemms[0].warpgroups or 1
        tiles = list(dict.fromkeys(x.buffer for x in loads))
        self.before_global_access({x.tensor for x in loads}, set(), st, out, s.span, tma=True)
        full = self.new_barrier(tiles, True, s.span, count=stages, arrivals=1, prefix="full", array=True)
        empty = self.new_barrier([], True, s.span, count=stages, arrivals=warpgroups, prefix="empty", array=True,
                                 completes="arrivals", releases=tiles)
        total = _expect_tx(loads) + self.skew
        k = ir.Var(s.var, "loop")
        n = s.extent
        S = ir.Int(stages)
        base = ir.Var(f"tl_{full.name}_base", "loop") if in_loop else None

        def ring(j):
            """Ring iteration of loop iteration j."""
            return j if base is None else fold(ir.BinOp("+", base, j))

        def issue(j, wait_empty, guard=False):
            """Iteration j's loads; `guard`: wait on `empty` only when g >= S (else
            only the ring's first use of the stage, which needs no release)."""
            g = ring(j)
            stage = fold(ir.BinOp("%", g, S))
            body = []
            if wait_empty:
                wait = ir.MbarrierWait(empty.name, fold(ir.BinOp("%", ir.BinOp("-", ir.BinOp("/", g, S), ir.Int(1)),
                                                                 ir.Int(2))), index=stage, span=s.span)
                body.append(wait if base is None and not guard else
                            ir.If(ir.BinOp(">=", g, S), (wait,), (), span=s.span))
            body.append(ir.ArriveExpectTx(full.name, total, index=stage, span=loads[0].span))
            body += [replace(_load_at(x, s.var, j), barrier=full.name, barrier_index=stage, stage=stage)
                     for x in loads]
            return body

        # every iteration: wait for the stage, run the gemms on it, release the one before
        g = ring(k)
        stage = fold(ir.BinOp("%", g, S))
        loop = [ir.MbarrierWait(full.name, fold(ir.BinOp("%", ir.BinOp("/", g, S), ir.Int(2))), index=stage,
                                span=s.span)]
        loop += [replace(x, stage=stage) for x in gemms]
        loop.append(ir.WgmmaWait(lag, span=gemms[-1].span))
        if lag:
            done = fold(ir.BinOp("%", ir.BinOp("-", g, ir.Int(1)), S))
            loop.append(ir.If(ir.BinOp(">=", k, ir.Int(1)), (ir.MbarrierArrive(empty.name, done, span=s.span),), ()))
        else:
            loop.append(ir.MbarrierArrive(empty.name, stage, span=s.span))
        if s.producer:
            self.specialized(s, k, n, base, ring, issue, empty, lag, loop, out)
            st.observed |= set(tiles)
            return
        # an earlier trip's threads, or the wgmmas of an earlier loop over these tiles, read them (or the
        # staging tile over them)
        self.before_tma_writes(tiles, st, out, s.span)
        # prologue: iterations 0 .. ahead-1 in flight before the loop
        for j in range(ahead):
            out.append(ir.If(fold(ir.BinOp("<", ir.Int(j), n)),
                             (ir.OneThread(tuple(issue(ir.Int(j), base is not None))),), (), span=s.span))
        j = fold(ir.BinOp("+", k, ir.Int(ahead)))
        refill = ir.OneThread(tuple(issue(j, True)))
        if ahead < stages and base is None:     # the first refills go to stages the prologue left empty
            refill = ir.If(ir.BinOp(">=", j, S), (refill,), (ir.OneThread(tuple(issue(j, False))),))
        if not (isinstance(n, ir.Int) and n.value <= ahead):    # else the prologue issued every iteration
            loop.append(ir.If(ir.BinOp("<", j, n), (refill,), ()))
        out.append(replace(s, body=tuple(loop)))
        out.append(ir.WgmmaWait(0, span=s.span))
        if base is not None:
            if lag:     # the last iteration's stage, which no later iteration of this trip releases
                last = fold(ir.BinOp("%", ir.BinOp("-", ring(n), ir.Int(1)), S))
                out.append(ir.If(fold(ir.BinOp(">=", n, ir.Int(1))), (ir.MbarrierArrive(empty.name, last, span=s.span),),
                                 (), span=s.span))
            out.append(ir.RingAdvance(base.name, n, span=s.span))
        st.observed |= set(tiles)

    def rotate(self, s: ir.For, st, out):
        """A rotating pipeline (plan-pipeline's For.rotate): iteration k's loads go
        to copy k % S of their tiles (ir.stage_tile), on copy k % S's barrier.
        Thread 0 issues iterations 0 .. S-2 before the loop; iteration k first
        refills the copy iteration k - 1 used with iteration k + S - 1's loads
        (after the block barrier, and proxy fence, that the threads' use of it
        needs), then every thread waits on its copy's barrier and runs the body on
        that copy. Each copy's barrier keeps its phase in a register, so a loop
        nested in another one (whose trips may each run a different count) goes on
        where the previous trip left every phase. The loop is unrolled by S, so each
        copy of the body names its tiles:

            for tl_k_trip in range((n + S - 1) / S) { for j in 0 .. S-1: if k < n { ... } }

        with k = tl_k_trip * S + j. Every load issued is waited for in the loop
        (a refill only issues an iteration the loop has), so none is in flight
        after it."""
        S = s.stages
        loads = []
        for x in s.body:
            if not isinstance(x, ir.TmaLoad):
                break
            loads.append(x)
        rest = s.body[len(loads):]
        tiles = list(dict.fromkeys(x.buffer for x in loads))
        names = [{t: ir.stage_tile(t, j) for t in tiles} for j in range(S)]
        fulls = [self.new_barrier(list(names[j].values()), True, s.span, prefix="full").name for j in range(S)]
        total = _expect_tx(loads) + self.skew
        n = s.extent

        def op(o, a, b):
            return fold(ir.BinOp(o, a, b, span=s.span))

        def issue(it, j):
            """Thread 0: iteration `it`'s loads into copy j, if the loop has it."""
            body = [ir.ArriveExpectTx(fulls[j], total, span=loads[0].span)]
            body += [replace(_load_at(x, s.var, it), buffer=names[j][x.buffer], barrier=fulls[j]) for x in loads]
            return ir.If(op("<", it, n), (ir.OneThread(tuple(body)),), (), span=s.span)

        trip = ir.Var(f"tl_{s.var}_trip", "loop", span=s.span)
        its = [op("+", op("*", trip, ir.Int(S)), ir.Int(j)) for j in range(S)]     # k of body copy j
        bodies = [rename_tiles(substitute_body(rest, {s.var: its[j]}), names[j]) for j in range(S)]
        # body copy j refills the copy the one before it used, with iteration k + S - 1
        refills = [issue(op("+", it, ir.Int(S - 1)), (j - 1) % S) for j, it in enumerate(its)]

        def unrolled(st, emit):
            """The S copies of the body for one trip, from state `st`; the state after."""
            for j, it in enumerate(its):
                then, inner = [], st.copy()
                previous = (j - 1) % S
                self.before_tma_writes(list(names[previous].values()), inner, then, s.span)
                then.append(refills[j])
                self.wait(inner, fulls[j], then, span=s.span)
                then += self.block(bodies[j], inner, True)
                emit.append(ir.If(op("<", it, n), tuple(then), (), span=s.span))
                st = self._last_state.join(st)
            return st

        # (no global ordering: plan-pipeline rotates no loop that loads a tensor of Kernel.rereads)
        self.before_tma_writes([t for j in range(S) for t in names[j].values()], st, out, s.span)
        out += [issue(ir.Int(j), j) for j in range(S - 1)]
        head = _fixpoint(st, lambda h: unrolled(h, []))
        body = []
        end = unrolled(head.copy(), body)
        # (n + S - 1) / S trips, an operation check-barriers computes from n on each path
        trips = fold(ir.BinOp("/", ir.BinOp("+", n, ir.Int(S - 1)), ir.Int(S), span=s.span), "trunc")
        out.append(ir.For(trip.name, trips, None, tuple(body), span=s.span))
        self._assign(st, head.join(end))

    def specialized(self, s, k, n, base, ring, issue, empty, lag, loop, out):
        """The ring of a `pipelined(..., producer = 1)` loop, warp-specialised: the
        producer warpgroup's thread runs `for k: [wait empty when g >= S],
        expect-tx, loads` as far ahead as the `empty` barriers let it (S stages
        in flight); the consumers' loop waits on `full`, runs the gemms and
        releases stage g - 1 once its wgmma has retired (the last stage after
        the loop). Nested in a loop, each side keeps its own count of the ring's
        earlier iterations (`base`, a per-thread variable). `loop`: the consumers'
        loop body."""
        S = ir.Int(s.stages)
        producer = [ir.For(s.var, n, None, tuple(issue(k, True, guard=True)), span=s.span)]
        out.append(replace(s, body=tuple(loop)))
        out.append(ir.WgmmaWait(0, span=s.span))
        if lag:     # the last iteration's stage: a later trip (or nothing) refills it
            last = fold(ir.BinOp("%", ir.BinOp("-", ring(n), ir.Int(1)), S))
            out.append(ir.If(fold(ir.BinOp(">=", n, ir.Int(1))), (ir.MbarrierArrive(empty.name, last, span=s.span),),
                             (), span=s.span))
        if base is not None:
            out.append(ir.RingAdvance(base.name, n, span=s.span))
            producer.append(ir.RingAdvance(base.name, n, span=s.span))
        self.producer_loops[id(s)] = tuple(producer)

    def back_edge_state(self, body, st):
        """The state at a loop's head: what enters it, joined with what one more
        trip through the body leaves (a fixpoint; the sets only grow)."""
        def trip(head):
            dry = self.dry()
            dry.block(body, head, True)
            return dry._last_state
        return self.recall(("head", id(body), st.key()), body, lambda: _fixpoint(st, trip)).copy()

    def loads(self, run, st, out, in_loop):
        self.before_global_access({x.tensor for x in run}, set(), st, out, run[0].span, tma=True)
        tiles = list(dict.fromkeys(s.buffer for s in run))
        for t in tiles:
            if t in st.pending:
                self.wait(st, st.pending[t], out, span=run[0].span)
        self.before_tma_writes(tiles, st, out, run[0].span)
        bar = self.new_barrier(tiles, in_loop, run[0].span)
        total = _expect_tx(run) + self.skew
        issued = [ir.ArriveExpectTx(bar.name, total, span=run[0].span)]
        issued += [replace(s, barrier=bar.name) for s in run]
        out.append(ir.OneThread(tuple(issued)))
        for t in tiles:
            st.pending[t] = bar.name

    def before_tma_writes(self, tiles, st, out, span):
        """Before thread 0 issues TMA loads into `tiles`: the TMA stores still
        reading them, or a tile placed over their memory (the epilogue's staging
        tile), are waited for, and threads that used any of it since the last
        block barrier meet at one (after a proxy fence if they wrote it)."""
        mem = set(tiles) | {b.name for b in self.k.buffers if b.alias in tiles}
        if st.storing.touching(mem):
            self.wait_stores(st, mem, out)
        if st.wgmma.touching(mem):
            self.wait_wgmma(st, mem, out, span)
        if mem & (st.thread_read | st.thread_written | st.unfenced | st.observed):
            self.sync(st, out, fence=bool(mem & st.unfenced), span=span)

    @staticmethod
    def wait_stores(st, tiles, out):
        """Thread 0 waits until the TMA stores reading `tiles` have read them."""
        pending, _, st.storing = st.storing.wait(tiles)
        out.append(ir.OneThread((ir.BulkWait(read=True, pending=pending),)))

    def under(self, tiles) -> set:
        """The tiles whose memory `tiles` are placed over (the gemm epilogue's staging tile)."""
        return {self.k.buffer(t).alias for t in tiles if self.k.buffer(t) and self.k.buffer(t).alias}

    def wgmma_used_in(self, s, st, out):
        """Before `s` (a statement, or a loop or `if` as a whole: ptxas serializes every
        wgmma of a kernel that waits for one inside a branch or loop and reads its
        accumulator after it, C7514): the wgmmas in flight whose accumulators it uses
        (a warpgroup's registers; a gemm adds to its accumulator after the wgmmas before
        it, in order) or whose operands it overwrites (the tiles under a staging tile
        too, and an A in registers) are waited for."""
        if not st.wgmma:
            return
        e = deep(self.k, s)
        _, writes = shared_accesses(self.k, s)
        under = self.under(writes)
        used = (e.reads | e.writes) & self.accumulators - ({s.acc} if isinstance(s, ir.Gemm) else set())
        used |= e.writes & self.register_a
        if st.wgmma.touching(used | writes | under):
            self.wait_wgmma(st, used | writes | under, out, s.span)

    def wait_wgmma(self, st, names, out, span):
        """Every warpgroup waits until its wgmmas using `names` (accumulators, operand
        tiles) have retired; a gemm's group is waited for no earlier (a later gemm, or
        the threads' work on other tiles, overlaps it)."""
        pending, done, st.wgmma = st.wgmma.wait(names)
        out.append(ir.WgmmaWait(pending, tuple(sorted(self.accumulators & set().union(*done))), span=span))

    def store(self, run, st, out):
        """TMA stores of one tile (its boxes), committed as one bulk group."""
        t, span = run[0].buffer, run[0].span
        self.before_global_access(set(), {run[0].tensor}, st, out, span, tma=True)
        if t in st.pending:
            self.wait(st, st.pending[t], out, one_thread=True, span=span)
        if t in st.unfenced:
            self.sync(st, out, fence=True, span=span)
        out.append(ir.OneThread((*run, ir.BulkCommit())))
        st.storing = st.storing.add({t})
        st.stored_global |= self.reread({run[0].tensor})

    def before_global_access(self, reads, writes, st, out, span, tma):
        """Before a statement reads `reads` and writes `writes` (global tensors) by TMA
        (`tma`: thread 0 issues it) or by every thread: where the kernel rereads one
        of them (Kernel.rereads), the block's earlier accesses are done first. Its
        TMA stores of them complete (wait_group 0, thread 0: their writes are then
        visible to it; a block barrier shows them to the other threads); the
        threads' writes of them meet at a block barrier, after a global proxy fence
        where TMA accesses next."""
        touched = self.reread(reads | writes)
        if not touched:
            return
        need_sync = bool(touched & st.written_global)
        if touched & st.stored_global:
            out.append(ir.OneThread((ir.BulkWait(read=False),)))
            st.stored_global.clear()
            st.storing = _InFlight()    # complete: their reads of shared memory too
            need_sync |= not tma
        if tma and touched & st.unfenced_global:
            out.append(ir.ProxyFence(span=span, space="global"))
            st.unfenced_global.clear()
            need_sync = True
        if need_sync:
            self.sync(st, out, fence=False, span=span)

    def reread(self, names) -> set:
        """The tensors of Kernel.rereads among `names` (tensors, or im2col views of them)."""
        return {self.views.get(t, t) for t in names} & self.rereads

    def thread_access(self, s, st, out):
        if self.rereads:
            touches = deep(self.k, s)
            self.before_global_access(set(touches.reads), set(touches.writes), st, out, s.span, tma=False)
            rewritten = self.reread(touches.writes)
            st.written_global |= rewritten
            st.unfenced_global |= rewritten
        reads, writes = shared_accesses(self.k, s)
        touched = reads | writes
        # a tile placed over another one's memory (the gemm epilogue's staging tile)
        # touches that memory too: its loads must have landed, its stores have read it
        under = self.under(writes)
        for t in sorted(under):
            if t in st.pending:
                self.wait(st, st.pending[t], out, span=s.span)
        if st.storing.touching(under):
            self.wait_stores(st, under, out)
        self.wgmma_used_in(s, st, out)
        for t in sorted(touched):
            if t in st.pending:
                self.wait(st, st.pending[t], out, span=s.span)
        need_sync = bool(touched & st.one_thread_seen)
        if st.storing.touching(writes):
            self.wait_stores(st, writes, out)
            need_sync = True
        if reads & st.thread_written or writes & (st.thread_written | st.thread_read):
            need_sync = True
        if under:
            need_sync = True    # the tile it lies over: every warpgroup's wgmma must be done with it
        fence = False
        if isinstance(s, ir.Gemm) and reads & st.unfenced:
            # wgmma reads shared memory through the async proxy, like TMA
            need_sync = fence = True
        if need_sync:
            self.sync(st, out, fence=fence, span=s.span)
        out.append(s)
        if isinstance(s, ir.Gemm):      # waited for where something first needs it done
            st.wgmma = st.wgmma.add({s.acc, s.a, s.b})
        st.thread_read |= reads
        st.thread_written |= writes
        st.unfenced |= writes


def _fixpoint(st, trip):
    """The state at a loop's head: what enters it, joined with what one more trip
    (`trip`: a copy of the head state -> the state after the trip) leaves, until it
    stops growing (the sets only grow)."""
    head = st.copy()
    for _ in range(8):
        new = head.join(trip(head.copy()))
        if new == head:
            break
        head = new
    return head


def _load_at(x: ir.TmaLoad, var: str, it) -> ir.TmaLoad:
    """Load `x` at iteration `it` of its loop (a prologue's or a refill's): the user's
    coordinates with `var` replaced, in device math (C++'s / and %)."""
    def at(cs):
        return tuple(fold(substitute(c, {var: it}), "trunc") for c in cs)
    zeros = None if x.zeros_if is None else at((x.zeros_if,))[0]
    if isinstance(zeros, ir.Int) and not zeros.value:
        zeros = None                                # inside the view at this iteration
    return replace(x, coords=at(x.coords), offsets=at(x.offsets), origin=at(x.origin), zeros_if=zeros)


def _merge_one_thread(body):
    out = []
    for s in body:
        nested = {f: _merge_one_thread(getattr(s, f)) for f in ir.STMT_BLOCK_FIELDS.get(type(s), ())}
        if nested:
            s = replace(s, **nested)
        if isinstance(s, ir.OneThread) and out and isinstance(out[-1], ir.OneThread):
            out[-1] = ir.OneThread(out[-1].body + s.body)
        else:
            out.append(s)
    return tuple(out)


def _producer_program(body, loops: dict) -> tuple:
    """What the producer warpgroup's thread runs: the loops around each ring of a
    `pipelined(..., producer = 1)` loop, with that ring's loads (`loops`) in place
    of the ring, and the scalars (`let`) those read; everything else is the
    consumers'."""
    out = []
    for s in body:
        if id(s) in loops:
            out += loops[id(s)]
        elif isinstance(s, ir.Let):
            out.append(s)
        elif any(id(x) in loops for x in ir.walk_stmts((s,))):
            if not isinstance(s, ir.For):
                raise SemanticError("producer = 1: the pipelined loop must sit in the kernel's body or in `for` "
                                    "loops (the producer warpgroup runs those loops too), not under an `if`",
                                    s.span)
            out.append(ir.For(s.var, s.extent, None, _producer_program(s.body, loops), span=s.span))
    return _used_lets(tuple(out))


def _used_lets(body) -> tuple:
    """`body` without the lets nothing after them reads."""
    out, used = [], set()
    for s in reversed(body):
        if isinstance(s, ir.Let) and s.name not in used:
            continue
        for x in ir.walk_stmts((s,)):
            map_stmt_exprs(x, lambda e: used.update(free_names(e)) or e)
        out.append(s)
    return tuple(reversed(out))


def _check_ring_tiles_private(k: ir.Kernel, body, loops: dict):
    """The tiles a producer's ring loads are touched by nothing outside that ring
    (the producer refills them whenever the `empty` barriers allow)."""
    rings = [s for s in ir.walk_stmts(body) if id(s) in loops]
    owner = {}
    for r in rings:
        for x in r.body:
            if isinstance(x, ir.TmaLoad) and owner.setdefault(x.buffer, r) is not r:
                raise SemanticError(f"producer = 1: '{x.buffer}' is loaded by the producer warpgroup's ring of line "
                                    f"{owner[x.buffer].span.line} and by this one; with a producer a ring's tiles "
                                    "are its own: give each loop tiles of its own", x.span)
    tiles = set(owner)
    inside = {id(x) for r in rings for x in ir.walk_stmts(r.body)}
    for s in ir.walk_stmts(body):
        if id(s) in inside or type(s) in ir.STMT_BLOCK_FIELDS:
            continue
        reads, writes = shared_accesses(k, s)
        if isinstance(s, ir.TmaLoad):
            writes = writes | {s.buffer}
        for t in sorted((reads | writes) & tiles):
            raise SemanticError(f"producer = 1: '{t}' is loaded by a producer warpgroup's ring and used here too; "
                                "with a producer the ring's tiles are its own", s.span)


def run(k: ir.Kernel, opts) -> ir.Kernel:
    ins = _Inserter(k, opts.expect_tx_skew)
    st = _State()
    body = list(ins.block(k.body, st, False))
    if st.wgmma:
        ins.wait_wgmma(st, st.wgmma.names(), body, k.span)      # none in flight as the block exits
    if st.storing:
        body.append(ir.OneThread((ir.BulkWait(read=True),)))    # all of them, before the block exits
    if ins.producer_loops:
        _check_ring_tiles_private(k, k.body, ins.producer_loops)
        producer = _producer_program(k.body, ins.producer_loops)
        body = [ir.Specialized(producer, _merge_one_thread(tuple(body)),
                               *ir.specialized_registers(k.threads.value))]
    if ins.barriers:
        # Thread 0 initialises every barrier and may go on at once with what it
        # alone runs (issuing the first loads early); the other threads meet it
        # at a block barrier before their first statement, so they never wait
        # on a barrier they might see uninitialised.
        lead = [ir.MbarrierInit(tuple(ins.barriers))]
        while body and isinstance(body[0], ir.OneThread):
            lead += body.pop(0).body
        body = [ir.OneThread(tuple(lead))] + ([ir.SyncThreads()] if body else []) + body
    return replace(k, body=_merge_one_thread(tuple(body)), barriers=tuple(ins.barriers))
