"""Host time per call of the ways to make a tilec kernel a torch operator, on the
CPU (no GPU needed): what chose tilec.torch's design.

    python benchmarks/torch_op_overhead.py

Each row is the median of many calls (perf_counter_ns) of a body that does
nothing, reached four ways: a plain Python call; torch.library.Library
define + impl (CPU key) through its OpOverload; torch.library.custom_op; and
tilec's own paths, a plain k(...) replay, a TorchOp replay and the registered
operator through the dispatcher, with a launch
that does nothing and the call key computed for CPU tensors (on the GPU,
benchmarks/bench.py host measures the real ones)."""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import tilec  # noqa: E402
import tilec.torch  # noqa: E402
from tilec.runtime import host  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def per_call_us(fn, calls=200_000):
    for _ in range(2000):
        fn()
    samples = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t)
    return statistics.median(samples) * 1e-3


def cpu_call_key(args):
    """host.torch_call_key without its CUDA check: the same work on CPU tensors."""
    tensor, key = torch.Tensor, []
    for a in args:
        t = type(a)
        if t is tensor or isinstance(a, tensor):
            key += (a.data_ptr(), a.shape, a.stride(), a.dtype)
        elif t is int or t is float:
            key += (t, a)
        else:
            return None
    return tuple(key)


def main():
    def body(a, b):
        return None

    lib = torch.library.Library("tilec_overhead", "FRAGMENT")
    lib.define("library_op(Tensor a, Tensor(a!) b) -> ()")
    lib.impl("library_op", body, "CPU")

    @torch.library.custom_op("tilec_overhead::custom_op", mutates_args=("b",), device_types="cpu")
    def custom(a: torch.Tensor, b: torch.Tensor) -> None:
        return None

    a = torch.randn(64, 128)
    b = torch.empty_like(a)
    library_op = torch.ops.tilec_overhead.library_op.default
    rows = [("plain Python call of the body", per_call_us(lambda: body(a, b))),
            ("torch.library.Library define + impl (OpOverload)", per_call_us(lambda: library_op(a, b))),
            ("torch.library.custom_op", per_call_us(lambda: custom(a, b)))]

    k = tilec.compile(str(ROOT / "examples/copy2d.tile"))
    op = k.as_torch_op()
    host.torch_call_key, tilec.torch._call_key = cpu_call_key, cpu_call_key     # this process only
    k._prepared[cpu_call_key((a, b))] = lambda: None                          # a launch that does nothing
    rows += [("tilec k(a, b), replayed (launch: nothing)", per_call_us(lambda: k(a, b))),
             ("tilec TorchOp op(a, b), replayed (launch: nothing)", per_call_us(lambda: op(a, b))),
             ("tilec op.op(a, b): the dispatcher, then k's replay", per_call_us(lambda: op.op(a, b)))]
    base = rows[0][1]
    print(f"torch {torch.__version__}, median host time per call")
    for name, us in rows:
        print(f"{name:52s} {us:7.2f} us  ({us - base:+.2f} over the plain call)")
    print(f"TorchOp over k(...): {rows[4][1] - rows[3][1]:+.2f} us; "
          f"the operator through the dispatcher over k(...): {rows[5][1] - rows[3][1]:+.2f} us")


if __name__ == "__main__":
    main()
