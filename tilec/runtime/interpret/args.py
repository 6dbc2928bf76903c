"""The interpreter's arguments: numpy arrays and torch tensors as numpy views
(bf16 and fp8 as bits), with what the TMA rules look at, and scalar values as
the kernel receives them."""
from __future__ import annotations

import sys

import numpy as np

from ...errors import LaunchError
from ...ir import nodes as ir
from .. import host
from .numbers import F32, _bf16_bits, decode, storage_dtype

class _Tensor:
    """One tensor argument: its elements as a numpy view (bf16 / fp8 as bits)
    and what the TMA rules look at."""

    def __init__(self, name, dtype, array, ptr, strides, writeback=None):
        self.name, self.dtype, self.array, self.ptr, self.writeback = name, dtype, array, ptr, writeback
        self.shape, self.strides = tuple(array.shape), tuple(strides)

    def tma_arg(self):
        return host.TensorArg(self.name, self.ptr, self.shape, self.strides, self.dtype, None)


def _numpy_tensor(a, name):
    dtype = host.numpy_dtype(a, name)
    # The GPU path copies numpy arrays into fresh, contiguous device memory: the
    # TMA rules see that copy (aligned, C strides), whatever the array's layout.
    return _Tensor(name, dtype, a.view(storage_dtype(ir.DTYPES[dtype])), 0, host._c_strides(a.shape))


_TORCH_SAME_SIZE = {"bf16": "int16", "u16": "int16", "u32": "int32", "u64": "int64", "f8e4m3": "uint8",
                    "f8e5m2": "uint8"}


def _torch_tensor(t, name):
    torch = sys.modules["torch"]
    host.check_dense(t, name)
    dtype = host._torch_dtype_name(t.dtype)
    if dtype is None:
        raise LaunchError(f"argument {name}: torch dtype {t.dtype} has no tilec dtype")
    cpu, writeback = t.detach(), None
    if cpu.device.type != "cpu":                  # a device tensor: copied in, and back if written
        cpu = cpu.cpu()
        writeback = lambda: t.detach().copy_(cpu)  # noqa: E731
    same = _TORCH_SAME_SIZE.get(dtype)
    array = (cpu.view(getattr(torch, same)) if same else cpu).numpy().view(storage_dtype(ir.DTYPES[dtype]))
    # the TMA rules judge the tensor that was passed (its pointer and strides), as on the GPU
    return _Tensor(name, dtype, array, t.data_ptr(), t.stride(), writeback)


def _tensor(obj, name, dtype, rank):
    if type(obj).__module__.startswith("torch") and "torch" in sys.modules and \
            isinstance(obj, sys.modules["torch"].Tensor):
        arg = _torch_tensor(obj, name)
    elif isinstance(obj, np.ndarray):
        arg = _numpy_tensor(obj, name)
    else:
        raise LaunchError(f"argument {name}: the interpreter takes numpy arrays and torch tensors, "
                          f"not a {type(obj).__name__}")
    if arg.dtype != dtype:
        raise LaunchError(f"argument {name}: dtype {arg.dtype} does not match the declared {dtype}")
    if len(arg.shape) != rank:
        raise LaunchError(f"argument {name}: rank {len(arg.shape)} does not match the declared rank {rank}")
    return arg


def _scalar_value(v, dt: ir.DType):
    """A scalar argument as the kernel receives it (runtime.host.scalar_value)."""
    if dt.name == "f16":
        return np.float16(v).astype(F32)
    if dt.name == "bf16":
        return decode(_bf16_bits(np.float32(v)), dt)
    if dt.is_float:
        return np.dtype(dt.numpy).type(v)
    t = np.dtype(dt.numpy)
    bits = 8 * t.itemsize
    v &= (1 << bits) - 1
    if t.kind == "i" and v >= 1 << (bits - 1):
        v -= 1 << bits
    return t.type(v)
