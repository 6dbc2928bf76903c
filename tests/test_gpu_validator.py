"""GPU: tilec's TMA rule checks give the same verdict as the driver's
cuTensorMapEncodeTiled / cuTensorMapEncodeIm2col over random parameter sets."""
import pytest

pytestmark = pytest.mark.gpu

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tilec.ir.nodes import DTYPES  # noqa: E402
from tilec.runtime.tensormap import CORNER_RANGE, im2col_problems, tiled_problems  # noqa: E402

TMAP_TYPES = {d.tmap: d.size for d in DTYPES.values()}
SWIZZLES = ["none", "32B", "64B", "128B"]


@pytest.fixture(scope="module")
def base():
    import torch
    buf = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    yield buf.data_ptr()
    del buf


def driver_tiled(tmap, addr, shape, strides_bytes, box, es, swizzle):
    from cuda.bindings import driver as cu
    u64 = lambda xs: [cu.cuuint64_t(int(x)) for x in xs]  # noqa: E731
    u32 = lambda xs: [cu.cuuint32_t(int(x)) for x in xs]  # noqa: E731
    strides = list(reversed(strides_bytes)) or [16]
    try:
        r = cu.cuTensorMapEncodeTiled(
            getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{tmap}"), len(shape), addr,
            u64(reversed(shape)), u64(strides), u32(reversed(box)), u32(reversed(es)),
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(cu.CUtensorMapSwizzle, "CU_TENSOR_MAP_SWIZZLE_" + swizzle.upper()),
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    except (OverflowError, ValueError, TypeError):
        return False
    return int(r[0]) == 0


@st.composite
def tiled_params(draw):
    tmap = draw(st.sampled_from(sorted(TMAP_TYPES)))
    size = TMAP_TYPES[tmap]
    rank = draw(st.integers(1, 5))
    shape = [draw(st.one_of(st.integers(1, 300), st.sampled_from([2**32, 2**32 + 1, 0]))) for _ in range(rank)]
    strides = [1]
    for d in range(rank - 1):   # element strides, innermost first, then flipped to outermost first
        dense = strides[-1] * shape[rank - 1 - d]
        strides.append(draw(st.one_of(st.just(dense), st.integers(1, 4096), st.sampled_from([2**37, 2**38]))))
    strides = list(reversed(strides))
    box = [draw(st.one_of(st.integers(1, 300), st.just(0))) for _ in range(rank)]
    es = [draw(st.integers(0, 9)) for _ in range(rank)]
    swizzle = draw(st.sampled_from(SWIZZLES))
    offset = draw(st.sampled_from([0, 0, 0, 4, 8, 16, 32]))
    return tmap, size, shape, strides, box, es, swizzle, offset


@settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(tiled_params())
def test_tiled_rules_agree_with_the_driver(base, p):
    tmap, size, shape, strides, box, es, swizzle, offset = p
    addr = base + offset
    ours = tiled_problems(size, addr, shape, strides, box, es, swizzle)
    theirs = driver_tiled(tmap, addr, shape, [s * size for s in strides[:-1]], box, es, swizzle)
    assert (ours == []) == theirs, f"tilec says {ours or 'legal'}; the driver says {'legal' if theirs else 'illegal'}"


@st.composite
def im2col_params(draw):
    tmap, size = draw(st.sampled_from([("FLOAT16", 2), ("FLOAT32", 4), ("BFLOAT16", 2), ("UINT8", 1)]))
    rank = draw(st.integers(3, 5))
    c = draw(st.sampled_from([1, 3, 4, 8, 16, 64, 256, 512]))
    spatial = [draw(st.integers(1, 64)) for _ in range(rank - 2)]
    n = draw(st.integers(1, 8))
    shape = [n, *spatial, c]
    strides, acc = [], 1
    for d in reversed(shape):
        strides.insert(0, acc)
        acc *= d
    lo, hi = CORNER_RANGE[rank]
    corner = st.one_of(st.integers(-3, 3), st.sampled_from([lo, lo - 1, hi, hi + 1]))
    lower = [draw(corner) for _ in range(rank - 2)]
    upper = [draw(corner) for _ in range(rank - 2)]
    cpp = draw(st.sampled_from([0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 257]))
    ppc = draw(st.sampled_from([0, 1, 16, 64, 128, 256, 1024, 1025]))
    es = [draw(st.integers(1, 9)) for _ in range(rank)]
    offset = draw(st.sampled_from([0, 0, 0, 8, 16]))
    return tmap, size, shape, strides, lower, upper, cpp, ppc, es, offset


def driver_im2col(tmap, addr, shape, strides_bytes, lower, upper, cpp, ppc, es):
    from cuda.bindings import driver as cu
    try:
        r = cu.cuTensorMapEncodeIm2col(
            getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{tmap}"), len(shape), addr,
            [cu.cuuint64_t(x) for x in reversed(shape)], [cu.cuuint64_t(x) for x in reversed(strides_bytes)],
            list(reversed(lower)), list(reversed(upper)), cpp, ppc, [cu.cuuint32_t(x) for x in reversed(es)],
            cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
            cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
            cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    except (OverflowError, ValueError, TypeError):
        return False
    return int(r[0]) == 0


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(im2col_params())
def test_im2col_rules_agree_with_the_driver(base, p):
    tmap, size, shape, strides, lower, upper, cpp, ppc, es, offset = p
    addr = base + offset
    ours = im2col_problems(size, addr, shape, strides, lower, upper, cpp, ppc, es)
    theirs = driver_im2col(tmap, addr, shape, [s * size for s in strides[:-1]], lower, upper, cpp, ppc, es)
    assert (ours == []) == theirs, f"tilec says {ours or 'legal'}; the driver says {'legal' if theirs else 'illegal'}"
