"""check-barriers: prove the mbarrier protocol of the lowered kernel, or report
the first violation with the barrier and the .tile line.

The kernel is run abstractly, as two classes of threads in block-synchronous
program order: thread 0 (which also runs `one_thread` blocks) and the rest.
Loops run 0, 1, 2 and 3 times (trip counts are not known at compile time, and
small ones are where tails go wrong; a pipelined ring 0 to stages + 2 times); a
loop whose extent is known (a constant, or fixed earlier on the path) runs that
many times, or, past twice the rings' fill plus one period of the barriers'
state, its first and last trips with a multiple of that period left out
(`_Checker.trips`). A loop inside another loop is run once per state it is
entered in (`_Checker.loop`: a nest costs a few runs a level, not the product
of its trips). Both sides of every
`if` are explored. A `let` that runs again (stream-K's K-step count, once per
unit) starts a new generation of its value, so units of one block run counts of
their own (`_Checker.let`, `_Checker.counts`).
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

A warp-specialised block (`Specialized`) runs its two programs concurrently on
one abstract state: the producer warpgroup's thread (a third class) and the
consumers, each as a cursor (`_Side`) that stops before every statement. A scheduler
steps whichever side it prefers whenever that side is not blocked on a wait,
else the other; both sides blocked (or one blocked, the other done) is a hang.
Every path runs twice: producer preferred (it fills the ring as far ahead as
the `empty` barriers let it, exposing refills of stages not yet released) and
consumers preferred (exposing reads before loads land). Loop trip counts, the
arms of unknown `if`s and store tails are choices, explored depth first: a run
forks at each choice, and each copy goes on from there with an option of its own
(`_Run`, `_Side`); an extent takes one value on both sides of a path (per
generation of the lets it reads). A run that comes to a store tail's choice in a
configuration (state, both sides' places, the choices fixed so far) that another run
came to stops there: everything after it is that run's to explore. The
consumers' block barriers are their own: only a wait on `empty` orders the
producer's refill of a stage after their use of it.

It does not prove index arithmetic in bounds, nor anything about global memory
written by one block and read by another."""
from __future__ import annotations

import collections
import copy
import math
import re
from dataclasses import dataclass, field, fields, replace

from ..errors import SemanticError
from ..ir import nodes as ir
from ..ir.printer import expr as show
from ..ir.effects import deep

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


def _key(e) -> str:
    """`e` as printed: the name its value has in a path's env. Kept on the node
    (IR nodes are immutable; the field-based == and hash do not see it), as the
    checker asks for each subexpression's text on every path."""
    key = e.__dict__.get("_tl_key")
    if key is None:
        key = show(e)
        object.__setattr__(e, "_tl_key", key)
    return key


def evaluate(e, env):
    """The integer value of `e` on a path (C semantics), or None where it depends
    on something the path does not fix (a shape, a block index)."""
    if e is None:
        return None
    return _compiled(e)(env)


def _compiled(e):
    """`e` as a function of a path's env (kept on the node, like _key): a name, a
    call or an operation whose text the env pins takes that value; an operation
    of known operands computes; anything else is None. A literal is its value."""
    fn = e.__dict__.get("_tl_eval")
    if fn is not None:
        return fn
    key = _key(e)
    if isinstance(e, ir.Int):
        value = e.value
        fn = lambda env: value     # noqa: E731
    elif isinstance(e, ir.BinOp):
        lhs, rhs, op = _compiled(e.lhs), _compiled(e.rhs), _C_OPS[e.op]

        def fn(env):
            if key in env:
                return env[key]
            a = lhs(env)
            if a is None:
                return None
            b = rhs(env)
            return None if b is None else op(a, b)
    elif isinstance(e, ir.UnaryOp):
        operand, negate = _compiled(e.operand), e.op == "-"

        def fn(env):
            if key in env:
                return env[key]
            a = operand(env)
            return None if a is None else (-a if negate else int(not a))
    else:
        fn = lambda env: env.get(key)     # noqa: E731
    object.__setattr__(e, "_tl_eval", fn)
    return fn


NAME = "check-barriers"

TRIP_COUNTS = (0, 1, 2, 3)
MAX_PATHS = 4096
# paths are compared (_distinct) only when more than this many run at once: comparing costs more
# than running the few hundred of a gemm's loops, most of which differ; a nest of loops whose
# store tails fork every trip passes it within a few trips and collapses to a handful
MERGE_ABOVE = 256
# env key of a path: whether the store tails of this trip run. A staged epilogue's tile crosses
# the last whole granule in one column chunk at most, but each tail sits between block barriers of
# its own, so running all of them checks every tail's reads, and running none the path that lacks
# their barriers: two choices per trip, not one per chunk
TAIL = "#tail"
# env keys of a path: how many times a let has run on it ('#gen:' + name), and the trip count last
# chosen for a loop extent ('#last:' + its text)
GEN, LAST = "#gen:", "#last:"
T0, REST = "thread 0", "the other threads"
PRODUCER = "the producer warpgroup"
CONSUMERS = "the consumers"


class BarrierBug(SemanticError):
    """The lowered kernel breaks the mbarrier protocol (a tilec bug if the IR came
    from tilec's own passes)."""


@dataclass
class _Bar:
    """An mbarrier on a path. Its state is finite, so that a path's state repeats where
    the barrier's does (a phase later), and a loop nest's paths meet (`_Checker.loop`):
    not the count of completed phases but whether any completed and the last one's
    parity, and per class whether it observed the last one."""
    armed: bool = False
    expect: int = 0
    loaded: int = 0
    tiles: set = field(default_factory=set)
    completed: int = 0      # 0: no phase completed; else 1 or 2, the count of completed phases mod 2 (as 1, 2)
    seen: dict = field(default_factory=lambda: {T0: True, REST: True, PRODUCER: True})  # observed the last phase
    counted: bool = False                               # completed by arrivals alone (a pipeline's empty)

    def clone(self):
        return _Bar(self.armed, self.expect, self.loaded, set(self.tiles), self.completed, dict(self.seen),
                    self.counted)

    def complete(self):
        """A phase completes: the next one's parity, and no class has observed it yet."""
        self.completed = 2 if self.completed & 1 else 1
        self.seen = dict.fromkeys(self.seen, False)


@dataclass
class _State:
    bars: dict = field(default_factory=dict)
    phase: dict = field(default_factory=dict)          # (barrier, class) -> phase register
    unwaited: dict = field(default_factory=dict)       # tile -> barrier of its load, until a wait
    visible: dict = field(default_factory=dict)        # TMA-loaded tile -> classes that may read its data
    touched: set = field(default_factory=set)          # tiles used by threads since the last block barrier
    written: set = field(default_factory=set)          # thread-written since the last proxy fence + barrier
    fenced: set = field(default_factory=set)           # ... fenced, barrier still to come
    groups: list = field(default_factory=list)         # tiles read by each bulk group not waited for, in order
    uncommitted: set = field(default_factory=set)      # read by TMA stores not in a bulk group yet
    env: dict = field(default_factory=dict)            # loop variables and loop extents on this path
    wgmma: list = field(default_factory=list)          # each wgmma group in flight: the tiles it reads, its acc
    released: dict = field(default_factory=dict)       # tile@stage -> the empty barrier whose wait frees it
    wgmma_read: set = field(default_factory=set)       # operands of wgmmas issued since the last block barrier

    def __deepcopy__(self, memo):
        """copy.deepcopy by hand (a path's fork copies the state; the generic copy was a
        third of a check's time): every container copied, the strings, numbers and tuples
        in them shared."""
        return _State({n: b.clone() for n, b in self.bars.items()}, dict(self.phase), dict(self.unwaited),
                      {t: set(c) for t, c in self.visible.items()}, set(self.touched), set(self.written),
                      set(self.fenced), [set(g) for g in self.groups], set(self.uncommitted), dict(self.env),
                      [set(w) for w in self.wgmma], dict(self.released), set(self.wgmma_read))


def _fingerprint(st, env=None) -> tuple:
    """All of a path's state, hashable: paths whose states are equal run alike from
    here on (the same statements, the same checks), so one of them stands for all.
    Dicts as their items in order: two equal dicts filled in another order count as
    different, which only leaves two equal paths unmerged (cheaper than sorting); the
    dicts filled from sets (`visible`, `released`) are filled in sorted order, so that
    which paths merge does not follow the names' salted hashes (PYTHONHASHSEED).
    `env`: the env's part (default: its items)."""
    return (tuple((n, b.armed, b.expect, b.loaded, frozenset(b.tiles), b.completed, tuple(b.seen.values()),
                   b.counted) for n, b in st.bars.items()),
            tuple(st.phase.items()), tuple(st.unwaited.items()),
            tuple((t, frozenset(c)) for t, c in st.visible.items()),
            frozenset(st.touched), frozenset(st.written), frozenset(st.fenced),
            tuple(frozenset(g) for g in st.groups), frozenset(st.uncommitted),
            tuple(st.env.items()) if env is None else env,
            tuple(frozenset(w) for w in st.wgmma), tuple(st.released.items()), frozenset(st.wgmma_read))


def _dedupe(states) -> list:
    """`states` without repeats (in order), however few: a loop's paths where the check
    remembers them (`_Checker.loop`)."""
    seen, out = set(), []
    for st in states:
        key = _fingerprint(st)
        if key not in seen:
            seen.add(key)
            out.append(st)
    return out


def _distinct(states) -> list:
    """`states` without repeats (in order): a store tail or an unknown `if` in a loop forks
    every trip, and the two arms mostly end in the same state, so without this a loop nest
    of 27 trips runs 2^27 paths (past MAX_PATHS, unchecked) where a handful differ."""
    if len(states) <= MERGE_ABOVE:
        return states
    envs = [tuple(st.env.items()) for st in states]     # paths of one env first (cheap): most differ there
    per_env = collections.Counter(envs)
    if len(per_env) == len(states):
        return states
    seen, out = set(), []
    for st, env in zip(states, envs):
        if per_env[env] > 1:
            key = _fingerprint(st)
            if key in seen:
                continue
            seen.add(key)
        out.append(st)
    return out


# the fields of statements whose expressions the checker evaluates on a path (a let's value too)
_EVALUATED = ("extent", "cond", "index", "barrier_index", "parity", "stage", "by")


def _texts(e, out: set) -> set:
    """The text of `e` and of every expression in it: the env keys that evaluating
    it may read (`evaluate` looks each subexpression's text up)."""
    if isinstance(e, ir.Expr):
        out.add(_key(e))
        for f in fields(e):
            _texts(getattr(e, f.name), out)
    elif isinstance(e, tuple):
        for x in e:
            _texts(x, out)
    return out


def _forking_tails(body) -> set:
    """ids of the store tails that choose TAIL for their block: the first chunk of the
    block's first store. The others take its choice (the chunks of that store, and an
    epilogue's later stores): each tail sits between block barriers of its own, so
    running them all checks each one's reads and running none the path without their
    barriers; a choice per store doubled the paths per store and trip."""
    out = set()

    def visit(block):
        first = next((s for s in block if isinstance(s, ir.StoreTail) and s.chunk == 0), None)
        if first is not None:
            out.add(id(first))
        for s in block:
            for f in ir.STMT_BLOCK_FIELDS.get(type(s), ()):
                visit(getattr(s, f))
    visit(body)
    return out


def _storing(st) -> set:
    """The tiles TMA stores may still be reading."""
    return set(st.uncommitted).union(*st.groups)


def _fail(msg, span):
    raise BarrierBug(msg, span, note="this kernel would hang or read stale data on the GPU")


def _tx_mismatch(name, bar):
    return (f"mbarrier {name}: expect-tx is {bar.expect} bytes but its TMA loads bring {bar.loaded}; the phase "
            f"would {'never complete' if bar.expect > bar.loaded else 'complete early'}")


def _generations(key, lets, env) -> tuple:
    """How many times each let that extent `key` reads has run on the path of `env`."""
    return tuple((n, env.get(GEN + n, 0)) for n in sorted(lets(key)))


_BLOCK, _LOOP, _SEQ = "block", "loop", "seq"     # kinds of a _Side's frames


class _Side:
    """Where one side of a Specialized block stands: a stack of frames, each a list
    (copied when a run forks), and the statement it runs next (`pending`:
    (statement, classes), None once the side is done). Frames: [_BLOCK, statements,
    next index, classes] (control flow in it is followed), [_LOOP, for statement,
    the loop variable's values, next index, classes], and [_SEQ, statements, next
    index, classes] (each run as it is: a store tail between its block barriers)."""
    __slots__ = ("stack", "pending")

    def __init__(self, body, classes):
        self.stack, self.pending = [[_BLOCK, body, 0, classes]], None

    def clone(self):
        c = _Side.__new__(_Side)
        c.stack, c.pending = [list(f) for f in self.stack], self.pending
        return c

    def key(self) -> tuple:
        """Where the side stands, hashable. Its pending statement is the one before the
        top frame's index (or none, between a step and the move to the next); a store
        tail's frame of its own is named by the tail."""
        return (self.pending is None,) + tuple(
            (f[0], id(f[1][1]) if f[0] is _SEQ else id(f[1]),
             tuple(f[2]) if isinstance(f[2], list) else f[2], *f[3:]) for f in self.stack)


class _Seen(Exception):
    """A run came to a store tail's choice in a configuration that an earlier run of
    the same block came to: everything from there on is explored from the earlier one."""


class _Run:
    """One path through a Specialized block, on a copy of the state. At each choice
    (an order of the sides, a trip count, an unknown `if`, a store tail) it takes
    the first option and leaves in `forks` a copy of itself for each other option,
    which goes on from that point with that option (`forced`): no path runs again
    what an earlier one ran before their choices part."""

    def __init__(self, st, counts, sides, forks):
        self.seen = set()           # the configurations at store tails' choices so far, by every run of the block
        self.st = copy.deepcopy(st)
        self.envs = {PRODUCER: self.st.env, CONSUMERS: dict(self.st.env)}  # each side's loop variables, ring counts
        self.counts = counts        # extent -> the trip counts to try
        self.sides = sides          # PRODUCER / CONSUMERS -> _Side
        self.order = None           # the side the scheduler prefers first, once chosen
        self.advancing = []         # sides to move on to their next statement before the scheduler goes on
        self.forks, self.forced = forks, None
        self.agreed = {}            # (extent, its lets' generations) -> the trip count both sides run
        self.last = {}              # extent -> the trip count chosen for it last (an earlier generation)

    def choose(self, n, tail=False):
        """The option to take at a choice of n. At a store tail's choice (`tail`), a run
        in a configuration that another run of the block came to stops (_Seen): its
        future, forks and all, is that run's. The two cases of a tile's tail mostly end
        in the same state, so that is where runs meet (in gemm.tile's producer stream-K
        candidates, 9 in 10 of the meetings; a configuration costs about as much as 8
        statement steps, so it is not taken at the other choices)."""
        if self.forced is not None:
            choice, self.forced = self.forced, None
            return choice
        if tail:
            config = self.config()
            if config in self.seen:
                raise _Seen
            self.seen.add(config)
        self.forks += [self.fork(o) for o in range(n - 1, 0, -1)]     # option 1 is taken up first
        return 0

    def config(self) -> tuple:
        """All that the rest of the run depends on, at a store tail's choice, hashable:
        the state, each side's env and place, and the run's own choices. The env of the
        side at the choice without its TAIL, which the choice overwrites."""
        envs = tuple(tuple(i for i in env.items() if not (env is self.st.env and i[0] == TAIL))
                     for env in self.envs.values())
        return (_fingerprint(self.st, envs), tuple(side.key() for side in self.sides.values()), self.order,
                tuple(self.advancing), tuple(self.agreed.items()), tuple(self.last.items()))

    def fork(self, choice):
        """A copy of this run at a choice, to go on with option `choice` of it."""
        c = copy.copy(self)
        c.st = copy.deepcopy(self.st)
        c.envs = {who: c.st.env if env is self.st.env else dict(env) for who, env in self.envs.items()}
        c.sides = {who: side.clone() for who, side in self.sides.items()}
        c.advancing, c.agreed, c.last, c.forced = list(self.advancing), dict(self.agreed), dict(self.last), choice
        return c

    def fix(self, key, value, lets):
        """Extent `key` runs `value` trips on both sides: on each side now, if the key
        reads no let or the side has run those lets as often as this one (the same
        generation of their values), else when that side runs them (`restore`)."""
        sig = _generations(key, lets, self.st.env)
        self.agreed[(key, sig)] = value
        for env in self.envs.values():
            if _generations(key, lets, env) == sig:
                env[key] = value

    def restore(self, name, lets, env):
        """After a let ran on a side: the extents of that generation the other side chose."""
        for (key, sig), value in self.agreed.items():
            if name in lets(key) and _generations(key, lets, env) == sig:
                env[key] = value


class _Checker:
    def __init__(self, k: ir.Kernel):
        self.k = k
        self.shared = {b.name for b in k.buffers if b.scope == "shared"}
        self.paths = 0
        self.dropped = False        # paths past MAX_PATHS were left unexplored
        self._accesses = {}         # id(statement) -> (statement, shared reads, shared writes, local tiles
                                    # touched, local tiles written)
        self.local = {b.name for b in k.buffers if b.scope == "local"}
        self.register_a = ir.register_a_tiles(k.body)
        self.sharing = {}           # a tile -> the tiles placed over its memory, or the one it lies over
        for b in k.buffers:
            if b.alias:             # (lower-copies' staging tile over a ring)
                self.sharing.setdefault(b.name, set()).add(b.alias)
                self.sharing.setdefault(b.alias, set()).add(b.name)
        self.releases = {b.name: set(b.releases) for b in k.barriers if b.releases}   # a ring's empty barriers
        # trips after which the barriers' state repeats: phases every 2, a ring of S stages every 2S
        rings = [x.stages for x in ir.walk_stmts(k.body) if isinstance(x, ir.For) and x.stages]
        self.period = math.lcm(2, *(2 * n for n in rings))
        self.fill = max(rings, default=0) + 2   # the same for a producer's plain loop and its consumers' ring
        # tiles a producer warpgroup refills: no block barrier of the consumers orders that
        self.refilled = {x.buffer for s in ir.walk_stmts(k.body) if isinstance(s, ir.Specialized)
                         for x in ir.walk_stmts(s.producer) if isinstance(x, ir.TmaLoad)}
        self.let_names = {s.name for s in ir.walk_stmts(k.body) if isinstance(s, ir.Let)}
        self._lets = {}             # an env key -> the lets it reads
        self._inert = {}            # id(loop) -> whether its trips change nothing checked
        self._forks_after = {}      # id(block) -> (the block, forks_after's answer)
        self._reads = {}            # id(loop) -> (the loop, the env keys its run may read, the lets it runs)
        self._loops = {}            # (id(loop), classes, state) -> (the loop, the states after its run)
        # loops inside another loop: entered again at each of its trips, so their runs are remembered
        self.nested = {id(x) for s in ir.walk_stmts(k.body) if isinstance(s, ir.For)
                       for x in ir.walk_stmts(s.body) if isinstance(x, ir.For)}
        self.loop_runs = 0          # loops run (not remembered): tests count them
        self.forking_tails = _forking_tails(k.body)

    def lets(self, key) -> frozenset:
        """The lets whose values the env key `key` (an expression's text) reads."""
        hit = self._lets.get(key)
        if hit is None:
            hit = self._lets[key] = frozenset(re.findall(r"[A-Za-z_]\w*", key)) & self.let_names
        return hit

    def let(self, s, env):
        """Run `let name = value`: a new generation of `name` on this path. What the path
        had pinned of the earlier one (the name, extents reading it) goes; the value is
        pinned if the path knows it. Stream-K's per-unit lets run once per unit, so each
        unit's K-step count is a choice of its own (`counts`)."""
        value = evaluate(s.value, env)
        for key in [key for key in env if key[0] != "#" and s.name in self.lets(key)]:
            del env[key]
        env[GEN + s.name] = env.get(GEN + s.name, 0) + 1
        if value is not None:
            env[s.name] = value

    def counts(self, key, options, env, last):
        """The trip counts to try for extent `key` (unknown on the path): `options` the
        first time its lets have their values; the second time (the next stream-K unit),
        the count the first ran (`last`), 1 and the most of `options` less one (one past a
        ring's stages): unit lengths that differ, so that the ring's stages and phases are
        carried across units of other lengths, at three choices instead of all; after that,
        `last` again."""
        gen = max((env.get(GEN + n, 0) for n in self.lets(key)), default=0)
        if last is None or gen <= 1:
            return tuple(options)
        return tuple(sorted({last, 1, max(options) - 1})) if gen == 2 else (last,)

    def inert(self, s) -> bool:
        """Whether loop `s`'s body does nothing this check follows (stream-K's partial
        sums added from other blocks' slots): then its trip count does not matter."""
        hit = self._inert.get(id(s))
        if hit is None:
            hit = all(isinstance(x, (ir.Let, ir.For, ir.If, ir.PartialAdd, ir.PartialStore))
                      and self.accesses(x) == (set(), set()) for x in ir.walk_stmts(s.body))
            self._inert[id(s)] = hit
        return hit

    def trips(self, known):
        """The values of the loop variable to run for a loop whose extent is `known`:
        every one while the count is small; past the rings' fill (the most stages + 2) plus
        one period of the barriers' state (`self.period`: phases flip every trip, a ring of
        S stages repeats every 2S), the first `fill` trips and at least as many last ones,
        leaving out a multiple of the period in the middle: every phase and stage ends where
        `known` trips leave it, and the variable keeps its real values, so conditions such as
        `k + 2 < 64` hold where they would on the GPU (a long constant loop with an
        unknown `if` inside forks at every trip it runs)."""
        n = max(int(known), 0)
        fill = self.fill
        if n <= 2 * fill + self.period:
            return range(n)
        tail = fill + (n - 2 * fill) % self.period      # the last trips: a ring's drain, its last phases
        return [*range(fill), *range(n - tail, n)]

    def forks_after(self, body) -> list:
        """Per statement of `body`: whether a statement after it may fork a path (a loop,
        an `if`, a store tail, a warp-specialised block). Only then are equal paths merged
        (`_distinct`) after it: merging costs a fingerprint per path, and paths that only
        run on to the end of the block are cheaper to run than to compare."""
        hit = self._forks_after.get(id(body))
        if hit is None:
            forking = [any(isinstance(x, (ir.For, ir.If, ir.StoreTail, ir.Specialized)) for x in ir.walk_stmts([s]))
                       for s in body]
            hit = [any(forking[i + 1:]) for i in range(len(body))]
            self._forks_after[id(body)] = (body, hit)
            return hit
        return hit[1]

    # ---- running blocks over sets of states
    def run(self, body, states, classes):
        for s, merge in zip(body, self.forks_after(body)):
            nxt = []
            for st in states:
                nxt += self.stmt(s, st, classes)
            # a warp-specialised block's paths (its interleavings) differ little but run on
            # through a short epilogue: cheaper to run than to compare, unless too many
            merge = merge and not isinstance(s, ir.Specialized)
            states = _distinct(nxt) if len(nxt) > MERGE_ABOVE and (merge or len(nxt) > MAX_PATHS) else nxt
            self.paths = max(self.paths, len(states))
            if len(states) > MAX_PATHS:
                states = states[:MAX_PATHS]
                self.dropped = True
        return states

    def stmt(self, s, st, classes):
        if isinstance(s, ir.Specialized):
            return self.specialized(s, st)
        if isinstance(s, ir.OneThread):
            return self.run(s.body, [st], (T0,))
        if isinstance(s, ir.For):
            return self.loop(s, st, classes) if id(s) in self.nested else self.run_loop(s, st, classes)
        if isinstance(s, ir.StoreTail):
            # in blocks whose tile crosses the last whole granule: barrier, reads, barrier
            forks = [st]
            if id(s) in self.forking_tails:
                forks = [copy.deepcopy(st), st]
                forks[0].env[TAIL], st.env[TAIL] = True, False
            for fork in forks:
                if fork.env[TAIL]:
                    for x in (ir.SyncThreads(span=s.span), s, ir.SyncThreads(span=s.span)):
                        self.step(x, fork, classes)
            return forks
        if isinstance(s, ir.If):
            cond = evaluate(s.cond, st.env)
            if cond is not None:
                return self.run(s.then if cond else s.orelse, [st], classes)
            atoms = _unknown_atoms(s.cond, st.env)
            if len(atoms) == 1:
                # e.g. `j < cdiv(K, 64)` before a pipelined loop: try small trip counts, and
                # keep the value on the path so the loop runs exactly that many times
                out = []
                for v in self.counts(atoms[0], range(0, 8), st.env, st.env.get(LAST + atoms[0])):
                    fork = copy.deepcopy(st)
                    fork.env[atoms[0]] = fork.env[LAST + atoms[0]] = v
                    out += self.stmt(s, fork, classes)
                return out
            return self.run(s.then, [copy.deepcopy(st)], classes) + self.run(s.orelse, [copy.deepcopy(st)], classes)
        self.step(s, st, classes)
        return [st]

    def reads(self, loop) -> tuple:
        """The env keys a run of `loop` may read (the texts of every expression the
        checker evaluates in it and their subexpressions, and the ring counts it
        advances) and the lets it runs (a let drops the keys that read its name)."""
        hit = self._reads.get(id(loop))
        if hit is None or hit[0] is not loop:
            texts, lets = set(), set()
            for x in ir.walk_stmts([loop]):
                for f in _EVALUATED:
                    _texts(getattr(x, f, None), texts)
                if isinstance(x, ir.Let):
                    _texts(x.value, texts)
                    lets.add(x.name)
                elif isinstance(x, ir.RingAdvance):
                    texts.add(x.var)
            keys = {LAST + t for t in texts} | {GEN + n for t in texts for n in self.lets(t)} | {GEN + n for n in lets}
            hit = self._reads[id(loop)] = (loop, frozenset(texts | keys | {TAIL}), frozenset(lets))
        return hit[1:]

    def loop(self, s, st, classes):
        """The paths after loop `s` entered with state `st`. A run of a loop depends only
        on the state it starts from, and of the env only on the keys it reads (`reads`):
        in a nest the same inner loop is entered again at every trip of the loops around
        it, in states that differ in their variables only, which it does not read. So
        each run is remembered by the state with the env cut to those keys (a loop
        variable written in the loop but never read, such as an outer one, left out),
        and a state that cuts to one seen before gets that run's paths, with the keys
        left out put back (the run's own writes first). Without this a nest of d loops
        ran its innermost body once per path of every level: ~(paths a trip)^d. (Loops in no
        other loop are run as they come: remembering costs a fingerprint and a copy of
        each path, and they are entered again only by paths that met.)"""
        texts, lets = self.reads(s)
        env, kept = st.env, {}
        for key, value in env.items():
            if key in texts or (lets and key[0] != "#" and self.lets(key) & lets):
                kept[key] = value
        st.env = kept
        memo = (id(s), classes, _fingerprint(st))
        hit = self._loops.get(memo)
        if hit is None or hit[0] is not s:
            hit = self._loops[memo] = (s, _dedupe(self.run_loop(s, copy.deepcopy(st), classes)))
        st.env = env
        out = []
        for after in hit[1]:
            after = copy.deepcopy(after)
            written = after.env
            after.env = {key: written[key] if key in written else value for key, value in env.items()
                         if key in written or key not in kept}     # (a key kept and gone: a let dropped it)
            for key, value in written.items():
                after.env.setdefault(key, value)
            out.append(after)
        return out

    def run_loop(self, s, st, classes):
        """Run loop `s` from `st`: its trip counts, each trip over all the paths."""
        self.loop_runs += 1
        out = []
        extent = show(s.extent)
        known = evaluate(s.extent, st.env)
        if known is not None:       # a constant extent, or one fixed on this path: its own count
            plans = (self.trips(known),)
        elif self.inert(s):
            return [st]
        else:
            counts = self.counts(extent, TRIP_COUNTS if s.stages is None else range(0, s.stages + 3), st.env,
                                 st.env.get(LAST + extent))
            plans = [range(n) for n in counts]
        for trips in plans:
            cur = [copy.deepcopy(st)]
            if known is None:       # fixed for the rest of the path (until a let it reads runs again)
                for c in cur:
                    c.env[extent] = c.env[LAST + extent] = len(trips)
            for i in trips:
                for c in cur:
                    c.env[s.var] = i
                cur = self.run(s.body, cur, classes)
                if len(cur) > MERGE_ABOVE:      # the next trip may fork them again
                    cur = _distinct(cur)
            out += cur
        return out

    # ---- a warp-specialised block
    def specialized(self, s, st):
        body = s.producer + s.consumers
        counts = {show(f.extent): range(f.stages + 3) for f in ir.walk_stmts(body)
                  if isinstance(f, ir.For) and f.stages is not None}
        out, forks = [], []
        forks.append(_Run(st, counts, {PRODUCER: _Side(s.producer, (PRODUCER,)),
                                       CONSUMERS: _Side(s.consumers, (T0, REST))}, forks))
        while forks and len(out) < MAX_PATHS:
            run = forks.pop()
            try:
                self.interleave(run)
            except _Seen:
                continue
            out.append(run.st)
        self.dropped |= bool(forks)
        self.paths = max(self.paths, len(out))
        return out

    def interleave(self, run):
        """Run the sides to their ends, stepping the first of `run.order` that is not
        blocked each time; fail where neither can go on. A fork starts where its
        choice was made: in the choice of order, or moving a side on (`advancing`)."""
        st = run.st
        if run.order is None:
            run.order = (CONSUMERS, PRODUCER) if run.choose(2) == 0 else (PRODUCER, CONSUMERS)
            run.advancing = list(run.order)     # each side to its first statement
        while run.advancing:
            self.advance(run, run.advancing[0])
            del run.advancing[0]
        while True:
            blocked = {}
            for who in run.order:
                side = run.sides[who]
                if side.pending is None:
                    continue
                st.env = run.envs[who]
                why = self.blocked(st, *side.pending)
                if why is None:
                    (s, classes), side.pending = side.pending, None
                    if isinstance(s, ir.Let):
                        self.let(s, st.env)
                        run.restore(s.name, self.lets, st.env)
                    else:
                        self.step(s, st, classes)
                    run.advancing = [who]
                    self.advance(run, who)
                    run.advancing = []
                    break
                blocked[who] = (why, side.pending[0].span)
            else:
                if not blocked:
                    break
                (who, (why, span)), *rest = blocked.items()
                if rest:
                    why = f"{PRODUCER} and {CONSUMERS} wait on each other: {why}; {rest[0][1][0]}"
                _fail(why, span)
        st.env = run.envs[CONSUMERS]

    def blocked(self, st, s, classes):
        """Why the wait `s` of `classes` cannot go on now, or None (and None for any other statement)."""
        if isinstance(s, ir.MbarrierWait):
            for c in classes:
                name, bar, parity = self.waited(s, st, c)
                if not self.passes(bar, parity, c):
                    return self.stuck(name, bar, parity, c)
        return None

    def advance(self, run, who):
        """Move side `who` on to the next statement it runs (its `pending`), through the
        control flow on the way: trip counts, unknown conditions and store tails are
        `run`'s choices, each made before the frame it is in moves on (a fork made
        there takes the same step again, with its own option)."""
        st, side = run.st, run.sides[who]
        st.env = run.envs[who]
        stack = side.stack
        while stack:
            f = stack[-1]
            if f[0] is _LOOP:
                _, loop, trips, j, classes = f
                if j == len(trips):
                    stack.pop()
                    continue
                f[3] = j + 1
                st.env[loop.var] = trips[j]
                stack.append([_BLOCK, loop.body, 0, classes])
                continue
            kind, stmts, i, classes = f
            if i == len(stmts):
                stack.pop()
                continue
            s = stmts[i]
            if kind is _SEQ or not isinstance(s, (ir.OneThread, ir.For, ir.If, ir.StoreTail)):
                f[2] = i + 1
                side.pending = (s, classes)
                return
            if isinstance(s, ir.OneThread):
                f[2] = i + 1
                stack.append([_BLOCK, s.body, 0, classes[:1]])
            elif isinstance(s, ir.For):
                n = evaluate(s.extent, st.env)
                if n is None and self.inert(s):
                    f[2] = i + 1
                    continue
                if n is None:
                    key = show(s.extent)
                    options = self.counts(key, run.counts.get(key, TRIP_COUNTS), st.env, run.last.get(key))
                    n = run.last[key] = options[run.choose(len(options))]
                    run.fix(key, n, self.lets)      # the same extent on both sides
                    trips = range(n)
                else:
                    trips = self.trips(n)
                f[2] = i + 1
                stack.append([_LOOP, s, trips, 0, classes])
            elif isinstance(s, ir.If):
                cond = evaluate(s.cond, st.env)
                taken = cond if cond is not None else run.choose(2) == 0
                f[2] = i + 1
                stack.append([_BLOCK, s.then if taken else s.orelse, 0, classes])
            else:                               # a store tail
                if id(s) in self.forking_tails:     # a block whose tile crosses the last whole granule
                    st.env[TAIL] = run.choose(2, tail=True) == 0
                f[2] = i + 1
                if st.env[TAIL]:
                    sync = ir.SyncThreads(span=s.span)
                    stack.append([_SEQ, (sync, s, sync), 0, classes])
        side.pending = None

    # ---- one statement
    def step(self, s, st, classes):
        if isinstance(s, ir.MbarrierInit):
            for b in s.barriers:
                for i in range(b.count):
                    name = f"{b.name}[{i}]" if b.array else b.name
                    st.bars[name] = _Bar(counted=b.completes == "arrivals")
                    for c in (T0, REST, PRODUCER):
                        st.phase[(name, c)] = 0
        elif isinstance(s, ir.ArriveExpectTx):
            name = self.bar_name(st, s.barrier, s.index, s)
            bar = self.bar(st, name, s)
            if bar.armed:
                _fail(f"mbarrier {name} is armed again before the phase it is armed for (parity {bar.completed & 1}) "
                      "was waited on", s.span)
            bar.armed, bar.expect, bar.loaded, bar.tiles = True, s.bytes, 0, set()
        elif isinstance(s, ir.MbarrierArrive):
            name = self.bar_name(st, s.barrier, s.index, s)
            bar = self.bar(st, name, s)
            stage = evaluate(s.index, st.env)
            ring = self.releases.get(s.barrier)       # another ring's tiles at this stage are not released
            for t in sorted(st.touched):      # sorted: dicts filled in an order no hash seed changes
                if t.endswith(f"@{stage}") and (ring is None or t.rsplit("@", 1)[0] in ring):
                    if any(t in group for group in st.wgmma):
                        _fail(f"stage {stage} is released on mbarrier {name} while a wgmma may still read '{t}'",
                              s.span)
                    st.released[t] = name
            bar.complete()
        elif isinstance(s, ir.WgmmaWait):
            del st.wgmma[:max(0, len(st.wgmma) - s.pending)]
        elif isinstance(s, ir.TmaLoad):
            self.tma_load(s, st)
        elif isinstance(s, ir.MbarrierWait):
            for c in classes:
                self.wait(s, st, c)
        elif isinstance(s, ir.Gemm):
            self.thread_access(s, st, classes)
            st.wgmma.append({self.tile(st, t, s.stage) for t in (s.a, s.b)} | {s.acc})
            st.wgmma_read |= {self.tile(st, t, s.stage) for t in (s.a, s.b)}
        elif isinstance(s, ir.FlipPhase):
            for c in classes:
                st.phase[(s.barrier, c)] ^= 1
        elif isinstance(s, ir.Let):
            self.let(s, st.env)
        elif isinstance(s, ir.RingAdvance):
            st.env[s.var] = st.env[s.var] + evaluate(s.by, st.env)  # the trip count is fixed on this path
        elif isinstance(s, ir.SyncThreads):
            if PRODUCER in classes:
                _fail(f"a block barrier in the program of {PRODUCER} deadlocks: one thread of it runs the "
                      "program, and the consumers' block barriers are theirs alone", s.span)
            if classes != (T0, REST):
                _fail("a block barrier inside a one-thread block deadlocks", s.span)
            # a tile a wgmma in flight reads stays used: only a block barrier after every
            # warpgroup's wait for that wgmma lets threads or TMA overwrite it
            st.touched = {t for t in st.touched if t.partition("@")[0] in self.refilled or
                          any(t in group for group in st.wgmma)}
            st.wgmma_read = {t for t in st.wgmma_read if any(t in group for group in st.wgmma)}
            st.written -= st.fenced
            st.fenced.clear()
            for t, seen in st.visible.items():
                if seen:
                    st.visible[t] = {T0, REST}
        elif isinstance(s, ir.ProxyFence) and s.space == "shared":
            st.fenced |= st.written
        elif isinstance(s, ir.TmaStore):
            t = s.buffer
            if t in st.unwaited or (t in st.visible and T0 not in st.visible[t]):
                _fail(f"TMA store of '{t}' before its load on mbarrier {st.unwaited[t]} was waited on", s.span)
            if t in st.written:
                _fail(f"TMA store of '{t}', which threads wrote, without fence.proxy.async and a block barrier "
                      "after the writes", s.span)
            st.uncommitted.add(t)
        elif isinstance(s, ir.BulkCommit):
            st.groups.append(st.uncommitted)
            st.uncommitted = set()
        elif isinstance(s, ir.BulkWait):
            st.groups = st.groups[len(st.groups) - s.pending:] if s.pending else []
        elif self.accesses(s) != (set(), set()) or self.local_accesses(s):
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
        if t in _storing(st):
            _fail(f"TMA load overwrites '{t}' while a TMA store may still be reading it (no wait_group.read)",
                  s.span)
        for x in self.beside(t, _storing(st)):
            _fail(f"TMA load overwrites '{t}' while a TMA store may still be reading '{x}', which shares its "
                  "memory (no wait_group.read)", s.span)
        for x in self.beside(t, st.touched):
            _fail(f"TMA load overwrites '{t}', whose memory threads used through '{x}', without a block barrier "
                  "in between", s.span)
        if any(t in group for group in st.wgmma):
            _fail(f"TMA load overwrites '{t}' while a wgmma may still read it (no wgmma.wait_group after the gemm)",
                  s.span)
        if t in st.touched:
            _fail(f"TMA load overwrites '{t}', which threads used, without a block barrier (or, from {PRODUCER}, "
                  "a wait on the release of its stage) in between", s.span)
        bar.loaded += s.bytes
        bar.tiles.add(t)
        st.unwaited[t] = bname
        st.visible[t] = set()

    def waited(self, s, st, c):
        """The barrier the wait `s` of class c names, its state, and the parity it waits on."""
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
        return name, bar, parity

    @staticmethod
    def passes(bar, parity, c):
        """Whether class c's wait on `parity` goes on now: the phase it waits for is
        complete, or completes (its bytes have landed)."""
        if bar.counted:
            # completed by arrivals: a wait on parity p passes once the phase of parity p is done
            return (bar.completed & 1) != parity
        if bar.armed:
            return parity == bar.completed & 1 and bar.loaded >= bar.expect
        # a phase another class completed, which c has not observed yet
        return bar.completed > 0 and parity == (bar.completed - 1) & 1 and not bar.seen[c]

    @staticmethod
    def stuck(name, bar, parity, c):
        """Why class c's wait on `parity` does not go on."""
        if bar.counted:
            return (f"{c} waits on mbarrier {name} (parity {parity}) for a release that no path makes before it: "
                    "it would hang")
        if bar.armed and parity == bar.completed & 1:
            return _tx_mismatch(name, bar)
        if bar.armed:
            return (f"{c} waits on mbarrier {name} with parity {parity}, but the phase in flight has parity "
                    f"{bar.completed & 1} (a phase bit that was not flipped)")
        return f"{c} waits on mbarrier {name} (parity {parity}) with no arrive on this path: it would hang"

    def wait(self, s, st, c):
        name, bar, parity = self.waited(s, st, c)
        if not self.passes(bar, parity, c):
            _fail(self.stuck(name, bar, parity, c), s.span)
        if bar.counted:
            for t, rel in list(st.released.items()):
                if rel == name:     # (a wait that passes is for the last phase: the release's or a later one)
                    st.touched.discard(t)
                    del st.released[t]
            return
        if bar.armed:
            if bar.loaded != bar.expect:
                _fail(_tx_mismatch(name, bar), s.span)      # it completed early
            bar.armed = False
            bar.complete()
        self._observe(st, bar, c)

    @staticmethod
    def _observe(st, bar, c):
        bar.seen[c] = True
        for t in sorted(bar.tiles):     # (sorted: see _fingerprint)
            st.unwaited.pop(t, None)
            st.visible.setdefault(t, set()).add(c)

    def _touches(self, s) -> tuple:
        """(shared tiles read, shared tiles written, local tiles used) by `s` and what
        it nests, once per statement (every path steps through it again)."""
        hit = self._accesses.get(id(s))
        if hit is None:
            e = deep(self.k, s)
            hit = self._accesses[id(s)] = (s, e.reads & self.shared, e.writes & self.shared,   # s: its id stays its own
                                           (e.reads | e.writes) & self.local, e.writes & self.local)
        return hit[1:]

    def beside(self, t, tiles) -> list:
        """Those of `tiles` (names, with a stage) that share tile `t`'s memory under
        another name: a staging tile placed over a ring (lower-copies' `alias`)."""
        others = self.sharing.get(t.partition("@")[0], ())
        return sorted(x for x in tiles if x.partition("@")[0] in others)

    def accesses(self, s):
        """The shared tiles `s` and what it nests read and write (effects.shared_accesses)."""
        return self._touches(s)[:2]

    def local_accesses(self, s) -> set:
        """The local tiles `s` and what it nests read or write."""
        return self._touches(s)[2]

    def local_writes(self, s) -> set:
        """The local tiles `s` and what it nests write."""
        return self._touches(s)[3]

    def thread_access(self, s, st, classes):
        reads, writes = self.accesses(s)
        stage = getattr(s, "stage", None)
        if stage is not None:
            reads = {self.tile(st, t, stage) for t in reads}
            writes = {self.tile(st, t, stage) for t in writes}
        for t in sorted(reads | writes):
            if t in st.visible and set(classes) - st.visible[t]:
                _fail(f"threads use '{t}' before waiting for its TMA load", s.span)
        for t in writes:
            if t in _storing(st):
                _fail(f"threads write '{t}' while a TMA store may still be reading it", s.span)
            for x in self.beside(t, _storing(st)):
                _fail(f"threads write '{t}' while a TMA store may still be reading '{x}', which shares its memory",
                      s.span)
        loading = [t for t in st.visible if set(classes) - st.visible[t]]
        for w in sorted(writes):    # (TMA loads only rings, never the staging tile placed over one)
            for t in self.beside(w, loading):
                _fail(f"threads write '{w}', placed over the memory of '{t}', while a TMA load into '{t}' may "
                      "still be writing it", s.span)
        for group in st.wgmma:
            for t in sorted(g for g in group if g in writes or self.beside(g, writes)):
                _fail(f"threads overwrite '{t}' while a wgmma may still read it (no wgmma.wait_group after the "
                      "gemm)", s.span)
        for t in sorted(t for t in st.wgmma_read if t in writes or self.beside(t, writes)):
            # wgmma.wait_group waits for the warpgroup's own wgmmas: another's may still read it
            _fail(f"threads overwrite '{t}', which a wgmma read, without a block barrier after every warpgroup's "
                  "wgmma.wait_group", s.span)
        if not isinstance(s, ir.Gemm):     # (a gemm adds to the accumulator of the wgmmas before it, in order)
            for t in sorted(self.local_accesses(s) - self.register_a):
                if any(t in group for group in st.wgmma):
                    _fail(f"threads use '{t}' while a wgmma may still write it (no wgmma.wait_group after the "
                          "gemm)", s.span)
        for t in sorted(self.local_writes(s) & self.register_a):    # an A in registers: read by the wgmma
            if any(t in group for group in st.wgmma):
                _fail(f"threads overwrite '{t}' while a wgmma may still read it (no wgmma.wait_group after the "
                      "gemm)", s.span)
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
                             if isinstance(s, ir.ArriveExpectTx) and s.barrier == name.partition("[")[0]), None)
                _fail(f"mbarrier {name} is armed at the end of the kernel and never waited on", span)
        if _storing(st):
            span = next((s.span for s in ir.walk_stmts(k.body) if isinstance(s, ir.TmaStore)), None)
            _fail("the kernel can exit while a TMA store still reads shared memory (no wait_group)", span)
        if st.wgmma:
            span = next((s.span for s in ir.walk_stmts(k.body) if isinstance(s, ir.Gemm)), None)
            _fail("the kernel can exit while a wgmma is in flight (no wgmma.wait_group)", span)
    if ch.dropped:      # said as a tilec.CheckIncompleteWarning by compiler.lower and on disk-cache hits
        where = f"{k.span}: " if k.span is not None else ""
        k = replace(k, check_notes=k.check_notes + (
            f"{where}check-barriers proved kernel {k.name}'s barrier protocol on its first {MAX_PATHS} paths "
            "only (branches on values known only at run time, one after another, double the paths); the rest "
            "were not checked",))
    return k
