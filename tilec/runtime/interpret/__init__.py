"""A CPU interpreter of tilec's lowered IR, exact about TMA.

`tilec.compile(src, backend="interpret")` (or `TILEC_INTERPRET=1`) returns an
`InterpretedKernel`: called like a compiled Kernel, it runs the kernel block
after block with numpy, on numpy arrays and torch tensors, in place.

It runs the IR after the last pass, the IR codegen/cuda.py prints, statement
by statement, and computes what that CUDA computes:

- TMA tiled loads read the tensor map's box at the instruction's int32
  coordinates, zero outside the tensor (clipped boxes, negative coordinates
  too); TMA stores drop what falls outside. A misaligned innermost coordinate
  is the GPU's illegal-instruction fault.
- TMA im2col loads walk the pixel box that the map's corners and element
  strides define, from the instruction's coordinates, add the tap offsets, and
  read zero outside the image (ow, then oh, then n, across image boundaries).
- Thread copies are bounds-checked and convert like the CUDA's casts (through
  float, or double where f64 is involved).
- `parallel` bodies run vectorised over their whole index space, statement by
  statement. Element arithmetic is C++'s: the usual arithmetic conversions,
  int32 wrap-around, truncating `/` and `%`, f16 / bf16 / fp8 computed in
  float, and `a * b + c` one fused multiply-add where the kernel fuses it
  (ir.exprs.fused_product).
- mbarriers are counted: a wait no phase would complete, or loads bringing
  more bytes than the expect-tx, raise InterpretError.
- A warp-specialised block (`pipelined(..., producer = 1)`) runs its
  producer's one thread and its consumers concurrently, one at a time: the
  producer first, each handing over at a wait that cannot pass; a wait that
  neither can let pass would hang (InterpretError).

Not modelled: timing, races (blocks run one after another, a specialised
block's two roles in turns between mbarrier waits), hangs other than mbarrier
waits, NaN payloads, the last ulp of exp / exp2 / log / log2 / rsqrt.
"""
from __future__ import annotations

import functools

import numpy as np

from ...codegen.abi import shape_bindings
from ...compiler import Program, load_source, lower, program_key
from ...errors import TilecError
from ...ir import nodes as ir
from ...ir.effects import written_tensors
from .. import host
from .args import _scalar_value, _tensor
from .blocks import INTERPRETED_RESIDENT_BLOCKS, InterpretError, _Blocks
from .numbers import decode, encode

__all__ = ["INTERPRETED_RESIDENT_BLOCKS", "InterpretError", "InterpretedKernel", "decode", "encode", "interpret", "run"]


@functools.lru_cache(maxsize=None)
def _host_code(text):
    return compile(text, "<tilec host expression>", "eval")


def _host_eval(e, env):
    """A grid size, a shape or a require, with the host wrapper's Python semantics."""
    from ...codegen.host import py_expr
    return eval(_host_code(py_expr(e)), _HOST_GLOBALS, env)


# the names py_expr's text calls besides the kernel's (env): the host wrapper's
_HOST_GLOBALS = {"tl_rt": host, "__builtins__": {"min": min, "max": max, "abs": abs, "bool": bool}}


# ---------------------------------------------------------------- the kernel object

_CACHE: dict = {}


def interpret(source, consts: dict, fallback: bool = True, arch: str = "sm_90a", tuned: dict | None = None,
              tune_report: str = "") -> "InterpretedKernel":
    """What `tilec.compile(src, backend="interpret", **consts)` returns (cached):
    the IR lowered for `arch` (sm_80 / sm_86 / sm_89: thread copies, tilec.arch).
    tuned: where tilec.compile would tune (tune=, a tune statement), the tuned
    consts this kernel runs with untimed (its best_config), and tune_report the
    text of its tune_report()."""
    source = load_source(source)
    key = program_key(source, consts, backend="interpret", fallback=fallback, arch=arch,
                      tuned=None if tuned is None else (tuple(tuned.items()), tune_report))
    k = _CACHE.get(key)
    if k is None:
        k = _CACHE[key] = InterpretedKernel(source, consts, fallback, arch=arch, tuned=tuned,
                                            tune_report=tune_report)
    return k


class InterpretedKernel(Program):
    """A tilec kernel run by the CPU interpreter. Call it with the kernel's
    arguments: numpy arrays and torch tensors (CPU ones are used in place,
    others are copied to the CPU and back), Python numbers for scalars."""

    def __init__(self, source, overrides: dict, fallback: bool = True, tma: bool = True, arch: str = "sm_90a",
                 tuned: dict | None = None, tune_report: str = ""):
        self.source = load_source(source)
        # What a script written for a TunedKernel reads: the interpreter does not time, so the
        # "best" config is the one it runs, the first candidate ({} where nothing is tuned).
        self.best_config = dict(tuned or {})
        self._tune_report = tune_report
        self._overrides = dict(overrides)
        self._fallback_allowed = fallback
        self._tma = tma
        self.arch = arch
        self._fallback = None
        self._lowered = lower(self.source, self._overrides, tma=tma, arch=arch)
        self.kernel_ir = self._lowered.kernel
        self.name = self.kernel_ir.name
        self.consts = dict(self.kernel_ir.consts)
        self.last_fix = {}          # the shape symbols the last launch that needed them fixed (_launcher_fixed)
        self._fixes = []            # every such {symbol: value} (k.fixes)

    @functools.cached_property
    def cuda_source(self) -> str:
        """The CUDA the GPU backend would compile from the same IR."""
        from ...codegen import cuda
        return cuda.generate(self.kernel_ir, self.source.name, arch=self.arch)

    @property
    def fallback(self) -> "InterpretedKernel":
        """The thread-copy variant (every global<->shared copy a thread copy, no mbarriers)."""
        if self._fallback is None:
            self._fallback = InterpretedKernel(self.source, self._overrides, fallback=False, tma=False,
                                               arch=self.arch)
        return self._fallback

    def _run_fallback(self, *args, stream=None):
        fb = self.fallback
        return fb._launch(InterpretCall(fb.kernel_ir, None), *args)

    def fixed(self, **symbols) -> "InterpretedKernel":
        """This program with shape symbols fixed, as Kernel.fixed."""
        return interpret(self.source, {**self._overrides, **symbols}, self._fallback_allowed, self.arch)

    def _compiled(self):
        """The GPU backend's Kernel of this program (what k.export writes): compiled by NVRTC, which needs
        no GPU."""
        from ...kernel import compile as compile_kernel
        return compile_kernel(self.source, arch=self.arch, fallback=self._fallback_allowed, debug=False,
                              backend="cuda", tune=False, **self._overrides)

    def _launcher(self, *args, stream=None):
        return self._launch(InterpretCall(self.kernel_ir, self._run_fallback if self._fallback_allowed else None,
                                          self._launcher_fixed), *args)

    def __call__(self, *args, stream=None):
        k = self.kernel_ir
        if len(args) != len(k.params):
            raise TypeError(f"kernel {k.name} takes {len(k.params)} arguments "
                            f"({', '.join(p.name for p in k.params)}), got {len(args)}")
        host.mark_written(args, self._written_params, k.name)
        try:
            return self._launcher(*args)
        except ZeroDivisionError as e:
            raise host.division_by_zero(k.name, self.host_source, e) from None

    def tune_report(self, key=None) -> str:
        """What TunedKernel.tune_report() is for a GPU kernel: here that nothing
        was tuned (the interpreter does not time) and which consts run."""
        if self._tune_report:
            return self._tune_report
        return f"{self.name}: not tuned (no tune= and no tune statement, or tune=False)\n"

    def as_torch_op(self, mutates=None):
        raise TilecError(f"kernel {self.name} runs on the interpret backend (backend=\"interpret\" or "
                         "TILEC_INTERPRET=1), which has no torch operator: call the kernel itself, k(...), "
                         "or compile it for the GPU (backend=\"cuda\") to register it with torch")

    def __repr__(self):
        variant = ", thread-copy variant" if not self._tma else ""
        return f"<tilec.InterpretedKernel {self.name}({self._settings()}) on the CPU{variant}>"

    # ---- a launch: the kernel's own host wrapper, with a Call that runs the blocks
    @functools.cached_property
    def host_source(self) -> str:
        """The host wrapper the GPU backend would run: the interpreter runs it too."""
        from ...codegen import host as host_codegen
        return host_codegen.generate(self.kernel_ir, self.source.name)

    @functools.cached_property
    def _launch(self):
        namespace = {}
        exec(compile(self.host_source, f"<tilec host wrapper of {self.name}>", "exec"), namespace)
        return namespace["launch"]

    @functools.cached_property
    def _written_params(self):
        """((position, name), ...) of the tensors the kernel writes, as Kernel._written_params."""
        return host.written_params(self._launch, written_tensors(self.kernel_ir))


class InterpretCall(host.Call):
    """What the host wrapper calls when the interpreter launches: the same binds,
    requires, TMA rules (and fallback) and grid as on the GPU, with arguments
    read as numpy views, tensor maps checked but not encoded, and the launch
    running the kernel's blocks on the CPU."""

    def __init__(self, k: ir.Kernel, fallback, fixed=None):
        super().__init__(k.name, None, None, written_tensors(k), fallback=fallback, fixed=fixed)
        self.k = k
        self.tensors, self.scalars = {}, {}

    def tensor(self, obj, name, dtype, rank):
        t = _tensor(obj, name, dtype, rank)
        size = ir.DTYPES[dtype].size
        if isinstance(obj, np.ndarray):     # as passed: a numpy array's own memory, a torch tensor's
            self.check_writable(name, obj.flags.writeable, "numpy array", "its flags.writeable is False")
            self.remember(name, "host", obj.__array_interface__["data"][0], t.shape, obj.strides, size)
        else:
            self.remember(name, str(obj.device), obj.data_ptr(), t.shape, tuple(s * size for s in t.strides), size)
        self.tensors[name] = t
        return t.tma_arg()

    def scalar(self, value, name, dtype):
        value = super().scalar(value, name, dtype)
        self.scalars[name] = _scalar_value(value, ir.DTYPES[dtype])
        return value

    def _encoded(self, encode, *driver_args):
        return None             # the rules were checked (host.Call); the blocks need no encoded map

    def nothing_to_do(self):
        return None

    def _finish(self):
        pass

    def launch(self, grid, threads, smem_bytes, params, persistent=False, balanced=False, stream_k=False):
        # `threads` is the launch's (with a producer warpgroup's 128); the blocks count the kernel's own;
        # a persistent kernel's grid is clamped where the blocks run (_Blocks.run)
        host.check_grid(grid)
        env = {**self.scalars, **_shape_symbols(self.k, self.tensors)}
        with np.errstate(all="ignore"):
            _Blocks(self.k, self.tensors, env).run(grid)
        for name in self.writes:
            if self.tensors[name].writeback is not None:
                self.tensors[name].writeback()
        return None


def _shape_symbols(k: ir.Kernel, tensors: dict) -> dict:
    """Each shape symbol as the kernel receives it (a 32-bit int, host.symbol, with its
    launch error for a dimension over 2^31-1), read where it is bound."""
    return {b.symbol: np.int32(host.symbol(b.symbol, tensors[b.tensor].shape[b.dim]).value)
            for b in shape_bindings(k)[0]}


def run(k: ir.Kernel, args, grid=None):
    """Run lowered kernel IR `k` on `args` over `grid` (x, y, z; by default the
    kernel's grid for these arguments) with no launch checks: for IR built by
    hand, and for numpy views taken as they are (strided, offset), as tests do."""
    tensors, env = {}, {}
    for p, a in zip(k.params, args):
        if isinstance(p, ir.TensorParam):
            tensors[p.name] = _tensor(a, p.name, p.dtype.name, len(p.shape))
        else:
            env[p.name] = _scalar_value(a, p.dtype)
    env.update(_shape_symbols(k, tensors))
    if grid is None:
        host_env = {n: int(v) for n, v in env.items() if isinstance(v, np.integer)}
        grid = tuple(_host_eval(g, host_env) for g in k.grid) + (1,) * (3 - len(k.grid))
    with np.errstate(all="ignore"):
        _Blocks(k, tensors, env).run(grid)
