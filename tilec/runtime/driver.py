"""The CUDA driver side: devices, primary contexts, modules and launches."""
from __future__ import annotations

import ctypes
import functools
import threading

from ..errors import DeviceError

_LOCK = threading.Lock()


def check(result, what: str):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        from cuda.bindings import driver as cu
        name = cu.cuGetErrorName(err)[1]
        name = name.decode() if isinstance(name, bytes) else str(err)
        raise DeviceError(f"{what} failed: {name}")
    if isinstance(result, tuple):
        return result[1] if len(result) == 2 else result[1:]
    return None


@functools.lru_cache(maxsize=1)
def _init() -> bool:
    """True when a driver and at least one GPU are present."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        return False
    try:
        if int(cu.cuInit(0)[0]) != 0:
            return False
        err, n = cu.cuDeviceGetCount()
        return int(err) == 0 and n > 0
    except Exception:   # no libcuda.so on this machine
        return False


def have_gpu() -> bool:
    return _init()


@functools.lru_cache(maxsize=1)
def several_devices() -> bool:
    """Whether this machine has more than one GPU (then a thread's current
    context is never trusted from memory: torch may have switched it)."""
    if not have_gpu():
        return False
    from cuda.bindings import driver as cu
    return check(cu.cuDeviceGetCount(), "cuDeviceGetCount") > 1


@functools.lru_cache(maxsize=None)
def compute_capability(device: int) -> tuple:
    from cuda.bindings import driver as cu
    dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
    A = cu.CUdevice_attribute
    major = check(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "attribute")
    minor = check(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "attribute")
    return major, minor


def target_arch(device: int = 0) -> str:
    """The architecture to compile for: sm_90a when there is no GPU (what tilec
    compiles for in CI), else the newest one of tilec.arch.NAMES whose cubin runs
    on the device (sm_80 / sm_86 / sm_89 on Ampere and Ada, sm_90a on Hopper,
    sm_100a / sm_120a on Blackwell); a DeviceError for a GPU none of them runs on."""
    from ..arch import NAMES, for_device
    if not have_gpu():
        return "sm_90a"
    major, minor = compute_capability(device)
    arch = for_device(major, minor)
    if arch is None:
        raise DeviceError(f"device {device} has compute capability {major}.{minor}, and tilec compiles for "
                          f"{', '.join(NAMES)}: none of their cubins runs on it")
    return arch


@functools.lru_cache(maxsize=None)
def primary_context(device: int):
    from cuda.bindings import driver as cu
    if not have_gpu():
        raise DeviceError("no CUDA GPU is available: tilec can compile here but not run kernels")
    dev = check(cu.cuDeviceGet(device), "cuDeviceGet")
    return check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")


_THREAD = threading.local()


def make_current(device: int) -> None:
    """Make `device`'s primary context (the one torch and cupy use) current in
    this thread. With one GPU, checked with the driver once per thread; with
    several, every time: torch switches the thread's context on its own
    (torch.cuda.set_device, `with torch.cuda.device(i)`), and a kernel launched
    in another device's context would run there, on pointers it cannot use.
    With several GPUs, callers give the thread its context back (context_kept)."""
    if getattr(_THREAD, "device", None) == device and not several_devices():
        return
    from cuda.bindings import driver as cu
    ctx = primary_context(device)
    cur = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(cur) != int(ctx):
        check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    _THREAD.device = device


class context_kept:
    """`with context_kept():` the calling thread's current CUDA context when the
    block is left is the one it had on entry. make_current switches to a device's
    primary context; torch and cupy read their current device from the current
    context (cudaGetDevice), so without this a call on cuda:1 tensors would leave
    the caller's later `device="cuda"` allocations on cuda:1. Nothing to do where
    the machine has one GPU (every context tilec makes current is the one
    device's, the current device torch and cupy see already)."""
    __slots__ = ("entered",)

    def __enter__(self):
        self.entered = None
        if several_devices():
            from cuda.bindings import driver as cu
            self.entered = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")

    def __exit__(self, *exc):
        if self.entered is None:
            return False
        from cuda.bindings import driver as cu
        if int(check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")) != int(self.entered):
            check(cu.cuCtxSetCurrent(self.entered), "cuCtxSetCurrent")
            _THREAD.device = None       # make_current's memory of this thread's context is stale now
        return False


def launcher(loaded, grid, threads, smem_bytes, params, name):
    """A function of the stream that launches `loaded` with these parameters
    through cuda.bindings' cuLaunchKernel (measured on the H100: 2 to 4 us less
    than calling libcuda through ctypes): everything but the stream decided
    once, for the replayed launch of a call with the same arguments (~0.3 us
    over a bare cuLaunchKernel). With several GPUs it launches in its device's
    primary context and gives the thread back the context it found."""
    from cuda.bindings import driver as cu
    call, success = cu.cuLaunchKernel, cu.CUresult.CUDA_SUCCESS
    head = (loaded.function, grid[0], grid[1], grid[2], threads, 1, 1, smem_bytes)
    address = ctypes.addressof(params)
    device = loaded.device

    def launch_on(stream):
        if getattr(_THREAD, "device", None) != device:
            make_current(device)
        err = call(*head, stream, address, 0)[0]
        if err is not success and int(err):     # identity first: the common case costs no int()
            check((err,), f"launching {name}")

    if not several_devices():
        return launch_on
    ctx, get_current, set_current = primary_context(device), cu.cuCtxGetCurrent, cu.cuCtxSetCurrent
    ctx_id = int(ctx)

    def launch_on_its_device(stream):
        found = get_current()[1]
        if int(found) == ctx_id:
            err = call(*head, stream, address, 0)[0]
        else:
            check(set_current(ctx), "cuCtxSetCurrent")
            try:
                err = call(*head, stream, address, 0)[0]
            finally:
                set_current(found)
        if err is not success and int(err):
            check((err,), f"launching {name}")
    return launch_on_its_device


class LoadedKernel:
    """A cubin loaded into one device's primary context."""

    def __init__(self, cubin: bytes, name: str, device: int, smem_bytes: int, arch: str = "sm_90a"):
        from cuda.bindings import driver as cu
        from ..arch import for_device, runs_on
        major, minor = compute_capability(device)
        if not runs_on(arch, major, minor):
            fits = for_device(major, minor)
            hint = f"compile it with arch='{fits}' (or leave arch out)" if fits else \
                "no architecture tilec compiles for runs there"
            raise DeviceError(f"kernel {name} was compiled for {arch}, which does not run on device {device} "
                              f"(compute capability {major}.{minor}): {hint}")
        make_current(device)
        self.module = check(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.function = check(cu.cuModuleGetFunction(self.module, name.encode()), "cuModuleGetFunction")
        if smem_bytes:  # the launch may take 48 KiB of shared memory, its mbarriers' static bytes included, unless
            # asked for more: ask for the dynamic bytes always (48 KiB of them and the barriers would not launch)
            check(cu.cuFuncSetAttribute(
                self.function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_bytes), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
        self.device = device
        self._debug_record = None
        self._resident = {}         # (threads, smem bytes) -> resident_blocks

    def resident_blocks(self, threads: int, smem_bytes: int) -> int:
        """How many blocks of this kernel the device holds at once: its SMs times
        the blocks per SM that registers, shared memory and threads allow (the
        grid of a persistent kernel), asked of the driver once per launch shape."""
        found = self._resident.get((threads, smem_bytes))
        if found is None:
            from cuda.bindings import driver as cu
            per_sm = check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.function, threads, smem_bytes),
                           "cuOccupancyMaxActiveBlocksPerMultiprocessor")
            sms = check(cu.cuDeviceGetAttribute(
                cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.device), "attribute")
            found = self._resident[(threads, smem_bytes)] = max(1, per_sm) * sms
        return found

    def debug_record(self):
        """Host memory the GPU can write (the debug build's timeout record): the
        host address to read it and the device address to pass, zeroed."""
        from cuda.bindings import driver as cu
        if self._debug_record is None:
            host_ptr = check(cu.cuMemHostAlloc(64, cu.CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc")
            dev_ptr = check(cu.cuMemHostGetDevicePointer(host_ptr, 0), "cuMemHostGetDevicePointer")
            self._debug_record = (int(host_ptr), int(dev_ptr))
        host_ptr, dev_ptr = self._debug_record
        ctypes.memset(host_ptr, 0, 64)
        return host_ptr, dev_ptr
