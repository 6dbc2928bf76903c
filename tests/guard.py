"""Guarded outputs: a tensor a kernel writes, as a view inside a larger buffer
filled with a sentinel (padding before and after it in every dim), so that a
write outside the tensor the kernel was given is caught. A tiled TMA store
clips at the 16-byte granule of the innermost dim, not at its last element
(shared/docs/tma-reference.md §6): comparing only the inside of an output
cannot see that.

    g = guarded((4097, 129), "f32")          # a torch tensor on the GPU
    k(a, g.view)
    assert torch.equal(g.view, a)            # what the test checks inside
    g.check()                                # and every padding element still holds the sentinel

`like` picks the array library: "torch" (on `device`), "numpy" (bf16 and the
f8 types through ml_dtypes) or "cupy". By default the padded row pitch and the
view's start are 16-byte aligned, so TMA can describe the view exactly as it
could a contiguous tensor; `align=False` gives a view whose start is not
16-byte aligned (TMA cannot describe it: a test of the thread-copy fallback).
"""
import numpy as np

# tilec dtype -> (bytes, the torch / numpy / ml_dtypes name, the default sentinel)
DTYPES = {
    "f16": (2, "float16", -7776.0),          # -7777 rounded: f16 and bf16 step by 4 and 32 there
    "bf16": (2, "bfloat16", -7776.0),
    "f32": (4, "float32", -7777.0),
    "f64": (8, "float64", -7777.0),
    "f8e4m3": (1, "float8_e4m3fn", -416.0),  # e4m3's range ends at 448
    "f8e5m2": (1, "float8_e5m2", -7168.0),
    "i8": (1, "int8", 0x5A),
    "u8": (1, "uint8", 0xA5),
    "i16": (2, "int16", 0x5A5A),
    "u16": (2, "uint16", 0xA5A5),
    "i32": (4, "int32", 0x5A5A5A5A),
    "u32": (4, "uint32", 0xA5A5A5A5),
    "i64": (8, "int64", 0x5A5A5A5A5A5A5A5A),
    "u64": (8, "uint64", 0xA5A5A5A5A5A5A5A5),
}
_BY_LIB_NAME = {lib: name for name, (_, lib, _) in DTYPES.items()}
_BITS = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}     # the sentinel is compared as these bits
SHOWN = 5                                                   # overwritten elements a failure lists


def tilec_dtype(dtype) -> str:
    """"f32", torch.float32, np.float32 or ml_dtypes.bfloat16 -> the tilec name."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return dtype
    text = str(dtype)
    lib = text[len("torch."):] if text.startswith("torch.") else np.dtype(dtype).name
    if lib not in _BY_LIB_NAME:
        raise ValueError(f"no tilec dtype for {dtype!r}")
    return _BY_LIB_NAME[lib]


def paddings(shape, elsize, pad=None, align=True):
    """(before, after) elements of padding per dim. `pad`: None (1 and 2 in outer
    dims; in the innermost, at least 16 bytes plus 3 elements after, so a granule
    overrun lands in it), an int for every side, or one int or (before, after)
    per dim. With `align`, the innermost dim's padding is rounded up so the view
    starts on a 16-byte boundary and the padded row is a multiple of 16 bytes
    (outer strides are whole rows, so they are aligned too); without it the
    padding is as given, and the default one starts the view off the 16-byte
    grid."""
    rank, per16 = len(shape), max(1, 16 // elsize)
    if pad is None:
        pads = [(1, 2)] * (rank - 1) + [(per16 if align else per16 + 3, per16 + 3)] if rank else []
    elif isinstance(pad, int):
        pads = [(pad, pad)] * rank
    else:
        pads = [(p, p) if isinstance(p, int) else tuple(p) for p in pad]
        if len(pads) != rank:
            raise ValueError(f"pad has {len(pads)} entries for a rank-{rank} shape")
    if align and rank:
        before, after = pads[-1]
        before = -(-before // per16) * per16
        after += -(before + shape[-1] + after) % per16
        pads[-1] = (before, after)
    elif pad is None and rank:                  # make sure the start is off the 16-byte grid
        before, after = pads[-1]
        pads[-1] = next(p for p in ((before + i, after + j) for i in range(16) for j in range(16))
                        if _start(shape, elsize, pads[:-1] + [p]) % 16)
    return pads


def _start(shape, elsize, pads):
    """The byte offset of the view in the buffer."""
    start, stride = 0, elsize
    for (before, after), n in reversed(list(zip(pads, shape))):
        start, stride = start + before * stride, stride * (before + n + after)
    return start


class Guarded:
    """`view`: what the kernel gets; `buffer`: the whole allocation; `pad`:
    (before, after) per dim; `sentinel`: what the padding holds."""

    def __init__(self, lib, xp, buffer, view, pad, dtype, sentinel, bits):
        self.lib, self._xp, self.buffer, self.view, self.pad = lib, xp, buffer, view, pad
        self.dtype, self.sentinel, self._bits = dtype, sentinel, bits
        self.shape = tuple(view.shape)

    def __repr__(self):
        return f"<Guarded {self.dtype}{list(self.shape)} in {self.lib} buffer {list(self.buffer.shape)}>"

    def _as_bits(self, a):
        if self.lib == "torch":
            return a.view(getattr(self._xp, _BITS[DTYPES[self.dtype][0]]))
        return a.view(_BITS[DTYPES[self.dtype][0]])

    def _slabs(self):
        """The padding as disjoint boxes: for dim d, the view's range in dims < d,
        before or after it in dim d, everything in dims > d. Yields (index, origin)."""
        inside = [slice(b, b + n) for (b, _), n in zip(self.pad, self.shape)]
        rank = len(self.shape)
        for d, ((before, after), n) in enumerate(zip(self.pad, self.shape)):
            for lo, hi in ((0, before), (before + n, before + n + after)):
                if hi > lo:
                    index = (*inside[:d], slice(lo, hi), *[slice(None)] * (rank - d - 1))
                    yield index, [s.start for s in inside[:d]] + [lo] + [0] * (rank - d - 1)

    def overwritten(self):
        """(how many padding elements no longer hold the sentinel, the first
        SHOWN of them as indices relative to the view)."""
        bits, count, first = self._as_bits(self.buffer), 0, []
        for index, origin in self._slabs():
            bad = bits[index] != self._bits
            n = int(bad.sum())
            if n:
                count += n
                where = self._xp.argwhere(bad) if self.lib != "torch" else bad.nonzero()
                for rel in where[:SHOWN - len(first)].tolist():
                    first.append(tuple(o + r - b for o, r, (b, _) in zip(origin, rel, self.pad)))
        return count, first

    def _value_at(self, rel):
        element = self.buffer[tuple(r + b for r, (b, _) in zip(rel, self.pad))]
        try:
            return element.item()
        except Exception:       # a type whose scalars do not convert: show the bits
            return hex(int(self._as_bits(self.buffer)[tuple(r + b for r, (b, _) in zip(rel, self.pad))].item()))

    def check(self):
        """Assert every padding element still holds the sentinel (the kernel wrote
        nothing outside the view)."""
        count, first = self.overwritten()
        if count:
            shown = ", ".join(f"{list(rel)} = {self._value_at(rel)}" for rel in first)
            raise AssertionError(f"{count} padding element(s) around the {self.dtype}{list(self.shape)} view were "
                                 f"overwritten (sentinel {_show(self.sentinel)}, padding {self.pad}); first at (indices "
                                 f"relative to the view) {shown}")


def guarded(shape, dtype, *, like="torch", device="cuda", pad=None, align=True, sentinel=None, fill=None) -> Guarded:
    """A Guarded whose `view` of `shape` and `dtype` (a tilec name, a torch or a
    numpy dtype) sits inside a buffer of the sentinel (the dtype's default: a
    recognisable finite value, compared bit for bit). `fill`: the view's initial
    contents, a scalar or an array / tensor of its shape; by default the
    sentinel too, so an element the kernel should have written and did not is
    the sentinel. See `paddings` for `pad` and `align`."""
    shape = tuple(int(n) for n in shape)
    name = tilec_dtype(dtype)
    elsize, lib_name, default = DTYPES[name]
    sentinel = default if sentinel is None else sentinel
    pad = paddings(shape, elsize, pad, align)
    outer = tuple(b + n + a for (b, a), n in zip(pad, shape))
    inside = tuple(slice(b, b + n) for (b, _), n in zip(pad, shape))
    is_int = name[0] in "iu"
    if like == "torch":
        import torch
        xp, tdt, ibits = torch, getattr(torch, lib_name), getattr(torch, _BITS[elsize])
        if is_int:
            bits = _signed(int(sentinel), elsize)
        else:
            one = torch.full((1,), float(sentinel), dtype=torch.float64).to(tdt)
            bits = int(one.view(ibits).item())
        buffer = torch.empty(outer, dtype=tdt, device=device)
        buffer.view(ibits).fill_(bits)
        view = buffer[inside]
        if fill is not None:
            if isinstance(fill, (int, float)):
                view.fill_(fill)
            else:
                view.copy_(fill if isinstance(fill, torch.Tensor) else torch.as_tensor(np.asarray(fill)))
    elif like in ("numpy", "cupy"):
        if like == "cupy":
            import cupy as xp
        else:
            xp = np
        if lib_name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            import ml_dtypes
            ndt = np.dtype(getattr(ml_dtypes, lib_name))
        else:
            ndt = np.dtype(lib_name)
        bits = _signed(int(sentinel), elsize) if is_int else int(np.array(sentinel, ndt).view(_BITS[elsize]))
        buffer = xp.empty(outer, ndt)
        buffer.view(_BITS[elsize])[...] = bits
        view = buffer[inside]
        if fill is not None:
            view[...] = fill
    else:
        raise ValueError(f"like={like!r}: one of 'torch', 'numpy', 'cupy'")
    return Guarded(like, xp, buffer, view, tuple(pad), name, sentinel, bits)


def _signed(v, elsize):
    """The signed integer with v's low elsize * 8 bits (how the padding is compared)."""
    v &= (1 << 8 * elsize) - 1
    return v - (1 << 8 * elsize) if v >> (8 * elsize - 1) else v


def _show(v):
    return hex(v) if isinstance(v, int) else repr(v)
