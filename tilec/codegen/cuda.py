"""IR -> CUDA C++ through templates/kernel.cu.j2. This module only prints what
the IR already decided: one small rule per statement kind."""
from __future__ import annotations

import functools
import math
import re
from dataclasses import replace

import jinja2

from .._version import __version__
from .._resources import resource
from ..arch import DEFAULT as DEFAULT_ARCH, get as get_arch
from ..ir import effects, im2col
from ..ir import nodes as ir
from ..ir.exprs import float_width, fold, fused_product, is_float, map_body, reads_f64, walk_expr, widened
from ..ir.nodes import walk_stmts
from ..ir.printer import binary, expr as show_expr
from ..passes import make_persistent, plan_smem
from .abi import WORKSPACE_FLAG_BYTES, kernel_params, stream_k_accumulators, workspace_bytes_per_block

_WRAPPED = {"f16": "f16_t", "bf16": "bf16_t", "f8e4m3": "f8e4m3_t", "f8e5m2": "f8e5m2_t"}
_C_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
           "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}
_FLOAT_FN = {"exp": "expf", "log": "logf", "log2": "log2f", "sqrt": "sqrtf", "rsqrt": "rsqrtf"}
_DOUBLE_FN = {"exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2", "sqrt": "sqrt", "rsqrt": "rsqrt"}


def _template(name: str) -> str | None:
    f = resource("templates") / name
    return f.read_text() if f.is_file() else None


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FunctionLoader(_template),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True)


def ctype(dt: ir.DType) -> str:
    return _WRAPPED.get(dt.name, dt.ctype)


def convert(dt: ir.DType, value: str) -> str:
    """`value` as a `dt` (a constructor for tilec's 16/8-bit float types; tl_to_int for
    an integer: a float saturates there, where C++ leaves it undefined)."""
    if dt.name in _WRAPPED:
        return f"{ctype(dt)}({value})"
    if not dt.is_float:
        return f"tl_to_int<{ctype(dt)}>({value})"
    return f"static_cast<{ctype(dt)}>({value})"


class _Printer:
    def __init__(self, k: ir.Kernel, debug: bool = False):
        self.k = k
        self.debug = debug and bool(k.barriers)
        self.expect = {s.barrier: s.bytes for s in ir.walk_stmts(k.body) if isinstance(s, ir.ArriveExpectTx)}
        self.threads = k.threads.value
        self.uses_math = False
        self.uses_int_convert = False   # set where the body is done (tl_to_int in any statement's code)
        self.last_commented = None
        self.swizzles = set()       # swizzled layouts read element-wise (bytes per chunk row)
        self.row_orders = {}        # tiles with Buffer.row_groups read element-wise: their groups' positions
        self.uses_fastdiv = False
        self.hoisted_names = set()      # the names of values computed before refill loops, so far
        self.uses_exp2 = False      # tl_exp2: f32 exp2 without the subnormal range
        self.mma_shapes = set()
        self.pair_stores = set()    # dtypes of accumulator pairs stored to shared memory
        self.uses_vec16 = False     # 16-byte vector thread copies
        self.cp_async = set()       # bytes of the cp.async copies of thread copies into shared memory
        self.load_if = set()        # bytes of the elements thread copies read with predicated loads
        self.uses_stream_k = False
        self.cast_to = set()        # dtypes of casts in expressions (f16(x) needs f16_t in a kernel of f32 tensors)
        self.block_sync = "__syncthreads();"    # inside a Specialized block's consumers: their named barrier
        self.row_slot = None        # in a thread loop, the register of a 'rows' tile that holds row i
        self.rows_writer = ""       # in a loop over a 'rows' tile's rows: the threads that write shared tiles

    # ---------------------------------------------------------- expressions
    def cast(self, e: ir.Cast, double: bool) -> str:
        """`e`'s value converted to its dtype (whose definition the kernel then includes);
        an integer value to an integer type (a 64-bit product's widening) by a plain static_cast."""
        self.cast_to.add(e.dtype.name)
        value = self.expr(e.value, 0, double)
        if e.dtype.name in _WRAPPED and self.reads_accumulator(e.value):
            value = f"__fmul_rn({value}, 1.0f)"     # as an Assign's `out = acc`, narrowed (C7514)
        if not e.dtype.is_float and not is_float(self.k, e.value):
            return f"static_cast<{ctype(e.dtype)}>({value})"
        return convert(e.dtype, value)

    def reads_accumulator(self, e) -> bool:
        """Whether `e` is an element of an f32 wgmma accumulator: converted to a narrower
        type as it is, ptxas serializes every wgmma of the kernel (C7514), because the
        conversion reads the accumulator register itself (codegen multiplies by 1 first)."""
        b = self.k.buffer(e.name) if isinstance(e, ir.Subscript) else None
        return b is not None and b.layout == "wgmma" and b.dtype.name == "f32"

    def expr(self, e, prec=0, double=False) -> str:
        if isinstance(e, ir.Int):
            return str(e.value) if -2**31 <= e.value < 2**31 else f"{e.value}LL"
        if isinstance(e, ir.Float):
            text = repr(e.value)
            return text if double else text + "f"
        if isinstance(e, ir.Var):
            p = self.k.param(e.name) if e.kind == "scalar" else None
            # an f16 / bf16 scalar is used as float, as an element of such a tile is (f16_t beside bf16_t or
            # float in `=` or `?:` has no conversion NVRTC can pick)
            return f"float({e.name})" if p is not None and p.dtype.name in _WRAPPED else e.name
        if isinstance(e, ir.BinOp):
            fused = fused_product(self.k, e, double)
            if fused is not None:
                return self.fma(e, *fused, double)
            # cdiv(M, BM) * cdiv(N, BN): each fits 32 bits, the product may not
            return binary(widened(e), prec, _C_PREC, lambda x, p: self.expr(x, p, double))
        if isinstance(e, ir.UnaryOp):
            inner = self.expr(e.operand, 7, double)
            if inner[:1] in "-+":       # `- -x` is not C++'s `--x`
                inner = f"({inner})"
            return f"{e.op}{inner}"
        if isinstance(e, ir.Call):
            if e.func == "select":
                c, a, b = (self.expr(x, 0, double) for x in e.args)
                return f"({c} ? {a} : {b})"
            args = ", ".join(self.expr(a, 0, double) for a in e.args)
            if e.func in ("min", "max", "cdiv", "abs"):
                self.uses_math = True
                return f"tl_{e.func}({args})"
            if e.func in ("fastdiv", "fastmod"):     # by a divisor prepared before a pipelined loop
                self.uses_fastdiv = True
                return f"tl_{e.func}({args})"
            if double:      # sqrt(alpha) of an f32 alpha would be CUDA's float overload
                return f"{_DOUBLE_FN[e.func]}(double({args}))"
            if e.func == "exp2":
                self.uses_exp2 = True
                return f"tl_exp2({args})"
            return f"{_FLOAT_FN[e.func]}({args})"
        if isinstance(e, ir.Cast):
            value = self.cast(e, double)
            # rounded, then used as float, as an element of such a tile is: an f16_t
            # beside a float in `?:` (select, min, max, abs) is ambiguous to NVRTC
            return f"float({value})" if e.dtype.name in _WRAPPED else value
        if isinstance(e, ir.Subscript):
            b = self.k.buffer(e.name)
            ref = self.element(b, e.indices)
            return f"float({ref})" if b.dtype.name in _WRAPPED else ref
        raise TypeError(f"cannot print {e!r}")

    def fma(self, e: ir.BinOp, side: int, width: int, double: bool) -> str:
        """`a * b ± c` or `c ± a * b` as the one fused multiply-add that
        ir.exprs.fused_product picks (its side and float width): __fmaf_rn
        (__fma_rn in double), which NVRTC never splits; with --fmad=false it fuses
        nothing else, so the kernel rounds where the source (and the interpreter) say."""
        product, other = (e.lhs, e.rhs) if side == 0 else (e.rhs, e.lhs)
        a, b, c = product.lhs, product.rhs, other

        def negated(x):     # in the float type: -u of an unsigned u wraps, -INT_MIN overflows
            if float_width(self.k, x, double) != width:
                x = ir.Cast(ir.DTYPES["f64" if width == 64 else "f32"], x, span=x.span)
            return ir.UnaryOp("-", x, span=x.span)

        if e.op == "-":
            if side == 0:
                c = negated(c)
            else:
                a = negated(a)
        fn = "__fma_rn" if width == 64 else "__fmaf_rn"
        return f"{fn}({', '.join(self.expr(x, 0, double) for x in (a, b, c))})"

    def element(self, b: ir.Buffer, indices) -> str:
        if b.scope == "local":
            # only ever inside a thread loop over the whole tile (check-types)
            if b.layout == "rows":
                return f"{b.name}[{self.row_slot}]"
            return f"{b.name}[tl_r]" if b.layout == "wgmma" else f"{b.name}[tl_slot]"
        # an index that multiplies a stride binds tighter than `*`: a[1 - i, j] is a[(1 - i) * 16 + j]
        idx = [self.expr(i, 6 if d < len(indices) - 1 else 5) for d, i in enumerate(indices)]
        if b.swizzle:
            self.swizzles.add(b.swizzle)
            rows = b.chunk_rows
            if b.phases > 1:    # pixel (i, j) in its column phase's chunk: rows of all S phases a chunk of C
                i, j, st = idx[0], idx[1], b.phases
                row = f"({j}) % {st} * {rows} + ({i}) * {b.phase_width} + ({j}) / {st}"
                rows *= st
            else:
                row = idx[0] if len(idx) == 2 else self.flat(b.shape[:-1], idx[:-1])    # a patch's pixel
            if b.row_groups:    # 8-row groups in a patch gemm's order: group g at tl_rows_<b>[g]
                self.row_orders[b.name] = b.row_positions
                row = f"tl_rows_{b.name}[({row}) / 8] * 8 + ({row}) % 8"
            return f"{b.name}[tl_sw{b.swizzle}({row}, {idx[-1]}, {rows}, {b.swizzle // b.dtype.size})]"
        if b.layout == "cols":      # column chunks of b.chunk elements, each row-major
            rows, w = b.shape[0], b.chunk
            return f"{b.name}[({idx[1]}) / {w} * {rows * w} + ({idx[0]}) * {w} + ({idx[1]}) % {w}]"
        return f"{b.name}[{self.flat(b.shape, idx)}]"

    def bar(self, name, index=None):
        return f"&tl_{name}" if index is None else f"&tl_{name}[{self.expr(index)}]"

    def zero_copies(self, s, ind) -> list:
        """An im2col load's bytes as copies of ir.ZEROS, on the load's barrier."""
        return [f"{ind}bulk_copy_zeros({self.tile_address(s.buffer, s.stage, s.smem_offset + i)}, "
                f"{min(ir.ZERO_BYTES, s.bytes - i)}, {self.bar(s.barrier, s.barrier_index)});  "
                "// columns past the view's last: zeros" for i in range(0, s.bytes, ir.ZERO_BYTES)]

    def tile_address(self, name, stage, offset):
        b = self.k.buffer(name)
        parts = [f"reinterpret_cast<unsigned char*>({name})"]
        if stage is not None:
            parts.append(f"({self.expr(stage)}) * {b.stage_bytes}")
        if offset:
            parts.append(str(offset))
        return " + ".join(parts) if len(parts) > 1 else name

    def rows_of(self, s):
        """The first 'rows' tile a parallel over (M) uses, if any: it walks that tile's rows."""
        e = effects.deep(self.k, s)
        return next((b for b in self.k.buffers if b.name in e.reads | e.writes and b.layout == "rows"), None)

    def fragment_of(self, s):
        """The wgmma accumulator a thread-level statement walks, if any: then it
        walks the accumulator's fragment registers instead of e % threads."""
        e = effects.deep(self.k, s)
        names = e.reads | e.writes
        frags = [b for b in self.k.buffers if b.name in names and b.layout == "wgmma"]
        return frags[0] if frags else None

    def fragment_index(self, acc: ir.Buffer):
        """(m64 tiles per warpgroup, registers per thread, and the row and column
        expressions of register tl_r): wgmma's m64nNk16 layout, where warpgroup g
        owns rows (g / wg_cols)*64*m_tiles.. and columns (g % wg_cols)*nw.., warp w
        16 of the rows, registers r and r + 1 two adjacent columns of one row.
        Rows and columns of the product wgmma computes: of acc^T if `transposed`."""
        mt, nw = ir.fragment_tiles(acc, self.threads)
        tile = f" + (tl_r / {nw // 2}) * 64" if mt > 1 else ""
        row = f"{_fragment_row(acc.wg_cols, mt, tile)} + (tl_r % 4) / 2 * 8"
        col = f"{_fragment_col(acc, self.threads)}(tl_r % {nw // 2}) / 4 * 8 + {_FRAGMENT_COL}"
        return mt, mt * nw // 2, row, col

    def fragment_loop(self, acc: ir.Buffer, names, body, ind, memory="writes") -> list:
        """Register r of a thread holds accumulator element (i, j) (fragment_index;
        (j, i) of acc^T when the accumulator is `transposed`). An unevenly split
        accumulator's last warpgroup holds registers past N, one whose rows are
        padded to m64 tiles registers past M: a body that writes memory (`memory`
        "writes") skips them; one that only reads it ("reads") reads column N - 1
        (row M - 1) for them, and one that touches none ("none") runs as is: a
        register set under a condition, next to wgmmas, makes ptxas serialize them
        (C7515), and these registers hold nothing."""
        _, regs, row, col = self.fragment_index(acc)
        col += " + tl_r % 2"
        if memory == "reads":
            rows, cols = acc.product_shape
            col = f"min({col}, {cols - 1})" if ir.uneven_split(acc) else col
            row = f"min({row}, {rows - 1})" if ir.padded_rows(acc) else row
        at = (col, row) if acc.transposed else (row, col)
        out = [f"{ind}#pragma unroll", f"{ind}for (int tl_r = 0; tl_r < {regs}; ++tl_r) {{"]
        out += [f"{ind}  const int {name} = {value};" for name, value in _used(zip(names, at), body)]
        lines = [ind + line for line in body]
        out += self.inside_fragment(acc, row, col, lines, ind + "  ") if memory == "writes" else lines
        out.append(f"{ind}}}")
        return out

    def memory_of(self, s) -> str:
        """What statement `s` (a parallel over an accumulator's fragments) does to
        memory, anything but local tiles: "writes", "reads" or "none" (fragment_loop)."""
        e = effects.deep(self.k, s)
        local = {b.name for b in self.k.buffers if b.scope == "local"}
        return "writes" if e.writes - local else "reads" if e.reads - local else "none"

    @staticmethod
    def inside_fragment(acc: ir.Buffer, row: str, col: str, body: list, ind) -> list:
        """`body`, for a register whose fragment row and column are `row` and `col`:
        where the warpgroups over N split the columns unevenly (ir.split_width), only
        if that column is one of the product's (the last warpgroup's registers past N
        hold none); where the rows are padded to m64 tiles, only if the row is one of
        the tile's (a multiple of 8: the same in a whole warp)."""
        tests = ([f"{col} < {acc.product_shape[1]}"] if ir.uneven_split(acc) else []) + \
            ([f"{row} < {acc.product_shape[0]}"] if ir.padded_rows(acc) else [])
        if not tests:
            return body
        what = "past the last warpgroup's columns" if ir.uneven_split(acc) else ""
        padding = f"past the tile's {'columns (acc^T rows)' if acc.transposed else 'rows'}"
        what += (" or " if what else "") + padding if ir.padded_rows(acc) else ""
        return [f"{ind}if ({' && '.join(tests)}) {{  // else a register {what}"] + \
            ["  " + line for line in body] + [f"{ind}}}"]

    def rows_loop(self, b: ir.Buffer, names, body, ind, memory="none") -> list:
        """A thread's rows of a 'rows' tile (the accumulator rows its fragments hold):
        register tl_q holds row (its row of warpgroups) * M / (warpgroups / wg_cols) + (tl_q
        / 2) * 64 + (warp) * 16 + lane / 4 + (tl_q % 2) * 8, on each of the 4 lanes of the
        quad (in each of the wg_cols warpgroups over N). Rows padded to m64 tiles
        (`fragment_rows`) hold no element: as in fragment_loop, a body that writes
        memory skips them, one that reads it reads row M - 1 for them."""
        slots = ir.row_slots(b, self.threads)
        tile = " + (tl_q / 2) * 64" if slots > 2 else ""
        row = f"{_fragment_row(b.wg_cols, slots // 2, tile)} + (tl_q % 2) * 8"
        padded = ir.padded_rows(b) and memory != "none"
        at = f"min({row}, {b.shape[0] - 1})" if padded and memory == "reads" else row
        out = [f"{ind}#pragma unroll", f"{ind}for (int tl_q = 0; tl_q < {slots}; ++tl_q) {{"]
        out += [f"{ind}  const int {name} = {value};" for name, value in _used(zip(names, [at]), body)]
        if padded and memory == "writes":
            return out + [f"{ind}  if ({row} < {b.shape[0]}) {{  // else a row past the tile's (padding)"] + \
                [ind + "  " + line for line in body] + [f"{ind}  }}", f"{ind}}}"]
        return out + [ind + line for line in body] + [f"{ind}}}"]

    @staticmethod
    def fragment_row_slot(acc: ir.Buffer, threads: int) -> str:
        """The register of a 'rows' tile that holds the row of accumulator register tl_r
        (its m64 tile's pair of rows, then row l / 4 or l / 4 + 8)."""
        mt, nw = ir.fragment_tiles(acc, threads)
        return f"tl_r / {nw // 2} * 2 + (tl_r % 4) / 2" if mt > 1 else "(tl_r % 4) / 2"

    def fence_fragments(self, ind, bufs=None) -> list:
        """Pin accumulator registers at this point (an empty asm reading and writing
        each one): without it NVVM may sink a fill into a branch or hoist a read
        above wgmma.wait_group, and ptxas then serializes every wgmma (C7515)."""
        bufs = bufs if bufs is not None else [b for b in self.k.buffers if b.layout == "wgmma"]
        return [f"{ind}wgmma_fence_operand({b.name});" for b in bufs if b.dtype.name in ("f32", "i32")]

    @staticmethod
    def flat(shape, idx) -> str:
        terms = []
        for d, i in enumerate(idx):
            stride = math.prod(shape[d + 1:])
            terms.append(i if stride == 1 else f"{i} * {stride}")
        return " + ".join(terms)

    # ---------------------------------------------------------- statements
    def block_at(self, body, row_slot, writer="") -> list:
        """A parallel's body (indented 2) in a loop where `row_slot` is the register of a
        'rows' tile that holds row i; `writer`: in a loop over a 'rows' tile's rows, which
        of the lanes holding a row write shared tiles."""
        outer = self.row_slot, self.rows_writer
        self.row_slot, self.rows_writer = row_slot, writer
        try:
            return self.block(body, "  ")
        finally:
            self.row_slot, self.rows_writer = outer

    def block(self, body, ind="") -> list:
        out = []
        for s in body:
            out += self.stmt(s, ind)
        return out

    def comment(self, s, ind) -> list:
        if s.span is None or s.span.line == self.last_commented:
            return []
        self.last_commented = s.span.line
        text = s.span.source.line(s.span.line).strip()
        return [f"{ind}// {s.span.source.name}:{s.span.line}: {text}"]

    def stmt(self, s, ind) -> list:
        if isinstance(s, ir.OneThread):
            return [f"{ind}if (threadIdx.x == 0) {{"] + self.block(s.body, ind + "  ") + [f"{ind}}}"]
        if isinstance(s, ir.MbarrierInit):
            return [f"{ind}mbarrier_init(&tl_{b.name}{f'[{i}]' if b.array else ''}, {b.arrivals});"
                    for b in s.barriers for i in range(b.count)] + \
                   [f"{ind}fence_mbarrier_init();"]
        if isinstance(s, ir.SyncThreads):
            return [f"{ind}{self.block_sync}"]
        if isinstance(s, ir.Specialized):
            return self.specialized(s, ind)
        if isinstance(s, ir.ArriveExpectTx):
            return self.comment(s, ind) + [f"{ind}mbarrier_arrive_expect_tx({self.bar(s.barrier, s.index)}, {s.bytes});"]
        if isinstance(s, ir.TmaLoad) and s.view:
            # coordinates (channel, spatial window origin..., image) and the tap's offsets, innermost first
            coords = ", ".join(f"int({self.expr(c)})" for c in reversed(s.coords))
            offsets = ", ".join(f"(unsigned short)({self.expr(o)})" for o in reversed(s.offsets))
            dst = self.tile_address(s.buffer, s.stage, s.smem_offset)
            load = [f"{ind}tma_load_im2col_{len(s.coords)}d({dst}, &tl_{s.tensor_map}, "
                    f"{self.bar(s.barrier, s.barrier_index)},",
                    f"{ind}    {coords},", f"{ind}    {offsets});"]
            past = s.zeros_if
            if past is None or (isinstance(past, ir.Int) and not past.value):
                return load
            if isinstance(past, ir.Int):
                return self.zero_copies(s, ind)
            return [f"{ind}if ({self.expr(past)}) {{"] + self.zero_copies(s, ind + "  ") + \
                [f"{ind}}} else {{"] + ["  " + line for line in load] + [f"{ind}}}"]
        if isinstance(s, ir.TmaLoad):
            coords = ", ".join(self.expr(c) for c in reversed(s.coords))
            dst = self.tile_address(s.buffer, s.stage, s.smem_offset)
            return [f"{ind}tma_load_{len(s.coords)}d({dst}, &tl_{s.tensor_map}, "
                    f"{self.bar(s.barrier, s.barrier_index)}, {coords});"]
        if isinstance(s, ir.MbarrierWait):
            parity = f"tl_phase_{s.barrier}" if s.parity is None else \
                str(s.parity) if isinstance(s.parity, int) else self.expr(s.parity)
            if self.debug:
                index = [b.name for b in self.k.barriers].index(s.barrier)
                line = s.span.line if s.span else 0
                return self.comment(s, ind) + [
                    f"{ind}mbarrier_wait_bounded({self.bar(s.barrier, s.index)}, {parity}, tl_debug, {index}, "
                    f"{self.expect.get(s.barrier, 0)}, {line});"]
            return self.comment(s, ind) + [f"{ind}mbarrier_wait({self.bar(s.barrier, s.index)}, {parity});"]
        if isinstance(s, ir.MbarrierArrive):
            return [f"{ind}if (threadIdx.x % 128 == 0) mbarrier_arrive({self.bar(s.barrier, s.index)});"]
        if isinstance(s, ir.WgmmaWait):
            fence = self.fence_fragments(ind, None if s.pending == 0 else [self.k.buffer(a) for a in s.accs])
            return [f"{ind}wgmma_wait_group<{s.pending}>();"] + fence
        if isinstance(s, ir.FlipPhase):
            return [f"{ind}tl_phase_{s.barrier} ^= 1;"]
        if isinstance(s, ir.RingAdvance):
            return [f"{ind}{s.var} += {self.expr(s.by)};  // the ring's iterations so far"]
        if isinstance(s, ir.TmaStore):
            coords = ", ".join(self.expr(c) for c in reversed(s.coords))
            return self.comment(s, ind) + \
                [f"{ind}tma_store_{len(s.coords)}d(&tl_{s.tensor_map}, "
                 f"{self.tile_address(s.buffer, None, s.smem_offset)}, {coords});"]
        if isinstance(s, ir.BulkCommit):
            return [f"{ind}bulk_commit_group();"]
        if isinstance(s, ir.BulkWait):
            return [f"{ind}bulk_wait_group{'_read' if s.read else ''}<{s.pending}>();"]
        if isinstance(s, ir.ProxyFence):
            return [f"{ind}fence_proxy_async_{s.space}();"]
        if isinstance(s, ir.For):
            comment = self.comment(s, ind)
            hoisted, divisors = [], []
            if _refill_loop(s):
                s, hoisted, divisors = _hoist_coordinates(s)
            names = {name for name, _ in hoisted + divisors}
            # a later loop of the same variable names its values alike: in a block of its own, they do not clash
            scoped = bool(names & self.hoisted_names)
            self.hoisted_names |= names
            inner = ind + "  " if scoped else ind
            pre = [f"{inner}const int {name} = {self.expr(e)};  // loop-invariant, computed once"
                   for name, e in hoisted]
            pre += [f"{inner}const tl_divisor {name} = tl_make_divisor({self.expr(e)});  // divides by "
                    f"{self.expr(e)} with a multiply in the loop" for name, e in divisors]
            self.uses_fastdiv |= bool(divisors)
            head = f"{inner}for (int {s.var} = 0; {s.var} < {self.expr(s.extent)}; ++{s.var}) {{"
            loop = pre + [head] + self.block(s.body, inner + "  ") + [f"{inner}}}"]
            if scoped:
                loop = [f"{ind}{{  // the values before this loop, in a scope of their own"] + loop + [f"{ind}}}"]
            return comment + loop
        if isinstance(s, ir.If) and isinstance(s.cond, ir.Int):
            # decided at compile time (a pipelined loop's prologue step past a constant trip count):
            # the block that runs, in a scope of its own unless it is barrier and TMA statements alone
            taken = s.then if s.cond.value else s.orelse
            if not taken:
                return []
            if all(isinstance(x, _UNSCOPED) for x in taken):
                return self.comment(s, ind) + self.block(taken, ind)
            return self.comment(s, ind) + [f"{ind}{{"] + self.block(taken, ind + "  ") + [f"{ind}}}"]
        if isinstance(s, ir.If):
            cond = self.expr(s.cond, double=reads_f64(self.k, s.cond))    # x > 0.1 with x f64: 0.1, not 0.1f
            out = self.comment(s, ind) + [f"{ind}if ({cond}) {{"] + self.block(s.then, ind + "  ")
            if s.orelse:
                out += [f"{ind}}} else {{"] + self.block(s.orelse, ind + "  ")
            return out + [f"{ind}}}"]
        if isinstance(s, ir.Parallel):
            shape = tuple(x.value for x in s.extents)
            acc, rows = self.fragment_of(s), self.rows_of(s)
            if acc is not None:
                body = self.block_at(s.body, self.fragment_row_slot(acc, self.threads))
                return self.comment(s, ind) + self.fragment_loop(acc, s.vars, body, ind, self.memory_of(s)) + \
                    self.fence_fragments(ind, [acc])
            if rows is not None:        # each row on the 4 lanes of its quad; lane 0 writes shared tiles
                writer = "threadIdx.x % 4 == 0" + \
                    (f" && {_warpgroup_col(rows.wg_cols)} == 0" if rows.wg_cols > 1 else "")
                return self.comment(s, ind) + self.rows_loop(rows, s.vars, self.block_at(s.body, "tl_q", writer), ind,
                                                             self.memory_of(s))
            return self.comment(s, ind) + self.thread_loop(shape, s.vars, self.block(s.body, "  "), ind)
        if isinstance(s, ir.Gemm):
            return self.comment(s, ind) + self.gemm(s, ind)
        if isinstance(s, ir.Assign):
            b = self.k.buffer(s.buffer)
            double = b.dtype.name == "f64" or reads_f64(self.k, s.value)
            v = s.value
            inner = v.value if isinstance(v, ir.Cast) and v.dtype == b.dtype else v
            if b.dtype.name in _WRAPPED and self.reads_accumulator(inner):
                # out = acc, narrowed: ptxas serializes every wgmma of the kernel (C7514) where a conversion
                # reads an accumulator register itself; an exact multiply by 1 in between keeps them async
                value = convert(b.dtype, f"__fmul_rn({self.expr(inner)}, 1.0f)")
            elif isinstance(v, ir.Cast) and v.dtype == b.dtype and (v.dtype.name in _WRAPPED or not v.dtype.is_float):
                value = self.cast(v, double)        # s = f16(x): as it reads; o = i8(x): converted once
            else:
                value = self.expr(v, 0, double)
            one = f"if ({self.rows_writer}) " if self.rows_writer and b.scope == "shared" else ""
            return [f"{ind}{one}{self.element(b, s.indices)} = {value};"]
        if isinstance(s, ir.Fill):
            b = self.k.buffer(s.buffer)
            names = [f"tl_i{d}" for d in range(len(b.shape))]
            value = self.expr(s.value, 0, b.dtype.name == "f64")
            if b.layout == "rows":
                return self.comment(s, ind) + self.rows_loop(b, names, [f"  {b.name}[tl_q] = {value};"], ind)
            line = f"  {self.element(b, [ir.Var(n) for n in names])} = {value};"
            if b.layout == "wgmma":
                return self.comment(s, ind) + self.fragment_loop(b, names, [line], ind, "none") + \
                    self.fence_fragments(ind, [b])
            return self.comment(s, ind) + self.thread_loop(b.shape, names, [line], ind)
        if isinstance(s, ir.Reduce):
            return self.comment(s, ind) + self.reduce(s, ind)
        if isinstance(s, ir.Let):
            ctype_ = "long long" if s.wide else "int"
            return self.comment(s, ind) + [f"{ind}const {ctype_} {s.name} = {self.expr(s.value)};"]
        if isinstance(s, (ir.PartialStore, ir.PartialAdd)):
            return self.comment(s, ind) + self.partial(s, ind)
        if isinstance(s, ir.ThreadCopy):
            return self.comment(s, ind) + self.thread_copy(s, ind)
        if isinstance(s, ir.StoreTail):
            return self.comment(s, ind) + self.store_tail(s, ind)
        raise TypeError(f"cannot print {type(s).__name__}")

    def partial(self, s, ind) -> list:
        """Stream-K's hand-over of a tile's partial sums through the launch's
        workspace: a flag per block at its start, then the blocks' slots; slot
        `s.slot` holds each accumulator's fragment registers, register r of
        thread i at float (or i32) r * threads + i (coalesced, 16 bytes per thread)."""
        self.uses_stream_k = True
        slot = f"reinterpret_cast<float4*>(tl_workspace + {WORKSPACE_FLAG_BYTES}) + " \
               f"static_cast<long long>({self.expr(s.slot)}) * {workspace_bytes_per_block(self.k) // 16}"
        flag = f"&tl_slot_ready[{self.expr(s.slot)}]"

        def vec(name):          # an i32 accumulator's registers move as int4 (float4 would round them)
            return "int4" if self.k.buffer(name).dtype.name == "i32" else "float4"

        def at_slot(name, at):  # the slot's 16 bytes at `at`, as vec(name)
            if vec(name) == "float4":
                return f"tl_slot[{at}]"
            return f"reinterpret_cast<{'const ' * isinstance(s, ir.PartialAdd)}int4*>(tl_slot)[{at}]"
        if isinstance(s, ir.PartialStore):
            body = [f"{ind}  float4* const tl_slot = {slot};"]
            body += self.slot_loops(s.buffers, ind, lambda name, at: [
                f"__stcg(&{at_slot(name, at)}, make_{vec(name)}({name}[tl_r], {name}[tl_r + 1], {name}[tl_r + 2], "
                f"{name}[tl_r + 3]));"])
            body += [f"{ind}  {self.block_sync}  // every thread's share is written",
                     f"{ind}  if (threadIdx.x == 0) tl_slot_release({flag});"]
        else:
            body = [f"{ind}  if (threadIdx.x == 0) tl_slot_acquire({flag});",
                    f"{ind}  {self.block_sync}  // the slot's partial sums are visible to every thread",
                    f"{ind}  const float4* const tl_slot = {slot};"]
            body += self.slot_loops(s.buffers, ind, lambda name, at: [
                f"const {vec(name)} tl_v = __ldcg(&{at_slot(name, at)});", f"{name}[tl_r] += tl_v.x;",
                f"{name}[tl_r + 1] += tl_v.y;", f"{name}[tl_r + 2] += tl_v.z;", f"{name}[tl_r + 3] += tl_v.w;"])
            body += self.fence_fragments(ind + "  ", [self.k.buffer(n) for n in s.buffers])
        return [f"{ind}{{"] + body + [f"{ind}}}"]

    def slot_loops(self, names, ind, lines) -> list:
        """For each accumulator of `names`, a loop over its registers in fours;
        `lines(name, at)` is the body, `at` the float4 of registers tl_r..tl_r + 3
        in the slot (accumulators in slot order, stream_k_accumulators)."""
        out, first = [], 0
        for b in stream_k_accumulators(self.k):
            regs = ir.fragment_regs(b, self.threads)
            if b.name in names:
                r = f"({first} + tl_r)" if first else "tl_r"
                out += [f"{ind}  #pragma unroll", f"{ind}  for (int tl_r = 0; tl_r < {regs}; tl_r += 4) {{"]
                out += [f"{ind}    {line}" for line in lines(b.name, f"{r} / 4 * {self.threads} + threadIdx.x")]
                out.append(f"{ind}  }}")
            first += regs
        return out

    def gemm(self, s: ir.Gemm, ind) -> list:
        """acc += a @ b: per K step (32 bytes of K), one wgmma per m64 row tile of
        this warpgroup, over its columns (ir.split_width: N / wg_cols rounded up to
        8; where that is uneven, the last warpgroup's wgmmas read b past N: its
        `overrun`). a is K-major ([M, K]) or
        M-major ([K, M], transpose_a), b N-major ([K, N]) or K-major ([N, K],
        transpose_b); each in column chunks whose rows are `swizzle` bytes
        (TMA's swizzle of that size): a descriptor's stride byte offset is the
        distance between 8-row groups (8 rows of a chunk) and, for the M/N-major
        operand or a K-major one in 16-byte chunks, its leading byte offset the
        distance between chunks (an M/N-major one in 16-byte chunks the other way
        round: _mn_major). Swapped
        (`s.swapped`), the product is acc^T += b^T @ a^T: b is wgmma's a and a its b."""
        a, b, acc = self.k.buffer(s.a), self.k.buffer(s.b), self.k.buffer(s.acc)
        ta, tb = s.transpose_a, s.transpose_b
        if s.swapped:
            a, b, ta, tb = b, a, not tb, not ta
        kdim = (b.shape[1] if tb else b.shape[0]) if s.patch else a.shape[0] if ta else a.shape[1]
        m, n = acc.fragment_shape
        rows = a.shape[0]                                    # a K-major a's rows: m, less its padding if any
        nw = ir.split_width(n, s.wg_cols)
        dt, esize = _mma_label(s, a, b), a.dtype.size
        kstep = 32 // esize                                  # each wgmma reads 32 bytes of K
        a_from = "regs" if s.a_in_registers else "m" if ta else "k"    # registers, M- or K-major shared
        self.mma_shapes.add((nw, dt, a_from, not tb, False))
        fn = f"wgmma_m64n{nw}k{kstep}_{dt}_{dict(regs='ar', m='am').get(a_from, '')}{'bk' if tb else 'bn'}"
        if s.zero:      # the first K step's wgmmas write acc without reading it
            self.mma_shapes.add((nw, dt, a_from, not tb, True))
        a_stage = "" if s.stage is None else f"{self.expr(s.stage, 6)} * {a.stage_bytes} + "
        b_stage = "" if s.stage is None else f"{self.expr(s.stage, 6)} * {b.stage_bytes} + "
        wg_row, wg_col = _warpgroup_row(s.wg_cols), _warpgroup_col(s.wg_cols)
        rows_per_wg = 64 * s.m_tiles
        sa, sb = a.swizzle, b.swizzle
        wa, wb = sa // esize, sb // esize                    # elements per chunk row
        out = [f"{ind}// swapped: {acc.name}^T += {s.b}^T @ {s.a}^T, {m} rows by {n} columns ({acc.name} has "
               f"{n} rows, not a multiple of 64)"] if s.swapped else []
        if ir.padded_rows(acc):
            out.append(f"{ind}// {acc.name}{'^T' if s.swapped else ''}'s {acc.product_shape[0]} rows padded to {m}: "
                       f"the wgmmas read {a.name}'s shared memory past them into registers nothing uses")
        if nw * s.wg_cols != n:
            out.append(f"{ind}// the last warpgroup owns columns {n - ir.split_last(n, s.wg_cols)} .. {n - 1}; its "
                       f"wgmmas, {nw} wide, read {b.name}'s shared memory past them into registers nothing uses")
        out.append(f"{ind}wgmma_fence();")
        for kk in range(kdim // kstep):
            k0 = kk * kstep
            if tb:                  # [N, K]: chunks of wb K columns, N rows each
                chunk, within = divmod(k0, wb)
                col = "" if s.wg_cols == 1 else f"({wg_col}) * {nw * sb} + "
                b_desc = f"wgmma_desc({b.name}, {b_stage}{col}{chunk * n * sb + within * esize}, {_lead(n, sb)}, " \
                         f"{8 * sb}, {sb})"
            else:                   # [K, N]: chunks of wb N columns, K rows each
                col = "" if s.wg_cols == 1 else f"({wg_col}) * {nw // wb * kdim * sb} + "
                b_desc = f"wgmma_desc({b.name}, {b_stage}{col}{k0 * sb}, {_mn_major(kdim, sb)}, {sb})"
            for t in range(s.m_tiles):
                if a_from == "regs":    # an [M, K] tile's fragments: per m64 tile K / 2 of them, 8 per K step
                    a_desc = f"{a.name} + {t * kdim // 2 + kk * 8}"
                elif s.patch:       # the im2col view of a patch: a pair of (tap, 8 channels) items a K step
                    a_desc = self.patch_desc(s, a, a_stage, kk, t)
                elif ta:            # [K, M]: chunks of wa M columns, K rows each
                    a_off = f"({wg_row}) * {rows_per_wg // wa * kdim * sa} + {t * 64 // wa * kdim * sa + k0 * sa}"
                    a_desc = f"wgmma_desc({a.name}, {a_stage}{a_off}, {_mn_major(kdim, sa)}, {sa})"
                else:               # [M, K]: chunks of wa K columns, M rows each
                    chunk, within = divmod(k0, wa)
                    a_off = f"({wg_row}) * {rows_per_wg * sa} + {chunk * rows * sa + t * 64 * sa + within * esize}"
                    a_desc = f"wgmma_desc({a.name}, {a_stage}{a_off}, {_lead(rows, sa)}, {8 * sa}, {sa})"
                first = "_zero" if s.zero and kk == 0 else ""
                out.append(f"{ind}{fn}{first}({acc.name} + {t * nw // 2}, {a_desc}, {b_desc});")
        out.append(f"{ind}wgmma_commit_group();")
        return out

    def patch_desc(self, s: ir.Gemm, a: ir.Buffer, a_stage: str, kk: int, t: int) -> str:
        """The descriptor of K step `kk` of m64 tile `t` of gemm `s`'s im2col view of
        patch `a` [PH, PW, C] (layout sw16: C / 8 chunks of PH x PW pixels, 16 bytes
        each; a stride S, S chunks of PH x ceil(PW / S) pixels, one a column phase:
        ir.patch_item_offset). Item i of the view's K (16-byte units) is filter tap i
        / (C / 8), chunk i % (C / 8); an m64 tile is 8 output rows of 8 pixels: its
        core matrices are 8 pixels of one patch row (16 bytes apart), S patch rows
        apart (the stride byte offset), the tile's first 8 K columns item 2kk and its
        next 8 item 2kk + 1 (of the order the weights' rows are in:
        Buffer.row_groups), the leading byte offset further, or, past the last tap,
        the patch's zeros (ir.patch_zeros), which lie after it."""
        (kh, kw), c = s.patch, a.shape[2]
        chunk_bytes, pitch = a.chunk_rows * 16, s.patch_stride * a.phase_width * 16   # an output row's patch rows
        order = self.k.buffer(s.b).row_groups or range(2 * kk + 2)
        first = ir.patch_item_offset(a, s.patch, order[2 * kk])
        rows = f"(({_warpgroup_row(s.wg_cols)}) * {s.m_tiles} + {t}) * {8 * pitch}"
        if order[2 * kk + 1] < kh * kw * c // 8:
            lead = str(ir.patch_item_offset(a, s.patch, order[2 * kk + 1]) - first)
        else:           # to the same pixel of the zeros, past every stage of the patch
            lead = f"smem_addr({s.zeros}) - smem_addr({a.name}) - ({a_stage}{first // chunk_bytes * chunk_bytes})"
        return f"wgmma_desc({a.name}, {a_stage}{rows} + {first}, {lead}, {pitch}, 16)"

    def thread_loop(self, shape, names, body, ind) -> list:
        """Element e of a tile goes to thread e % threads, register slot e / threads."""
        n = math.prod(shape)
        slots = -(-n // self.threads)
        out = [f"{ind}{_unroll(slots, body)}", f"{ind}for (int tl_slot = 0; tl_slot < {slots}; ++tl_slot) {{"]
        inner = ind + "  "
        guarded = n % self.threads != 0
        if guarded:
            out.append(f"{inner}if (tl_slot * {self.threads} + threadIdx.x < {n}) {{")
            inner += "  "
        indices = list(zip(names, _unflatten(shape)))
        declared = [f"{inner}const int {name} = {idx};" for name, idx in _used(indices, body)]
        if declared:
            declared.insert(0, f"{inner}const int tl_e = tl_slot * {self.threads} + threadIdx.x;")
        out += declared + [inner + line[2:] for line in body]
        if guarded:
            out.append(f"{ind}  }}")
        out.append(f"{ind}}}")
        return out

    def reduce(self, s: ir.Reduce, ind) -> list:
        """acc[i] = op over row i (axis 1) or column i (axis 0) of s. Floats reduce
        in float (double with an f64 side), integer sums in unsigned long long
        (exact modulo 2^64, then wrapped to acc's type), integer maxima and minima
        in s's own type. With one thread per result (ir.reduce_lanes), a thread
        loop over acc's elements, each thread walking its row or column in order
        from the first element; else reduce_in_lanes."""
        src, acc = self.k.buffer(s.src), self.k.buffer(s.dst)
        if src.dtype.is_float:
            t = "double" if "f64" in (src.dtype.name, acc.dtype.name) else "float"
        else:
            t = "unsigned long long" if s.op == "sum" else ctype(src.dtype)

        def at(k):
            ref = self.element(src, [ir.Var("tl_i0"), k] if s.axis == 1 else [k, ir.Var("tl_i0")])
            return ref if ctype(src.dtype) == t else f"static_cast<{t}>({ref})"

        def combine(value):
            if s.op == "sum":
                return f"tl_acc + {value}"
            self.uses_math = True
            return f"tl_{s.op}(tl_acc, {value})"      # floats: fmaxf / fminf, any order gives the same bits

        n = src.shape[s.axis]
        what = "row" if s.axis == 1 else "column"
        result = "tl_acc" if ctype(acc.dtype) == t else convert(acc.dtype, "tl_acc")
        if src.scope == "local":
            return self.reduce_local(s, src, acc, t, combine, result, ind)
        lanes = ir.reduce_spread(self.k, s).lanes
        if lanes > 1:
            return self.reduce_in_lanes(s, acc, n, lanes, t, at, combine, result, ind)
        body = [f"  {t} tl_acc = {at(ir.Int(0))};  // the {s.op} of {what} tl_i0 of {src.name}"]
        if n > 1:
            body += [f"  for (int tl_k = 1; tl_k < {n}; ++tl_k) {{", f"    tl_acc = {combine(at(ir.Var('tl_k')))};",
                     "  }"]
        body.append(f"  {self.element(acc, [ir.Var('tl_i0')])} = {result};")
        return self.thread_loop(acc.shape, ["tl_i0"], body, ind)

    def reduce_local(self, s, src, acc, t, combine, result, ind) -> list:
        """A local tile [M, N], reduced where its elements are (ir.local_reduce_spread):
        each thread walks its own slots of a result in order (its lane's elements),
        the lanes combine in halves within each warp (__shfl_down_sync by h lanes, h *
        N threads for a column 'across'), and each group's first lane holds the
        group's value. One group and a shared result: that lane writes it. Else the
        groups leave their values in ir.REDUCE_WARPS (slot r * groups + w, between
        two block barriers), and a thread loop over acc combines each result's
        groups in order. A result that one thread walks whole (lanes == 1) is
        element r % threads's own: that thread writes it."""
        spread, threads = ir.reduce_spread(self.k, s), self.threads
        m, n = src.shape
        what = "row" if s.axis == 1 else "column"

        def slot(index):
            ref = f"{src.name}[{index}]"
            return ref if ctype(src.dtype) == t else f"static_cast<{t}>({ref})"

        def walk(first, rest, keep=None):   # tl_acc over the slots first, then rest(k) for k = 1 .. count - 1
            count, index = rest                 # (those for which `keep` holds, if given)
            out = [f"{t} tl_acc = {slot(first)};"]
            if count > 1:
                step = f"tl_acc = {combine(slot(index))};"
                out += ["#pragma unroll", f"for (int tl_k = 1; tl_k < {count}; ++tl_k) {{",
                        f"  if ({keep}) {step}" if keep else f"  {step}", "}"]
            return out

        if spread.local.startswith("wgmma"):
            return self.reduce_fragments(s, src, acc, spread, t, walk, combine, result, ind)
        if spread.local == "along" and s.axis == 1:     # row r: slots r * Q ... r * Q + Q - 1, lane = thread
            q = n // threads
            loop, res = ("tl_r", m), "tl_r"
            lane, stride = "threadIdx.x", 1
            values = walk(f"tl_r * {q}", (q, f"tl_r * {q} + tl_k"))
            how = f"each {what} of {s.src} on all {threads} threads, {q} element{'s' if q > 1 else ''} a thread"
        elif spread.local == "along":                   # column r = c * T + t: slots i * Q + c, on one thread
            q = n // threads
            loop, res = ("tl_c", q), f"tl_c * {threads} + threadIdx.x"
            lane, stride = None, 1
            values = walk("tl_c", (m, f"tl_k * {q} + tl_c"))
            how = f"each {what} of {s.src} on one thread"
        elif s.axis == 1:                               # slot s: element t % N of row s * T / N + t / N
            p = threads // n
            loop, res = ("tl_s", m * n // threads), f"tl_s * {p} + threadIdx.x / {n}"
            lane, stride = f"(threadIdx.x % {n})", 1
            values = [f"{t} tl_acc = {slot('tl_s')};"]
            how = f"each {what} of {s.src} on {n} threads, one element a thread"
        else:                                           # column t % N: lane t / N walks rows g, g + T / N, ...
            loop, res = None, f"threadIdx.x % {n}"
            lane, stride = f"(threadIdx.x / {n})", n
            values = walk("0", (m * n // threads, "tl_k"))
            how = f"each {what} of {s.src} on {threads // n} threads"
        return self.reduce_lanes_out(s, acc, spread, t, combine, result, values, loop, res, lane, stride, how, ind)

    def reduce_fragments(self, s, src, acc, spread, t, walk, combine, result, ind) -> list:
        """A 'wgmma' tile (an accumulator, or a tile beside one) reduced in its fragments
        (ir.fragment_element): a fragment row's elements are on the 4 lanes of a
        quad, nw / 4 a lane (register r of columns (r % (nw / 2)) / 4 * 8 + (l % 4) *
        2 + r % 2, walked in column order), in each warpgroup over N; a fragment
        column's on 8 lanes 4 apart in every warp over M, 2 per m64 tile a lane
        (rows l / 4, + 8, + 64, ..., in order). Which one is the tile's row: see
        ir.fragment_reduce_spread."""
        threads = self.threads
        mt, nw = ir.fragment_tiles(src, threads)
        half = nw // 2                          # registers a thread has per m64 tile
        row0 = _fragment_row(src.wg_cols, mt)
        col0 = _fragment_col(src, threads)
        n, keep = src.fragment_shape[1], None   # an uneven split: the last warpgroup's columns past N are none
        gathered = None
        if spread.local == "wgmma rows":        # results: this thread's 2 * mt fragment rows
            loop = ("tl_x", 2 * mt)
            res = f"{row0} + tl_x / 2 * 64 + tl_x % 2 * 8"
            first = f"tl_x / 2 * {half} + tl_x % 2 * 2"
            inside = f"{col0}tl_k / 2 * 8 < {n}" if ir.uneven_split(src) else None
            values = walk(first, (nw // 4, f"{first} + tl_k / 2 * 4 + tl_k % 2"), inside)
            lane, stride = "threadIdx.x", 1       # a quad's first lane leads
            group = None if src.wg_cols == 1 else _warpgroup_col(src.wg_cols)
            how = f"each fragment row of {s.src} on the 4 lanes of a quad" + \
                (f" in each of {src.wg_cols} warpgroups" if src.wg_cols > 1 else "") + f", {nw // 4} elements a lane"
            if ir.padded_rows(src) and acc.layout != "rows":    # rows past M (padding): no result to write
                keep = f"{res} < {src.product_shape[0]}"    # (the same in a whole warp: a multiple of 8)
        else:                                   # results: this thread's nw / 4 fragment columns
            loop = ("tl_x", nw // 4)
            res = f"{col0}tl_x / 2 * 8 + {_FRAGMENT_COL} + tl_x % 2"
            first = "tl_x / 2 * 4 + tl_x % 2"
            inside = f"{row0} + tl_k / 2 * 64 + tl_k % 2 * 8 < {src.product_shape[0]}" if ir.padded_rows(src) \
                else None
            values = walk(first, (2 * mt, f"tl_k / 2 * {half} + tl_k % 2 * 2 + {first}"), inside)
            lane, stride = "(threadIdx.x % 32 / 4)", 4
            group = f"(threadIdx.x % 128 / 32 + ({_warpgroup_row(src.wg_cols)}) * 4)"
            how = f"each fragment column of {s.src} on 8 lanes of each of {spread.groups} warps, {2 * mt} " \
                  "elements a lane"
            keep = f"{col0}tl_x / 2 * 8 < {n}" if ir.uneven_split(src) else None    # the same in a whole warp
            if ir.padded_rows(src):     # the warps whose rows are all padding (the last ones) take no part
                real = sum(g // 4 * 64 * mt + g % 4 * 16 < src.product_shape[0] for g in range(spread.groups))
                how += f" ({real} of them holding rows of the tile)"
                gathered = real
        return self.reduce_lanes_out(s, acc, spread, t, combine, result, values, loop, res, lane, stride, how, ind,
                                     group, keep, gathered)

    def reduce_lanes_out(self, s, acc, spread, t, combine, result, values, loop, res, lane, stride, how, ind,
                         group=None, keep=None, gathered=None) -> list:
        """The end of reduce_local and reduce_fragments: after `values` (tl_acc, a lane's
        walk of result `res`, in `loop` if any), the lanes of each warp combine in halves
        (__shfl_down_sync by h * stride threads), and each warp's first lane (`lane` %
        per_warp == 0) writes the result (one warp and a shared result), or its value
        into slot res * groups + its warp's index (`group`; by default lane /
        per_warp) for a thread loop over acc to combine in order after a barrier.
        `keep`: which results of the loop exist (an uneven split's last warpgroup
        walks columns past N); `gathered`: how many groups, the first ones, the
        combine reads (the rest hold only rows padded to m64 tiles)."""
        groups, per_warp = spread.groups, spread.per_warp
        body = list(values)
        if spread.lanes > 1 and per_warp > 1:
            body += ["#pragma unroll", f"for (int tl_h = {per_warp // 2}; tl_h > 0; tl_h /= 2) {{",
                     f"  tl_acc = {combine(self.shuffled(t, f'tl_h * {stride}' if stride > 1 else 'tl_h'))};",
                     "}"]
        slots = ir.reduce_slots(self.k, s)
        warps = f"reinterpret_cast<{t}*>({ir.REDUCE_WARPS})"
        if not slots:
            if spread.lanes == 1:           # this thread walked result res whole, and holds acc's element res
                target = f"{acc.name}[{loop[0] if loop else 0}]" if acc.scope == "local" else \
                    f"{acc.name}[{res}]"
                body.append(f"{target} = {result};")
            elif acc.layout == "rows":      # the quad's first lane's value to all 4, each writes its register
                body += [f"tl_acc = {self.shuffled(t, 'threadIdx.x & 28', '__shfl_sync')};",
                         f"{acc.name}[{loop[0]}] = {result};"]
            else:                           # one group: its first lane writes the shared result
                body += [f"if ({lane} % {per_warp} == 0) {{", f"  {acc.name}[{res}] = {result};", "}"]
        elif per_warp == 1:                 # every lane is its warp's only one
            body.append(f"{warps}[({res}) * {groups} + {lane}] = tl_acc;")
        else:
            group = "0" if groups == 1 else group or f"{lane} / {per_warp}"
            body += [f"if ({lane} % {per_warp} == 0) {{",
                     f"  {warps}[({res}) * {groups} + {group}] = tl_acc;", "}"]
        steps = (["the lanes of each warp combine in halves"] if spread.lanes > 1 and per_warp > 1 else []) + \
            ([f"the {groups} warps' values in order"] if groups > 1 else [])
        out = [f"{ind}{{  // {s.op} of {how}" + ("; " + ", then ".join(steps) if steps else "")]
        if slots:
            out.append(f"{ind}  {self.block_sync}  // a reduce before may still read the slots")
        if keep:        # results of the loop that exist (the same for every lane of a warp: its shuffles)
            body = [f"if ({keep}) {{"] + [f"  {line}" for line in body] + ["}"]
        if loop:
            out += [f"{ind}  #pragma unroll", f"{ind}  for (int {loop[0]} = 0; {loop[0]} < {loop[1]}; ++{loop[0]}) {{"]
            out += [f"{ind}    {line}" for line in body] + [f"{ind}  }}"]
        else:
            out += [f"{ind}  {line}" for line in body]
        out.append(f"{ind}}}")
        if slots:
            gather = [f"  {t} tl_acc = {warps}[tl_i0 * {groups}];"]
            if (gathered or groups) > 1:
                gather += ["  #pragma unroll", f"  for (int tl_w = 1; tl_w < {gathered or groups}; ++tl_w) {{",
                           f"    tl_acc = {combine(f'{warps}[tl_i0 * {groups} + tl_w]')};", "  }"]
            out.append(f"{ind}{self.block_sync}  // every warp's value in its slot")
            if acc.layout == "rows":        # each thread combines its own rows' slots
                out += self.rows_loop(acc, ["tl_i0"], gather + [f"  {acc.name}[tl_q] = {result};"], ind)
            else:
                gather.append(f"  {self.element(acc, [ir.Var('tl_i0')])} = {result};")
                out += self.thread_loop(acc.shape, ["tl_i0"], gather, ind)
        return out

    def shuffled(self, t, lane, how="__shfl_down_sync", width=None) -> str:
        """tl_acc from another lane (`how`: __shfl_down_sync by `lane` lanes, or
        __shfl_sync from lane `lane`), within segments of `width` lanes (None: the
        whole warp), in a type the shuffle takes (8-, 16-bit integers through int)."""
        shuffled = t if t in ("float", "double", "int", "unsigned", "long long", "unsigned long long") else "int"
        moved = "tl_acc" if shuffled == t else f"static_cast<{shuffled}>(tl_acc)"
        pulled = f"{how}(0xffffffffu, {moved}, {lane}{'' if width is None else f', {width}'})"
        return pulled if shuffled == t else f"static_cast<{t}>({pulled})"

    def reduce_in_lanes(self, s, acc, n, lanes, t, at, combine, result, ind) -> list:
        """`lanes` threads (a power of two) per result: thread t works on result
        t / lanes, its lane g = t % lanes walks elements g, g + lanes, g + 2 *
        lanes, ... in order; then the lanes of each warp combine as halves, lane
        g taking lane g + h's for h = min(lanes, 32) / 2, ..., 1 (__shfl_down_sync:
        every thread of a warp takes part, a thread past the last result with a
        value never read). A group of W > 1 warps then meets in shared memory
        (ir.REDUCE_WARPS, one slot a warp, between two block barriers: the first
        keeps a reduce before from still reading the slots), and lane 0 combines
        the warps' values in order, warp 0's first. Lane 0 writes acc[i]."""
        what = "row" if s.axis == 1 else "column"
        width = min(lanes, 32)
        warps = lanes // width
        pulled = self.shuffled(t, "tl_h", width=width)
        spare = self.threads // lanes > acc.elements      # threads past the last result, in the shuffles only
        first = f"tl_acc = {at(ir.Var('tl_lane'))};"
        rest = [f"for (int tl_k = tl_lane + {lanes}; tl_k < {n}; tl_k += {lanes}) {{",
                f"  tl_acc = {combine(at(ir.Var('tl_k')))};",
                "}"] if n > lanes else []
        if spare:
            walk = [f"{t} tl_acc = 0;", f"if (tl_i0 < {acc.elements}) {{"] + ["  " + x for x in [first] + rest] + ["}"]
        else:
            walk = [f"{t} {first}"] + rest
        then = "then the warps in order" if warps > 1 else ""
        body = [f"{{  // {lanes} threads per {what} of {s.src}: lane g walks elements g, g + {lanes}, ..., then the "
                f"lanes {'of each warp ' if warps > 1 else ''}combine in halves{', ' + then if then else ''}",
                f"  const int tl_i0 = threadIdx.x / {lanes}, tl_lane = threadIdx.x % {lanes};"]
        body += ["  " + line for line in walk]
        body += ["  #pragma unroll",
                 f"  for (int tl_h = {width // 2}; tl_h > 0; tl_h /= 2) {{",
                 f"    tl_acc = {combine(pulled)};",
                 "  }"]
        live = f"tl_i0 < {acc.elements} && " if spare else ""
        last = []       # lane 0's, before it writes the result
        if warps > 1:
            slots = f"reinterpret_cast<{t}*>({ir.REDUCE_WARPS})"
            body += [f"  {self.block_sync}  // a reduce before may still read the warps' slots",
                     f"  if ({live}tl_lane % 32 == 0) {{",
                     f"    {slots}[threadIdx.x / 32] = tl_acc;",
                     "  }",
                     f"  {self.block_sync}"]
            last = ["#pragma unroll",
                    f"for (int tl_w = 1; tl_w < {warps}; ++tl_w) {{",
                    f"  tl_acc = {combine(f'{slots}[threadIdx.x / 32 + tl_w]')};",
                    "}"]
        body += [f"  if ({live}tl_lane == 0) {{"] + ["    " + line for line in last] + \
            [f"    {self.element(acc, [ir.Var('tl_i0')])} = {result};", "  }", "}"]
        return [ind + line for line in body]

    def thread_copy(self, s: ir.ThreadCopy, ind) -> list:
        vector = self.vector_copy(s, ind + "  ")
        if vector is None:
            return self.element_copy(s, ind)
        cond, lines = vector
        return [f"{ind}if ({cond}) {{  // whole 16-byte vectors: contiguous rows, 16-byte aligned"] + lines + \
            [f"{ind}}} else {{"] + self.element_copy(s, ind + "  ") + [f"{ind}}}"]

    def vector_copy(self, s: ir.ThreadCopy, ind):
        """A global <-> shared copy between a row-major shared tile and a tensor of
        the same dtype whose tile rows are whole 16-byte vectors: (the block-uniform
        test that the tensor's rows are contiguous and the tile's vectors 16-byte
        aligned in it, the copy in 16-byte vectors) or None. Vectors that cross the
        tensor's last column go element by element, rows outside it read zeros."""
        src_b, dst_b = self.k.buffer(s.src.name), self.k.buffer(s.dst.name)
        tile, region = (src_b, s.dst) if src_b is not None else (dst_b, s.src)
        t = self.k.param(region.name)
        if (src_b is None) == (dst_b is None) or not isinstance(t, ir.TensorParam) or tile.scope != "shared" \
                or tile.layout != "row" or tile.stages != 1 or tile.dtype != t.dtype or 16 % t.dtype.size:
            return None
        per, width = 16 // t.dtype.size, s.shape[-1]
        if per < 2 or width % per or tuple(tile.shape) != tuple(s.shape) or ir.split_box(region, len(s.shape)):
            return None
        self.uses_vec16 = True
        last, lead = len(t.shape) - 1, len(t.shape) - len(s.shape)
        names = [f"tl_i{d}" for d in range(len(s.shape))]
        coords = [self.expr(c, 5) + (f" + {names[d - lead]}" if d >= lead else "") for d, c in enumerate(region.starts)]
        cond = " && ".join([f"tl_{t.name}_stride{last} == 1",
                            f"(reinterpret_cast<unsigned long long>({t.name}) & 15) == 0"] +
                           [f"tl_{t.name}_stride{d} % {per} == 0" for d in range(last)] +
                           [f"({self.expr(region.starts[-1], 6)}) % {per} == 0"])
        rows_ok = " && ".join(f"static_cast<unsigned long long>({c}) < static_cast<unsigned long long>"
                              f"(tl_{t.name}_dim{d})" for d, c in enumerate(coords[:last])) or "true"
        row = "".join(f" + static_cast<long long>({c}) * tl_{t.name}_stride{d}" for d, c in enumerate(coords[:last]))
        n, ct = math.prod(s.shape) // per, ctype(t.dtype)
        lines, index = [f"  const int tl_e = tl_v * {per};"], _unflatten(s.shape)
        lines += [f"  const int {name} = {idx};" for name, idx in zip(names, index)]
        in_row = (f"static_cast<unsigned long long>(tl_x + tl_l) < static_cast<unsigned long long>"
                  f"(tl_{t.name}_dim{last})")
        whole = f"tl_x >= 0 && tl_x + {per} <= tl_{t.name}_dim{last}"
        lines += [f"  {'const ' if src_b is not None else ''}{ct}* const tl_s = &{self.element(tile, [ir.Var(x) for x in names])};",
                  f"  const long long tl_x = {coords[last]};"]
        if src_b is None:       # global -> shared: cp.async, zeros where the vector leaves the tensor
            self.cp_async.add(16)
            lines += [f"  const long long tl_left = tl_{t.name}_dim{last} - tl_x;  // elements of the row from tl_x on",
                      f"  if ({rows_ok} && tl_x >= 0 && tl_left > 0) {{",
                      f"    tl_cp_async16(tl_s, {t.name}{row} + tl_x, "
                      f"tl_left >= {per} ? 16 : static_cast<int>(tl_left) * {t.dtype.size});",
                      "  } else {",
                      f"    tl_cp_async16(tl_s, {t.name}, 0);",
                      "  }"]
        else:                   # shared -> global
            lines += [f"  if ({rows_ok}) {{",
                      f"    {ct}* const tl_row = {t.name}{row};",
                      f"    if ({whole}) {{",
                      "      *reinterpret_cast<tl_v16*>(tl_row + tl_x) = *reinterpret_cast<const tl_v16*>(tl_s);",
                      "    } else {",
                      "      #pragma unroll",
                      f"      for (int tl_l = 0; tl_l < {per}; ++tl_l) if ({in_row}) tl_row[tl_x + tl_l] = tl_s[tl_l];",
                      "    }",
                      "  }"]
        slots = -(-n // self.threads)
        out = [f"{ind}{_unroll(slots, lines)}", f"{ind}for (int tl_slot = 0; tl_slot < {slots}; ++tl_slot) {{",
               f"{ind}  const int tl_v = tl_slot * {self.threads} + threadIdx.x;  // one 16-byte vector"]
        inner = ind + "  "
        if n % self.threads:
            out.append(f"{inner}if (tl_v < {n}) {{")
            inner += "  "
        rest = lines[1 + len(names):]
        declared = [f"  const int {name} = {value};" for name, value in _used(zip(names, index), rest)]
        out += [inner + line[2:] for line in [lines[0]] + declared + rest]
        if n % self.threads:
            out.append(f"{ind}  }}")
        out.append(f"{ind}}}")
        if src_b is None:
            out.append(f"{ind}tl_cp_async_wait_all();  // this thread's vectors are in shared memory")
        return cond, out

    def element_copy(self, s: ir.ThreadCopy, ind) -> list:
        names = [f"tl_i{d}" for d in range(len(s.shape))]
        src_b, dst_b = self.k.buffer(s.src.name), self.k.buffer(s.dst.name)
        lines = []
        view = self.k.view(s.src.name)
        if src_b is not None:
            value = self.element(src_b, [ir.Var(n) for n in names])
        else:
            ptr, cond = self.view_element(view, s.src, names) if view is not None else \
                self.global_element(s.src, names, "src")
            lines += [f"  const bool tl_in = {cond};"]
        src_dt = (src_b or self.k.param(view.tensor if view else s.src.name)).dtype
        dst_dt = (dst_b or self.k.param(s.dst.name)).dtype
        if src_b is not None and src_b.layout == "wgmma" and not src_b.transposed and dst_b is None and \
                not ir.split_box(s.dst, len(s.shape)):
            return self.fragment_store(s, src_b, ind)
        if src_b is not None and src_b.layout == "wgmma" and dst_b is not None and dst_b.scope == "shared" \
                and dst_dt.name in PAIR_TYPES and not (src_b.transposed and dst_dt.size != 2):
            return self.fragment_pairs(s, src_b, dst_b, ind)
        if src_b is None and dst_b is not None and dst_b.scope == "shared" and src_dt == dst_dt \
                and src_dt.size in (4, 8):
            # cp.async, src size 0 outside the tensor (zeros), every element in flight before the wait
            self.cp_async.add(src_dt.size)
            base = view.tensor if view is not None else s.src.name
            lines.append(f"  tl_cp_async{src_dt.size}(&{self.element(dst_b, [ir.Var(n) for n in names])}, "
                         f"tl_in ? &{ptr} : {base}, tl_in ? {src_dt.size} : 0);")
            return self.thread_loop(s.shape, names, lines, ind) + \
                [f"{ind}tl_cp_async_wait_all();  // this thread's elements are in shared memory"]
        if src_b is None:       # a predicated load: zero bits outside the tensor
            self.load_if.add(src_dt.size)
            value = f"tl_load_if{src_dt.size}(&{ptr}, tl_in)"
        value = _converted(value, src_dt, dst_dt)
        if dst_b is not None:
            lines.append(f"  {self.element(dst_b, [ir.Var(n) for n in names])} = {value};")
        else:
            ptr, cond = self.global_element(s.dst, names, "dst")
            lines.append(f"  if ({cond}) {ptr} = {value};")
        acc = self.fragment_of(s)
        if acc is not None:
            fence = self.fence_fragments(ind, [acc]) if dst_b is acc else []
            memory = "reads" if dst_b is not None and dst_b.scope == "local" else "writes"
            return self.fragment_loop(acc, names, lines, ind, memory) + fence
        return self.thread_loop(s.shape, names, lines, ind)

    def store_tail(self, s: ir.StoreTail, ind) -> list:
        """The columns of the store's tile from the tensor's last whole 16-byte
        granule to the row's end (fewer than a granule): the TMA store's map stops
        before them, because TMA stores write whole granules. Only blocks whose tile
        crosses that point run it (a block-uniform test), between block barriers."""
        t, b = self.k.param(s.tensor), self.k.buffer(s.buffer)
        per, width = ir.granule_elements(t.dtype), s.shape[-1]
        inner = f"tl_{t.name}_dim{len(t.shape) - 1}"
        names = [f"tl_i{d}" for d in range(len(s.shape))]
        rows = list(zip(names[:-1], _unflatten(s.shape[:-1], per)))
        ptr, cond = self.global_element(ir.Region(t.name, s.coords, ()), names, "dst")
        value = self.element(b, [ir.Var(n) for n in names])
        i = ind
        return [f"{i}{{  // {t.name}'s columns past its last whole 16-byte granule, written by threads",
                f"{i}  const long long tl_x0 = {self.expr(s.coords[-1])};",
                f"{i}  const long long tl_tail = {inner} / {per} * {per};  // where the TMA store's map ends",
                f"{i}  if (tl_tail < {inner} && tl_x0 < {inner} && tl_tail < tl_x0 + {width}) {{",
                f"{i}    const int tl_first = static_cast<int>((tl_x0 > tl_tail ? tl_x0 : tl_tail) - tl_x0);",
                f"{i}    {self.block_sync}  // the tile is complete and visible to every thread",
                f"{i}    for (int tl_e = threadIdx.x; tl_e < {math.prod(s.shape[:-1]) * per}; "
                f"tl_e += {self.threads}) {{"]  + \
               [f"{i}      const int {n} = {e};" for n, e in rows] + \
               [f"{i}      const int {names[-1]} = tl_first + tl_e % {per};",
                f"{i}      if ({names[-1]} < {width} && {cond}) {ptr} = {value};",
                f"{i}    }}",
                f"{i}    {self.block_sync}  // read before anything overwrites the tile",
                f"{i}  }}",
                f"{i}}}"]

    def specialized(self, s: ir.Specialized, ind) -> list:
        """The producer warpgroup (threads `threads` and up) and the consumers,
        each after its setmaxnreg; the consumers' block barriers become a named
        barrier of their own."""
        t = self.threads
        producer = self.block(s.producer, ind + "    ")
        self.block_sync = f"consumers_sync<{t}>();"
        consumers = self.block(s.consumers, ind + "  ")
        self.block_sync = "__syncthreads();"
        return [f"{ind}if (threadIdx.x >= {t}) {{  // the producer warpgroup: one thread issues the ring's loads",
                f"{ind}  setmaxnreg_dec<{s.producer_regs}>();",
                f"{ind}  if (threadIdx.x == {t}) {{"] + producer + [f"{ind}  }}",
                f"{ind}}} else {{  // the {t} consumer threads",
                f"{ind}  setmaxnreg_inc<{s.consumer_regs}>();"] + consumers + [f"{ind}}}"]

    def fragment_pairs(self, s: ir.ThreadCopy, acc: ir.Buffer, dst: ir.Buffer, ind) -> list:
        """copy(acc, shared tile), or of a chunk of acc's columns (the tile's
        width from a start column): registers r and r + 1 of a thread are columns
        c and c + 1 of one row, so each pair is converted together (cvt .f16x2 /
        .bf16x2) and stored as one 4-byte (8 for f32) word; one conversion per
        register makes ptxas serialize the kernel's wgmmas (C7514)."""
        mt, regs, row, col = self.fragment_index(acc)
        self.pair_stores.add(dst.dtype.name)
        if acc.transposed:
            return self.transposed_pairs(acc, dst, regs, row, col, ind)
        pair_t, pack = PAIR_TYPES[dst.dtype.name]
        where = self.element(dst, [ir.Var("tl_i0"), ir.Var("tl_i1")])
        first = fold(s.src.starts[1]).value if s.src.starts else 0
        body = [f"{ind}  const int tl_i0 = {row};", f"{ind}  const int tl_i1 = {col}{f' - {first}' if first else ''};"]
        body += self.inside_fragment(acc, "tl_i0", "tl_i1", [
            f"{ind}  *reinterpret_cast<{pair_t}*>(&{where}) = {pack}({acc.name}[tl_r], {acc.name}[tl_r + 1]);"],
            ind + "  ")
        if not first and dst.shape == acc.shape:
            return [f"{ind}#pragma unroll",
                    f"{ind}for (int tl_r = 0; tl_r < {regs}; tl_r += 2) {{  // columns tl_i1, tl_i1 + 1"] + \
                body + [f"{ind}}}"]
        # the chunk's registers: in each m64 tile's share (regs / mt), those of its columns
        half, lo, hi = regs // mt, first // 2, (first + dst.shape[1]) // 2
        what = f"columns tl_i1, tl_i1 + 1 of acc's columns {first} .. {first + dst.shape[1] - 1}"
        if mt == 1:
            head = [f"{ind}for (int tl_r = {lo}; tl_r < {hi}; tl_r += 2) {{  // {what}"]
        else:
            head = [f"{ind}for (int tl_j = 0; tl_j < {mt * (hi - lo)}; tl_j += 2) {{  // {what}",
                    f"{ind}  const int tl_r = tl_j / {hi - lo} * {half} + {lo} + tl_j % {hi - lo};"]
        return [f"{ind}#pragma unroll"] + head + body + [f"{ind}}}"]

    def transposed_pairs(self, acc: ir.Buffer, dst: ir.Buffer, regs, row, col, ind) -> list:
        """copy(acc, shared tile) of a transposed accumulator: registers r and r + 1
        of a thread are rows i and i + 1 of one column j of acc, converted together
        (as fragment_pairs) and stored as two 2-byte halves."""
        assert dst.shape == acc.shape and dst.dtype.size == 2, (dst.shape, acc.shape, dst.dtype)
        _, pack = PAIR_TYPES[dst.dtype.name]
        halves = [self.element(dst, [ir.Var(i), ir.Var("tl_i1")]) for i in ("tl_i0", "tl_i0 + 1")]
        return [f"{ind}#pragma unroll",
                f"{ind}for (int tl_r = 0; tl_r < {regs}; tl_r += 2) {{  // rows tl_i0, tl_i0 + 1 of column tl_i1",
                f"{ind}  const int tl_i0 = {col};", f"{ind}  const int tl_i1 = {row};"] + \
            self.inside_fragment(acc, "tl_i1", "tl_i0", [
                f"{ind}  const unsigned tl_v = {pack}({acc.name}[tl_r], {acc.name}[tl_r + 1]);",
                f"{ind}  reinterpret_cast<unsigned short&>({halves[0]}) = static_cast<unsigned short>(tl_v);",
                f"{ind}  reinterpret_cast<unsigned short&>({halves[1]}) = static_cast<unsigned short>(tl_v >> 16);"],
                ind + "  ") + [f"{ind}}}"]

    def fragment_store(self, s: ir.ThreadCopy, acc: ir.Buffer, ind) -> list:
        """copy(acc, T[...]) from wgmma fragments: a thread's registers cover 2 rows
        per m64 tile and column pairs 8 apart, so each row's bounds test and
        address are computed once (64-bit), then its columns stored. (Per-element
        index math made NVVM and ptxas take twice as long on gemm.tile.)"""
        t = self.k.param(s.dst.name)
        mt, nw = ir.fragment_tiles(acc, self.threads)
        n = acc.fragment_shape[1]
        lead = len(t.shape) - 2
        starts = [self.expr(e, 5) for e in s.dst.starts]
        outer = [f"static_cast<unsigned long long>({c}) < static_cast<unsigned long long>(tl_{t.name}_dim{d})"
                 for d, c in enumerate(starts[:lead])]
        offset = "".join(f" + static_cast<long long>({c}) * tl_{t.name}_stride{d}"
                         for d, c in enumerate(starts[:lead]))
        value = _converted(f"{acc.name}[tl_h / 2 * {nw // 2} + tl_j * 4 + tl_h % 2 * 2 + tl_p]", acc.dtype, t.dtype)
        row_ok = (f"static_cast<unsigned long long>(tl_y) < static_cast<unsigned long long>(tl_{t.name}_dim{lead})")
        if ir.padded_rows(acc):     # and a row of the tile, not of its padding to m64 tiles
            row_ok = f"tl_row + tl_h / 2 * 64 + tl_h % 2 * 8 < {acc.shape[0]} && {row_ok}"
        i = ind
        out = [f"{i}{{",
               f"{i}  const int tl_row = {_fragment_row(acc.wg_cols, ir.fragment_tiles(acc, self.threads)[0])};",
               f"{i}  const int tl_col = {_fragment_col(acc, self.threads)}{_FRAGMENT_COL};"]
        if outer:
            out += [f"{i}  if ({' && '.join(outer)}) {{"]
            i += "  "
        out += [f"{i}  #pragma unroll",
                f"{i}  for (int tl_h = 0; tl_h < {2 * mt}; ++tl_h) {{  // rows: +8 within an m64 tile, +64 per tile",
                f"{i}    const long long tl_y = static_cast<long long>({starts[lead]}) + tl_row + tl_h / 2 * 64 + "
                "tl_h % 2 * 8;",
                f"{i}    if ({row_ok}) {{",
                f"{i}      {ctype(t.dtype)}* const tl_out = {t.name}{offset} + tl_y * tl_{t.name}_stride{lead};",
                f"{i}      #pragma unroll",
                f"{i}      for (int tl_j = 0; tl_j < {nw // 8}; ++tl_j) {{"] + ([
                f"{i}        if (tl_col + tl_j * 8 >= {n}) break;  // the last warpgroup's registers past N"]
                if ir.uneven_split(acc) else []) + [
                f"{i}        #pragma unroll",
                f"{i}        for (int tl_p = 0; tl_p < 2; ++tl_p) {{",
                f"{i}          const long long tl_x = static_cast<long long>({starts[lead + 1]}) + tl_j * 8 + tl_col + tl_p;",
                f"{i}          if (static_cast<unsigned long long>(tl_x) < static_cast<unsigned long long>"
                f"(tl_{t.name}_dim{lead + 1})) tl_out[tl_x * tl_{t.name}_stride{lead + 1}] = {value};",
                f"{i}        }}", f"{i}      }}", f"{i}    }}", f"{i}  }}"]
        if outer:
            out.append(f"{ind}  }}")
        out.append(f"{ind}}}")
        return out

    def view_element(self, v: ir.Im2colView, r: ir.Region, names):
        """Element (m0 + i0, k0 + i1) of an im2col view read straight from X, and the
        test that it is inside the matrix and its tap inside the image (else zero)."""
        x = self.k.param(v.tensor)
        (m, kk), coords, (rows, columns) = im2col.element(v, x, r.starts, names)
        conds = [f"{self.expr(m, 4)} < {self.expr(rows, 4)}", f"{self.expr(kk, 4)} < {self.expr(columns, 4)}"]
        idx = []
        for d, e in enumerate(coords):
            ce = self.expr(e, 5)
            if 0 < d < len(coords) - 1:
                conds.append(f"static_cast<unsigned long long>({ce}) < static_cast<unsigned long long>(tl_{x.name}_dim{d})")
            idx.append(f"static_cast<long long>({ce}) * tl_{x.name}_stride{d}")
        return f"{x.name}[{' + '.join(idx)}]", " && ".join(conds)

    def global_element(self, r: ir.Region, names, which):
        """The element of tensor region `r` at tile index `names`, and its in-bounds test.
        Index math is 64-bit: tensors may be larger than 2^31 elements."""
        t = self.k.param(r.name)
        lead = len(t.shape) - len(names)
        offsets = _split_rows(r, lead, names[0])
        idx, conds = [], []
        for d, start in enumerate(r.starts):
            coord = self.expr(start, 5)
            if d in offsets:
                coord = f"{coord} + {offsets[d]}"
            elif d >= lead:
                coord = f"{coord} + {names[d - lead]}"
            idx.append(f"static_cast<long long>({coord}) * tl_{t.name}_stride{d}")
            conds.append(f"static_cast<unsigned long long>({coord}) < static_cast<unsigned long long>(tl_{t.name}_dim{d})")
        return f"{t.name}[{' + '.join(idx)}]", " && ".join(conds)


def _split_rows(r: ir.Region, lead: int, row: str) -> dict:
    """Where region `r` splits the tile's first dimension (index `row`) over its
    dimensions `..lead` (ir.split_box), each such dimension's offset from its start:
    {dimension: expression}; {} where it does not."""
    box = ir.split_box(r, len(r.starts) - lead)
    if not box:
        return {}
    first = next(d for d, e in enumerate(box) if e > 1)
    out = {}
    for d in range(first, lead + 1):
        inner = math.prod(box[d + 1:lead + 1])
        term = f"{row} / {inner}" if inner > 1 else row
        out[d] = f"({term}) % {box[d]}" if d > first else f"({term})"
    return out


UNROLL_ALL = 64      # a thread loop of at most this many slots a thread is unrolled whole


def _unroll(slots: int, body) -> str:
    """The pragma of a thread loop over `slots` slots. A body that reads or writes a
    local tile's registers (`name[tl_slot]`) is unrolled whole: registers need
    compile-time indices. Others are unrolled whole up to UNROLL_ALL slots and by 4
    beyond (a parallel over a 256 x 256 shared region on 32 threads, 2048 slots,
    took NVRTC 16 s unrolled whole)."""
    if slots <= UNROLL_ALL or any("[tl_slot]" in line for line in body):
        return "#pragma unroll"
    return "#pragma unroll 4"


def _unflatten(shape, unit=1) -> list:
    """The tile index of flat element tl_e / unit (row-major over `shape`), per dim."""
    out = []
    for d, extent in enumerate(shape):
        stride = math.prod(shape[d + 1:]) * unit
        idx = "tl_e" if stride == 1 else f"tl_e / {stride}"
        out.append(f"{idx} % {extent}" if d else idx)
    return out


def _hoist_coordinates(loop: ir.For):
    """A pipelined loop's TMA coordinates (and im2col offsets) with their
    loop-invariant parts that divide by a value known only at run time (a
    persistent loop's tile row `(pid + i * P) / cdiv(N, BN) * BM`, an im2col
    tile's first pixel `by * 128 / W % H`) replaced by names computed before
    the loop. The refills run on thread 0 inside the loop, where the compiler may
    not hoist a division (it could fault), and the other threads of its
    warpgroup wait for it at the next wgmma. A division that does change in
    the loop, of a non-negative value by a run-time value that does not (an
    im2col tap, `(k + 2) * 64 / C`), becomes a multiply by a divisor prepared
    before the loop (tl_fastdiv). Returns (loop, [(name, expr)], [(divisor
    name, expr)])."""
    names: dict = {}
    divisors: dict = {}

    def varies(e):
        return any(isinstance(x, ir.Var) and x.name == loop.var for x in walk_expr(e))

    def divides_at_run_time(e):
        return any(isinstance(x, ir.BinOp) and x.op in ("/", "%") and not isinstance(x.rhs, ir.Int)
                   for x in walk_expr(e))

    def hoist(e):
        if not varies(e) and divides_at_run_time(e):
            key = show_expr(e)
            if key not in names:
                names[key] = (f"tl_{loop.var}_inv{len(names)}", e)
            return ir.Var(names[key][0], "let")
        if isinstance(e, ir.BinOp) and e.op in ("/", "%") and not isinstance(e.rhs, ir.Int) \
                and not varies(e.rhs) and _non_negative(e.lhs):
            key = show_expr(e.rhs)
            if key not in divisors:
                divisors[key] = (f"tl_{loop.var}_div{len(divisors)}", e.rhs)
            return ir.Call("fastdiv" if e.op == "/" else "fastmod", (hoist(e.lhs), ir.Var(divisors[key][0], "let")))
        if isinstance(e, ir.BinOp):
            return ir.BinOp(e.op, hoist(e.lhs), hoist(e.rhs))
        if isinstance(e, ir.Call) and e.func in ("min", "max"):     # an im2col column's tap, clamped
            return replace(e, args=tuple(hoist(a) for a in e.args))
        return e

    def stmt(x):
        if isinstance(x, ir.TmaLoad):
            return replace(x, coords=tuple(hoist(c) for c in x.coords), offsets=tuple(hoist(o) for o in x.offsets))
        return x
    body = map_body(loop.body, stmt)
    return replace(loop, body=body), list(names.values()), list(divisors.values())


# statements that declare no C++ name in the scope they are emitted in
_UNSCOPED = (ir.OneThread, ir.If, ir.TmaLoad, ir.ArriveExpectTx, ir.MbarrierWait, ir.MbarrierArrive)


def _refill_loop(loop: ir.For) -> bool:
    """A loop whose TMA coordinates _hoist_coordinates may compute before it: a
    pipelined ring, or a loop of TMA loads that binds no name of its own inside
    (the producer warpgroup's half of a `pipelined(..., producer = 1)` loop: a
    single thread that issues every refill, so a division it repeats per step
    delays every stage; the s2 conv layer ran 0.88 of cuDNN with them, 0.94 with
    them hoisted, benchmarks/NOTES.md session 13)."""
    if loop.ring:
        return True
    body = list(walk_stmts(loop.body))
    return any(isinstance(x, ir.TmaLoad) for x in body) and \
        not any(isinstance(x, (ir.For, ir.Let, ir.Parallel)) for x in body)


def _non_negative(e) -> bool:
    """Provably >= 0: sums, products and quotients of literals >= 0, loop and
    block indices, shape symbols and consts."""
    if isinstance(e, ir.Int):
        return e.value >= 0
    if isinstance(e, ir.Var):
        return e.kind in ("loop", "block", "symbol", "const", "let")
    if isinstance(e, ir.BinOp) and e.op in ("+", "*", "/", "%"):
        return _non_negative(e.lhs) and _non_negative(e.rhs)
    return False


def _fragment_row(wg_cols: int, m_tiles: int, tile="") -> str:
    """The first accumulator row a thread holds in wgmma's m64nNk16 fragments (and
    so the first row of a 'rows' tile beside them): warpgroup g owns rows (g /
    wg_cols) * 64 * m_tiles.. (`tile`: + 64 per m64 tile), warp w 16 of them, lane l
    row l / 4 (and row + 8)."""
    return f"({_warpgroup_row(wg_cols)}) * {64 * m_tiles}{tile} + (threadIdx.x % 128) / 32 * 16 + (threadIdx.x % 32) / 4"


def _fragment_col(acc: ir.Buffer, threads: int) -> str:
    """The first column of the warpgroup's share ('' when one warpgroup spans N), ending in ' + '."""
    _, nw = ir.fragment_tiles(acc, threads)
    return "" if acc.wg_cols == 1 else f"({_warpgroup_col(acc.wg_cols)}) * {nw} + "


def _mn_major(kdim: int, swizzle: int) -> str:
    """An M/N-major operand's leading and stride byte offsets: swizzled, the
    distance between column chunks (`kdim` rows each) and between 8-row groups;
    in 16-byte chunks, not swizzled, wgmma takes them the other way round (its
    interleaved layout: the stride offset steps M/N, the leading one K)."""
    chunks, groups = kdim * swizzle, 8 * swizzle
    return f"{groups}, {chunks}" if swizzle == 16 else f"{chunks}, {groups}"


def _lead(rows: int, swizzle: int) -> int:
    """A K-major operand's leading byte offset: with 16-byte chunks (not swizzled)
    a K step's 32 bytes are two chunks, `rows` rows of 16 bytes apart; swizzled
    chunks hold a whole K step, and wgmma ignores the field (1, in 16-byte units)."""
    return rows * swizzle if swizzle == 16 else 16


def _warpgroup_row(wg_cols: int) -> str:
    """Which row of warpgroups a thread's is, `wg_cols` warpgroups to a row (over N)."""
    return "threadIdx.x / 128" if wg_cols == 1 else f"threadIdx.x / {128 * wg_cols}"


def _warpgroup_col(wg_cols: int) -> str:
    """Which of the `wg_cols` warpgroups of its row a thread's is."""
    return f"threadIdx.x / 128 % {wg_cols}"


_FRAGMENT_COL = "(threadIdx.x % 4) * 2"     # a lane's first column in each 8-column group


# dtype -> (the C type of two adjacent elements, the primitive that packs two floats, or two ints: i32)
PAIR_TYPES = {"f16": ("unsigned", "tl_pack_f16x2"), "bf16": ("unsigned", "tl_pack_bf16x2"),
              "f32": ("tl_f32x2", "tl_pack_f32x2"), "i32": ("tl_i32x2", "tl_pack_i32x2")}


def _converted(value: str, src_dt: ir.DType, dst_dt: ir.DType) -> str:
    if src_dt == dst_dt:
        return value
    if src_dt.is_float or dst_dt.is_float:     # narrow floats convert through float
        arith = "double" if "f64" in (src_dt.name, dst_dt.name) else "float"
        return convert(dst_dt, f"static_cast<{arith}>({value})")
    return convert(dst_dt, value)


def _used(named_values, body) -> list:
    """The (name, value) pairs whose name the body's lines mention: index variables
    nothing reads are not declared (no dead code, no NVRTC warning). Comments do
    not count: a source line quoted above its code may name an index that folding
    removed (`a[(i + 1) % 1, j]` is `a[0 * 16 + j]`)."""
    text = "\n".join(re.sub(r"//.*", "", line) for line in body)
    return [(n, v) for n, v in named_values if re.search(rf"\b{n}\b", text)]


def _primitives(k: ir.Kernel, printer_uses_math: bool, debug: bool = False, pr=None, arch: str = DEFAULT_ARCH) -> list:
    stmts = list(ir.walk_stmts(k.body))
    need = []

    def add(macro, *args):
        need.append({"macro": macro, "args": args})

    dtypes = {b.dtype.name for b in k.buffers} | {p.dtype.name for p in k.params} | (pr.cast_to if pr else set())
    for name, macro in (("f16", "f16"), ("bf16", "bf16")):
        if name in dtypes:
            add(macro)
    f8 = "f8" if get_arch(arch).fp8_cvt else "f8_soft"     # no fp8 cvt before sm_89
    if "f8e4m3" in dtypes:
        add(f8, "f8e4m3_t", "e4m3")
    if "f8e5m2" in dtypes:
        add(f8, "f8e5m2_t", "e5m2")
    if k.tensor_maps:
        add("tensor_map")
    if k.tensor_maps or k.barriers or any(b.swizzle for b in k.buffers) or (pr is not None and pr.cp_async):
        add("smem_addr")
    if k.barriers:
        add("mbarrier")
    if k.barriers and debug:
        add("mbarrier_debug")
    for rank in sorted({len(s.coords) for s in stmts if isinstance(s, ir.TmaLoad) and not s.view}):
        add("tma_load", rank)
    for rank in sorted({len(s.coords) for s in stmts if isinstance(s, ir.TmaLoad) and s.view}):
        add("tma_load_im2col", rank)
    if any(isinstance(s, ir.TmaLoad) and s.zeros_if is not None for s in stmts):
        add("bulk_copy_zeros", ir.ZERO_BYTES)
    for rank in sorted({len(s.coords) for s in stmts if isinstance(s, ir.TmaStore)}):
        add("tma_store", rank)
    if any(isinstance(s, (ir.BulkCommit, ir.BulkWait)) for s in stmts):
        add("bulk_group")
    if any(isinstance(s, ir.Specialized) for s in stmts):
        add("warp_specialized")
    if any(isinstance(s, ir.ProxyFence) for s in stmts):
        add("proxy_fence")
    if printer_uses_math:
        add("math")
    if pr is not None and pr.uses_int_convert:
        add("int_convert")
    if pr is not None and pr.uses_exp2:
        add("exp2")
    if pr is not None and pr.uses_fastdiv:
        add("fastdiv")
    if pr is not None and pr.mma_shapes:
        fenced = {b.dtype.name for b in k.buffers if b.layout == "wgmma"}     # fence_fragments' overloads
        add("wgmma_common", "f32" in fenced, "i32" in fenced)
        for n, dt, a_from, b_n_major, zero in sorted(pr.mma_shapes):
            types, k = _MMA_TYPES[dt]
            add("wgmma_mma", n, dt, a_from, b_n_major, types, k, zero)
    for swizzle in sorted(pr.swizzles if pr is not None else ()):
        add("swizzled", swizzle)
    for name, positions in sorted(pr.row_orders.items() if pr is not None else ()):
        add("row_order", name, positions)
    if pr is not None and pr.pair_stores:
        add("pack2", sorted(pr.pair_stores))
    if pr is not None and pr.uses_vec16:
        add("vec16")
    if pr is not None and pr.cp_async:
        add("cp_async", sorted(pr.cp_async))
    if pr is not None and pr.load_if:
        add("load_if", sorted(pr.load_if))
    if pr is not None and pr.uses_stream_k:
        add("stream_k")
    return need


# a gemm's operand label (in its wgmma function's name) -> the instruction's D.A.B types, its K step
_MMA_TYPES = {"f16": ("f32.f16.f16", 16), "bf16": ("f32.bf16.bf16", 16), "f8e4m3": ("f32.e4m3.e4m3", 32),
              "f8e5m2": ("f32.e5m2.e5m2", 32), "tf32": ("f32.tf32.tf32", 8), "i8": ("s32.s8.s8", 32),
              "u8": ("s32.u8.u8", 32), "i8u8": ("s32.s8.u8", 32), "u8i8": ("s32.u8.s8", 32)}


def _mma_label(s: ir.Gemm, a: ir.Buffer, b: ir.Buffer) -> str:
    """The operand types of gemm `s` as wgmma reads them (a and b in wgmma's order):
    one dtype's name, tf32, or an 8-bit integer pair (i8u8) where they differ."""
    if s.tf32:
        return "tf32"
    return a.dtype.name if a.dtype == b.dtype else a.dtype.name + b.dtype.name


def _has_phase_register(k, name) -> bool:
    return any(isinstance(s, ir.FlipPhase) and s.barrier == name for s in ir.walk_stmts(k.body))


def _param_decl(k: ir.Kernel, p) -> str:
    if p.kind == "tensor_map":
        return f"const __grid_constant__ CUtensorMap tl_{p.name}"
    if p.kind == "debug_record":
        return "int* const tl_debug"
    if p.kind == "workspace":
        return "unsigned char* const tl_workspace"
    if p.kind == "pointer":
        return f"{ctype(p.dtype)}* __restrict__ {p.name}"
    if p.kind in ("dim", "stride"):
        return f"const long long tl_{p.name}"
    if p.kind == "symbol":     # 32-bit, like CUDA's int: the host checks each fits (rt.symbol)
        return f"const int {p.name}"
    return f"const {ctype(p.dtype)} {p.name}"


def _launch_bounds(k: ir.Kernel) -> str:
    """Threads per block, and for a warp-specialised kernel the blocks per SM
    plan-smem found room for (ptxas keeps registers within both)."""
    blocks = [s.blocks_per_sm for s in ir.walk_stmts(k.body) if isinstance(s, ir.Specialized)]
    return f"{k.launch_threads}, {blocks[0]}" if blocks else str(k.launch_threads)


def generate(k: ir.Kernel, source_name: str, debug: bool = False, arch: str = DEFAULT_ARCH) -> str:
    """The kernel's CUDA for `arch` (k lowered for it). `debug`: every mbarrier wait
    is bounded (~1 s); on expiry it records which barrier, phase, expect-tx bytes
    and .tile line, and traps."""
    pr = _Printer(k, debug)
    body = pr.block(k.body)
    pr.uses_int_convert = any("tl_to_int<" in line for line in body)
    prologue = []
    if k.smem_bytes and any(b.swizzle for b in k.buffers):
        prologue.append(f"extern __shared__ __align__({plan_smem.DYNAMIC_BASE_ALIGN}) unsigned char tl_smem_raw[];")
        prologue.append("// swizzled tiles need 1024-byte aligned shared addresses")
        prologue.append("unsigned char* const tl_smem = tl_smem_raw + ((1024u - (smem_addr(tl_smem_raw) & 1023u)) & 1023u);")
    elif k.smem_bytes:
        prologue.append(f"extern __shared__ __align__({plan_smem.DYNAMIC_BASE_ALIGN}) unsigned char tl_smem[];")
    for b in k.buffers:
        shape = ", ".join(map(str, b.shape))
        if b.scope == "shared":
            prologue.append(f"{ctype(b.dtype)}* const {b.name} = reinterpret_cast<{ctype(b.dtype)}*>"
                            f"(tl_smem + {b.smem_offset});  // shared {b.name}: {b.dtype.name}[{shape}]")
        elif b.layout == "wgmma":
            regs = ir.fragment_regs(b, pr.threads)
            prologue.append(f"{ctype(b.dtype)} {b.name}[{regs}];  // local {b.name}: {b.dtype.name}[{shape}] as wgmma "
                            f"accumulator fragments{' of its transpose' if b.transposed else ''}")
        elif b.layout == "rows":
            prologue.append(f"{ctype(b.dtype)} {b.name}[{ir.row_slots(b, pr.threads)}];  // local {b.name}: "
                            f"{b.dtype.name}[{shape}] in the accumulator rows this thread's fragments hold")
        else:
            slots = -(-b.elements // pr.threads)
            prologue.append(f"{ctype(b.dtype)} {b.name}[{slots}];  // local {b.name}: {b.dtype.name}[{shape}],"
                            f" element e in thread e % {pr.threads}")
    for b in k.barriers:
        count = f"[{b.count}]" if b.array else ""
        prologue.append(f"__shared__ __align__(8) unsigned long long tl_{b.name}{count};")
    for name in [b.name for b in k.barriers if not b.array and _has_phase_register(k, b.name)]:
        prologue.append(f"unsigned tl_phase_{name} = 0;  // parity of {name}'s next phase")
    for var in dict.fromkeys(s.var for s in ir.walk_stmts(k.body) if isinstance(s, ir.RingAdvance)):
        prologue.append(f"int {var} = 0;  // iterations of its pipelined ring in earlier trips of the "
                        "loop around it")
    for axis, name in zip("xyz", k.grid_vars):
        prologue.append(f"const int {name} = blockIdx.{axis};")
    if k.persistent:
        prologue.append(f"const int {make_persistent.BLOCKS} = gridDim.x;  // the blocks the GPU holds at once, "
                        "each looping over tiles")
    if pr.uses_stream_k:
        prologue.append(f"unsigned* const tl_slot_ready = reinterpret_cast<unsigned*>(tl_workspace);  // a flag per "
                        f"block; the blocks' slots of partial sums start at byte {WORKSPACE_FLAG_BYTES}")
    return _env().get_template("kernel.cu.j2").render(
        version=__version__, source_name=source_name, kernel_name=k.name, consts=k.consts_text, arch=arch,
        primitives=_primitives(k, pr.uses_math, pr.debug, pr, arch), launch_bounds=_launch_bounds(k),
        params=[_param_decl(k, p) for p in kernel_params(k, pr.debug)] or ["void"],
        prologue=prologue, body=body)
