"""A longer hunt than test_gpu_reduce's property test: N random reduce cases
(test_reduce.reduce_case: tile shapes, thread counts, dtypes, axes, ops, result
spaces, local sources) on the GPU against the numpy reference of the lane order and the
interpreter, bit for bit; counts the cases whose lanes span several warps.

    python tests/hunt_reduce.py 7 300          (on the GPU machine, from the repository root)"""
import sys

sys.path.insert(0, "tests")
from hypothesis import HealthCheck, given, seed, settings, strategies as st  # noqa: E402

import test_gpu_reduce  # noqa: E402
from test_reduce import lanes_of, reduce_case  # noqa: E402

inner = test_gpu_reduce.test_reduce_any_tile_and_block_on_the_gpu.hypothesis.inner_test
count = {"ran": 0, "over several warps": 0, "local sources": 0, "failed": 0}


@seed(int(sys.argv[1]))
@settings(max_examples=int(sys.argv[2]), deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(reduce_case(), st.integers(0, 2**32 - 1))
def hunt(case, data_seed):
    count["ran"] += 1
    dt, adt, axis, op, space, bm, bn, threads = case[:8]
    count["over several warps"] += lanes_of(space, axis, bm, bn, threads) > 32
    count["local sources"] += case[12]
    try:
        inner(case, data_seed)
    except Exception as e:
        count["failed"] += 1
        print(f"FAIL {case} data seed {data_seed}: {type(e).__name__}: {str(e)[:500]}", flush=True)


hunt()
print(f"seed {sys.argv[1]}: {count}", flush=True)
