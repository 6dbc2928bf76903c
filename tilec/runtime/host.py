"""What generated host wrappers call: read arguments (torch, cupy, anything with
DLPack or __cuda_array_interface__, numpy copied in and out), check them, build
tensor maps and launch."""
from __future__ import annotations

import ctypes
import functools
import math
import numbers
import sys

from ..errors import DeviceError, LaunchError, TilecError
from ..ir.nodes import DTYPES
from . import driver, overlap
from .driver import check
from .tensormap import TmaRuleError, check_im2col, check_tiled, encode_im2col, encode_tiled

__all__ = ["Call", "TensorArg", "TmaRuleError", "cdiv", "i64", "pointer", "scalar_value", "symbol"]

_NP_NAMES = {d.numpy: d.name for d in DTYPES.values() if d.numpy}
_TORCH_NAMES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float64": "f64", "int8": "i8",
                "uint8": "u8", "int16": "i16", "uint16": "u16", "int32": "i32", "uint32": "u32",
                "int64": "i64", "uint64": "u64", "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2"}


_PACKAGE = __file__.rsplit("runtime", 1)[0]     # .../tilec/


def user_stacklevel() -> int:
    """The stacklevel of warnings.warn, called by this function's caller, that names
    the first frame outside tilec (its modules and the generated host wrappers)."""
    f, level = sys._getframe(2), 2
    while f is not None and (f.f_code.co_filename.startswith(_PACKAGE) or
                             f.f_code.co_filename.startswith("<tilec host wrapper")):
        f, level = f.f_back, level + 1
    return level


def numpy_dtype(a, name: str) -> str:
    """The tilec dtype of numpy array `a`, argument `name`: a LaunchError for a dtype
    tilec has not, and for elements in the other byte order ('>f4' is named float32
    too, but its bytes would be read swapped)."""
    dtype = _NP_NAMES.get(a.dtype.name)
    if dtype is None:
        raise LaunchError(f"argument {name}: numpy dtype {a.dtype} has no tilec dtype")
    if not a.dtype.isnative:
        raise LaunchError(f"argument {name}: its elements are in the other byte order (numpy dtype "
                          f"'{a.dtype.str}'), which the kernel would read and write swapped: pass "
                          f"{name}.astype({name}.dtype.newbyteorder('='))")
    return dtype


_INT_RANGES = {f"{s}{b}": ((-(1 << (b - 1)), (1 << (b - 1)) - 1) if s == "i" else (0, (1 << b) - 1))
               for s in "iu" for b in (8, 16, 32, 64)}
_FLOAT_MAX = {"f32": 3.4028234663852886e38, "f64": sys.float_info.max, "f16": 65504.0, "bf16": 3.3895313892515355e38}
_FLOAT_ROUNDS_TO_INF = {"f32": 2.0 ** 128 * (1 - 2.0 ** -25), "f16": 65520.0, "bf16": 2.0 ** 128 * (1 - 2.0 ** -9)}


def _zero_d_hint(value, name: str) -> str:
    """What to do with a one-element array or tensor passed for a scalar."""
    shape = getattr(value, "shape", None)
    if shape is not None and all(n == 1 for n in shape):
        return f" (a {len(shape)}-d array of one element: pass {name}.item())"
    return ""


def division_by_zero(name: str, host_source: str, exc: ZeroDivisionError) -> LaunchError:
    """The launch error for a host expression (a grid size, a declared dim, a
    require) that divides by zero for a call's arguments (`grid (a) = (cdiv(M, n))`
    with n = 0): the wrapper's line that divided, from the traceback."""
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == f"<tilec host wrapper of {name}>":
            line = tb.tb_lineno
        tb = tb.tb_next
    lines = host_source.splitlines()
    at = f": `{lines[line - 1].strip()}` in its host wrapper (k.host_source line {line})" \
        if line is not None and 0 < line <= len(lines) else ""
    return LaunchError(f"kernel {name}: a host expression divides by zero for these arguments{at}; the grid, the "
                       "declared dims and the requires are computed from the arguments' shapes and scalars")


def cdiv(a, b):
    return -(-a // b)


_TORCH_DTYPE_NAMES = {}


def _torch_dtype_name(dt):
    name = _TORCH_DTYPE_NAMES.get(dt)
    if name is None:
        name = _TORCH_NAMES.get(str(dt).removeprefix("torch."))
        _TORCH_DTYPE_NAMES[dt] = name
    return name


def _torch_stream(device):
    """The current torch stream of `device` as a CUstream handle (int)."""
    return _torch_stream_getter()(device)


def _torch_stream_getter():
    torch = sys.modules.get("torch")
    if torch is None:
        return lambda device: 0         # no torch: the legacy default stream
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)   # what Triton uses: ~0.2 us
    return raw if raw is not None else (lambda device: torch.cuda.current_stream(device).cuda_stream)


class TensorArg:
    """One tensor argument as the kernel sees it: device pointer, shape and
    strides in elements (outermost first), and where it lives."""
    __slots__ = ("name", "ptr", "shape", "strides", "dtype", "device", "host", "stream", "keep")

    def __init__(self, name, ptr, shape, strides, dtype, device, stream=None, host=None, keep=None):
        self.name, self.ptr, self.shape, self.strides = name, ptr, shape, strides
        self.dtype, self.device, self.stream, self.host, self.keep = dtype, device, stream, host, keep

    def global_dims(self, whole_granules=False):
        """cuTensorMapEncode*'s globalDim: the dims, innermost first. whole_granules:
        the innermost rounded down to whole 16-byte granules, for a store map: a
        TMA store writes every granule its box touches inside the map, so a map
        ending mid-granule would write past the tensor (tma-reference.md §6); the
        kernel's store tail writes the rest of each row."""
        dims = tuple(reversed(self.shape))
        if whole_granules and dims:
            size = DTYPES[self.dtype].size
            per = max(1, 16 // size)
            if dims[0] < per:
                raise TmaRuleError(f"argument {self.name}: its rows are {dims[0]} x {size} bytes, less than the "
                                   "16-byte granule a TMA store writes")
            dims = (dims[0] // per * per,) + dims[1:]
        return dims

    def global_strides(self):
        """globalStrides: the byte strides of dims 1.., innermost first. A rank-1
        map has none, but the driver rejects an empty array (seen on the H100):
        one it ignores."""
        size = DTYPES[self.dtype].size
        if len(self.shape) == 1:
            return (cdiv(self.shape[0] * size, 16) * 16,)
        return tuple(s * size for s in reversed(self.tma_strides()[:-1]))

    def tma_strides(self):
        """Strides for a tensor map: a dim of extent 1 is never stepped over, so
        its stride is free; make it the legal, 16-byte aligned value."""
        s = list(self.strides)
        per16 = max(1, 16 // DTYPES[self.dtype].size)
        for d in range(len(s) - 2, -1, -1):
            if self.shape[d] == 1:
                span = s[d + 1] * self.shape[d + 1]
                s[d] = cdiv(max(span, 1), per16) * per16
        if self.shape and self.shape[-1] == 1:
            s[-1] = 1
        return tuple(s)


def check_distinct(name, shape, strides, itemsize):
    """A tensor the kernel writes must not have two elements at one address: a dim of
    stride 0 (an expanded or broadcast view) puts all of its elements at one, strides
    that step inside one another (as_strided) put some at one, and the kernel's
    writes to them would race (torch refuses the first kind of in-place write too).
    `strides` in bytes. An empty tensor has no elements to write."""
    if 0 in shape:
        return
    for d, (n, s) in enumerate(zip(shape, strides) if 0 in strides else ()):
        if s == 0 and n > 1:
            raise LaunchError(f"argument {name}: dim {d} has stride 0, so its {n} elements share one address "
                              f"(an expanded or broadcast view); the kernel writes {name}, and its writes there "
                              "would race: pass a tensor whose elements are distinct")
    ok = overlap.nested(shape, strides, itemsize) or overlap.distinct(overlap.View(0, shape, strides, itemsize))
    if not ok:
        how = "some of its elements share memory" if ok is False else \
            f"its strides interleave its dims too finely for tilec to check that no two elements share memory " \
            f"(more than {overlap.LIMIT} runs)"
        raise LaunchError(f"argument {name}: {how} (shape {tuple(shape)}, strides {tuple(strides)} bytes, elements "
                          f"of {itemsize} bytes); the kernel writes {name}, and its writes there would race: pass a "
                          "tensor whose elements are distinct")


def _signed_strides(strides, itemsize):
    """Element strides as signed ints: cuda.core's StridedMemoryView gives a negative
    stride (a reversed cupy view) as its unsigned 64-bit byte value divided by the
    element size (seen on the H100: -128 f32 elements read as 2^62 - 128). No real
    byte stride reaches 2^63."""
    wrap = (1 << 64) // itemsize
    return tuple(s - wrap if s >= (1 << 63) // itemsize else s for s in strides)


def _c_strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


class Prepared:
    """Everything a launch needs once the arguments are read: replayed as is when
    the same arguments (pointers, shapes, strides, dtypes, scalars) come again,
    on the current torch stream of its device."""
    __slots__ = ("keep", "device", "launch_on", "current_stream")

    def __init__(self, name, loaded, grid, threads, smem_bytes, ptrs, keep, device):
        self.keep, self.device = (ptrs, keep), device     # the parameter memory the launch points at
        self.launch_on = driver.launcher(loaded, grid, threads, smem_bytes, ptrs, name)
        workspaces = [p for p in keep if isinstance(p, Workspace)]
        if workspaces:          # a stream-K kernel: the workspace of the stream it is launched on
            self.launch_on = workspaces[0].launcher(self.launch_on, device, grid[0])
        self.current_stream = functools.partial(_torch_stream_getter(), device)

    def __call__(self, stream=None):
        self.launch_on(self.current_stream() if stream is None else stream)


def torch_call_key(args):
    """A key for the launch of `args` when every argument is a CUDA torch tensor or
    a number (None otherwise): what a Prepared launch depends on, and nothing else.
    Its device is not part of it: under unified addressing a device pointer names
    one device, and a Prepared launch remembers it."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    tensor = torch.Tensor
    key = []
    for a in args:              # one flat tuple: 4 entries per tensor, 2 per number
        t = type(a)
        if t is tensor or isinstance(a, tensor):
            if not a.is_cuda or (t is not tensor and (a.is_nested or a.layout is not torch.strided)):
                return None         # (a subclass may be a nested tensor: Call.tensor names it)
            try:
                key += (a.data_ptr(), a.shape, a.stride(), a.dtype)
            except RuntimeError:    # no strides or storage (a sparse tensor): Call.tensor names it
                return None
        elif t is int or t is float:
            key += (t, a)
        else:
            return None
    return tuple(key)


def written_params(launch, writes) -> tuple:
    """((position, name), ...) of the tensor parameters the kernel writes, in the call's
    order: the generated wrapper's `launch(tl_call, ...)` parameters that WRITES names."""
    code = launch.__code__
    return tuple((i, n) for i, n in enumerate(code.co_varnames[1:code.co_argcount]) if n in writes)


def mark_written(args, written, kernel_name) -> None:
    """Before a launch (replayed or not), for each torch tensor the kernel writes
    (`written`: written_params): refuse one that requires grad while grad mode is on,
    as torch refuses an in-place op on a leaf that requires grad (autograd cannot see
    the kernel's writes, so gradients through it would be silently wrong), and bump its
    version counter, as torch's in-place ops do, so that autograd raises where the
    kernel overwrote a tensor an earlier op saved for backward instead of using the
    new values. Inference tensors keep no version counter."""
    if not written:
        return
    torch = _autograd_hooks()
    if torch is None:
        return
    tensor, grad_enabled, bump = torch
    touched = []
    for i, name in written:
        t = args[i] if i < len(args) else None
        if type(t) is not tensor and not isinstance(t, tensor) or t.is_inference():
            continue
        if t.requires_grad and grad_enabled():
            raise LaunchError(f"argument {name} requires grad, and kernel {kernel_name} writes it: autograd does "
                              f"not see a tilec kernel's writes, so gradients through {name} would be wrong: write "
                              "it under torch.no_grad() (as an optimizer step does), or pass a tensor that does not "
                              "require grad")
        touched.append(t)
    if touched:
        bump(touched)


_AUTOGRAD = None


def _autograd_hooks():
    """(torch.Tensor, torch.is_grad_enabled, a function that bumps the version counters
    of a list of tensors), looked up once torch is imported; None before. The bump is
    torch._C._increment_version where it takes a sequence (it does from torch 2.4;
    about half the cost of the public torch.autograd.graph.increment_version, which
    calls it), else the public one."""
    global _AUTOGRAD
    if _AUTOGRAD is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        bump = getattr(torch._C, "_increment_version", None)
        try:
            bump([])
        except Exception:       # an older torch: one tensor at a time
            one = torch.autograd.graph.increment_version
            bump = lambda tensors: [one(t) for t in tensors]       # noqa: E731
        _AUTOGRAD = (torch.Tensor, torch.is_grad_enabled, bump)
    return _AUTOGRAD


def check_dense(t, name) -> None:
    """A torch tensor tilec can read: elements at a pointer and strides (torch.strided),
    not a sparse or nested tensor, whose data_ptr() and stride() say nothing of its elements."""
    torch = sys.modules["torch"]
    if t.layout is not torch.strided or t.is_nested:
        kind = "nested" if t.is_nested else str(t.layout).removeprefix("torch.")
        raise LaunchError(f"argument {name}: a {kind} tensor, where tilec takes dense (strided) tensors: pass a dense "
                          f"one ({name}.to_dense(), or to_padded_tensor for a nested tensor)")


def home_device(args):
    """The device of the first torch or cupy GPU tensor in `args` (None if none): where
    numpy arguments are copied to, whatever their place among the arguments."""
    torch = sys.modules.get("torch")
    for a in args:
        if torch is not None and isinstance(a, torch.Tensor):
            if a.is_cuda:
                return a.get_device()
        elif type(a).__module__.startswith("cupy"):
            return a.device.id
    return None


class Call:
    """The state of one launch: its arguments, device, stream, and host copies.
    A generated host wrapper's `launch(tl_call, *args)` reads, checks, encodes and
    launches through it. `fallback`: what runs the kernel's thread-copy variant
    on the same arguments when a TMA rule rules a map out (None: raise).
    `fixed`: fixed(symbols) -> what runs the program compiled with those shape
    symbols fixed (TmaRuleError.fix), on the same arguments (None: never)."""

    def __init__(self, kernel_name, loaded, stream, writes, debug=None, fallback=None, home=None, fixed=None):
        self.fallback = fallback
        self.fixed = fixed
        self.home = home            # the device of the GPU tensors among the arguments (home_device)
        self.debug = debug          # debug build: (barrier names, source name), else None
        self.record = None
        self.kernel_name = kernel_name
        self.loaded = loaded            # device -> LoadedKernel
        self.stream = stream
        self.stream_arg = stream
        self.writes = writes
        self.device = None
        self.args = []
        self.keep = []
        self.memory = {}                # name -> (memory space, (pointer, shape, byte strides, size), byte range)

    # ------------------------------------------------------------ arguments
    def tensor(self, obj, name, dtype, rank) -> TensorArg:
        mod = type(obj).__module__
        if mod.startswith("torch"):
            arg = self._torch(obj, name)
        elif mod.startswith("numpy"):
            arg = self._numpy(obj, name)
        else:
            arg = self._strided(obj, name)
        if arg.dtype != dtype:
            raise LaunchError(f"argument {name}: dtype {arg.dtype} does not match the declared {dtype}")
        if len(arg.shape) != rank:
            raise LaunchError(f"argument {name}: rank {len(arg.shape)} does not match the declared rank {rank}")
        size = DTYPES[dtype].size
        if mod.startswith("numpy"):   # a numpy array's own memory, not the dense copy tilec makes of it
            self.check_writable(name, obj.flags.writeable, "numpy array", "its flags.writeable is False")
            self.remember(name, "host", obj.__array_interface__["data"][0], obj.shape, obj.strides, size)
        else:
            self.remember(name, f"cuda:{arg.device}", arg.ptr, arg.shape, tuple(s * size for s in arg.strides), size)
        if self.device is None:
            self.device = arg.device
        elif arg.device != self.device:
            first = self.args[0].name
            raise LaunchError(f"argument {name} is on cuda:{arg.device} but {first} is on cuda:{self.device}")
        if self.stream is None and arg.stream is not None:
            self.stream = arg.stream
        self.args.append(arg)
        return arg

    def check_writable(self, name, writable, what, why):
        """A tensor the kernel writes must be writable: its producer's read-only mark is
        kept (a read-only numpy array, a DLPack or __cuda_array_interface__ export marked so)."""
        if name in self.writes and not writable:
            raise LaunchError(f"argument {name}: the {what} is read-only ({why}), and kernel {self.kernel_name} "
                              "writes it: pass a writable one")

    def remember(self, name, space, ptr, shape, strides, size):
        """Where argument `name`'s elements are (strides in bytes), for check_overlaps;
        a tensor the kernel writes must have distinct elements (check_distinct)."""
        if name in self.writes:
            check_distinct(name, shape, strides, size)
        key = (ptr, tuple(shape), tuple(strides), size)
        self.memory[name] = (space, key, overlap.byte_range(*key))

    def check_overlaps(self, in_place):
        """No tensor the kernel writes may share memory with another argument, but for
        one case: the same view (pointer, shape, strides) as a tensor the kernel only
        reads, where the compiler found the kernel reads it only where it then writes
        (mark-in-place). `in_place`: (written, read) -> None, or why not, for every
        pair of a tensor the kernel writes and one it only reads."""
        names = list(self.memory)
        for i, x in enumerate(names):
            for y in names[i + 1:]:
                if x not in self.writes and y not in self.writes:
                    continue
                (space_x, key_x, range_x), (space_y, key_y, range_y) = self.memory[x], self.memory[y]
                if space_x != space_y or range_x is None or range_y is None or range_x[1] <= range_y[0] or \
                        range_y[1] <= range_x[0]:
                    continue        # apart: most calls end here
                shared = overlap.share_memory(overlap.View(*key_x), overlap.View(*key_y))
                if shared is False:
                    continue
                w, r = (x, y) if x in self.writes else (y, x)
                if key_x == key_y:
                    if r in self.writes:
                        raise LaunchError(f"arguments {x} and {y} are one tensor (the same memory, shape and "
                                          "strides), and the kernel writes both: their writes would race: pass "
                                          "separate tensors")
                    why = in_place[(w, r)]
                    if why is None:
                        continue
                    raise LaunchError(f"arguments {r} and {w} are one tensor (the same memory, shape and strides), "
                                      f"but kernel {self.kernel_name} cannot run in place: {why}: pass a separate "
                                      f"{w}")
                how = "share memory but are not the same view" if shared else \
                    f"lie in one memory range, in views too fragmented for tilec to check that they share no " \
                    f"element (more than {overlap.LIMIT} runs)"
                raise LaunchError(f"arguments {x} and {y} {how}; the kernel writes {w}, so its writes would race "
                                  f"with the {'writes' if r in self.writes else 'reads'} of {r}: pass tensors that "
                                  "do not overlap")

    def _torch(self, t, name):
        torch = sys.modules["torch"]
        if not isinstance(t, torch.Tensor):
            return self._strided(t, name)
        check_dense(t, name)
        dtype = _torch_dtype_name(t.dtype)
        if dtype is None:
            raise LaunchError(f"argument {name}: torch dtype {t.dtype} has no tilec dtype")
        if not t.is_cuda:
            raise LaunchError(f"argument {name}: a tensor on the {t.device.type.upper()} was passed where a GPU "
                              f"tensor is required (move it with {name}.cuda(), or pass a numpy array to have "
                              "tilec copy it)")
        dev = t.get_device()
        stream = _torch_stream(dev) if self.stream is None else None
        return TensorArg(name, t.data_ptr(), tuple(t.shape), t.stride(), dtype, dev, stream, keep=t)

    def _numpy(self, a, name):
        import numpy as np
        dtype = numpy_dtype(a, name)
        a0 = np.asarray(a)          # (np.ascontiguousarray makes a 0-d array 1-d, and the rank check wrong)
        host = a0 if a0.flags.c_contiguous else np.ascontiguousarray(a0)
        dev = self.device if self.device is not None else self.home or 0
        driver.make_current(dev)
        from cuda.bindings import driver as cu
        nbytes = max(host.nbytes, 16)
        ptr = int(check(cu.cuMemAlloc(nbytes), "cuMemAlloc"))
        self.keep.append(ptr)
        if host.nbytes:
            check(cu.cuMemcpyHtoD(ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
        return TensorArg(name, ptr, tuple(host.shape), _c_strides(host.shape), dtype, dev, host=(a, host))

    def _strided(self, obj, name):
        try:
            from cuda.core.utils import StridedMemoryView
        except ImportError:  # older cuda.core
            from cuda.core.experimental.utils import StridedMemoryView
        try:
            make = getattr(StridedMemoryView, "from_any_interface", None)
            view = make(obj, stream_ptr=-1) if make is not None else StridedMemoryView(obj, stream_ptr=-1)
        except Exception as e:
            raise LaunchError(f"argument {name}: a {type(obj).__name__} is not a tensor tilec can read "
                              f"(needs DLPack or __cuda_array_interface__): {e}") from None
        if not view.is_device_accessible or view.device_id < 0:
            raise LaunchError(f"argument {name}: the array is in host memory where a GPU tensor is required")
        self.check_writable(name, not getattr(view, "readonly", False), type(obj).__name__,
                            "its producer exports it read-only")
        dtype = _NP_NAMES.get(view.dtype.name) if view.dtype is not None else None
        if dtype is None:
            raise LaunchError(f"argument {name}: element type {view.dtype} has no tilec dtype")
        shape = tuple(view.shape)
        strides = _signed_strides(view.strides, view.dtype.itemsize) if view.strides is not None else \
            _c_strides(shape)
        stream = None
        if type(obj).__module__.startswith("cupy"):
            import cupy
            with cupy.cuda.Device(view.device_id):      # its device's current stream, not the current device's
                stream = cupy.cuda.get_current_stream().ptr
        return TensorArg(name, view.ptr, shape, strides, dtype, view.device_id, stream, keep=obj)

    # ------------------------------------------------------------ checks
    def bind(self, arg, dim, value, symbol, bound_from):
        """Dim `dim` of `arg` is also symbol `symbol`, already bound to `value`."""
        got = arg.shape[dim]
        if got != value:
            raise LaunchError(f"argument {arg.name}: dim {dim} is {got} but {symbol} = {value} "
                              f"(from {bound_from})")

    def expect(self, arg, dim, value, says):
        """Dim `dim` of `arg` is declared `value`; `says`: the declaration, "{}" where the value goes."""
        got = arg.shape[dim]
        if got != value:
            raise LaunchError(f"argument {arg.name}: dim {dim} is {got} but the declaration says "
                              + says.format(value))

    def require(self, ok, text, values):
        if not ok:
            shown = ", ".join(f"{k} = {v}" for k, v in values.items())
            raise LaunchError(f"require {text} failed ({shown})")

    def scalar(self, value, name, dtype):
        """`value` as a Python float or int: numpy's scalars (np.float32(0.5), np.int32(3))
        count as the numbers they are (numbers.Real / Integral), and so do ml_dtypes'
        floats (ml_dtypes.bfloat16(0.5), which numbers does not know); bools do not
        (numpy's is neither, Python's is an Integral)."""
        if dtype.startswith(("f", "bf")):
            ml_float = type(value).__module__ == "ml_dtypes" and type(value).__name__.startswith(("float", "bfloat"))
            if not (isinstance(value, numbers.Real) or ml_float) or isinstance(value, bool):
                raise LaunchError(f"argument {name}: expected a number for {dtype}, got {type(value).__name__}"
                                  + _zero_d_hint(value, name))
            try:
                v = float(value)
            except OverflowError:
                v = None
            limit = _FLOAT_ROUNDS_TO_INF.get(dtype)
            if v is None or limit is not None and math.isfinite(v) and abs(v) >= limit:
                raise LaunchError(f"argument {name}: {value} is past {dtype}'s largest finite value "
                                  f"({_FLOAT_MAX[dtype]:g}): it would be {'-' if v is not None and v < 0 else ''}inf "
                                  "in the kernel (pass inf if that is meant)")
            return v
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise LaunchError(f"argument {name}: expected an integer for {dtype}, got {type(value).__name__}"
                              + _zero_d_hint(value, name))
        v = int(value)
        lo, hi = _INT_RANGES[dtype]
        if not lo <= v <= hi:
            raise LaunchError(f"argument {name}: {v} is outside {dtype} ({lo} .. {hi}): the kernel would see it "
                              "wrapped")
        return v

    # ------------------------------------------------------------ kernel parameters
    def cuTensorMapEncodeTiled(self, arg, *, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides,
                               boxDim, elementStrides, interleave, swizzle, l2Promotion, oobFill):
        """A tiled tensor map of `arg`: every TMA rule checked first (a TmaRuleError
        naming the argument and the rule), then the driver's encode, cached.
        Tuples innermost first, enums by the suffix of their CU_TENSOR_MAP_* name."""
        self._not_empty(arg)
        check_tiled(arg, globalDim, boxDim, elementStrides, swizzle)
        return self._encoded(encode_tiled, arg.name, tensorDataType, tensorRank, globalAddress, globalDim,
                             globalStrides, boxDim, elementStrides, interleave, swizzle, l2Promotion, oobFill)

    def cuTensorMapEncodeIm2col(self, arg, *, tensorDataType, tensorRank, globalAddress, globalDim, globalStrides,
                                pixelBoxLowerCorner, pixelBoxUpperCorner, channelsPerPixel, pixelsPerColumn,
                                elementStrides, interleave, swizzle, l2Promotion, oobFill, channelSymbol=None):
        """An im2col tensor map of channels-last `arg`, its rules checked first.
        `channelSymbol`: the shape symbol of `arg`'s channels, where one is (not a
        driver argument: a TmaRuleError's fix, tensormap.check_im2col)."""
        self._not_empty(arg)
        check_im2col(arg, pixelsPerColumn, channelsPerPixel, tuple(reversed(pixelBoxLowerCorner)),
                     tuple(reversed(pixelBoxUpperCorner)), tuple(reversed(elementStrides)), channelSymbol)
        return self._encoded(encode_im2col, arg.name, tensorDataType, tensorRank, globalAddress, globalDim,
                             globalStrides, pixelBoxLowerCorner, pixelBoxUpperCorner, channelsPerPixel,
                             pixelsPerColumn, elementStrides, interleave, swizzle, l2Promotion, oobFill)

    def _encoded(self, encode, *driver_args):
        """The driver's encode of a map whose rules held (kept alive for the launch)."""
        m = encode(*driver_args)
        self.keep.append(m)
        return m

    @staticmethod
    def _not_empty(arg):
        """A TMA rule like the others (the thread-copy variant runs instead): a gemm's
        K = 0 leaves A and B empty while C is not, and C must still be written."""
        if 0 in arg.shape:
            raise TmaRuleError(f"argument {arg.name}: it is empty (shape {list(arg.shape)}); "
                              "a TMA tensor map cannot describe an empty tensor")

    def debug_record(self):
        host_ptr, dev_ptr = self.loaded(self.device or 0).debug_record()
        self.record = host_ptr
        return ctypes.c_void_p(dev_ptr)

    def _check_debug_run(self):
        """Wait for the debug launch; a timed-out mbarrier wait becomes a TilecError."""
        from cuda.bindings import driver as cu
        err = cu.cuStreamSynchronize(self.stream or 0)[0]
        rec = (ctypes.c_int * 9).from_address(self.record)
        if rec[0]:
            barriers, source = self.debug
            raise DeviceError(
                f"kernel {self.kernel_name} hung: block ({rec[5]}, {rec[6]}, {rec[7]}) thread {rec[8]} waited "
                f"over 1 s on mbarrier {barriers[rec[1]]} (parity {rec[2]}, expect-tx {rec[3]} bytes) at "
                f"{source}:{rec[4]}; the kernel trapped and this CUDA context is unusable now")
        check((err,), f"running {self.kernel_name}")

    def nothing_to_do(self):
        self.keep = [k for k in self.keep if isinstance(k, int)]
        self._finish()

    def fall_back(self, err, *args):
        """Run the program compiled with the shape symbols the rule needs fixed, where
        that makes the launch legal (an im2col channel count: TmaRuleError.fix), else
        the thread-copy variant (numpy copies are redone by either)."""
        self.keep = [k for k in self.keep if isinstance(k, int)]
        self.args = [a for a in self.args if a.host is None]
        self._finish()
        if err.fix and self.fixed is not None:
            fixed = ", ".join(f"{n} = {v}" for n, v in err.fix.items())
            try:
                run = self.fixed(err.fix)
            except TilecError as e:     # plan-gemm / plan-tma refuse it: the thread copies, or the first error
                err = TmaRuleError(f"{err.message}; compiled with {fixed}, the kernel does not compile either "
                                   f"({e.message})")
            else:
                return run(*args, stream=self.stream_arg)
        if self.fallback is None:
            raise err
        import warnings
        from ..errors import TmaFallbackWarning
        # Python's filters decide how often it shows (once per line of the caller by default, every
        # call with "always", an exception with "error"), at the user's line that called the kernel
        warnings.warn(TmaFallbackWarning(
            f"{err.message}: TMA cannot copy it, so kernel {self.kernel_name} runs its thread-copy "
            "variant (correct, slower); pass fallback=False to tilec.compile to get an error instead"),
            stacklevel=user_stacklevel())
        return self.fallback(*args, stream=self.stream_arg)

    def launch(self, grid, threads, smem_bytes, params, persistent=False, balanced=False, stream_k=False):
        """`params`: ctypes values and encoded tensor maps, in the kernel's order.
        `persistent`: grid[0] counts tiles; launch at most the blocks the GPU holds
        at once, each looping over tiles (`balanced`: persistent_blocks' fewest;
        `stream_k`: all of them)."""
        try:
            check_grid(grid)
            dev = self.device or 0
            loaded = self.loaded(dev)
            if persistent:
                grid = (persistent_blocks(grid[0], loaded.resident_blocks(threads, smem_bytes), balanced,
                                           stream_k), 1, 1)
            driver.make_current(dev)
            ptrs = (ctypes.c_void_p * max(1, len(params)))()
            for i, p in enumerate(params):
                ptrs[i] = p.getPtr() if hasattr(p, "getPtr") else ctypes.addressof(p)
            prepared = Prepared(self.kernel_name, loaded, grid, threads, smem_bytes, ptrs, params, dev)
            prepared.launch_on(self.stream or 0)
            if self.debug is not None:
                self._check_debug_run()
                return None         # never replayed: each debug launch is checked
            return prepared
        finally:
            self._finish()

    def _finish(self):
        host_args = [a for a in self.args if a.host is not None]
        if not host_args and not any(isinstance(k, int) for k in self.keep):
            return
        from cuda.bindings import driver as cu
        if host_args:
            check(cu.cuCtxSynchronize(), f"running {self.kernel_name}")
        for a in host_args:
            if a.name in self.writes:
                orig, host = a.host
                if host.nbytes:
                    check(cu.cuMemcpyDtoH(host.ctypes.data, a.ptr, host.nbytes), "cuMemcpyDtoH")
                if host is not orig:
                    orig[...] = host
        self.abandon()

    def abandon(self):
        """Free the device copies of numpy arguments (once): after a launch, and where
        a check refused the call before it (else each refused call would leak them)."""
        copies = [k for k in self.keep if isinstance(k, int)]
        if not copies:
            return
        self.keep = [k for k in self.keep if not isinstance(k, int)]
        from cuda.bindings import driver as cu
        for k in copies:
            cu.cuMemFree(k)


class Workspace(ctypes.c_void_p):
    """The kernel parameter `tl_workspace` of a stream-K kernel (make-persistent):
    a flag per launched block, then per block a slot for a tile's partial sums. Each launch
    points it at the workspace of its device and stream (_WORKSPACES), so that
    launches on two streams never share one; the kernel leaves every flag
    cleared, so the next launch on that stream starts from a clean workspace."""

    def __init__(self, bytes_per_block):
        super().__init__(None)
        self.bytes_per_block = bytes_per_block

    def launcher(self, launch_on, device, blocks):
        from ..codegen.abi import WORKSPACE_FLAG_BYTES
        if blocks * 4 > WORKSPACE_FLAG_BYTES:
            raise LaunchError(f"a stream-K launch of {blocks} blocks: its workspace has flags for "
                              f"{WORKSPACE_FLAG_BYTES // 4}")
        need = WORKSPACE_FLAG_BYTES + blocks * self.bytes_per_block

        def launch_with_workspace(stream):
            self.value = workspace(device, stream, need)
            launch_on(stream)
        return launch_with_workspace


class _Buffer:
    """A stream's stream-K workspace: its device pointer and size, and whether a CUDA
    graph may point at it (made beside a capture, or used by a captured launch), so
    that it is never freed."""
    __slots__ = ("ptr", "nbytes", "captured")

    def __init__(self, ptr, nbytes, captured):
        self.ptr, self.nbytes, self.captured = ptr, nbytes, captured


_WORKSPACES = {}                # (device, stream) -> _Buffer


def workspace(device, stream, nbytes) -> int:
    """A zeroed device buffer of at least `nbytes` for stream-K launches on
    (`device`, `stream`), kept for later launches there. A larger need gets a
    new buffer (stream-ordered: allocated and zeroed on that stream); the
    outgrown one is freed on the stream after the launches queued there, unless
    a captured CUDA graph may point at it (those are kept, `_RETIRED`)."""
    cu, not_capturing = _capture_query()
    key = (device, int(stream))
    have = _WORKSPACES.get(key)
    capturing = check(cu.cuStreamIsCapturing(stream), "cuStreamIsCapturing") != not_capturing
    if have is not None and have.nbytes >= nbytes:      # every launch but a stream's first (or a larger one)
        if capturing:
            have.captured = True            # the graph being captured points at it
        return have.ptr
    with driver.context_kept():     # a replayed launch's first on this stream: the caller's context after
        return _new_workspace(cu, key, have, device, stream, nbytes, capturing)


def _new_workspace(cu, key, have, device, stream, nbytes, capturing):
    driver.make_current(device)
    if capturing:
        new = _Buffer(_workspace_beside_a_capture(nbytes), nbytes, True)
    else:
        ptr = int(check(cu.cuMemAllocAsync(nbytes, stream), "cuMemAllocAsync (stream-K workspace)"))
        check(cu.cuMemsetD8Async(ptr, 0, nbytes, stream), "cuMemsetD8Async (stream-K workspace)")
        new = _Buffer(ptr, nbytes, False)
    if have is not None:
        if have.captured or capturing:      # a graph may use it (a free can't be captured either)
            _RETIRED.append(have)
        else:
            check(cu.cuMemFreeAsync(have.ptr, stream), "cuMemFreeAsync (outgrown stream-K workspace)")
    _WORKSPACES[key] = new
    return new.ptr


@functools.lru_cache(maxsize=1)
def _capture_query():
    """(cuda.bindings.driver, its CU_STREAM_CAPTURE_STATUS_NONE): looked up once, not
    per stream-K launch."""
    from cuda.bindings import driver as cu
    return cu, cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def _workspace_beside_a_capture(nbytes) -> int:
    """A zeroed workspace for a stream that a CUDA graph is being captured on
    (the graph then holds the launch that points at it, and later launches on
    that stream use it too): allocated and zeroed outside the capture, on a
    stream of its own, with this thread's capture mode relaxed for the while
    (a capture in global mode refuses cuMemAlloc, and a memset on the captured
    stream would be recorded instead of run)."""
    from cuda.bindings import driver as cu
    mode = check(cu.cuThreadExchangeStreamCaptureMode(
        cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED), "cuThreadExchangeStreamCaptureMode")
    try:
        ptr = int(check(cu.cuMemAlloc(nbytes), "cuMemAlloc (stream-K workspace)"))
        side = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        try:
            check(cu.cuMemsetD8Async(ptr, 0, nbytes, side), "cuMemsetD8Async (stream-K workspace)")
            check(cu.cuStreamSynchronize(side), "cuStreamSynchronize")
        finally:
            check(cu.cuStreamDestroy(side), "cuStreamDestroy")
    finally:
        check(cu.cuThreadExchangeStreamCaptureMode(mode), "cuThreadExchangeStreamCaptureMode")
    return ptr


_RETIRED = []                   # outgrown workspaces a captured CUDA graph may point at: kept


def persistent_blocks(tiles: int, resident: int, balanced: bool, stream_k: bool = False) -> int:
    """The blocks of a persistent launch of `tiles` tiles where `resident` blocks fit
    at once: as many as fit (but no more than the tiles), every one that fits for
    `stream_k` (its kernel splits the K steps of fewer tiles than blocks over
    them: make-persistent), or `balanced` (a kernel whose tiles are tensor-core
    gemms, no stream-K: codegen/host.py) the fewest that take the tiles in as few
    waves (512 tiles, 132 resident: 4 waves, so 128 blocks of 4 tiles rather than
    116 of 4 and 16 of 3). A gemm tile takes about as long however many run beside
    it, so that is the same time, and the idle SMs leave the others power and L2
    bandwidth: +0.2-0.9% for gemm 4096^3 on the H100 (benchmarks/NOTES.md, session
    11). Not for memory-bound tiles, which run faster with fewer beside them, nor
    stream-K, which splits the last wave over every block."""
    if stream_k:
        return resident
    blocks = min(tiles, resident)
    if not balanced or blocks <= 0:
        return blocks
    waves = -(-tiles // blocks)
    return -(-tiles // waves)


def check_grid(grid):
    if min(grid) < 0:
        raise LaunchError(f"grid {list(grid)} has a negative extent")
    if grid[0] > 2**31 - 1 or grid[1] > 65535 or grid[2] > 65535:
        raise LaunchError(f"grid {list(grid)} is over CUDA's limits (2^31-1, 65535, 65535)")


def pointer(arg):
    return ctypes.c_void_p(arg.ptr)


def i64(v):
    return ctypes.c_longlong(v)


def symbol(name, v):
    """A shape symbol as the kernel takes it: a 32-bit int, like the tile
    coordinates computed from it (TMA coordinates are 32-bit too)."""
    if v > 2**31 - 1:
        raise LaunchError(f"shape symbol {name} = {v} is over 2^31-1: kernels index each dimension with 32-bit ints")
    return ctypes.c_int32(v)


def scalar_value(v, dtype):
    if dtype == "f32":
        return ctypes.c_float(v)
    if dtype == "f64":
        return ctypes.c_double(v)
    if dtype in ("f16", "bf16"):
        import numpy as np
        if dtype == "f16":
            return ctypes.c_uint16(int(np.array(v, np.float16).view(np.uint16)))
        bits = int(np.array(v, np.float32).view(np.uint32))
        bits += 0x7FFF + ((bits >> 16) & 1)      # round to nearest even
        return ctypes.c_uint16((bits >> 16) & 0xFFFF)
    ctypes_ints = {"i8": ctypes.c_int8, "u8": ctypes.c_uint8, "i16": ctypes.c_int16, "u16": ctypes.c_uint16,
                   "i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64}
    if dtype in ctypes_ints:
        return ctypes_ints[dtype](v)
    raise LaunchError(f"scalar parameters of type {dtype} are not supported")

