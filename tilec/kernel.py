"""`tilec.compile` and the Kernel object: every stage of one compiled kernel."""
from __future__ import annotations

import builtins
import marshal
import os
import sys
import threading
import warnings

from .codegen import cuda as cuda_codegen
from .codegen import host as host_codegen
from .arch import get as get_arch
from .compiler import Program, load_source, lower, program_key, warn_notes
from .errors import CaptureError, TilecError, ToolchainWarning, recursion_checked
from ._version import __version__
from .runtime import cache, driver, host, nvrtc

_CACHE: dict = {}
# The host wrapper's code object is kept in the disk cache (marshal), for this Python only.
_CODE_TAG = f"{sys.implementation.cache_tag}:{marshal.version}"
_CACHE_LOCK = threading.Lock()
_KEY_LOCKS: dict = {}       # program key -> the lock its first compile holds


class Kernel(Program):
    """A compiled tilec kernel. Call it with the kernel's arguments (torch / cupy
    tensors, anything with DLPack or __cuda_array_interface__, numpy arrays)."""

    def __init__(self, source, overrides: dict, arch: str, fallback: bool = True, tma: bool = True,
                 debug: bool = False, built=None):
        """`built`: (meta, cubin) of this program as build() made them in another
        process (autotuning's compile workers): kept in the disk cache and used
        as a cache hit is, its check notes said here."""
        self.source = source
        self.debug = debug
        self.arch = arch
        self._overrides = dict(overrides)
        self._tma = tma
        self._fallback_allowed = fallback
        self._fallback = None
        self._lowered_ir = None
        self._loaded = {}
        self._load_lock = threading.Lock()
        self._prepared = {}         # launch key -> runtime.host.Prepared
        self.last_fix = {}          # the shape symbols the last launch that needed them fixed (_launcher_fixed)
        self._fixes = []            # every such {symbol: value} so far: a call with them goes straight there
        disk_key = _disk_key(source, self._overrides, arch, tma, debug)
        hit = None if built is not None else cache.load(disk_key)
        self.from_disk_cache = hit is not None
        self._host_code = None      # the host wrapper compiled, or as marshal bytes from the disk cache
        if hit is not None or built is not None:
            meta, cubin = hit or built
            if meta.get("host_code_tag") == _CODE_TAG:
                self._host_code = meta.get("host_code")
            warn_notes(meta.get("check_notes", ()), meta.get("pipeline_notes", ()))
            if built is not None:
                cache.store(disk_key, meta, cubin)
        else:
            self._lowered_ir, meta, cubin, self._host_code = _build(source, self._overrides, arch, tma, debug)
            cache.store(disk_key, meta, cubin)
        for message in nvrtc.known_miscompiles(meta["ptx"], arch, tuple(meta["nvrtc_version"])):
            warnings.warn(ToolchainWarning(f"kernel {meta['name']}: {message}"), stacklevel=3)
        self.name = meta["name"]
        self.consts = meta["consts"]
        self.cuda_source = meta["cuda_source"]
        self.host_source = meta["host_source"]
        self.ptx = meta["ptx"]
        self.compile_log = meta.get("compile_log", "")   # NVRTC / ptxas warnings; empty for a clean kernel
        self.pipeline_notes = tuple(meta.get("pipeline_notes", ()))  # the pipelined loops that run plain, and why
        self.cubin = cubin
        self.compile_seconds = meta["compile_seconds"] if hit is None else 0.0
        self._smem_bytes = meta["smem_bytes"]
        self._wrapper = None

    # ---- the generated host wrapper, run on first use (a tune statement's default may never be called)
    def _host(self):
        w = self._wrapper
        if w is None:
            namespace = {}
            exec(self._host_code_object(), namespace)
            launch, writes = namespace["launch"], namespace["WRITES"]
            w = self._wrapper = (launch, writes, namespace.get("DEBUG"), host.written_params(launch, writes),
                                 namespace.get("FIXABLE", {}))
        return w

    def _host_code_object(self):
        code = self._host_code
        if isinstance(code, bytes):         # from the disk cache, written by this Python
            try:
                code = marshal.loads(code)
            except (ValueError, EOFError, TypeError):
                code = None
        return code if code is not None else _compile_host(self.host_source, self.name)

    @property
    def _launch(self):
        """launch(tl_call, *args): the generated host wrapper."""
        return self._host()[0]

    @property
    def _writes(self):
        return self._host()[1]

    @property
    def _debug_info(self):
        return self._host()[2]

    @property
    def _written_params(self):
        """((position, name), ...) of the tensors the kernel writes (host.mark_written)."""
        return self._host()[3]

    @property
    def _fixable(self):
        """{shape symbol: (argument, dim)}: the symbols a launch may fix, where each is read."""
        return self._host()[4]

    # ---- inspection
    @property
    def _lowered(self):
        """The IR after every pass (built on demand: a disk-cache hit skips it)."""
        if self._lowered_ir is None:
            self._lowered_ir = lower(self.source, self._overrides, tma=self._tma, arch=self.arch)
        return self._lowered_ir

    @property
    def kernel_ir(self):
        return self._lowered.kernel

    # ---- running
    def _module(self, device: int):
        m = self._loaded.get(device)
        if m is None:
            with self._load_lock:
                m = self._loaded.get(device)
                if m is None:
                    m = driver.LoadedKernel(self.cubin, self.name, device, self._smem_bytes, self.arch)
                    self._loaded[device] = m
        return m

    @property
    def fallback(self) -> "Kernel":
        """The thread-copy variant: runs when an argument breaks a TMA rule at launch
        (e.g. rows that are not 16-byte aligned). Compiled on first use. For sm_90a
        it is the lowering sm_80 / sm_86 / sm_89 get (tilec.arch), on a GPU that runs it."""
        if self._fallback is None:
            with self._load_lock:
                if self._fallback is None:
                    self._fallback = Kernel(self.source, self._overrides, self.arch, fallback=False, tma=False,
                                            debug=self.debug)
        return self._fallback

    def fixed(self, **symbols) -> "Kernel":
        """This program compiled with shape symbols fixed (k.fixed(C=24) is
        tilec.compile(src, C=24) with this kernel's consts): what a launch runs
        whose im2col loads break a rule only while the channel count is a symbol
        (runtime.host.Call.fall_back). Compiled on first use, cached."""
        overrides = {**self._overrides, **symbols}
        return cached(program_key(self.source, overrides, arch=self.arch, fallback=self._fallback_allowed,
                                  debug=self.debug),
                      lambda: Kernel(self.source, overrides, self.arch, self._fallback_allowed, debug=self.debug))

    def _compiled(self) -> "Kernel":
        return self

    def _call(self, stream, fallback, args):
        """The runtime.host.Call through which the host wrapper makes one launch of `args`."""
        return host.Call(self.name, self._module, stream, self._writes, self._debug_info, fallback,
                         home=host.home_device(args), fixed=self._launcher_fixed)

    def _launcher(self, *args, stream=None):
        """Launch `args` (checked by the caller's __call__), as a fall-back target does:
        where an earlier launch fixed shape symbols to the values these arguments
        have, that program at once (its wrapper checks the arguments), else this one."""
        for fix in self._fixes:
            if _has(args, fix, self._fixable):
                return self._launcher_fixed(fix)(*args, stream=stream)
        return self._run(self._call(stream, self._run_fallback if self._fallback_allowed else None, args), args)

    def _run_fallback(self, *args, stream=None):
        fb = self.fallback
        return fb._run(fb._call(stream, None, args), args)

    def _run(self, call, args):
        """The host wrapper's launch of `args` through `call`; a call it refuses frees
        the device copies of the numpy arguments it made before the check that failed."""
        code = self._launch.__code__
        if len(args) != code.co_argcount - 1 and not code.co_flags & 0x04:    # (0x04: CO_VARARGS, a stand-in's)
            names = ", ".join(code.co_varnames[1:code.co_argcount])
            raise TypeError(f"kernel {self.name} takes {code.co_argcount - 1} arguments ({names}), got {len(args)}")
        try:
            return self._launch(call, *args)
        except BaseException:
            call.abandon()
            raise

    def __call__(self, *args, stream=None):
        key = host.torch_call_key(args) if stream is None else None
        host.mark_written(args, self._written_params, self.name)
        if key is not None:
            prepared = self._prepared.get(key)
            if prepared is not None:          # the same arguments again: replay the launch
                prepared()
                return None
        if _capturing():
            raise self._capture_error()
        with driver.context_kept():     # the arguments' device's context for the while, then the caller's again
            try:
                prepared = self._launcher(*args, stream=stream)
            except ZeroDivisionError as e:
                raise host.division_by_zero(self.name, self.host_source, e) from None
        if key is not None and prepared is not None:
            if len(self._prepared) >= 1024:
                self._prepared.clear()
            self._prepared[key] = prepared
        return None

    def _capture_error(self):
        head = f"kernel {self.name} was called during CUDA graph capture"
        if self.debug:
            return CaptureError(f"{head}: a debug build synchronizes after every launch and is never replayed, "
                                "so it cannot be captured; compile it without debug=True / TILEC_DEBUG=1")
        return CaptureError(
            f"{head} with arguments it has not been called with before: only the replay of an earlier call "
            "(the same torch tensors, pointers, shapes, strides and scalars, no stream=) can be captured, since "
            "a first call may compile and load the kernel, encode tensor maps or copy arrays. Call the kernel "
            "once with the same arguments before the capture (a warm-up call), then capture")

    def as_torch_op(self, mutates=None):
        """This kernel as a torch operator (tilec.torch.op): torch.compile traces
        it as one node, CUDA graphs capture it after a warm-up call."""
        from . import torch as tilec_torch
        return tilec_torch.op(self, mutates)

    def __repr__(self):
        return f"<tilec.Kernel {self.name}({self._settings()}) for {self.arch}>"


def _has(args, symbols: dict, where: dict) -> bool:
    """Whether `args` have these shape symbols' values, each read at where[symbol]
    = (argument, dim) (an argument without a shape: no)."""
    try:
        return all(args[where[s][0]].shape[where[s][1]] == v for s, v in symbols.items())
    except (AttributeError, IndexError, KeyError, TypeError):
        return False


def _compile_host(host_source: str, name: str):
    return builtins.compile(host_source, f"<tilec host wrapper of {name}>", "exec")


def _capturing() -> bool:
    """True while torch captures a CUDA graph on the current stream."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def _build(source, overrides: dict, arch: str, tma: bool, debug: bool):
    """Lower, generate and compile one program: (the Lowered, the disk-cache
    entry's meta, the cubin, the host wrapper's code object). lower() says the
    check notes as warnings; the meta keeps them."""
    lw = lower(source, overrides, tma=tma, arch=arch)
    cuda_source = cuda_codegen.generate(lw.kernel, source.name, debug, arch)
    compiled = nvrtc.compile_cuda(cuda_source, lw.kernel.name, arch)
    host_source = host_codegen.generate(lw.kernel, source.name, debug)
    host_code = _compile_host(host_source, lw.kernel.name)
    meta = {"name": lw.kernel.name, "consts": dict(lw.kernel.consts), "smem_bytes": lw.kernel.smem_bytes,
            "cuda_source": cuda_source, "host_source": host_source,
            "host_code": marshal.dumps(host_code), "host_code_tag": _CODE_TAG,
            "ptx": compiled.ptx, "compile_seconds": compiled.seconds, "compile_log": compiled.log,
            "nvrtc_version": list(nvrtc.version()),     # the compiler of the cubin (nvrtc.known_miscompiles)
            "check_notes": list(lw.kernel.check_notes), "pipeline_notes": list(lw.kernel.pipeline_notes)}
    return lw, meta, compiled.cubin, host_code


def build(source, overrides: dict, arch: str, tma: bool = True, debug: bool = False):
    """(meta, cubin) of one program, as Kernel(..., built=) takes them: what a
    compile worker (runtime/workers.py) sends back."""
    _, meta, cubin, _ = _build(load_source(source), overrides, arch, tma, debug)
    return meta, cubin


def is_built(source, overrides: dict, arch: str, fallback: bool = True, debug: bool = False) -> bool:
    """Whether compile() would find this program compiled already: in this
    process or in the disk cache (then no worker need build it)."""
    if program_key(source, overrides, arch=arch, fallback=fallback, debug=debug) in _CACHE:
        return True
    return cache.exists(_disk_key(source, overrides, arch, True, debug))


def _disk_key(source, overrides: dict, arch: str, tma: bool, debug: bool) -> str:
    """A compiled program's disk-cache key: this tilec, the program and the NVRTC that compiles it."""
    return cache.key(__version__, program_key(source, overrides, arch=arch, tma=tma, debug=debug), nvrtc.identity())


def env_debug() -> bool:
    """compile()'s default debug: TILEC_DEBUG=1."""
    return os.environ.get("TILEC_DEBUG", "0") not in ("0", "")


@recursion_checked
def compile(src, arch: str | None = None, fallback: bool = True, debug: bool | None = None,
            backend: str | None = None, tune=None, key=None, where=None, tune_l2: str = "warm",
            **consts):
    """Compile a .tile program (a path or the text) with optional const overrides:
    a Kernel, a tilec.autotune.TunedKernel where it tunes, or an interpreted
    kernel with backend="interpret".

    fallback: when an argument breaks a TMA rule at launch, run the kernel's
    thread-copy variant (with a TmaFallbackWarning) instead of raising LaunchError.
    debug (default: TILEC_DEBUG=1): bound every mbarrier wait (~1 s); a kernel
    that would hang raises a DeviceError naming the barrier, phase, bytes and line.
    backend: "cuda" (default), or "interpret" (default when TILEC_INTERPRET=1): run
    the same lowered IR on the CPU with numpy (tilec.runtime.interpret).
    arch: one of tilec.arch.NAMES (sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_120a;
    default: the GPU's, sm_90a without one; with backend="interpret", sm_90a).
    Before sm_90 there is no TMA: copies are thread copies, and `gemm` (wgmma)
    is sm_90a only.
    tune: {const: (values, ...), ...}, key: names of shape symbols / scalars
    (default: every shape symbol of the header, then the scalars a `where`
    condition reads; () tunes once for all shapes):
    an autotuned kernel (tilec.autotune.TunedKernel): the first
    call with new key values compiles every candidate, times them on its
    arguments and keeps the fastest (cached in memory and on disk). With
    backend="interpret" the first candidate that compiles is returned, untimed
    (an InterpretedKernel whose best_config is that candidate; a tune statement's
    declared values likewise).
    A program with a tune statement is tuned over its space (less the consts
    given here; a plain Kernel if none is left), its declared values first,
    keyed by every shape symbol of its header unless `key` is given; tune= given
    replaces the statement's space (the same default key), and tune=False ignores the statement (a
    Kernel of the declared consts, which backend="interpret" always runs).
    where: a tune condition, as after a tune statement's `where` (docs/language.md
    §3): on a new key, only the candidates for which it holds are compiled and
    timed; it replaces the statement's own (where="1": none).
    tune_l2: "warm" (default): candidates are timed back to back, so the inputs a
    launch reads are in L2 from the launch before, as in repeated calls of one
    kernel; "cold": the L2 is flushed before each timed launch, so the inputs come
    from DRAM, as a model's weights do when each layer reads its own once (a
    decode step's few-row gemms pick differently)."""
    source = load_source(src)
    if backend is None:
        backend = "interpret" if os.environ.get("TILEC_INTERPRET", "0") not in ("0", "") else "cuda"
    explicit = tune is not None and tune is not False
    if where is not None and (not isinstance(where, str) or not where.strip()):
        raise TilecError(f"where= takes a tune condition's text, e.g. \"BM <= M\", got {where!r}")
    for given, name in ((where is not None, "where="), (key is not None, "key=")):
        if given and tune is False:
            raise TilecError(f"{name} goes with tuning, and tune=False tunes nothing")
    if tune_l2 not in ("warm", "cold"):
        raise TilecError(f"tune_l2= is \"warm\" (inputs in L2 from the launch before) or \"cold\" (the L2 "
                         f"flushed before each timed launch), got {tune_l2!r}")
    if tune_l2 != "warm" and tune is False:
        raise TilecError(f"tune_l2={tune_l2!r} goes with tuning, and tune=False tunes nothing")
    if backend == "interpret":
        from .runtime.interpret import interpret
        if explicit:
            from .autotune import first_interpreted
            return first_interpreted(source, consts, tune, key, fallback, get_arch(arch or "sm_90a").name)
        if tune is None and "tune" in source.text:      # the declared consts, untimed; best_config says which
            from .autotune import interpreted_statement
            k = interpreted_statement(source, consts, fallback, get_arch(arch or "sm_90a").name)
            if k is not None:
                return k
        return interpret(source, consts, fallback, get_arch(arch or "sm_90a").name)
    if backend != "cuda":
        raise TilecError(f"unknown backend '{backend}' (cuda or interpret)")
    if arch is None:
        arch = driver.target_arch()
    arch = get_arch(arch).name
    if debug is None:
        debug = env_debug()
    if explicit:
        from .autotune import tuned
        return tuned(source, consts, tune, key, arch, fallback, debug, where, tune_l2)
    if tune is None and "tune" in source.text:     # the program's tune statement (read without the parser)
        from .autotune import from_statement
        k = from_statement(source, consts, key, arch, fallback, debug, where, tune_l2)
        if k is not None:
            return k
    for given, name in ((where is not None, "where="), (key is not None, "key="),
                        (tune_l2 != "warm", f"tune_l2={tune_l2!r}")):
        if given:
            raise TilecError(f"{name} goes with tuning: give tune= (or compile a program with a tune statement)")
    return cached(program_key(source, consts, arch=arch, fallback=fallback, debug=debug),
                  lambda: Kernel(source, consts, arch, fallback, debug=debug))


def cached(pkey, make):
    """The kernel cached under program key `pkey`, made by `make()` on first use.
    One lock per key, so that different programs (autotuning's candidates) lower
    in parallel threads; NVRTC itself is serialised (runtime/nvrtc.py)."""
    k = _CACHE.get(pkey)
    if k is None:
        with _CACHE_LOCK:
            lock = _KEY_LOCKS.setdefault(pkey, threading.Lock())
        with lock:
            k = _CACHE.get(pkey)
            if k is None:
                k = _CACHE[pkey] = make()
    return k


__all__ = ["Kernel", "compile", "TilecError"]
