"""`tilec emit --emit tma`: every TMA copy with its map, box, smem offset and the
expect-tx bytes of its barrier. What a user reads when a kernel hangs."""
from __future__ import annotations

from ..ir import nodes as ir
from ..ir.printer import expr


def tma_table(k: ir.Kernel) -> str:
    rows = [("line", "kind", "tensor", "tile", "box", "swizzle", "smem offset", "bytes", "barrier", "expect-tx")]
    expect = {}
    notes = []
    for s in ir.walk_stmts(k.body):
        if isinstance(s, ir.ArriveExpectTx):
            expect[s.barrier] = s.bytes
    for s in ir.walk_stmts(k.body):
        if isinstance(s, (ir.TmaLoad, ir.TmaStore)):
            tm = k.tensor_map(s.tensor_map)
            buf = k.buffer(s.buffer)
            t = k.param(s.tensor)
            box = "x".join(map(str, tm.box))
            coords = ", ".join(expr(c) for c in s.coords)
            if isinstance(s, ir.TmaLoad) and s.view:
                origin = ", ".join(expr(c) for c in s.origin)
                box = f"{tm.box[0]}px x {tm.box[1]}ch"
                rows.append((str(s.span.line if s.span else "?"), "load.im2col", f"{s.view}[{origin}]", buf.name,
                             box, tm.swizzle, str(buf.smem_offset + s.smem_offset), str(s.bytes), s.barrier,
                             str(expect.get(s.barrier, "?"))))
                notes.append(
                    f"line {s.span.line if s.span else '?'}: {s.view} = im2col({t.name}) map {tm.name}: corners "
                    f"[{', '.join(map(str, tm.lower_corner))}] .. [{', '.join(map(str, tm.upper_corner))}], "
                    f"element strides [{', '.join(map(str, tm.element_strides))}]\n"
                    f"    coordinates [{', '.join(expr(c) for c in s.coords)}]\n"
                    f"    tap offsets [{', '.join(expr(o) for o in s.offsets)}]" +
                    (f"\n    zeros from {ir.ZEROS} (columns past the view's last) if {expr(s.zeros_if)}"
                     if s.zeros_if is not None else ""))
            elif isinstance(s, ir.TmaLoad):
                rows.append((str(s.span.line if s.span else "?"), "load.tile", f"{t.name}[{coords}]", buf.name,
                             box, tm.swizzle, str(buf.smem_offset + s.smem_offset), str(s.bytes), s.barrier,
                             str(expect.get(s.barrier, "?"))))
            else:
                rows.append((str(s.span.line if s.span else "?"), "store.tile", f"{t.name}[{coords}]", buf.name,
                             box, tm.swizzle, str(buf.smem_offset + s.smem_offset), str(tm.box_bytes(t.dtype)), "bulk_group", "-"))
                note = (f"line {s.span.line if s.span else '?'}: map {tm.name} ends at {t.name}'s last whole 16-byte "
                        "granule (TMA stores write whole granules); threads store the rest of each row")
                if tm.inner_rounded and note not in notes:
                    notes.append(note)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    text = "".join(f"{n}\n" for n in notes)
    return f"TMA copies of kernel {k.name} (box outermost first; expect-tx is the barrier's total)\n" + \
        "\n".join(lines) + "\n" + text
