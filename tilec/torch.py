"""tilec kernels as torch operators, for torch.compile and CUDA graphs.

    op = k.as_torch_op()        # or tilec.torch.op(k, mutates=("C",))
    op(a, b)                    # eager: the kernel's own (replayed) launch
    torch.compile(f, fullgraph=True)    # f calls op: one node, torch.ops.tilec.<name>.default

The kernel is registered through torch.library as the operator
`tilec::<kernel>_<digest>`: a schema from its signature (tensors it writes are
mutated arguments, `Tensor(a!)`; float scalars `float`, integer scalars
`SymInt`; no outputs), a fake implementation that checks dtypes, ranks and
shape symbols without running anything, and, for CUDA (and CPU, to raise
tilec's error), the kernel itself.

Calling the TorchOp calls the operator, except in eager mode with the same
CUDA tensors and scalars as an earlier call: then it replays that call's
launch itself, as `k(...)` does, without the dispatcher's ~1 us of Python and
C++ (benchmarks/torch_op_overhead.py on the CPU, `benchmarks/bench.py host`
on the GPU). Under tracing (torch.compile, make_fx, fake
tensors, any dispatch mode) it is always the operator, the graph's node.
"""
from __future__ import annotations

import builtins
import hashlib
import threading

import torch

from .codegen.abi import shape_bindings
from .codegen.host import py_expr
from .compiler import program_key
from .errors import LaunchError, TilecError
from .ir import nodes as ir
from .ir.effects import written_tensors
from .kernel import Kernel
from .runtime import host as rt

__all__ = ["TorchOp", "op"]

_LIB = None             # torch.library.Library("tilec", "FRAGMENT"), made by the first op
_OPS = {}               # operator name -> TorchOp
_LOCK = threading.Lock()
_is_compiling = torch.compiler.is_compiling             # constant True while dynamo traces
_dispatch_modes = torch._C._len_torch_dispatch_stack     # fake tensors, make_fx, ... (~40 ns)
_call_key = rt.torch_call_key
_TORCH_DTYPES = {tilec_name: getattr(torch, name) for name, tilec_name in rt._TORCH_NAMES.items()}


class TorchOp:
    """A tilec kernel registered as a torch operator. Call it like the kernel;
    `op` is the registered OpOverload (torch.ops.tilec.<name>.default), `name`
    its qualified name, `mutates` the tensor parameters it writes."""
    __slots__ = ("kernel", "op", "name", "mutates")

    def __call__(self, *args):
        if not (_is_compiling() or _dispatch_modes()):
            # eager, the same CUDA tensors and scalars as an earlier call: replay
            # its launch as Kernel.__call__ does, without the dispatcher's ~1 us
            # tilec's autograd rule first (host.mark_written), not the dispatcher's fallback
            rt.mark_written(args, self.kernel._written_params, self.kernel.name)
            prepared = self.kernel._prepared.get(_call_key(args))
            if prepared is not None:
                prepared()
                return None
        return self.op(*args)            # traced, a first call, meta or CPU tensors: the operator

    def __repr__(self):
        return f"<tilec.TorchOp {self.op._schema}>"


def op(kernel: Kernel, mutates=None) -> TorchOp:
    """Register `kernel` as a torch operator (once per kernel and `mutates`).

    mutates: names of the tensor parameters the kernel writes; by default the
    tensors its statements write (ir.effects.written_tensors, what the host wrapper's WRITES lists)."""
    if not isinstance(kernel, Kernel):
        raise TilecError(f"tilec.torch.op takes a kernel from tilec.compile (backend 'cuda'), "
                         f"not a {type(kernel).__name__}")
    k = kernel.kernel_ir
    tensors = [p.name for p in k.tensors]
    if mutates is None:
        mutates = written_tensors(k)
    mutates = (mutates,) if isinstance(mutates, str) else tuple(mutates)
    unknown = [m for m in mutates if m not in tensors]
    if unknown:
        raise TilecError(f"mutates names {', '.join(map(repr, unknown))}, not a tensor parameter of kernel "
                         f"{kernel.name} ({', '.join(tensors)})")
    # what tilec.compile keys its kernels on, and mutates: the same name for the same program compiled again
    identity = repr(program_key(kernel.source, kernel._overrides, arch=kernel.arch,
                                fallback=kernel._fallback_allowed, debug=kernel.debug, mutates=sorted(mutates)))
    name = f"{kernel.name}_{hashlib.sha256(identity.encode()).hexdigest()[:12]}"
    with _LOCK:
        entry = _OPS.get(name)
        if entry is not None:           # the same program compiled again: the newest kernel runs it
            entry.kernel = kernel
            return entry
        global _LIB
        if _LIB is None:
            _LIB = torch.library.Library("tilec", "FRAGMENT")
        entry = TorchOp()
        entry.kernel, entry.name, entry.mutates = kernel, f"tilec::{name}", tuple(p for p in tensors if p in mutates)
        _LIB.define(name + schema(k, entry.mutates))

        def run(*args):
            entry.kernel(*args)
        _LIB.impl(name, run, "CUDA")
        _LIB.impl(name, run, "CPU")     # the kernel's own error: a CPU tensor where a GPU tensor is required
        torch.library.register_fake(entry.name, fake_impl(k), lib=_LIB)
        entry.op = getattr(torch.ops.tilec, name).default
        _OPS[name] = entry
        return entry


def schema(k: ir.Kernel, mutates) -> str:
    """The operator's schema, e.g. `(Tensor X, Tensor(a!) Y, float alpha) -> ()`."""
    args, alias = [], 0
    for p in k.params:
        if isinstance(p, ir.TensorParam) and p.name in mutates:
            args.append(f"Tensor(a{alias}!) {p.name}")
            alias += 1
        elif isinstance(p, ir.TensorParam):
            args.append(f"Tensor {p.name}")
        else:
            args.append(f"{'float' if p.dtype.is_float else 'SymInt'} {p.name}")
    return f"({', '.join(args)}) -> ()"


def fake_impl(k: ir.Kernel):
    """What tracing runs instead of the kernel: the launch's checks of dtypes,
    ranks, devices and shape symbols, on tensors without data. A symbol is
    bound by its first bare appearance and checked everywhere else, as in the
    host wrapper (codegen.host.generate); a check on a symbolic size becomes a
    torch._check assertion. The `require`s are left to the launch."""
    bound, dims = shape_bindings(k)
    binds = [(b.symbol, b.tensor, b.dim) for b in bound]
    checks = [(c.tensor, c.dim, builtins.compile(py_expr(c.expr), "<shape>", "eval"),
               f"{c.expr.name} = {{}} (from {c.bound_from})" if c.bound_from
               else f"the declaration says {c.says}") for c in dims]
    params = k.params

    def fake(*args):
        shapes = {}
        for p, a in zip(params, args):
            if not isinstance(p, ir.TensorParam):
                continue
            if a.dtype != _TORCH_DTYPES.get(p.dtype.name):
                raise LaunchError(f"argument {p.name}: dtype {a.dtype} does not match the declared "
                                  f"{p.dtype.name}")
            if a.dim() != len(p.shape):
                raise LaunchError(f"argument {p.name}: rank {a.dim()} does not match the declared rank "
                                  f"{len(p.shape)}")
            if a.device.type not in ("cuda", "meta"):
                raise LaunchError(f"argument {p.name}: a tensor on the {a.device.type.upper()} was passed where "
                                  "a GPU tensor is required")
            shapes[p.name] = a.shape
        symbols = {name: shapes[t][d] for name, t, d in binds}
        for t, d, code, text in checks:
            got, want = shapes[t][d], eval(code, {"tl_rt": rt}, symbols)
            message = f"argument {t}: dim {d} is {got} but {text.format(want)}"
            if isinstance(got, int) and isinstance(want, int):
                if got != want:
                    raise LaunchError(message)
            else:
                torch._check(got == want, lambda message=message: message)
        return None
    return fake
