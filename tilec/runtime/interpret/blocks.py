"""Block execution: the kernel's body, block after block, statement by
statement, with shared memory as bytes, TMA exact (boxes, clipping at 16-byte
granules on store, im2col pixel boxes, swizzles), mbarriers counted, and
`parallel` bodies vectorised over their index space. A warp-specialised block's
producer and consumers run concurrently, one at a time, meeting at mbarriers
(_Roles)."""
from __future__ import annotations

import functools
import itertools
import math
import threading

import numpy as np

from ...errors import DeviceError
from .. import host
from ...codegen.abi import balanced_grid
from ...ir import im2col
from ...ir import nodes as ir
from ...ir.exprs import fused_product, reads_f64, widened
from ...ir.tma import SWIZZLE_SPAN
from ...passes import make_persistent
from .numbers import (F32, F64, U8, _POISON, _WRAPPED, _f32_literal, _fma, _promote, arith, common_type, convert, min_max,
                      decode, encode, storage_dtype)

INTERPRETED_RESIDENT_BLOCKS = 3   # a persistent kernel's grid here: each block loops over several tiles
LAST_BLOCK_FIRST = False          # test hook: run the blocks in the reverse order (but a stream-K kernel's:
                                  # a block adds partial sums that lower-numbered blocks stored), so that a
                                  # result that depends on the blocks' order differs between the two runs


class InterpretError(DeviceError):
    """The interpreter met what the GPU would hang or fault on, or leaves undefined."""


class _Barrier:
    __slots__ = ("name", "arrivals", "phase", "pending", "tx", "expected", "brought")

    def __init__(self, name, arrivals):
        self.name, self.arrivals = name, arrivals
        self.phase, self.pending, self.tx, self.expected, self.brought = 0, arrivals, 0, 0, 0

    def settle(self, span):
        if self.pending < 0:
            raise InterpretError(f"mbarrier {self.name}: more arrivals than its {self.arrivals} per phase", span)
        if self.pending == 0 and self.tx < 0:
            raise InterpretError(f"mbarrier {self.name}: its TMA loads bring {self.brought} bytes but the expect-tx "
                                 f"is {self.expected}; the phase completes before all the data lands", span)
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending, self.expected, self.brought = self.arrivals, 0, 0


def _missing(bar):
    return (f"expect-tx is {bar.expected} bytes but its TMA loads bring {bar.brought}"
            if bar.pending == 0 else f"{bar.pending} arrival(s) missing")


class _Role:
    """One program of a Specialized block: its statements, its own registers
    (`env`: loop variables, ring counters; `state`: the _Blocks attributes of
    _ROLE_STATE while another role runs), the wait it cannot pass (mbarrier,
    parity) while it has handed the baton over, and whether it has finished."""
    __slots__ = ("name", "body", "env", "state", "waiting", "done")

    def __init__(self, name, body, env, state):
        self.name, self.body, self.env, self.state = name, body, env, state
        self.waiting, self.done = None, False

    def where(self):
        if self.done:
            return f"the {self.name} finished"
        bar, parity = self.waiting
        return f"the {self.name} waiting on mbarrier {bar.name} with parity {parity} ({_missing(bar)})"


_ROLE_STATE = ("one_thread_depth", "lanes", "phase_reg")


class _Abort(Exception):
    """Unwinds a role when the other one has raised."""


class _Roles:
    """The producer and the consumers of a Specialized block, run concurrently
    and deterministically: the producer in a Python thread of its own, the
    consumers in the caller's, one at a time, whichever holds the baton (`turn`,
    under `cond`). The producer starts (it runs ahead, as on the GPU). A role
    whose mbarrier wait cannot pass hands the baton over and checks again when
    it comes back: the other role has then finished or waits itself, with
    nothing changed since, so a wait still not passable would hang (as it does
    at once when the other role has finished). The first exception of either
    role unwinds the other (_Abort) and is raised once the thread has ended."""

    def __init__(self, blocks, s, env):
        self.blocks = blocks
        self.producer = _Role("producer", s.producer, dict(env),
                              {"one_thread_depth": 1, "lanes": None, "phase_reg": dict(blocks.phase_reg)})
        self.consumers = _Role("consumers", s.consumers, dict(env),
                               {"one_thread_depth": 0, "lanes": None, "phase_reg": dict(blocks.phase_reg)})
        self.cond = threading.Condition()
        self.turn = self.producer
        self.error = None

    def run(self):
        b = self.blocks
        outer = {n: getattr(b, n) for n in _ROLE_STATE}
        errstate = np.geterr()              # numpy's error state is the thread's own
        producer = threading.Thread(target=self._play, args=(self.producer, errstate), daemon=True,
                                    name=f"tilec producer of block {b.block_index}")
        producer.start()
        try:
            self._play(self.consumers, errstate)
        finally:
            producer.join()
            for n, v in outer.items():
                setattr(b, n, v)
        if self.error is not None:
            raise self.error

    def _play(self, role, errstate):
        try:
            with np.errstate(**errstate):
                self._take(role)
                self.blocks.block(role.body, role.env)
        except _Abort:
            pass
        except BaseException as e:          # raised in the caller's thread by run(); the first one wins
            if self.error is None:
                self.error = e
        finally:
            role.done = True
            self._give(role)

    def _take(self, role):
        """Wait for the baton; then the blocks run with `role`'s registers."""
        with self.cond:
            self.cond.wait_for(lambda: self.turn is role or self.error is not None)
        if self.error is not None:
            raise _Abort
        for n, v in role.state.items():
            setattr(self.blocks, n, v)

    def _give(self, role):
        """Hand the baton to the other role, keeping `role`'s registers."""
        role.state = {n: getattr(self.blocks, n) for n in _ROLE_STATE}
        with self.cond:
            self.turn = self.consumers if role is self.producer else self.producer
            self.cond.notify()

    def wait(self, bar, parity, s):
        """The role holding the baton waits on `bar` for the phase of `parity`,
        not complete: the other role runs until it finishes or waits itself."""
        role = self.turn
        other = self.consumers if role is self.producer else self.producer
        if not other.done:
            role.waiting = bar, parity
            self._give(role)
            self._take(role)
            role.waiting = None
            if (bar.phase & 1) != parity:
                return
        raise self.blocks.hang(bar, parity, s, f"; the {role.name} waiting there, {other.where()}")


class _Lanes:
    """The index space of the `parallel` being run, and which of its elements
    are active (inside `if`s and loops of the body)."""
    __slots__ = ("vars", "shape", "mask")

    def __init__(self, vars, shape, mask=None):
        self.vars, self.shape, self.mask = vars, shape, mask


def _int(v) -> int:
    return int(np.asarray(v).astype(np.int64))


def _i32(v) -> int:
    """A value passed to an `int` parameter (TMA coordinates)."""
    return int(np.asarray(v).astype(np.int64).astype(np.int32))


def _box_slices(shape, starts, box):
    """(tensor slices, box slices) of the part of a box inside the tensor, or None."""
    src, dst = [], []
    for c, b, n in zip(starts, box, shape):
        lo, hi = max(c, 0), min(c + b, n)
        if lo >= hi:
            return None
        src.append(slice(lo, hi))
        dst.append(slice(lo - c, hi - c))
    return tuple(src), tuple(dst)


def read_box(array, starts, box):
    """The box of `array` at `starts`, zero outside the array."""
    out = np.zeros(box, array.dtype)
    sl = _box_slices(array.shape, starts, box)
    if sl is not None:
        out[sl[1]] = array[sl[0]]
    return out


def write_box(array, starts, box, data):
    """The box of `array` at `starts` = data, dropping what falls outside."""
    sl = _box_slices(array.shape, starts, box)
    if sl is not None:
        array[sl[0]] = data[sl[1]]




def _swizzled_offsets(rows, width, units, r, c):
    """codegen's tl_sw<bytes>(r, c, rows, width): element (r, c) of a tile of
    swizzled column chunks whose rows are `units` 16-byte units (C's truncating
    / and %); the unit index XORs with the row's 128-byte line (address bits
    7.. of the pattern)."""
    per16 = width // units
    cc = np.fmod(c, width)
    chunk = (c - cc) // width
    line = np.fmod(r // (8 // units), units)
    return chunk * rows * width + r * width + ((cc // per16) ^ line) * per16 + cc % per16


def _swizzled_units(address, rows, span):
    """Where TMA's swizzle puts the 16-byte units of `rows` rows of `span` bytes
    written from shared address `address`: (row index, unit index) arrays, each
    row's units XORed with its address bits 7.. (CUTLASS Swizzle<3,4,3> for 128B)."""
    r = np.arange(rows)
    unit = np.arange(span // 16)[None, :] ^ (((address + r * span) >> 7) & (span // 16 - 1))[:, None]
    return r[:, None], unit


def _box(t, region, shape) -> tuple:
    """The box a thread copy of a tile of `shape` moves at tensor region `region`:
    the region's extents where they split the tile's rows (ir.split_box), else the
    tile's shape in the innermost dimensions."""
    return ir.split_box(region, len(shape)) or (1,) * (len(t.shape) - len(shape)) + tuple(shape)


def _rows_and_columns(b) -> tuple:
    """A chunked shared tile as the 2-D tile its layout chunks: its leading dimensions
    one (an im2col patch [PH, PW, C] is PH x PW rows of C), its last the columns."""
    return math.prod(b.shape[:-1]), b.shape[-1]


def _tile_offsets(b, r, c):
    """Element (r, c) of a shared tile in a chunked layout (rows: _rows_and_columns),
    in elements from its start: codegen's tl_sw<bytes> for swizzled layouts, column
    chunks of b.chunk for 'cols'; a tile with row_groups holds its 8-row groups where
    codegen's tl_rows_<tile> puts them."""
    rows = b.chunk_rows
    if b.phases > 1:    # a strided view's patch: pixel (i, j) in column phase j % S's chunk (codegen's element)
        i, j = np.divmod(np.asarray(r), b.shape[1])
        r = j % b.phases * rows + i * b.phase_width + j // b.phases
        rows *= b.phases
    if b.row_groups:
        r = np.asarray(r)
        if r.size and (r.min() < 0 or r.max() >= 8 * len(b.row_groups)):
            raise InterpretError(f"an element access of '{b.name}' reads past its rows (its 8-row groups are "
                                 "reordered: undefined on the GPU)", None)
        r = np.asarray(b.row_positions)[r // 8] * 8 + r % 8
    if b.swizzle:
        return _swizzled_offsets(rows, b.swizzle // b.dtype.size, b.swizzle // 16, r, c)
    w = b.chunk
    cc = np.fmod(c, w)
    return (c - cc) // w * (rows * w) + r * w + cc


class _Blocks:
    """Runs the kernel's body once per block of the grid (x fastest).

    Shared memory is one byte array (`dynamic_smem` bytes, its start taken as
    1024-byte aligned, as codegen arranges for swizzled tiles); a shared tile is
    elements at its offset, in its layout, one copy per pipeline stage. Local
    tiles are plain arrays in the tile's own (logical) order."""

    def __init__(self, k: ir.Kernel, tensors: dict, env: dict):
        self.k, self.tensors, self.base_env = k, tensors, env
        self.smem = np.empty(max(k.smem_bytes, 1), U8)
        self.locals, self.whole = {}, {}
        self.buffers = {b.name: b for b in k.buffers}
        for b in k.buffers:
            st = storage_dtype(b.dtype)
            if b.scope == "shared":
                n = len(self.smem) // st.itemsize * st.itemsize
                self.whole[b.name] = (self.smem[:n].view(st), b.smem_offset // st.itemsize)
            else:
                self.locals[b.name] = np.empty(b.shape, st)
        self.maps = {t.name: t for t in k.tensor_maps}
        self.threads = k.threads.value
        self.lanes = None
        self.one_thread_depth = 0
        self.roles = None                   # the _Roles of the Specialized statement being run
        self._view_exprs = {}
        self._fused = {}                    # (id of a + or - expression, double): (it, fused_product's answer)
        self.reduce_lanes = {}              # id of a reduce of a local tile: ir.reduce_lanes
        self.rings = [s for s in ir.walk_stmts(k.body) if isinstance(s, ir.RingAdvance)]

    def run(self, grid):
        if self.k.persistent:       # grid[0] counts tiles: a few resident blocks, each looping over several
            grid = (host.persistent_blocks(grid[0], INTERPRETED_RESIDENT_BLOCKS, balanced_grid(self.k),
                                           bool(self.k.stream_k)), 1, 1)
        names = self.k.grid_vars
        self.slots = {}                     # stream-K: the workspace's slots stored and not yet added
        order = list(itertools.product(range(grid[2]), range(grid[1]), range(grid[0])))
        for bz, by, bx in order[::-1] if LAST_BLOCK_FIRST and not self.k.stream_k else order:
            self.block_index = (bx, by, bz)
            env = dict(self.base_env)
            env.update(zip(names, (np.int32(bx), np.int32(by), np.int32(bz))))
            if self.k.persistent:               # gridDim.x: the resident blocks
                env[make_persistent.BLOCKS] = np.int32(grid[0])
            self.smem.fill(_POISON)
            for a in self.locals.values():
                a.view(U8).fill(_POISON)
            self.barriers = {}
            self.phase_reg = {b.name: 0 for b in self.k.barriers}
            env.update((s.var, np.int32(0)) for s in self.rings)
            self.block(self.k.body, env)
        if self.slots:
            raise InterpretError(f"stream-K: workspace slot(s) {sorted(self.slots)} stored and never added: their "
                                 "flags would stay set into the next launch", None)

    def block(self, body, env):
        for s in body:
            _STMT[type(s)](self, s, env)

    # ------------------------------------------------------------ tiles
    def tile(self, b, stage=0):
        """Shared tile `b` (copy `stage`) or local tile `b` in logical order: a view
        of its storage where the layout is row-major, else a copy."""
        if b.scope == "local":
            return self.locals[b.name]
        whole, base = self.whole[b.name]
        base += stage * b.stage_bytes // whole.itemsize
        if b.layout == "row":
            return whole[base:base + b.elements].reshape(b.shape)
        r, c = _indices(_rows_and_columns(b))
        return whole[base + _tile_offsets(b, r.astype(np.int64), c)].reshape(b.shape)

    def set_tile(self, b, values):
        if b.scope == "local" or b.layout == "row":
            self.tile(b)[...] = values
        else:
            whole, base = self.whole[b.name]
            r, c = _indices(_rows_and_columns(b))
            whole[base + _tile_offsets(b, r.astype(np.int64), c)] = np.reshape(values, r.shape)

    def _stage(self, e, env):
        return 0 if e is None else _int(self.ev(e, env))

    # ------------------------------------------------------------ control flow
    def one_thread(self, s, env):
        self.one_thread_depth += 1
        try:
            self.block(s.body, env)
        finally:
            self.one_thread_depth -= 1

    def issuers(self):
        """How many threads run the statement at hand: 1 inside one_thread (and
        in a Specialized block's producer), else the kernel's `threads`."""
        return 1 if self.one_thread_depth else self.threads

    def specialized(self, s, env):
        self.roles = _Roles(self, s, env)
        try:
            self.roles.run()
        finally:
            self.roles = None

    def for_(self, s, env):
        if self.lanes is not None:
            return self.lane_for(s, env)
        for i in range(_int(self.ev(s.extent, env))):
            env[s.var] = np.int32(i)
            self.block(s.body, env)

    def if_(self, s, env):
        if self.lanes is not None:
            return self.lane_if(s, env)
        self.block(s.then if self.ev(s.cond, env, reads_f64(self.k, s.cond)) != 0 else s.orelse, env)

    def let(self, s, env):
        v = self.ev(s.value, env)
        env[s.name] = np.int64(v) if s.wide else np.int32(v)

    def partial_store(self, s, env):
        """Stream-K: the block's partial sums go to its workspace slot (a copy of
        each accumulator in logical order), and the slot is marked ready."""
        slot = _int(self.ev(s.slot, env))
        if slot in self.slots:
            raise InterpretError(f"stream-K: workspace slot {slot} is stored twice in one launch", s.span)
        self.slots[slot] = {name: self.locals[name].copy() for name in s.buffers}

    def partial_add(self, s, env):
        """Stream-K: wait for a slot (blocks run in index order here, and a block
        waits only on lower-numbered ones, so a slot not yet stored would never
        be on the GPU either: the block would spin forever), add it, free it."""
        slot = _int(self.ev(s.slot, env))
        if slot not in self.slots:
            raise InterpretError(f"stream-K: block {self.block_index[0]} waits for workspace slot {slot}, which no "
                                 "block has stored: on the GPU it would spin forever", s.span)
        part = self.slots.pop(slot)
        for name in s.buffers:
            acc = self.locals[name]
            acc[...] = (acc.astype(np.float32) + part[name].astype(np.float32)).astype(acc.dtype)

    def nothing(self, s, env):
        """Fences, block barriers, bulk-group commits and waits, wgmma waits:
        ordering only. Blocks and statements run one at a time, in order (a
        Specialized block's two roles each in its own order)."""

    # ------------------------------------------------------------ mbarriers
    def mbarrier_init(self, s, env):
        for b in s.barriers:
            for i in range(b.count):
                self.barriers[(b.name, i)] = _Barrier(f"{b.name}[{i}]" if b.array else b.name, b.arrivals)

    def barrier(self, name, index, s, env):
        i = 0 if index is None else _int(self.ev(index, env))
        bar = self.barriers.get((name, i))
        if bar is None:
            raise InterpretError(f"mbarrier {name}[{i}] is used before mbarrier.init (or does not exist)", s.span)
        return bar

    def arrive_expect_tx(self, s, env):
        bar = self.barrier(s.barrier, s.index, s, env)
        n = self.issuers()
        bar.tx += s.bytes * n
        bar.expected += s.bytes * n
        bar.pending -= n
        bar.settle(s.span)

    def mbarrier_arrive(self, s, env):
        """One thread per warpgroup (threadIdx.x % 128 == 0) arrives."""
        bar = self.barrier(s.barrier, s.index, s, env)
        bar.pending -= 1 if self.one_thread_depth else -(-self.threads // 128)
        bar.settle(s.span)

    def complete_tx(self, name, index, nbytes, s, env):
        bar = self.barrier(name, index, s, env)
        nbytes *= self.issuers()
        bar.tx -= nbytes
        bar.brought += nbytes
        bar.settle(s.span)

    def mbarrier_wait(self, s, env):
        bar = self.barrier(s.barrier, s.index, s, env)
        if s.parity is None:
            parity = self.phase_reg[s.barrier]
        else:
            parity = (s.parity if isinstance(s.parity, int) else _int(self.ev(s.parity, env))) & 1
        if (bar.phase & 1) == parity:          # the phase with this parity has not completed
            if self.roles is None:
                raise self.hang(bar, parity, s)
            self.roles.wait(bar, parity, s)

    def hang(self, bar, parity, s, roles=""):
        return InterpretError(f"kernel {self.k.name} would hang: block {self.block_index} waits on mbarrier "
                              f"{bar.name} with parity {parity}, a phase nothing completes ({_missing(bar)}){roles}",
                              s.span)

    def flip_phase(self, s, env):
        self.phase_reg[s.barrier] ^= 1

    def ring_advance(self, s, env):
        env[s.var] = np.int32(env[s.var] + _int(self.ev(s.by, env)))

    # ------------------------------------------------------------ TMA
    def _check_inner(self, tensor, coord, s):
        size = ir.DTYPES[tensor.dtype].size
        if coord * size % 16:
            raise InterpretError(f"TMA access of '{tensor.name}' at innermost coordinate {coord} ({coord * size} "
                                 "bytes) is not 16-byte aligned: on the GPU the instruction faults "
                                 "(CUDA_ERROR_ILLEGAL_INSTRUCTION)", s.span)

    def _smem_span(self, b, address, nbytes, swizzle, s, what):
        """Check that a TMA access of `nbytes` at shared address `address` is
        aligned and stays inside tile `b` (all its stages)."""
        align = 1024 if swizzle == "128B" else 128
        if address % align:
            raise InterpretError(f"{what} at shared-memory offset {address}: TMA needs {align}-byte alignment "
                                 f"{'with the 128-byte swizzle' if align == 1024 else ''}".rstrip(), s.span)
        end = b.smem_offset + b.ring_bytes
        if not (b.smem_offset <= address and address + nbytes <= end):
            raise InterpretError(f"{what} writes shared bytes {address} .. {address + nbytes}, outside tile "
                                 f"'{b.name}' ({b.smem_offset} .. {end})", s.span)

    def _to_smem(self, address, data, swizzle):
        """TMA writes `data` (the box, innermost dim contiguous) at `address`; with
        a swizzle, the 16-byte units of each row XOR the address bits 7.. (CUTLASS
        Swizzle<3,4,3> for 128B)."""
        raw = np.ascontiguousarray(data).view(U8).reshape(-1)
        span = SWIZZLE_SPAN[swizzle]
        if not span:
            self.smem[address:address + raw.size] = raw
            return
        rows = raw.reshape(-1, span // 16, 16)
        r, unit = _swizzled_units(address, rows.shape[0], span)
        dst = self.smem[address:address + raw.size].reshape(rows.shape)
        dst[r, unit] = rows

    def _from_smem(self, address, nbytes, swizzle):
        span = SWIZZLE_SPAN[swizzle]
        raw = self.smem[address:address + nbytes]
        if not span:
            return raw.copy()
        rows = raw.reshape(-1, span // 16, 16)
        r, unit = _swizzled_units(address, rows.shape[0], span)
        return rows[r, unit].reshape(-1)

    def _check_swizzle(self, tm, inner_bytes, s):
        span = SWIZZLE_SPAN[tm.swizzle]
        if span and inner_bytes != span:
            raise InterpretError(f"tensor map {tm.name}: a {inner_bytes}-byte inner box with the {tm.swizzle} "
                                 "swizzle is not modelled", s.span)

    def tma_load(self, s, env):
        tm = self.maps[s.tensor_map]
        tensor = self.tensors[s.tensor]
        b = self.buffers[s.buffer]
        if s.zeros_if is not None and self.ev(s.zeros_if, env):
            self.zero_copies(s, b, env)
            return
        if s.view:
            data = self.im2col_box(s, tm, tensor, env)
        else:
            coords = [_i32(self.ev(c, env)) for c in s.coords]
            self._check_inner(tensor, coords[-1], s)
            # a dim of element stride e moves every e-th element of its box: ceil(box / e) of them
            data = read_box(tensor.array, coords, tm.box)[tuple(slice(None, None, e) for e in tm.element_strides)]
        address = b.smem_offset + self._stage(s.stage, env) * b.stage_bytes + s.smem_offset
        self._check_swizzle(tm, data.shape[-1] * data.itemsize, s)
        self._smem_span(b, address, data.nbytes, tm.swizzle, s, f"TMA load into '{b.name}'")
        self._to_smem(address, data, tm.swizzle)
        self.complete_tx(s.barrier, s.barrier_index, data.nbytes, s, env)

    def zero_copies(self, s, b, env):
        """An im2col load whose columns lie past the view's last: cp.async.bulk
        copies of the module's zeros (ir.ZEROS) over the load's bytes, on its barrier."""
        address = b.smem_offset + self._stage(s.stage, env) * b.stage_bytes + s.smem_offset
        self._smem_span(b, address, s.bytes, "none", s, f"copy of zeros into '{b.name}'")
        self.smem[address:address + s.bytes] = 0
        self.complete_tx(s.barrier, s.barrier_index, s.bytes, s, env)

    def im2col_box(self, s, tm, tensor, env):
        """One cp.async.bulk.tensor .im2col: pixels_per_column pixels from the
        instruction's (n, window origins...) on, walking the pixel box the map's
        corners and traversal strides define, innermost spatial dim fastest, on
        into the next image; each pixel's channels c0 .. c0 + channels_per_pixel
        at the window origin + the tap offsets; zero outside the image."""
        x = tensor.array
        bp, bc = tm.box
        coords = [_i32(self.ev(c, env)) for c in s.coords]
        offsets = [_int(self.ev(o, env)) & 0xFFFF for o in s.offsets]
        n0, *origin, c0 = coords
        self._check_inner(tensor, c0, s)
        n_img, *spatial, channels = x.shape
        steps = tm.element_strides[1:-1]
        counts = [(dim - 1 + up - lo) // st + 1
                  for dim, lo, up, st in zip(spatial, tm.lower_corner, tm.upper_corner, steps)]
        first = n0
        for a, lo, st, cnt in zip(origin, tm.lower_corner, steps, counts):
            q, r = divmod(a - lo, st)
            if r or not 0 <= q < cnt:
                raise InterpretError(f"im2col load from window origin {origin} of '{tensor.name}': not a point of "
                                     f"the pixel box (corners {list(tm.lower_corner)} .. {list(tm.upper_corner)}, "
                                     f"strides {list(steps)}); what TMA loads then is not modelled", s.span)
            first = first * cnt + q
        rest = first + np.arange(bp, dtype=np.int64)
        pos = []
        for cnt in reversed(counts):
            pos.insert(0, rest % cnt)
            rest = rest // cnt
        # rows past the last image read zero (on the H200, loads that start past it read zeros:
        # benchmarks/NOTES.md session 47)
        valid = (rest >= 0) & (rest < n_img)
        pixel = []
        for q, lo, st, off, dim in zip(pos, tm.lower_corner, steps, offsets, spatial):
            p = lo + q * st + off
            valid &= (p >= 0) & (p < dim)
            pixel.append(p)
        out = np.zeros((bp, bc), x.dtype)
        c_lo, c_hi = max(c0, 0), min(c0 + bc, channels)
        if c_lo < c_hi and valid.any():
            index = (rest[valid],) + tuple(p[valid] for p in pixel)
            out[valid, c_lo - c0:c_hi - c0] = x[index][:, c_lo:c_hi]
        return out

    def tma_store(self, s, env):
        tm = self.maps[s.tensor_map]
        tensor = self.tensors[s.tensor]
        b = self.buffers[s.buffer]
        coords = [_i32(self.ev(c, env)) for c in s.coords]
        self._check_inner(tensor, coords[-1], s)
        st = tensor.array.dtype
        nbytes = math.prod(tm.box) * st.itemsize
        self._check_swizzle(tm, tm.box[-1] * st.itemsize, s)
        address = b.smem_offset + s.smem_offset
        self._smem_span(b, address, nbytes, tm.swizzle, s, f"TMA store from '{b.name}'")
        data = self._from_smem(address, nbytes, tm.swizzle).view(st).reshape(tm.box)
        # The hardware writes every 16-byte granule of a row that the box touches
        # inside the map (tma-reference.md §6): past a map that ends mid-granule.
        width = tensor.array.shape[-1]
        per = ir.granule_elements(ir.DTYPES[tensor.dtype])
        inner = width // per * per if tm.inner_rounded else width
        reach = -(-inner // per) * per
        lo, hi = max(coords[-1], 0), min(coords[-1] + tm.box[-1], reach)
        if hi > width and lo < hi and _box_slices(tensor.array.shape[:-1], coords[:-1], tm.box[:-1]) is not None:
            raise InterpretError(f"TMA store into '{tensor.name}' writes columns {max(lo, width)} .. {hi - 1}, past "
                                 f"its rows of {width} elements: TMA stores write whole 16-byte granules, so the "
                                 f"store map {tm.name} must end at the last whole granule", s.span)
        write_box(tensor.array[..., :inner], coords, tm.box, data)

    def store_tail(self, s, env):
        """codegen's store_tail: in a block whose tile crosses the tensor's last
        whole 16-byte granule, the tile's columns from there to the row's end."""
        t, b = self.tensors[s.tensor], self.buffers[s.buffer]
        width = t.array.shape[-1]
        per = ir.granule_elements(ir.DTYPES[t.dtype])
        coords = [_int(self.ev(c, env)) for c in s.coords]
        x0, tail, tile_w = coords[-1], width // per * per, s.shape[-1]
        if not (tail < width and x0 < width and tail < x0 + tile_w):
            return
        first = max(x0, tail) - x0
        box = (1,) * (len(t.shape) - len(s.shape)) + tuple(s.shape)
        cols = self.tile(b).reshape(box)[..., first:first + per]
        write_box(t.array, coords[:-1] + [x0 + first], box[:-1] + (cols.shape[-1],), cols)

    # ------------------------------------------------------------ thread-level statements
    def fill(self, s, env):
        b = self.buffers[s.buffer]
        self.set_tile(b, encode(self.ev(s.value, env, b.dtype.name == "f64"), b.dtype))

    def reduce(self, s, env):
        """codegen/cuda.py's reduce: acc[i] = op over row i (axis 1) or column i
        (axis 0) of s, in order from the first element, or in ir.reduce_spread's lanes
        (a local tile's: reduce_local) combined in halves within each warp, then the
        warps in order: floats in
        float (double with an f64 side), so float sums round as the GPU's do; integer sums
        modulo 2^64 (any order gives those bits), integer maxima and minima in s's type;
        then converted to acc's dtype as C++ assigns it."""
        src, acc = self.buffers[s.src], self.buffers[s.dst]
        x = np.moveaxis(decode(self.tile(src), src.dtype), s.axis, 0)   # x[k]: element k of every row / column
        if src.dtype.is_float:
            x = x.astype(F64 if "f64" in (src.dtype.name, acc.dtype.name) else F32)

            def combine(total, v):
                if s.op == "sum":
                    return total + v
                return min_max(s.op, total, v)                  # tl_max(tl_acc, v), tl_min(tl_acc, v)
            if src.scope == "local":
                total = self.reduce_local(s, x, combine)
            else:
                lanes = ir.reduce_spread(self.k, s).lanes
                totals = [x[g::lanes] for g in range(lanes)]   # lane g walks elements g, g + lanes, ...
                total = _in_warps([totals[w:w + 32] for w in range(0, lanes, 32)], combine)
        elif s.op == "sum":
            total = np.add.reduce(x.astype(np.uint64), axis=0, dtype=np.uint64)
        else:
            total = (np.maximum if s.op == "max" else np.minimum).reduce(x, axis=0)
        self.set_tile(acc, encode(total, acc.dtype))

    def reduce_local(self, s, x, combine):
        """A local tile's reduce, where its elements are (ir.reduce_lanes: each result's
        lanes, warp by warp), vectorized over the results whose lanes hold the same
        positions; x[p, r]: element p of result r."""
        lanes = self.reduce_lanes.get(id(s))
        if lanes is None:
            lanes = self.reduce_lanes[id(s)] = ir.reduce_lanes(self.k, s)
        alike = {}
        for r, warps in enumerate(lanes):
            alike.setdefault(tuple(tuple(w) for w in warps), []).append(r)
        total = np.empty(x.shape[1:], x.dtype)
        for warps, results in alike.items():
            part = x[:, results]
            total[results] = _in_warps([[part[list(ps)] for ps in warp] for warp in warps], combine)
        return total

    def thread_copy(self, s, env):
        """codegen/cuda.py's thread_copy: every element of the tile, global sides
        bounds-checked (zero outside, writes outside dropped), and a dtype change
        as `dst_t(static_cast<float or double>(value))`, between integers directly."""
        k = self.k
        src_b, dst_b, view = self.buffers.get(s.src.name), self.buffers.get(s.dst.name), k.view(s.src.name)
        if src_b is not None:
            data = self.tile(src_b)
            if s.src.starts:        # a part of the tile (a chunk of an accumulator's columns)
                data = data[tuple(slice(o, o + n) for o, n in
                                  zip((_int(self.ev(c, env)) for c in s.src.starts), s.shape))]
            data = data.reshape(s.shape)
            src_dt = src_b.dtype
        elif view is not None:
            data = self.view_elements(s, view, env)
            src_dt = k.param(view.tensor).dtype
        else:
            t = self.tensors[s.src.name]
            box = _box(t, s.src, s.shape)
            data = read_box(t.array, [_int(self.ev(c, env)) for c in s.src.starts], box).reshape(s.shape)
            src_dt = k.param(s.src.name).dtype
        dst_dt = (dst_b or k.param(s.dst.name)).dtype
        if src_dt != dst_dt and not (src_dt.is_float or dst_dt.is_float):
            data = encode(data, dst_dt)             # integer to integer: wraps, as C++ converts
        elif src_dt != dst_dt:
            arith_t = F64 if "f64" in (src_dt.name, dst_dt.name) else F32
            data = encode(convert(decode(data, src_dt), arith_t), dst_dt)
        if dst_b is not None:
            self.set_tile(dst_b, data.reshape(dst_b.shape))
        else:
            t = self.tensors[s.dst.name]
            box = _box(t, s.dst, s.shape)
            write_box(t.array, [_int(self.ev(c, env)) for c in s.dst.starts], box, data.reshape(box))

    def view_elements(self, s, v, env):
        """A tile of an im2col view read by threads, with the index math and tests
        of codegen's view_element (ir/im2col.py over the tensor's dims)."""
        x = self.k.param(v.tensor)
        exprs = self._view_exprs.get(id(s))
        if exprs is None:
            (m, kk), coords, (rows, columns) = im2col.element(v, x, s.src.starts, ("tl_i0", "tl_i1"))
            tests = [ir.BinOp("<", m, rows), ir.BinOp("<", kk, columns)]
            for d in range(1, len(coords) - 1):     # unsigned compares: 0 <= coord < dim
                tests += [ir.BinOp(">=", coords[d], ir.Int(0)), ir.BinOp("<", coords[d], ir.Var(f"tl_{x.name}_dim{d}"))]
            exprs = self._view_exprs[id(s)] = (coords, tests)
        coords, tests = exprs
        tensor = self.tensors[x.name]
        lenv = dict(env)
        lenv["tl_i0"], lenv["tl_i1"] = _indices(tuple(s.shape))
        lenv.update((f"tl_{x.name}_dim{d}", np.int64(n)) for d, n in enumerate(tensor.shape))
        inside = np.ones(s.shape, bool)
        for t in tests:
            inside &= self.ev(t, lenv)
        idx = [np.broadcast_to(np.asarray(self.ev(c, lenv), np.int64), s.shape)[inside] for c in coords]
        for d, (i, n) in enumerate(zip(idx, tensor.shape)):
            if i.size and (i.min() < 0 or i.max() >= n):
                raise InterpretError(f"a thread copy from im2col view '{v.name}' reads '{x.name}' outside its dim {d} "
                                     "(undefined on the GPU)", s.span)
        out = np.zeros(s.shape, tensor.array.dtype)
        out[inside] = tensor.array[tuple(idx)]
        return out

    def gemm(self, s, env):
        """acc += a @ b (a is [K, M] with transpose_a, b [N, K] with transpose_b), products and sums in f32 as
        wgmma accumulates (8-bit integers: in i32, wrapping); the order of its sums is not modelled (compare with a
        tolerance). Operands are read in their layout (the swizzle TMA wrote);
        the wgmma descriptors themselves are not interpreted."""
        a, b, acc = (self.buffers[n] for n in (s.a, s.b, s.acc))
        stage = self._stage(s.stage, env)
        work = np.int64 if acc.dtype.name == "i32" else F32    # 8-bit integers: exact sums, wrapped to i32 below
        av = decode(self.tile(a, stage), a.dtype).astype(work)
        bv = decode(self.tile(b, stage), b.dtype).astype(work)
        if s.tf32:          # the tensor cores read tf32: each f32's lower 13 mantissa bits are not read
            av, bv = ((np.ascontiguousarray(x).view(np.uint32) & np.uint32(0xFFFFE000)).view(F32) for x in (av, bv))
        if s.patch:         # the im2col view of patch av [PH, PW, C]: rows its output pixels, columns (kh, kw, c)
            (kh, kw), (ph, pw, c), st = s.patch, av.shape, s.patch_stride
            oh, ow = (ph - kh) // st + 1, (pw - kw) // st + 1
            cols = [av[i:i + st * (oh - 1) + 1:st, j:j + st * (ow - 1) + 1:st] for i in range(kh) for j in range(kw)]
            av = np.concatenate(cols, axis=-1).reshape(-1, kh * kw * c)
            av = np.pad(av, ((0, 0), (0, bv.shape[1 if s.transpose_b else 0] - av.shape[1])))
        # einsum's own loop, not BLAS: a multithreaded BLAS can be slower than this
        # on small tiles by a hundred times (seen on a 2-core machine)
        spec = f"{'ki' if s.transpose_a else 'ik'},{'nk' if s.transpose_b else 'kn'}->in"
        product = np.einsum(spec, av, bv)
        total = product if s.zero else decode(self.tile(acc), acc.dtype).astype(work) + product
        if work is np.int64:        # wgmma's s32 sums wrap (two's complement), as the interpreter's i32 adds do
            total = total.astype(np.int32)
        self.set_tile(acc, encode(total, acc.dtype))

    # ------------------------------------------------------------ parallel bodies
    def parallel(self, s, env):
        shape = tuple(x.value for x in s.extents)
        env.update(zip(s.vars, _indices(shape)))
        self.lanes = _Lanes(s.vars, shape)
        try:
            self.block(s.body, env)
        finally:
            self.lanes = None

    def lane_if(self, s, env):
        cond = np.asarray(self.ev(s.cond, env, reads_f64(self.k, s.cond)) != 0)
        outer = self.lanes.mask
        if cond.ndim == 0:
            return self.block(s.then if cond else s.orelse, env)
        cond = np.broadcast_to(cond, self.lanes.shape)
        for body, m in ((s.then, cond), (s.orelse, ~cond)):
            m = m if outer is None else outer & m
            if body and m.any():
                self.lanes.mask = m
                self.block(body, env)
        self.lanes.mask = outer

    def lane_for(self, s, env):
        extent = np.asarray(self.ev(s.extent, env))
        outer = self.lanes.mask
        if extent.ndim == 0:
            trips = _int(extent)
        else:
            extent = np.broadcast_to(extent, self.lanes.shape)
            trips = _int(extent.max() if outer is None else extent[outer].max(initial=0))
        for i in range(trips):
            env[s.var] = np.int32(i)
            if extent.ndim:
                self.lanes.mask = (i < extent) if outer is None else outer & (i < extent)
            self.block(s.body, env)
        self.lanes.mask = outer

    def assign(self, s, env):
        b = self.buffers[s.buffer]
        double = b.dtype.name == "f64" or reads_f64(self.k, s.value)
        value = encode(self.ev(s.value, env, double), b.dtype)
        own = self._own_tile(b, s.indices)
        mask = self.lanes.mask
        if own is not None:
            np.copyto(own, value, where=True if mask is None else mask)
            return
        whole, where = self._element_index(b, s.indices, env, s)
        active = np.ones(self.lanes.shape, bool) if mask is None else mask
        whole[where[active]] = np.broadcast_to(value, self.lanes.shape)[active]

    def _own_tile(self, b, indices):
        """The tile itself (a view) when it is indexed with the parallel's own
        indices over its whole shape and stored row-major; else None."""
        ln = self.lanes
        if ln.shape == tuple(b.shape) and len(indices) == len(ln.vars) and (b.scope == "local" or b.layout == "row") \
                and all(type(i) is ir.Var and i.name == v for i, v in zip(indices, ln.vars)):
            return self.tile(b)
        if b.layout == "rows" and len(ln.shape) == 2 and len(indices) == 1 and type(indices[0]) is ir.Var \
                and indices[0].name == ln.vars[0] and ln.shape[0] == b.shape[0]:
            return np.broadcast_to(self.tile(b)[:, None], ln.shape)     # read at [i] beside an accumulator
        if b.scope == "local":
            raise InterpretError(f"local tile '{b.name}' accessed away from the parallel's own indices", None)
        return None

    def _element_index(self, b, indices, env, where):
        """Element `b[indices]` where codegen puts it (row-major flattening or the
        swizzle, not bounds-checked), as an index into all of shared memory."""
        whole, base = self.whole[b.name]
        idx = [np.asarray(self.ev(i, env), np.int64) for i in indices]
        if b.swizzle or b.layout == "cols":
            row = idx[0] if len(idx) == 2 else idx[0] * b.shape[1] + idx[1]       # a patch's pixel
            flat = _tile_offsets(b, row, idx[-1])
        else:
            flat = np.int64(0)
            for d, i in enumerate(idx):
                flat = flat + i * math.prod(b.shape[d + 1:])
        flat = np.broadcast_to(base + flat, self.lanes.shape)
        mask = self.lanes.mask
        active = flat if mask is None else flat[mask]
        if active.size and (active.min() < 0 or active.max() >= len(whole)):
            raise InterpretError(f"element access of shared tile '{b.name}' lands outside the kernel's shared "
                                 "memory (undefined on the GPU)", where.span)
        return whole, flat if mask is None else np.where(mask, flat, base)

    # ------------------------------------------------------------ expressions (C++ semantics)
    def ev(self, e, env, double=False):
        t = type(e)
        if t is ir.Var:
            return env[e.name]
        if t is ir.Int:
            return np.int32(e.value) if -2**31 <= e.value < 2**31 else np.int64(e.value)
        if t is ir.BinOp:
            return self.binop(e, env, double)
        if t is ir.Float:
            return np.float64(e.value) if double else _f32_literal(e.value)
        if t is ir.Subscript:
            b = self.buffers[e.name]
            own = self._own_tile(b, e.indices)
            if own is not None:
                return decode(own, b.dtype)
            whole, where = self._element_index(b, e.indices, env, e)
            return decode(whole[where], b.dtype)
        if t is ir.UnaryOp:
            v = self.ev(e.operand, env, double)
            if e.op == "!":
                return v == 0
            return -v.astype(_promote(v.dtype))
        if t is ir.Cast:
            v = self.ev(e.value, env, double)
            if e.dtype.name in _WRAPPED:           # f16_t(float(x)): rounded, then used as float
                return decode(encode(v, e.dtype), e.dtype)
            return convert(v, np.dtype(e.dtype.numpy))
        if t is ir.Call:
            return self.call(e, env, double)
        raise TypeError(f"cannot interpret {e!r}")

    def dtype_of(self, e, env, double):
        """The type `ev` gives `e`, without evaluating it (the arm of a select that
        is not taken still sets the select's type, as in C++: `c ? float : double`
        is a double)."""
        t = type(e)
        if t is ir.Var:
            return np.asarray(env[e.name]).dtype
        if t is ir.Int:
            return np.dtype(np.int32) if -2**31 <= e.value < 2**31 else np.dtype(np.int64)
        if t is ir.Float:
            return F64 if double else F32
        if t in (ir.Subscript, ir.Cast):
            dt = self.buffers[e.name].dtype if t is ir.Subscript else e.dtype
            return F32 if dt.name in _WRAPPED else np.dtype(dt.numpy)
        if t is ir.UnaryOp:
            return np.dtype(bool) if e.op == "!" else _promote(self.dtype_of(e.operand, env, double))
        if t is ir.BinOp:
            if e.op in ("==", "!=", "<", "<=", ">", ">=", "&&", "||"):
                return np.dtype(bool)
            e = widened(e)
            return common_type(self.dtype_of(e.lhs, env, double), self.dtype_of(e.rhs, env, double))
        if e.func in ("select", "min", "max", "cdiv"):
            args = e.args[1:] if e.func == "select" else e.args
            t = common_type(*(self.dtype_of(a, env, double) for a in args))
            return common_type(t, np.dtype(np.int32)) if e.func == "cdiv" else t
        if e.func == "abs":
            return self.dtype_of(e.args[0], env, double)
        return F64 if double else F32               # exp, exp2, log, log2, sqrt, rsqrt

    def binop(self, e, env, double):
        op = e.op
        if op in ("+", "-"):
            return self.add_sub(e, env, double)
        e = widened(e)                             # static_cast<long long>(a) * b for two sizes
        a, b = self.ev(e.lhs, env, double), self.ev(e.rhs, env, double)
        if op == "&&":
            return np.logical_and(a != 0, b != 0)
        if op == "||":
            return np.logical_or(a != 0, b != 0)
        return arith(op, a, b, e)

    def add_sub(self, e, env, double):
        """`a * b ± c` and `c ± a * b` in float or double as one fused
        multiply-add where device code fuses them (ir.exprs.fused_product), else
        the plain sum or difference."""
        key = (id(e), double)
        if key not in self._fused:
            # e is kept with the answer, so its id stays its own while the cache lives
            self._fused[key] = (e, fused_product(self.k, e, double))
        fused = self._fused[key][1]
        if fused is None:
            return arith(e.op, self.ev(e.lhs, env, double), self.ev(e.rhs, env, double), e)
        i, width = fused
        t = F64 if width == 64 else F32
        product, other = (e.lhs, e.rhs) if i == 0 else (e.rhs, e.lhs)
        f, g, c = (convert(self.ev(x, env, double), t) for x in (product.lhs, product.rhs, other))
        if e.op == "-":
            if i == 0:
                c = -c
            else:
                f = -f
        return _fma(f, g, c, t)

    def call(self, e, env, double):
        if e.func == "select":                     # c ? a : b
            c = self.ev(e.args[0], env, double)
            if np.ndim(c) == 0:                    # one value: only the arm taken is evaluated, as in C++,
                t = common_type(self.dtype_of(e.args[1], env, double), self.dtype_of(e.args[2], env, double))
                return convert(self.ev(e.args[1] if c != 0 else e.args[2], env, double), t)   # in both's type
            a, b = self.ev(e.args[1], env, double), self.ev(e.args[2], env, double)   # per lane
            t = common_type(a.dtype, b.dtype)
            return np.where(c != 0, convert(a, t), convert(b, t))
        args = [self.ev(a, env, double) for a in e.args]
        f = e.func
        if f in ("min", "max"):                    # tl_min, tl_max: in the common type
            t = common_type(args[0].dtype, args[1].dtype)
            return min_max(f, convert(args[0], t), convert(args[1], t))
        if f == "abs":                             # tl_abs: A, a < 0 ? -a : a
            a = args[0]
            return np.where(a < 0, -a.astype(_promote(a.dtype)), a).astype(a.dtype)
        if f == "cdiv":                            # tl_cdiv: a / b + (a % b > 0)
            a, b = args
            return arith("+", arith("/", a, b, e), np.asarray(arith("%", a, b, e) > 0).astype(np.int32), e)
        t = F64 if double else F32                 # expf / exp ...
        a = convert(args[0], t)
        if f == "rsqrt":
            return (t.type(1) / np.sqrt(a)).astype(t)
        if f == "exp2" and not double:             # tl_exp2: results below 2^-126 flushed to 0
            return flush_exp2(np.exp2(a))
        if f in _FLOAT_FN:
            return _FLOAT_FN[f](a)
        raise TypeError(f"cannot interpret a call of {f}")


def flush_exp2(y):
    """An f32 exp2's results as the GPU's tl_exp2 (ex2.approx.ftz) gives them: those below
    2^-126, the smallest normal float, are 0."""
    return np.where(y < F32.type(2.0 ** -126), F32.type(0), y).astype(F32)


# the float calls numpy computes in the argument's type (rsqrt as 1 / sqrt, above)
_FLOAT_FN = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt}


@functools.lru_cache(maxsize=64)
def _indices(shape):
    out = tuple(np.indices(shape, dtype=np.int32))
    for a in out:
        a.flags.writeable = False
    return out


def _in_warps(warps, combine):
    """warps[w][g]: lane g's elements in the order it walks them. Each lane combines its
    own in order, a warp's lanes then in halves (lane g takes lane g + h's, h = n / 2
    ... 1, as __shfl_down_sync does), then the warps' values in order."""
    values = []
    for warp in warps:
        part = []
        for elements in warp:
            total = elements[0]
            for v in elements[1:]:
                total = combine(total, v)
            part.append(total)
        while len(part) > 1:
            h = len(part) // 2
            part = [combine(part[g], part[g + h]) for g in range(h)]
        values.append(part[0])
    total = values[0]
    for v in values[1:]:
        total = combine(total, v)
    return total


_STMT = {
    ir.OneThread: _Blocks.one_thread, ir.For: _Blocks.for_, ir.If: _Blocks.if_,
    ir.MbarrierInit: _Blocks.mbarrier_init, ir.ArriveExpectTx: _Blocks.arrive_expect_tx,
    ir.MbarrierWait: _Blocks.mbarrier_wait, ir.FlipPhase: _Blocks.flip_phase, ir.RingAdvance: _Blocks.ring_advance,
    ir.TmaLoad: _Blocks.tma_load, ir.TmaStore: _Blocks.tma_store, ir.StoreTail: _Blocks.store_tail,
    ir.ProxyFence: _Blocks.nothing, ir.SyncThreads: _Blocks.nothing, ir.BulkCommit: _Blocks.nothing,
    ir.BulkWait: _Blocks.nothing,
    ir.Fill: _Blocks.fill, ir.ThreadCopy: _Blocks.thread_copy, ir.Parallel: _Blocks.parallel,
    ir.Assign: _Blocks.assign, ir.Gemm: _Blocks.gemm, ir.MbarrierArrive: _Blocks.mbarrier_arrive,
    ir.WgmmaWait: _Blocks.nothing, ir.Reduce: _Blocks.reduce, ir.Specialized: _Blocks.specialized,
    ir.Let: _Blocks.let, ir.PartialStore: _Blocks.partial_store, ir.PartialAdd: _Blocks.partial_add,
}
