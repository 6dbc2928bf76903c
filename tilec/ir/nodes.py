"""IR node types: small frozen dataclasses, each with the span of its source text.

Expressions are trees of `Expr`; statements form structured blocks (tuples).
Passes build new nodes with `dataclasses.replace` instead of mutating."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..errors import Span

SPAN = field(default=None, compare=False, repr=False)


# ---------------------------------------------------------------- dtypes

@dataclass(frozen=True)
class DType:
    name: str       # the tilec spelling: f16, bf16, ...
    size: int       # bytes
    ctype: str      # CUDA C++ type under NVRTC (no headers)
    numpy: str      # numpy dtype name ('' when numpy has none)
    tmap: str       # CUtensorMapDataType enum suffix
    is_float: bool


DTYPES = {d.name: d for d in [
    DType("f16", 2, "__half", "float16", "FLOAT16", True),
    DType("bf16", 2, "__nv_bfloat16", "bfloat16", "BFLOAT16", True),
    DType("f32", 4, "float", "float32", "FLOAT32", True),
    DType("f64", 8, "double", "float64", "FLOAT64", True),
    DType("i8", 1, "signed char", "int8", "UINT8", False),
    DType("u8", 1, "unsigned char", "uint8", "UINT8", False),
    DType("i16", 2, "short", "int16", "UINT16", False),
    DType("u16", 2, "unsigned short", "uint16", "UINT16", False),
    DType("i32", 4, "int", "int32", "INT32", False),
    DType("u32", 4, "unsigned int", "uint32", "UINT32", False),
    DType("i64", 8, "long long", "int64", "INT64", False),
    DType("u64", 8, "unsigned long long", "uint64", "UINT64", False),
    DType("f8e4m3", 1, "__nv_fp8_e4m3", "float8_e4m3fn", "UINT8", True),
    DType("f8e5m2", 1, "__nv_fp8_e5m2", "float8_e5m2", "UINT8", True),
]}


# ---------------------------------------------------------------- expressions

class Expr:
    span: Optional[Span]


@dataclass(frozen=True)
class Int(Expr):
    value: int
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Float(Expr):
    value: float
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Var(Expr):
    """A name. `kind` is filled in by name resolution:
    symbol (shape symbol bound at launch), scalar (scalar parameter), block
    (block index), loop (for variable), lane (parallel variable), let, const."""
    name: str
    kind: str = ""
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class BinOp(Expr):
    op: str
    lhs: Expr
    rhs: Expr
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class UnaryOp(Expr):
    op: str
    operand: Expr
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Call(Expr):
    func: str
    args: tuple
    kwargs: tuple = ()          # ((name, Expr), ...)
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Cast(Expr):
    dtype: DType
    value: Expr
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class TupleExpr(Expr):
    items: tuple
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Slice(Expr):
    """`start : stop` inside a region subscript."""
    start: Expr
    stop: Expr
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Subscript(Expr):
    """`name[i, j]`: an element of a tile in an expression, or a region in a copy."""
    name: str
    indices: tuple
    span: Optional[Span] = SPAN


# ---------------------------------------------------------------- declarations

@dataclass(frozen=True)
class TensorParam:
    name: str
    dtype: DType
    shape: tuple            # of Expr, outermost first
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class ScalarParam:
    name: str
    dtype: DType
    span: Optional[Span] = SPAN


# swizzled shared layouts (gemm operands) -> bytes per row of a column chunk
SWIZZLED = {"sw128": 128, "sw64": 64, "sw32": 32, "sw16": 16}


@dataclass(frozen=True)
class Buffer:
    """A block-wide tile: scope 'shared' (shared memory) or 'local' (registers).

    layout: 'row' (shared: row-major; local: element e of the flattened tile in
    thread e % threads), 'sw128' / 'sw64' / 'sw32' (shared, a gemm operand:
    column chunks whose rows are 128 / 64 / 32 bytes, in TMA's swizzle of that
    size, what wgmma descriptors read; 'sw16': chunks of 16-byte rows, not
    swizzled, wgmma's interleaved layout, where a chunk of 32 bytes does not fit:
    im2col filter taps of 16 or 48 bytes, a warpgroup's 8 or 24 M/N-major
    columns), 'wgmma' (local, a gemm accumulator:
    wgmma's m64nNk16 fragment layout; `wg_cols` warpgroups split its columns),
    'cols' (shared: column chunks of `chunk` elements, each chunk row-major: a
    K tile of an im2col view that spans several filter taps, one TMA load each),
    'rows' (local, 1-D: an accumulator's rows, element i on the 4 lanes of the
    quad whose fragments hold row i, in each of the `wg_cols` warpgroups over N, the
    same value on each: row_slots)."""
    name: str
    scope: str
    dtype: DType
    shape: tuple            # of int after const folding
    smem_offset: Optional[int] = None
    layout: str = "row"
    stages: int = 1         # copies in a pipelined loop's ring (shared)
    chunk: int = 0          # 'cols': elements per column chunk
    alias: str = ""         # placed over this tile's memory (used only after its last use)
    wg_cols: int = 1        # 'wgmma', 'rows': warpgroups side by side over the columns
    transposed: bool = False  # 'wgmma': the fragments hold acc^T (a gemm with its operands swapped)
    row_groups: tuple = ()  # shared, swizzled: position p holds the tile's 8-row group row_groups[p] (the
                            # weights of a patch gemm whose K pairs are not in K order); (): in order
    phases: int = 1         # sw16 patch [PH, PW, C] of a stride-S im2col view: pixel column j in phase j % S
    overrun: int = 0        # shared: bytes past its last copy that wgmma reads (an unevenly split gemm's last
                            # warpgroup: columns past N; a tile's rows padded to m64 tiles: rows past M), into
                            # fragment registers nothing uses
    fragment_rows: int = 0  # 'wgmma', 'rows': the rows wgmma computes where neither the tile's M nor its N is a
                            # multiple of 64 (M, or N of a transposed tile, padded to m64 tiles; the rows past
                            # it hold no element); 0: the product's own
    span: Optional[Span] = SPAN

    @property
    def product_shape(self) -> tuple:
        """'wgmma': the tile as the product wgmma computes it: [N, M] for a transposed
        accumulator (its fragments hold acc^T), else its shape."""
        return tuple(reversed(self.shape)) if self.transposed else tuple(self.shape)

    @property
    def fragment_shape(self) -> tuple:
        """'wgmma': the shape the fragments hold: product_shape, its rows padded to
        `fragment_rows` where they are."""
        rows, *rest = self.product_shape
        return (self.fragment_rows or rows, *rest)

    @property
    def row_positions(self) -> tuple:
        """Where each 8-row group of a tile with `row_groups` lies: position of group g."""
        return tuple(sorted(range(len(self.row_groups)), key=self.row_groups.__getitem__))

    @property
    def swizzle(self) -> int:
        """Bytes per row of a swizzled layout's column chunk (0: not swizzled)."""
        return SWIZZLED.get(self.layout, 0)

    @property
    def tma_swizzle(self) -> str:
        """The swizzle of the TMA loads that fill this layout's chunks."""
        return f"{self.swizzle}B" if self.swizzle > 16 else "none"

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def chunk_rows(self) -> int:
        """Rows of a column chunk of a chunked layout: the tile's leading dimensions as
        one; a swizzled im2col patch ([PH, PW, C], rank 3) pads them to whole 8-row
        groups, so that each chunk starts 128-byte aligned, as its TMA load needs;
        with `phases` S, a chunk is one phase's PH x ceil(PW / S) pixels."""
        rows = self.elements // self.shape[-1]
        if self.phases > 1:
            rows = self.shape[0] * self.phase_width
        return -(-rows // 8) * 8 if self.swizzle and len(self.shape) > 2 else rows

    @property
    def phase_width(self) -> int:
        """A patch's pixels a row in each column phase: ceil(PW / phases)."""
        return -(-self.shape[1] // self.phases)

    @property
    def bytes(self) -> int:
        if self.swizzle and len(self.shape) > 2:
            return self.phases * self.chunk_rows * self.shape[-1] * self.dtype.size
        return self.elements * self.dtype.size

    @property
    def stage_bytes(self) -> int:
        """Distance between the copies of a pipelined tile (keeps each aligned)."""
        align = 1024 if self.swizzle else 128
        return -(-self.bytes // align) * align

    @property
    def ring_bytes(self) -> int:
        """Shared memory that all `stages` copies of the tile span (and the bytes past
        them that a wgmma reads: `overrun`)."""
        return self.stage_bytes * (self.stages - 1) + self.bytes + self.overrun


@dataclass(frozen=True)
class Require:
    cond: Expr
    text: str
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class TuneWhere:
    """`tune ... where COND;`: which candidates a tune compiles and times for a
    call's key values. `text` is COND as written, its whitespace collapsed."""
    cond: Expr
    text: str
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Im2colView:
    """`let Xc = im2col(X, kernel = ..., stride = ..., pad = ..., dilation = ...)`:
    the [N * OH * OW, KH * KW * C] implicit-GEMM matrix of channels-last X.
    Per-spatial-dim tuples are outermost first, like the source."""
    name: str
    tensor: str
    kernel: tuple
    stride: tuple
    pad: tuple
    dilation: tuple
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class TensorMap:
    """One CUtensorMap the host encodes and passes as a __grid_constant__ parameter.
    Tuples are outermost first, like the source (the driver wants them reversed)."""
    name: str
    tensor: str
    kind: str               # 'tiled' | 'im2col'
    box: tuple              # tiled: the box; im2col: (pixels_per_column, channels_per_pixel)
    element_strides: tuple
    swizzle: str            # none | 32B | 64B | 128B
    l2_promotion: str       # none | 64B | 128B | 256B
    lower_corner: tuple = ()    # im2col: per spatial dim
    upper_corner: tuple = ()
    inner_rounded: bool = False  # a store map: the innermost globalDim is the tensor's rounded
                                 # down to whole 16-byte granules (TMA stores clip at granules)
    span: Optional[Span] = SPAN

    def box_bytes(self, dtype: DType) -> int:
        if self.kind == "im2col":
            return self.box[0] * self.box[1] * dtype.size
        n = dtype.size
        for b, s in zip(self.box, self.element_strides):
            n *= -(-b // s)
        return n


@dataclass(frozen=True)
class Mbarrier:
    """completes: 'tx' (a phase completes when the bytes its arrive.expect_tx
    announced have landed: TMA loads) or 'arrivals' (when `arrivals` threads
    have arrived: consumers releasing a pipeline stage)."""
    name: str
    arrivals: int
    in_loop: bool           # phase kept in a register and flipped after each wait
    count: int = 1          # barriers in the array (one per pipeline stage)
    array: bool = False     # declared as an array, indexed by stage
    completes: str = "tx"
    span: Optional[Span] = SPAN
    releases: tuple = ()    # 'arrivals': the tiles whose stage an arrive releases (its ring's; () for any)


# ---------------------------------------------------------------- statements

class Stmt:
    span: Optional[Span]


@dataclass(frozen=True)
class Region:
    """`A[i0, i1]` or `A[i0 : i0 + 64, ...]`, or a bare tile name (whole tile)."""
    name: str
    starts: tuple           # of Expr, one per dim of the named tensor/tile
    extents: tuple          # of Expr or None (None: from the other side of the copy)
    span: Optional[Span] = SPAN


def split_box(region: Region, rank: int) -> tuple:
    """A tensor region's extents where they split the first dimension of a tile of
    `rank` over several tensor dimensions (`Y[n, h : h + 16, w : w + 8, 0 : F]` of a
    [128, F] tile: rows 8i..8i + 7 of the tile are row h + i, columns w.. of the
    tensor); () where the region fills the innermost dimensions. Check-types allows
    only exact splits (its _split_rows), so a split is an extent past 1 before the
    tile's own dimensions (extents not integers, or none at all, count as 1)."""
    box = tuple(x.value if isinstance(x, Int) else 1 for x in region.extents)
    return box if any(e > 1 for e in box[:len(box) - rank]) else ()


@dataclass(frozen=True)
class Copy(Stmt):
    src: Region
    dst: Region
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Fill(Stmt):
    buffer: str
    value: Expr
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Gemm(Stmt):
    """acc += a @ b (a is [M, K], or [K, M] with transpose_a; b is [K, N], or
    [N, K] with transpose_b) on wgmma; after plan-gemm, `warpgroups`
    warpgroups, `wg_cols` of them side by side over N, each own `m_tiles` m64
    row tiles of N / wg_cols columns. `swapped`: M is not a multiple of 64, so
    wgmma computes acc^T += b^T @ a^T (b on its 64-row side, a's M as its N);
    then `warpgroups`, `wg_cols` and `m_tiles` describe that product. `zero`:
    acc = a @ b, its old value ignored (plan-gemm folds a `fill(acc, 0)` just
    before the gemm into it: the first wgmma of each row tile does not read acc).
    `a_in_registers`: a is a local tile, wgmma's A from registers (its fragments
    laid out as an [M, K] accumulator's are). `tf32`: f32 operands, which the
    tensor cores read as tf32 (`tf32 = true` in the source says so)."""
    a: str
    b: str
    acc: str
    transpose_b: bool
    warpgroups: int = 0
    m_tiles: int = 0
    transpose_a: bool = False
    tf32: bool = False
    wg_cols: int = 1
    swapped: bool = False
    zero: bool = False
    a_in_registers: bool = False
    stage: Optional[Expr] = None          # pipelined: which copy of a and b
    patch: tuple = ()                     # (KH, KW): a is `im2col(a, kernel = (KH, KW), stride = S)` of the
                                          # shared patch a [PH, PW, C]: rows its ((PH - KH) / S + 1) x ((PW -
                                          # KW) / S + 1) output pixels, columns (kh, kw, c), zeros past
                                          # KH * KW * C (patch_zeros)
    patch_stride: int = 1                 # S
    zeros: str = ""                       # plan-gemm: the zero tile those columns read, where there are any
    span: Optional[Span] = SPAN


def patch_item_offset(patch: Buffer, kernel: tuple, item: int) -> int:
    """Where item `item` of the K of an im2col view of shared patch `patch` [PH, PW, C]
    (filter `kernel`) starts, in bytes from the patch's first pixel: in K order,
    filter tap item / (C / 8), channels 8 * (item % (C / 8)) .. + 8, in the patch's
    layout (sw16: per 8 channels and column phase q < S, a chunk of chunk_rows
    pixels, 16 bytes each: pixel (i, j) of phase j % S at i * ceil(PW / S) + j / S)."""
    tap, chunk = divmod(item, patch.shape[2] // 8)
    kh, kw = divmod(tap, kernel[1])
    s = patch.phases
    return ((chunk * s + kw % s) * patch.chunk_rows + kh * patch.phase_width + kw // s) * 16


def patch_zeros(tile: str) -> str:
    """The zero-filled shared tile placed after patch `tile` that a gemm on its
    im2col view reads for the view's columns past its filter taps."""
    return f"tl_{tile}_zeros"


@dataclass(frozen=True)
class Reduce(Stmt):
    """`reduce(s, acc, axis = A, op = sum | max | min)`: acc[i] = op over row i of the
    2-D shared tile `src` (axis 1) or over its column i (axis 0), from the first
    element on, into the 1-D tile `dst` (assigned, not accumulated). The spans
    of the two arguments point errors at them."""
    src: str
    dst: str
    axis: int
    op: str                 # 'sum' | 'max' | 'min'
    src_span: Optional[Span] = field(default=None, compare=False, repr=False)
    dst_span: Optional[Span] = field(default=None, compare=False, repr=False)
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Assign(Stmt):
    buffer: str
    indices: tuple
    value: Expr
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Parallel(Stmt):
    vars: tuple             # names
    extents: tuple          # of Expr (ints after folding)
    body: tuple
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class For(Stmt):
    var: str
    extent: Expr
    stages: Optional[int]   # None: range(n); else pipelined(n, stages=S)
    body: tuple
    ring: bool = False      # plan-pipeline: its loads and gemms run on an S-stage TMA ring
    rotate: bool = False    # plan-pipeline: another body whose loaded tiles get S copies (stage_tile),
                            # used in turn, the loads S - 1 iterations ahead (insert-barriers)
    producer: object = 0    # pipelined(..., producer = 1): a producer warpgroup of its own issues the
                            # ring's loads (warp specialisation); an Expr until fold-consts, then 0 or 1
    span: Optional[Span] = SPAN
    start: Optional[Expr] = None    # range(start, stop[, step]) (`extent` is stop) until lower-ranges makes
    step: Optional[Expr] = None     # it a loop from 0 (None: 0 and 1, range(n))


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: tuple
    orelse: tuple
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Let(Stmt):
    """`const int name = value;`: a scalar the statements after it (in its block
    and the blocks nested there) read by name, as a Var of kind "let". `wide`:
    a 64-bit value (a product that may pass 2^31). make-persistent binds its
    stream-K schedule's per-block and per-unit numbers with these."""
    name: str
    value: Expr
    wide: bool = False
    index: bool = False     # make-persistent's tile, block and K-step numbers: never negative
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class PartialStore(Stmt):
    """Stream-K: this block computed only some of a tile's K steps. Each consumer
    thread writes its fragment registers of the accumulators `buffers` to the
    block's slot `slot` of the launch's workspace (f32, coalesced); then the
    block marks the slot ready (a release at GPU scope) for the block that
    finishes the tile."""
    buffers: tuple
    slot: Expr
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class PartialAdd(Stmt):
    """Stream-K: wait until slot `slot` of the workspace is ready (an acquire at
    GPU scope), mark it free again, and add the partial sums it holds to the
    accumulators `buffers`, register by register."""
    buffers: tuple
    slot: Expr
    span: Optional[Span] = SPAN


# ---- after lower_copies

@dataclass(frozen=True)
class TmaLoad(Stmt):
    """global -> shared, cp.async.bulk.tensor .tile (or .im2col when `view` names
    an im2col view); completes on `barrier`."""
    tensor: str
    buffer: str
    coords: tuple           # of Expr, outermost first: the region's starts; for im2col,
                            # (n, spatial window origins..., channel) after plan-tma
    tensor_map: str = ""
    barrier: str = ""
    bytes: int = 0
    view: str = ""          # im2col: the view copied from
    origin: tuple = ()      # im2col: the view coordinates (m0, k0)
    offsets: tuple = ()     # im2col: the filter tap's offsets, outermost first
    smem_offset: int = 0    # bytes into the tile (a chunk of a swizzled tile)
    box: tuple = ()          # the region's extents where they split the tile's rows (split_box)
    stage: Optional[Expr] = None          # pipelined: which copy of the tile
    barrier_index: Optional[Expr] = None  # pipelined: which barrier of the array
    zeros_if: Optional[Expr] = None       # im2col: where this holds (the load's columns lie past the
                                          # view's last), the same bytes are copies of ZEROS instead
                                          # (cp.async.bulk global -> shared, on the same barrier)
    span: Optional[Span] = SPAN


# The kernel module's global array of ZERO_BYTES zero bytes that an im2col load's
# columns past the view's end are copied from (TmaLoad.zeros_if), in copies of at
# most ZERO_BYTES each.
ZEROS = "tl_zeros"
ZERO_BYTES = 2048


@dataclass(frozen=True)
class TmaStore(Stmt):
    """shared -> global, cp.async.bulk.tensor .tile .bulk_group."""
    buffer: str
    tensor: str
    coords: tuple
    tensor_map: str = ""
    smem_offset: int = 0    # bytes into the tile (a column chunk of a 'cols' tile)
    box: tuple = ()          # the region's extents where they split the tile's rows (split_box)
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class StoreTail(Stmt):
    """The partner of a TMA store into a tensor whose rows may end inside a 16-byte
    granule: TMA stores clip at granules, not elements, so the store's map stops at
    the last whole granule, and here the threads of a block whose tile crosses it
    write the columns from there to the row's end (a block barrier before and after,
    in those blocks only). `coords` and `shape` are the whole store's."""
    buffer: str
    tensor: str
    coords: tuple
    shape: tuple            # of int: the tile's shape
    chunk: int = 0          # an epilogue staged in column chunks: this one's place among them; as the
    chunks: int = 1         # chunks lie side by side, the tail crosses one of them at most
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class ThreadCopy(Stmt):
    """An element-wise copy done by all threads of the block; global sides are
    bounds-checked (outside reads give zero, outside writes are dropped)."""
    src: Region
    dst: Region
    shape: tuple            # of int: the tile shape that moves
    span: Optional[Span] = SPAN


# ---- after insert_barriers

@dataclass(frozen=True)
class MbarrierInit(Stmt):
    barriers: tuple         # of Mbarrier
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class ArriveExpectTx(Stmt):
    barrier: str
    bytes: int
    index: Optional[Expr] = None
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class MbarrierWait(Stmt):
    barrier: str
    parity: object          # int, an Expr (pipelines), or None: the barrier's phase register
    index: Optional[Expr] = None
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class MbarrierArrive(Stmt):
    """One thread per warpgroup arrives (a consumer releasing a pipeline stage)."""
    barrier: str
    index: Optional[Expr] = None
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class WgmmaWait(Stmt):
    """wgmma.wait_group: at most `pending` committed wgmma groups still in flight;
    `accs`: the accumulators of the groups it retires (where some stay in flight)."""
    pending: int
    accs: tuple = ()
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class FlipPhase(Stmt):
    barrier: str
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class RingAdvance(Stmt):
    """A pipelined loop inside another loop: its ring's stages and phases go on
    where the previous trip left them. `var` (a block-uniform count, 0 at the
    kernel's start) is the number of ring iterations earlier trips ran; this
    adds the loop's trip count `by` to it."""
    var: str
    by: Expr
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class ProxyFence(Stmt):
    """fence.proxy.async.shared::cta: generic-proxy smem writes become visible to TMA
    (`space` 'global': fence.proxy.async.global, the same for global memory)."""
    span: Optional[Span] = SPAN
    space: str = "shared"


@dataclass(frozen=True)
class SyncThreads(Stmt):
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class BulkCommit(Stmt):
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class BulkWait(Stmt):
    """cp.async.bulk.wait_group[.read] N: earlier TMA stores, all but the last
    `pending` bulk groups, have read their smem (`read=True`) or completed."""
    read: bool
    pending: int = 0
    span: Optional[Span] = SPAN


@dataclass(frozen=True)
class Specialized(Stmt):
    """Warp specialisation (a ring of `pipelined(..., producer = 1)`): the block
    has a producer warpgroup of its own, threads `threads` .. `threads + 127`
    after the kernel's `threads` consumers. One thread of it runs `producer`
    (the loops around the ring, the ring's empty waits, expect-tx and TMA
    loads); the consumers run `consumers` (everything else; their block
    barriers are a named barrier of the consumers alone). The two run
    concurrently and meet only at the ring's mbarriers. Each warpgroup first
    moves registers with setmaxnreg: the producer down to `producer_regs`, the
    consumers up to `consumer_regs` per thread."""
    producer: tuple
    consumers: tuple
    producer_regs: int
    consumer_regs: int
    blocks_per_sm: int = 1  # plan-smem: the blocks an SM can hold (launch bounds; the registers above assume it)
    span: Optional[Span] = SPAN


PRODUCER_THREADS = 128      # the producer warpgroup a Specialized block adds to the kernel's threads


def specialized_registers(threads: int, blocks_per_sm: int = 1) -> tuple:
    """(producer, consumer) registers per thread after setmaxnreg, for `threads`
    consumers beside the producer warpgroup. ptxas gives every thread the
    launch bound's limit at entry (it does so for kernels with setmaxnreg): the
    CTA's pool. The producer (loop counters, coordinates) keeps 40, or 32 beside
    three consumer warpgroups (as FlashAttention-3 does); the consumers share
    the rest (setmaxnreg.inc takes no more than the pool holds, or it would wait
    forever), in steps of 8, at most 240."""
    block = threads + PRODUCER_THREADS
    entry = thread_registers(block * blocks_per_sm)
    producer = min(entry, 40 if threads <= 256 else 32)
    return producer, min(240, (entry * block - producer * PRODUCER_THREADS) // threads // 8 * 8)


def thread_registers(threads: int, producer: bool = False) -> int:
    """Registers a consumer thread's code can use: ptxas's limit for the block
    (64K per SM over its threads, the producer warpgroup's included, in steps of
    8, at most 255). ptxas compiles the whole kernel within it: setmaxnreg.inc
    moves registers at run time but does not raise that limit (measured: C7602
    asks for 154 registers with 128 at 512 threads, setmaxnreg.inc 160 or not)."""
    block = threads + (PRODUCER_THREADS if producer else 0)
    return min(255, 65536 // block // 8 * 8)


@dataclass(frozen=True)
class ReduceSpread:
    """How reduce `s` spreads over the block's threads (ir.reduce_spread; codegen/
    cuda.py's reduce and plan-smem follow it). Each result is walked by `lanes`
    threads, each its own elements in order (of a shared tile: lane g takes
    elements g, g + lanes, g + 2 * lanes, ...; of a local tile: those it holds,
    ir.reduce_lanes); then the lanes combine in halves within groups of
    `per_warp` (one warp's: lane g takes lane g + h's for h = per_warp / 2, ...,
    1, warp shuffles), then the groups' values in order, the first group's first
    (through shared memory). `local` is '' for a shared tile, else how a local
    tile's rows lie over the threads: 'along' (each row's elements on every
    thread, or a column on one) or 'across' (a slot of every thread holds a
    piece of several rows), local_reduce_spread; 'wgmma rows' or 'wgmma
    columns' (the fragments' rows or columns), fragment_reduce_spread."""
    lanes: int
    per_warp: int
    local: str = ""

    @property
    def groups(self) -> int:
        return self.lanes // self.per_warp


def reduce_spread(k: "Kernel", s: Reduce) -> ReduceSpread:
    """A shared tile: `lanes` threads per result, a power of two, at most threads
    // results and at most the elements of a row or column it walks (each
    thread has one at least), only where the result tile is shared (the group's
    first thread writes it; a local result's element lives on thread e % threads,
    outside the group), else 1. A local tile: where its elements already are
    (local_reduce_spread, fragment_reduce_spread). `threads` is a multiple of 32
    (check-types), so every warp of the block takes part in the shuffles whole."""
    src, acc = k.buffer(s.src), k.buffer(s.dst)
    if src.scope == "local" and src.layout == "wgmma":
        return fragment_reduce_spread(src, k.threads.value, s.axis)
    if src.scope == "local":
        spread = local_reduce_spread(k.threads.value, src.shape, s.axis)
        assert spread is not None, "plan-gemm admits only local tiles that spread evenly"
        return spread
    if acc.scope != "shared":
        return ReduceSpread(1, 1)
    limit = min(k.threads.value // acc.elements, src.shape[s.axis])
    lanes = 1 << (limit.bit_length() - 1) if limit >= 1 else 1
    return ReduceSpread(lanes, min(lanes, 32))


def local_reduce_spread(threads: int, shape, axis: int) -> Optional[ReduceSpread]:
    """A local tile [M, N] holds element (i, j) on thread (i * N + j) % threads
    (§5), so where N is a multiple of the threads T, thread t holds columns t, t
    + T, ... of every row ('along': a row's lanes are all T threads, a column's
    one thread), and where T is a multiple of N, slot s of thread t holds element
    t % N of row s * T / N + t / N ('across': a row's lanes are the N threads of
    one slot, a column's the T / N threads t % N == j, in order of t). `across`
    also needs every thread to hold as many elements (M * N a multiple of T) and
    N a divisor of 32 or a multiple of it, so that lanes never straddle warps
    unevenly. None where the tile spreads any other way."""
    m, n = shape
    if n % threads == 0:
        return ReduceSpread(threads, 32, "along") if axis == 1 else ReduceSpread(1, 1, "along")
    if threads % n or (m * n) % threads or (32 % n and n % 32):
        return None
    if axis == 1:
        return ReduceSpread(n, min(n, 32), "across")
    return ReduceSpread(threads // n, max(32 // n, 1), "across")


def split_width(n: int, wg_cols: int) -> int:
    """The columns each of `wg_cols` warpgroups side by side over N computes: N /
    wg_cols rounded up to a multiple of 8 (wgmma's n steps). Where that does not
    divide N evenly (N = 24 over 2: 16 and 8), the last warpgroup's wgmmas are as
    wide as the others' and read past the operand's N columns (its `overrun`), into
    fragment registers past N that nothing uses; it owns split_last columns."""
    return (-(-n // wg_cols) + 7) // 8 * 8 if wg_cols > 1 else n


def split_last(n: int, wg_cols: int) -> int:
    """The columns of the last of `wg_cols` warpgroups over N (split_width)."""
    return n - (wg_cols - 1) * split_width(n, wg_cols)


def fragment_tiles(acc: "Buffer", threads: int) -> tuple:
    """(m64 tiles, columns) of the accumulator (of acc^T if transposed) that one
    warpgroup holds in wgmma's fragments: `threads / 128` warpgroups, `wg_cols`
    of them side by side over N, each split_width(N) columns wide."""
    rows = threads // 128 // acc.wg_cols
    m, n = acc.fragment_shape
    return m // (64 * rows), split_width(n, acc.wg_cols)


def fragment_regs(b: "Buffer", threads: int) -> int:
    """Registers a thread holds of a 'wgmma' tile: 2 x 2 elements per 8 columns of
    each m64 tile of its warpgroup (elements / threads, unless the warpgroups over N
    split it unevenly: then the last one's registers past N hold no element)."""
    mt, nw = fragment_tiles(b, threads)
    return mt * nw // 2


def uneven_split(b: "Buffer") -> bool:
    """Whether the warpgroups over N split 'wgmma' tile `b`'s columns (of the
    product wgmma computes) unevenly: then a register may hold no element."""
    n = b.fragment_shape[1]
    return split_width(n, b.wg_cols) * b.wg_cols != n


def padded_rows(b: "Buffer") -> bool:
    """Whether the fragments of 'wgmma' or 'rows' tile `b` hold rows past the
    product's (`fragment_rows`: its rows padded to m64 tiles), registers that hold
    no element."""
    return b.fragment_rows > 0 and b.fragment_rows > b.product_shape[0]   # (0 before plan-gemm: symbols)


def row_slots(b: "Buffer", threads: int) -> int:
    """Registers a thread holds of a 'rows' tile of M elements: 2 rows (l / 4 and l / 4
    + 8 of its warp's 16) per m64 tile of its warpgroup's M / (warpgroups / wg_cols) rows
    (M padded to m64 tiles: `fragment_rows`)."""
    return 2 * (b.fragment_rows or b.shape[0]) // (64 * (threads // 128 // b.wg_cols))


def fragment_element(acc: "Buffer", threads: int, t: int, r: int) -> tuple:
    """The element (i, j) of a 'wgmma' tile that register r of thread t holds (codegen's
    fragment_index): warpgroup g owns fragment rows (g / wg_cols) * 64 * m_tiles..
    and columns (g % wg_cols) * nw.., m64 tile r / (nw / 2), warp w 16 of its rows,
    lane l row l / 4 (+ 8 for registers 2, 3 of each 4) and columns (l % 4) * 2 +
    r % 2 of each 8-column group r % (nw / 2) / 4; (j, i) for acc^T's fragments."""
    mt, nw = fragment_tiles(acc, threads)
    g = t // 128
    row = g // acc.wg_cols * 64 * mt + r // (nw // 2) * 64 + t % 128 // 32 * 16 + t % 32 // 4 + r % 4 // 2 * 8
    col = g % acc.wg_cols * nw + r % (nw // 2) // 4 * 8 + t % 4 * 2 + r % 2
    return (col, row) if acc.transposed else (row, col)


def fragment_reduce_spread(acc: "Buffer", threads: int, axis: int) -> ReduceSpread:
    """A reduce of a 'wgmma' tile where its fragments are: a fragment row is on the 4
    lanes of a quad in each of the wg_cols warpgroups over N (4 lanes a warp); a
    fragment column on 8 lanes (4 apart) of every warp of the warpgroups over M.
    Which one a reduce walks: rows of the tile (axis 1) are fragment rows unless the
    fragments hold acc^T."""
    rows = threads // 128 // acc.wg_cols
    if (axis == 1) != acc.transposed:
        return ReduceSpread(4 * acc.wg_cols, 4, "wgmma rows")
    return ReduceSpread(32 * rows, 8, "wgmma columns")


def tile_owners(b: "Buffer", threads: int) -> list:
    """owners[i][j]: the thread that holds element (i, j) of local tile `b` (§5's e %
    threads, or wgmma's fragments)."""
    m, n = b.shape
    if b.layout != "wgmma":
        return [[(i * n + j) % threads for j in range(n)] for i in range(m)]
    owners = [[0] * n for _ in range(m)]
    for t in range(threads):
        for r in range(fragment_regs(b, threads)):
            i, j = fragment_element(b, threads, t, r)
            if i < m and j < n:             # else a padding register (an uneven split, rows padded to m64)
                owners[i][j] = t
    return owners


def reduce_lanes(k: "Kernel", s: Reduce) -> list:
    """For a reduce of a local tile: [result][warp] -> the positions along the reduced
    axis that each of the warp's threads holding part of the result has, threads in
    increasing order, positions increasing (each lane walks its elements in that
    order; a warp's lanes then combine in halves, the warps in order: the order
    codegen's reduce_local takes, which the interpreter follows)."""
    src = k.buffer(s.src)
    owners = tile_owners(src, k.threads.value)
    results, walk = (src.shape[0], src.shape[1]) if s.axis == 1 else (src.shape[1], src.shape[0])
    out = []
    for r in range(results):
        held = {}
        for p in range(walk):
            held.setdefault(owners[r][p] if s.axis == 1 else owners[p][r], []).append(p)
        warps = {}
        for t in sorted(held):
            warps.setdefault(t // 32, []).append(tuple(held[t]))
        out.append([warps[w] for w in sorted(warps)])
    return out


def reduce_slots(k: "Kernel", s: Reduce) -> int:
    """The 8-byte slots of REDUCE_WARPS that reduce `s` uses: a shared tile's
    groups of several warps, one slot a warp of the block; a local tile's, one a
    group of each result, where the groups' values meet in shared memory (or the
    lane that holds a result is not the thread that writes it: a local result
    anywhere but a column 'along'); else 0."""
    spread, acc = reduce_spread(k, s), k.buffer(s.dst)
    if not spread.local:
        return k.threads.value // 32 if spread.groups > 1 else 0
    if spread.lanes == 1 or (spread.groups == 1 and (acc.scope == "shared" or acc.layout == "rows")):
        return 0
    src = k.buffer(s.src)       # rows padded to m64 tiles: a slot for each (their values unread), no test
    rows = padded_rows(src) and (s.axis == 1) != src.transposed
    return (src.fragment_rows if rows else acc.elements) * spread.groups


# the shared tile where the warps of a reduce's lane group leave their values
# (plan-smem adds it where some reduce has more than 32 lanes): one 8-byte slot a warp
REDUCE_WARPS = "tl_reduce_warps"


def stage_tile(name: str, stage: int) -> str:
    """The copy `stage` of a tile a rotating pipelined loop loads (For.rotate):
    copy 0 is the tile itself."""
    return name if stage == 0 else f"tl_{name}_stage{stage}"


@dataclass(frozen=True)
class OneThread(Stmt):
    """A block executed by thread 0 only (TMA issue, expect-tx, store commit)."""
    body: tuple
    span: Optional[Span] = SPAN


def granule_elements(dt: DType) -> int:
    """Elements in one 16-byte granule, the unit a TMA store writes per row."""
    return max(1, 16 // dt.size)


def rows_in_whole_granules(t: TensorParam) -> bool:
    """Whether every row of `t` ends on a 16-byte granule for any argument: its
    innermost extent is a literal multiple of the granule. Else its TMA stores
    need a rounded map and a StoreTail."""
    inner = t.shape[-1]
    return isinstance(inner, Int) and inner.value % granule_elements(t.dtype) == 0


# ---------------------------------------------------------------- the kernel

@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple               # TensorParam | ScalarParam
    consts: tuple               # ((name, int), ...) in declaration order
    lets: tuple                 # ((name, Expr), ...)
    requires: tuple             # Require
    grid_vars: tuple            # names bound to blockIdx.x, .y, .z
    grid: tuple                 # of Expr
    threads: Optional[Expr]
    buffers: tuple              # Buffer
    body: tuple
    tensor_maps: tuple = ()
    barriers: tuple = ()
    smem_bytes: int = 0
    views: tuple = ()           # Im2colView
    span: Optional[Span] = SPAN
    tune: tuple = ()            # the tune statement: ((const name, (value, ...)), ...) as written
    tune_where: Optional[TuneWhere] = None   # its `where` condition (the tune evaluates it)
    persistent: object = 0      # grid (...) = (...), persistent = 1: the launch keeps only the blocks
                                # the GPU holds at once, each looping over the tiles (make-persistent);
                                # an Expr until fold-consts, then 0 or 1
    stream_k: object = 0        # grid ..., persistent = 1, stream_k = 1: the tiles of the last, partial
                                # wave split their K steps over all blocks (make-persistent); the launch
                                # then needs a workspace (kernel param tl_workspace)
    group: object = 1           # grid ..., group = G: tiles numbered in groups of G rows of the second
                                # grid index, the first one fastest inside a group (make-persistent)
    in_place: tuple = ()        # mark-in-place: ((written tensor, read tensor), None or why not), ...): may the
                                # launch pass one tensor as both (runtime.host.Call.check_overlaps)
    rereads: tuple = ()         # mark-in-place: the tensors the kernel may read after writing them (not
                                # in place with itself): insert-barriers orders those reads
    check_notes: tuple = ()     # what check-barriers left unchecked (paths past its limit), as messages:
                                # tilec.CheckIncompleteWarning at every compile, disk-cache hits included
    pipeline_notes: tuple = ()  # plan-pipeline: the pipelined loops (2 or more stages) that run as plain loops,
                                # and why, as messages: tilec.PipelineWarning at every compile, disk-cache hits
                                # included
    fixed: tuple = ()           # fold-consts: ((shape symbol, int), ...) fixed at compile time by an override
                                # (tilec.compile(src, C=24), -D C=24, or a launch that needs it: runtime.host),
                                # their values in every shape and expression since

    @property
    def fixed_text(self) -> str:
        """The fixed shape symbols as messages and generated files say them: "C = 24"."""
        return ", ".join(f"{n} = {v}" for n, v in self.fixed)

    @property
    def consts_text(self) -> str:
        """The consts as the generated files' headers say them, then any fixed shape symbols."""
        consts = ", ".join(f"{n} = {v}" for n, v in self.consts)
        fixed = f"shape symbols fixed at compile time: {self.fixed_text}" if self.fixed else ""
        return "; ".join(t for t in (consts, fixed) if t)

    def param(self, name):
        return next((p for p in self.params if p.name == name), None)

    def buffer(self, name):
        return next((b for b in self.buffers if b.name == name), None)

    def tensor_map(self, name):
        return next(t for t in self.tensor_maps if t.name == name)

    def view(self, name):
        return next((v for v in self.views if v.name == name), None)

    def space(self, name: str) -> str:
        """global | shared | local | view (im2col) | scalar: where a name's elements live."""
        b = self.buffer(name)
        if b is not None:
            return b.scope
        if isinstance(self.param(name), TensorParam):
            return "global"
        if any(n == name for n, _ in self.lets):
            return "view"
        return "scalar"

    @property
    def tensors(self):
        return tuple(p for p in self.params if isinstance(p, TensorParam))

    @property
    def producer_warpgroup(self) -> bool:
        """Whether a pipelined loop asks for a producer warpgroup of its own (producer = 1)."""
        return any(isinstance(s, For) and s.producer == 1 for s in walk_stmts(self.body))

    @property
    def launch_threads(self) -> int:
        """Threads per block at launch: the kernel's `threads`, plus the producer
        warpgroup of a warp-specialised kernel."""
        extra = PRODUCER_THREADS if any(isinstance(s, Specialized) for s in walk_stmts(self.body)) else 0
        return self.threads.value + extra

    @property
    def scalars(self):
        return tuple(p for p in self.params if isinstance(p, ScalarParam))


STMT_BLOCK_FIELDS = {For: ("body",), Parallel: ("body",), If: ("then", "orelse"), OneThread: ("body",),
                     Specialized: ("producer", "consumers")}


def walk_stmts(body):
    """Every statement of a block, depth first, nested blocks included."""
    for s in body:
        yield s
        for f in STMT_BLOCK_FIELDS.get(type(s), ()):
            yield from walk_stmts(getattr(s, f))


def register_a_tiles(body) -> set:
    """The local tiles gemms read as wgmma's A from registers (plan-gemm's `a_in_registers`)."""
    return {s.a for s in walk_stmts(body) if isinstance(s, Gemm) and s.a_in_registers}
