"""The IR printer: what `tilec emit --emit ir [--after PASS]` shows and what
FileCheck tests read. Every fact a pass decides (box, bytes, barrier, parity,
smem offset) is visible here."""
from __future__ import annotations

from . import nodes as ir

_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3,
         "+": 4, "-": 4, "*": 5, "/": 5, "%": 5}


def binary(e: ir.BinOp, prec: int, precedence: dict, show, op: str | None = None, chains: bool = True) -> str:
    """`lhs op rhs` in a language with these operator precedences (higher binds
    tighter, left-associative), parenthesised where the enclosing `prec` needs:
    the one core of the IR printer, the CUDA printer and the host-wrapper
    printer. `show(e, prec)` prints an operand; `op` is the operator as that
    language spells it; `chains`: False where `a < b < c` means something else
    (Python's chained comparisons), so both operands of such an operator bind
    tighter."""
    op = op or e.op
    p = precedence[op]
    text = f"{show(e.lhs, p if chains else p + 1)} {op} {show(e.rhs, p + 1)}"
    return f"({text})" if p < prec else text


def expr(e, prec: int = 0) -> str:
    if isinstance(e, ir.Int):
        return str(e.value)
    if isinstance(e, ir.Float):
        return repr(e.value)
    if isinstance(e, ir.Var):
        return e.name
    if isinstance(e, ir.BinOp):        # comparisons do not chain in the language: (a == b) == c
        return binary(e, prec, _PREC, expr, chains=_PREC[e.op] != _PREC["=="])
    if isinstance(e, ir.UnaryOp):
        return f"{e.op}{expr(e.operand, 6)}"
    if isinstance(e, ir.Call):
        args = [expr(a) for a in e.args] + [f"{k} = {expr(v)}" for k, v in e.kwargs]
        return f"{e.func}({', '.join(args)})"
    if isinstance(e, ir.Cast):
        return f"{e.dtype.name}({expr(e.value)})"
    if isinstance(e, ir.TupleExpr):
        return "(" + ", ".join(expr(i) for i in e.items) + ")"
    if isinstance(e, ir.Subscript):
        return f"{e.name}[{', '.join(expr(i) for i in e.indices)}]"
    if isinstance(e, ir.Slice):
        return f"{expr(e.start)} : {expr(e.stop)}"
    raise TypeError(f"not an expression: {e!r}")


def region(r: ir.Region) -> str:
    if not r.starts:
        return r.name
    parts = []
    for s, x in zip(r.starts, r.extents or (None,) * len(r.starts)):
        parts.append(expr(s) if x is None else f"{expr(s)} : +{expr(x)}")
    return f"{r.name}[{', '.join(parts)}]"


def _bar(name, index) -> str:
    return name if index is None else f"{name}[{expr(index)}]"


def _loc(s) -> str:
    return f"  // line {s.span.line}" if s.span is not None else ""


def stmt(s, ind: str) -> list:
    L = _loc(s)
    if isinstance(s, ir.Copy):
        return [f"{ind}copy {region(s.src)} -> {region(s.dst)}{L}"]
    if isinstance(s, ir.Fill):
        return [f"{ind}fill {s.buffer}, {expr(s.value)}{L}"]
    if isinstance(s, ir.Gemm):
        tb = (", transpose_a" if s.transpose_a else "") + (", transpose_b" if s.transpose_b else "") + \
            (", tf32" if s.tf32 else "")
        wg = f" on {s.warpgroups} warpgroups x {s.m_tiles} m64 tiles" if s.warpgroups else ""
        wg += f", {s.wg_cols} across N" if s.wg_cols > 1 else ""
        wg += f", {s.a} from registers" if s.a_in_registers else ""
        wg += f", {s.a} as im2col kernel = ({s.patch[0]}, {s.patch[1]})" if s.patch else ""
        wg += f" stride = {s.patch_stride}" if s.patch_stride > 1 else ""
        wg += f" as {s.acc}^T = {s.b}^T @ {s.a}^T" if s.swapped else ""
        wg += f" [stage {expr(s.stage)}]" if s.stage is not None else ""
        return [f"{ind}gemm {s.a}, {s.b}, {s.acc}{tb}{wg}{f', {s.acc} = product' if s.zero else ''}{L}"]
    if isinstance(s, ir.Reduce):
        return [f"{ind}reduce {s.src} -> {s.dst}, axis {s.axis}, op {s.op}{L}"]
    if isinstance(s, ir.Assign):
        return [f"{ind}{s.buffer}[{', '.join(expr(i) for i in s.indices)}] = {expr(s.value)}{L}"]
    if isinstance(s, ir.Parallel):
        head = f"{ind}parallel ({', '.join(s.vars)}) in ({', '.join(expr(x) for x in s.extents)}) {{{L}"
        return [head] + block(s.body, ind + "  ") + [f"{ind}}}"]
    if isinstance(s, ir.For):
        bounds = [s.start, s.extent] + ([s.step] if s.step is not None else []) if s.start is not None else [s.extent]
        it = f"range({', '.join(expr(x) for x in bounds)})" if s.stages is None else \
            f"pipelined({expr(s.extent)}, stages = {expr(s.stages) if isinstance(s.stages, ir.Expr) else s.stages}" + \
            (f", producer = {expr(s.producer) if isinstance(s.producer, ir.Expr) else s.producer})"
             if _asks_producer(s) else ")")
        return [f"{ind}for {s.var} in {it} {{{L}"] + block(s.body, ind + "  ") + [f"{ind}}}"]
    if isinstance(s, ir.If):
        out = [f"{ind}if {expr(s.cond)} {{{L}"] + block(s.then, ind + "  ")
        if s.orelse:
            out += [f"{ind}}} else {{"] + block(s.orelse, ind + "  ")
        return out + [f"{ind}}}"]
    if isinstance(s, ir.TmaLoad):
        via = f" map {s.tensor_map}" if s.tensor_map else ""
        bar = f" bar {s.barrier} bytes {s.bytes}" if s.barrier else ""
        coords = ", ".join(expr(c) for c in s.coords)
        if s.stage is not None or s.barrier_index is not None:
            bar = f" bar {_bar(s.barrier, s.barrier_index)} bytes {s.bytes}" if s.barrier else ""
        if s.view:
            origin = ", ".join(expr(c) for c in s.origin)
            if s.stage is not None:
                origin += f"] [stage {expr(s.stage)}"
            offs = f" offsets [{', '.join(expr(o) for o in s.offsets)}]" if s.offsets else ""
            at = f" at {s.tensor}[{coords}]{offs}" if s.offsets else ""
        dst = f"{s.buffer}+{s.smem_offset}" if s.smem_offset else s.buffer
        if s.view:
            zeros = f" zeros from {ir.ZEROS} if {expr(s.zeros_if)}" if s.zeros_if is not None else ""
            return [f"{ind}tma.load.im2col {dst} <- {s.view}[{origin}]{at}{via}{bar}{zeros}{L}"]
        if s.stage is not None:
            dst += f"[stage {expr(s.stage)}]"
        if s.barrier and s.barrier_index is not None:
            bar = f" bar {_bar(s.barrier, s.barrier_index)} bytes {s.bytes}"
        return [f"{ind}tma.load.tile {dst} <- {s.tensor}[{coords}]{via}{bar}{L}"]
    if isinstance(s, ir.TmaStore):
        via = f" map {s.tensor_map}" if s.tensor_map else ""
        coords = ", ".join(expr(c) for c in s.coords)
        src = s.buffer + (f"+{s.smem_offset}" if s.smem_offset else "")
        return [f"{ind}tma.store.tile {s.tensor}[{coords}] <- {src}{via}{L}"]
    if isinstance(s, ir.StoreTail):
        coords = ", ".join(expr(c) for c in s.coords)
        shape = "x".join(map(str, s.shape))
        return [f"{ind}store.tail {s.tensor}[{coords}] <- {s.buffer} tile {shape} "
                f"(threads: the columns past the last whole 16-byte granule){L}"]
    if isinstance(s, ir.ThreadCopy):
        shape = "x".join(map(str, s.shape))
        return [f"{ind}thread.copy {region(s.src)} -> {region(s.dst)} tile {shape}{L}"]
    if isinstance(s, ir.MbarrierInit):
        bars = ", ".join(f"{b.name}{f'[{b.count}]' if b.array else ''}(arrivals={b.arrivals})"
                         for b in s.barriers)
        return [f"{ind}mbarrier.init {bars}"]
    if isinstance(s, ir.ArriveExpectTx):
        return [f"{ind}mbarrier.arrive.expect_tx {_bar(s.barrier, s.index)}, {s.bytes} bytes{L}"]
    if isinstance(s, ir.MbarrierWait):
        parity = f"phase({s.barrier})" if s.parity is None else \
            str(s.parity) if isinstance(s.parity, int) else expr(s.parity)
        return [f"{ind}mbarrier.try_wait.parity {_bar(s.barrier, s.index)}, {parity}{L}"]
    if isinstance(s, ir.MbarrierArrive):
        return [f"{ind}mbarrier.arrive {_bar(s.barrier, s.index)} (one thread per warpgroup){L}"]
    if isinstance(s, ir.WgmmaWait):
        return [f"{ind}wgmma.wait_group {s.pending}" + (f"  ({', '.join(s.accs)} done)" if s.pending else "")]
    if isinstance(s, ir.FlipPhase):
        return [f"{ind}phase({s.barrier}) ^= 1"]
    if isinstance(s, ir.RingAdvance):
        return [f"{ind}{s.var} += {expr(s.by)}"]
    if isinstance(s, ir.Let):
        return [f"{ind}let {s.name} = {expr(s.value)}{' (64-bit)' if s.wide else ''}"]
    if isinstance(s, ir.PartialStore):
        return [f"{ind}partial_store({', '.join(s.buffers)}) -> workspace slot {expr(s.slot)}, release{L}"]
    if isinstance(s, ir.PartialAdd):
        return [f"{ind}partial_add({', '.join(s.buffers)}) <- workspace slot {expr(s.slot)}, acquire{L}"]
    if isinstance(s, ir.ProxyFence):
        return [f"{ind}fence.proxy.async.{'global' if s.space == 'global' else 'shared::cta'}{L}"]
    if isinstance(s, ir.SyncThreads):
        return [f"{ind}barrier.sync{L}"]
    if isinstance(s, ir.BulkCommit):
        return [f"{ind}cp.async.bulk.commit_group"]
    if isinstance(s, ir.BulkWait):
        return [f"{ind}cp.async.bulk.wait_group{'.read' if s.read else ''} {s.pending}"]
    if isinstance(s, ir.OneThread):
        return [f"{ind}one_thread {{"] + block(s.body, ind + "  ") + [f"{ind}}}"]
    if isinstance(s, ir.Specialized):
        return [f"{ind}producer_warpgroup setmaxnreg {s.producer_regs}, one thread, {s.blocks_per_sm} block(s) per SM {{"] + \
            block(s.producer, ind + "  ") + \
            [f"{ind}}}", f"{ind}consumers setmaxnreg {s.consumer_regs} (barrier.sync: the consumers alone) {{"] + \
            block(s.consumers, ind + "  ") + [f"{ind}}}"]
    raise TypeError(f"not a statement: {s!r}")


def _asks_producer(s: ir.For) -> bool:
    return not (s.producer in (0, None) or isinstance(s.producer, ir.Int) and s.producer.value == 0)


def block(body, ind: str) -> list:
    out = []
    for s in body:
        out += stmt(s, ind)
    return out


def _const_value(v):
    return v if isinstance(v, int) else expr(v[1]) if isinstance(v, tuple) else expr(v)


def kernel(k: ir.Kernel) -> str:
    out = []
    params = []
    for p in k.params:
        if isinstance(p, ir.TensorParam):
            params.append(f"{p.name}: {p.dtype.name}[{', '.join(expr(d) for d in p.shape)}]")
        else:
            params.append(f"{p.name}: {p.dtype.name}")
    out.append(f"kernel {k.name}({', '.join(params)}) {{")
    for c in k.consts:
        out.append(f"  const {c[0]} = {_const_value(c[1])}")
    for name, value in k.fixed:
        out.append(f"  fixed {name} = {value}  // a shape symbol fixed at compile time")
    if k.tune:
        where = "" if k.tune_where is None else f" where {expr(k.tune_where.cond)}"
        out.append("  tune " + ", ".join(f"{name} in ({', '.join(map(str, values))})" for name, values in k.tune)
                   + where)
    for name, value in k.lets:
        out.append(f"  let {name} = {expr(value)}")
    for r in k.requires:
        out.append(f"  require {expr(r.cond)}")
    persistent = "".join(f", {name} = {expr(v) if isinstance(v, ir.Expr) else v}"
                         for name, v, default in (("persistent", k.persistent, 0), ("stream_k", k.stream_k, 0),
                                                  ("group", k.group, 1))
                         if v != default and v != ir.Int(default))
    out.append(f"  grid ({', '.join(k.grid_vars)}) = ({', '.join(expr(g) for g in k.grid)}){persistent}")
    out.append(f"  threads {expr(k.threads)}")
    for b in k.buffers:
        where = f" @ smem[{b.smem_offset}]" if b.smem_offset is not None else ""
        where += f" layout {b.layout}" if b.layout != "row" else ""
        where += f" chunk {b.chunk}" if b.layout == "cols" else ""
        where += f" row_groups [{', '.join(map(str, b.row_groups))}]" if b.row_groups else ""
        where += f" phases {b.phases}" if b.phases > 1 else ""
        where += " transposed" if b.transposed else ""
        where += f" padded to {b.fragment_rows} rows" if ir.padded_rows(b) else ""
        where += f" across {b.wg_cols} warpgroups" if b.wg_cols > 1 else ""
        if b.layout == "wgmma" and ir.uneven_split(b):     # each of the first ones split_width columns
            n = b.fragment_shape[1]
            where += f" ({' + '.join([str(ir.split_width(n, b.wg_cols))] * (b.wg_cols - 1))} + " \
                     f"{ir.split_last(n, b.wg_cols)} columns)"
        where += f" over {b.alias}" if b.alias else ""
        where += f" stages {b.stages}" if b.stages > 1 else ""
        where += f" overrun {b.overrun}" if b.overrun else ""
        shape = ", ".join(expr(d) if isinstance(d, ir.Expr) else str(d) for d in b.shape)
        out.append(f"  {b.scope} {b.name}: {b.dtype.name}[{shape}]{where}")
    for (written, read), why in k.in_place:
        if why is None:         # mark-in-place: the launch may pass one tensor as both (why not, in the host wrapper)
            out.append(f"  in_place {written} = {read}")
    for t in k.rereads:         # mark-in-place: reads of t are ordered after the kernel's writes of t
        out.append(f"  rereads {t}")
    for v in k.views:
        out.append(f"  view {v.name} = im2col({v.tensor}, kernel = {v.kernel}, stride = {v.stride}, "
                   f"pad = {v.pad}, dilation = {v.dilation})")
    for t in k.tensor_maps:
        if t.kind == "im2col":
            shape = (f"pixels_per_column {t.box[0]} channels_per_pixel {t.box[1]}"
                     f" corners [{', '.join(map(str, t.lower_corner))}] .. [{', '.join(map(str, t.upper_corner))}]")
        else:
            shape = f"box [{', '.join(map(str, t.box))}]"
        out.append(f"  tensormap {t.name}: {t.kind} {t.tensor} {shape}"
                   f" element_strides [{', '.join(map(str, t.element_strides))}]"
                   f" swizzle {t.swizzle} l2_promotion {t.l2_promotion}"
                   f"{' inner_dim rounded_to_16B' if t.inner_rounded else ''}")
    for b in k.barriers:
        count = f"[{b.count}]" if b.array else ""
        out.append(f"  mbarrier {b.name}{count} arrivals {b.arrivals}{' phase register' if b.in_loop and not b.array else ''}"
                   + (f" releases {', '.join(b.releases)}" if b.releases else ""))
    if k.smem_bytes:
        out.append(f"  dynamic_smem {k.smem_bytes} bytes")
    out.append("")
    out += block(k.body, "  ")
    out.append("}")
    return "\n".join(out) + "\n"
