"""The kernel's parameter list, shared by the CUDA and host-wrapper generators so
that what one declares the other packs, in the same order; and how a launch
reads the shape symbols from its arguments, shared by every launcher (the
Python host wrapper, the exported C++, the torch operator's fake implementation)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..ir import nodes as ir
from ..ir.effects import names_used
from ..ir.printer import expr as tile_expr


@dataclass(frozen=True)
class Bind:
    """Dim `dim` of tensor `tensor` is shape symbol `symbol`'s first bare appearance:
    it binds the symbol."""
    symbol: str
    tensor: str
    dim: int


@dataclass(frozen=True)
class DimCheck:
    """Every other dim: it must equal `expr`, a symbol bound at `bound_from`
    ("T dim d"), or an expression of symbols and consts (bound_from "")."""
    tensor: str
    dim: int
    expr: ir.Expr
    bound_from: str
    says: str = ""      # (bound_from "") what its message says the declaration is, "{}" where the value goes


def shape_bindings(k: ir.Kernel) -> tuple:
    """(binds, checks) in argument order: a symbol is bound by its first bare
    appearance in a tensor's shape and checked everywhere else."""
    binds, checks, bound = [], [], {}
    for t in k.tensors:
        for d, e in enumerate(t.shape):
            if isinstance(e, ir.Var) and e.name not in bound:
                bound[e.name] = f"{t.name} dim {d}"
                binds.append(Bind(e.name, t.name, d))
            elif isinstance(e, ir.Var):
                checks.append(DimCheck(t.name, d, e, bound[e.name]))
            else:
                checks.append(DimCheck(t.name, d, e, "", _says(k, e)))
    return binds, checks


def channel_symbol(k: ir.Kernel, t: ir.TensorMap):
    """The shape symbol that is an im2col map's channel count, if one is: its value
    may break the load's rule where a fixed one would not (runtime.host.Call.fall_back)."""
    channels = k.param(t.tensor).shape[-1]
    return channels.name if t.kind == "im2col" and isinstance(channels, ir.Var) else None


def _says(k: ir.Kernel, e: ir.Expr) -> str:
    """A declared dim as its check's message says it: "9 * C = {}", or a number
    alone, with the shape symbols fixed at compile time where the kernel has any."""
    if not isinstance(e, ir.Int):
        return f"{tile_expr(e)} = {{}}"
    return str(e.value) + (f" (compiled with {k.fixed_text})" if k.fixed else "")


@dataclass(frozen=True)
class Param:
    name: str
    kind: str                   # tensor_map | pointer | dim | stride | symbol | scalar | workspace
    tensor: Optional[str] = None
    index: int = 0
    dtype: Optional[ir.DType] = None

    @property
    def nbytes(self) -> int:
        """Its size in the kernel's parameter buffer: a symbol is a 32-bit int (rt.symbol)."""
        if self.kind == "tensor_map":
            return 128
        if self.kind == "scalar":
            return self.dtype.size
        return 4 if self.kind == "symbol" else 8


def thread_copied_tensors(k: ir.Kernel) -> list:
    """Tensors that threads read or write element by element (need a pointer):
    thread copies' global sides and the tensors of store tails."""
    names = []
    for s in ir.walk_stmts(k.body):
        if isinstance(s, ir.ThreadCopy):
            regions = (s.src.name, s.dst.name)
        elif isinstance(s, ir.StoreTail):
            regions = (s.tensor,)
        else:
            continue
        for r in regions:
            name = k.view(r).tensor if k.view(r) else r
            if isinstance(k.param(name), ir.TensorParam) and name not in names:
                names.append(name)
    return names


def kernel_params(k: ir.Kernel, debug: bool = False) -> list:
    params = [Param(t.name, "tensor_map", tensor=t.tensor) for t in k.tensor_maps]
    if debug and k.barriers:
        params.append(Param("tilec_debug", "debug_record"))
    if stream_k_accumulators(k):
        params.append(Param("tl_workspace", "workspace"))
    for name in thread_copied_tensors(k):
        t = k.param(name)
        params.append(Param(name, "pointer", tensor=name, dtype=t.dtype))
        params += [Param(f"{name}_dim{i}", "dim", tensor=name, index=i) for i in range(len(t.shape))]
        params += [Param(f"{name}_stride{i}", "stride", tensor=name, index=i) for i in range(len(t.shape))]
    symbols = names_used(k, k.body, "symbol")
    ordered = [d.name for t in k.tensors for d in t.shape if isinstance(d, ir.Var)]
    params += [Param(s, "symbol") for s in dict.fromkeys(ordered) if s in symbols]
    scalars = names_used(k, k.body, "scalar")
    params += [Param(p.name, "scalar", dtype=p.dtype) for p in k.scalars if p.name in scalars]
    return params


def stream_k_accumulators(k: ir.Kernel) -> tuple:
    """The accumulators a stream-K kernel hands between blocks (make-persistent),
    in declaration order: each block's workspace slot holds them in this order."""
    names = {n for s in ir.walk_stmts(k.body) if isinstance(s, (ir.PartialStore, ir.PartialAdd)) for n in s.buffers}
    return tuple(b for b in k.buffers if b.name in names)


def workspace_bytes_per_block(k: ir.Kernel) -> int:
    """A stream-K launch's workspace: past the flags (WORKSPACE_FLAG_BYTES), per
    launched block a slot of f32 partial sums (its accumulators); 0 for any
    other kernel."""
    threads = k.threads.value
    return sum(ir.fragment_regs(b, threads) * threads for b in stream_k_accumulators(k)) * 4


# The first bytes of a stream-K workspace: a 4-byte flag per launched block, at
# the same place for every kernel, so kernels of different slot sizes sharing a
# stream's workspace never read another's partial sums as a flag (every launch
# leaves the flags cleared). Room for 16384 blocks; the host refuses more.
WORKSPACE_FLAG_BYTES = 65536


def balanced_grid(k: ir.Kernel) -> bool:
    """Whether a persistent launch of `k` runs the fewest blocks that take its tiles
    in as many waves (runtime.host.persistent_blocks): its tiles are tensor-core
    gemms (compute-bound) and it has no stream-K schedule."""
    return bool(k.persistent) and not k.stream_k and any(isinstance(s, ir.Gemm) for s in ir.walk_stmts(k.body))
