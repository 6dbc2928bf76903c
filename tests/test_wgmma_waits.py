"""A gemm's wgmmas are waited for where something first needs them done
(insert-barriers): a thread statement using its accumulator, threads or TMA
overwriting one of its operands, a ring, the kernel's end. Until then later gemms
and the threads' work on other tiles overlap it, and `wgmma.wait_group N` leaves
the groups issued after it in flight. The IR and CUDA this gives, the interpreter
and the GPU against exact integer products (guarded outputs), and check-barriers
catching a wait left out or a block barrier placed before it."""
import warnings
from dataclasses import replace

import numpy as np
import pytest

import tilec
from tilec.compiler import lower
from tilec.ir import nodes as ir
from tilec.passes import Options, check_barriers
from tilec.passes.check_barriers import BarrierBug

from guard import guarded
from test_rotate import _without

# C = sum over K blocks k of (k + 1) * A_k B_k, through `part`, while E = A D goes on
# in `other`: the scaling of part waits for part's wgmmas only (wait_group 1)
TWO = """kernel two(A: f16[M, K], B: f16[K, N], D: f16[K, N], C: f32[M, N], E: f32[M, N]) {
    const BM = 64, BN = 64, BK = 64, WG = 1, STAGES = 2;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128 * WG;
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    shared d: f16[BK, BN];
    local acc: f32[BM, BN];
    local other: f32[BM, BN];
    local part: f32[BM, BN];
    fill(acc, 0.0);
    fill(other, 0.0);
    for k in pipelined(cdiv(K, BK), stages = STAGES) {
        copy(A[by * BM, k * BK], a);
        copy(B[k * BK, bx * BN], b);
        copy(D[k * BK, bx * BN], d);
        fill(part, 0.0);
        gemm(a, b, part);
        gemm(a, d, other);
        parallel (i, j) in (BM, BN) {
            acc[i, j] = acc[i, j] + part[i, j] * f32(k + 1);
        }
    }
    copy(acc, C[by * BM, bx * BN]);
    copy(other, E[by * BM, bx * BN]);
}
"""

# threads overwrite the operand p of a gemm in flight: every warpgroup waits, then a
# block barrier, then the writes (C = 5 * A[:, :64] B[:64, :])
OVERWRITE = """kernel twice(A: f16[M, K], B: f16[K, N], C: f32[M, N]) {
    const BM = 128, BN = 64, WG = 2;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128 * WG;
    shared a: f16[BM, 64];
    shared p: f16[BM, 64];
    shared b: f16[64, BN];
    local acc: f32[BM, BN];
    fill(acc, 0.0);
    copy(A[by * BM, 0], a);
    copy(B[0, bx * BN], b);
    parallel (i, c) in (BM, 64) {
        p[i, c] = f16(f32(a[i, c]) * 2.0);
    }
    gemm(p, b, acc);
    parallel (i, c) in (BM, 64) {
        p[i, c] = f16(f32(a[i, c]) * 3.0);
    }
    gemm(p, b, acc);
    copy(acc, C[by * BM, bx * BN]);
}
"""

CONFIGS = [dict(BM=64, WG=1, STAGES=2), dict(BM=64, WG=1, STAGES=3), dict(BM=128, WG=2, STAGES=2)]
SHAPES = [(64, 64, 64), (100, 72, 320), (200, 136, 200)]


def operands(m, n, k, seed):
    """Small integers: every product and sum below is exact in f32."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-2, 3, s).astype(np.float16) for s in ((m, k), (k, n), (k, n))]


def two_reference(a, b, d):
    c = np.zeros((a.shape[0], b.shape[1]))
    for k0 in range(0, a.shape[1], 64):
        c += (k0 // 64 + 1) * (a[:, k0:k0 + 64].astype(np.float64) @ b[k0:k0 + 64].astype(np.float64))
    return c, a.astype(np.float64) @ d.astype(np.float64)


def after(src, **consts):
    return lower(src, consts).stages["insert-barriers"]


def lines(k) -> list:
    from tilec.ir.printer import kernel as show
    return [x.strip() for x in show(k).splitlines()]


def test_a_gemm_is_waited_for_at_the_first_use_of_its_accumulator():
    text = lines(after(TWO))
    at = text.index(next(x for x in text if x.startswith("gemm a, b, part")))
    assert text[at + 1].startswith("gemm a, d, other")
    assert text[at + 2] == "wgmma.wait_group 1  (part done)"       # other's wgmmas go on
    assert text[at + 3].startswith("parallel (i, j) in (64, 64)")
    # the refill of the copies both gemms read waits for both, before its block barrier
    refill = [i for i, x in enumerate(text) if x.startswith("tma.load.tile a <-")]
    assert any(text[i - 5:i - 3] == ["wgmma.wait_group 0", "barrier.sync  // line 13"] for i in refill)


def test_the_cuda_pins_only_the_accumulator_that_wait_retires():
    cuda = tilec.compile(TWO, arch="sm_90a").cuda_source
    at = cuda.index("wgmma_wait_group<1>();")
    assert cuda[at:].splitlines()[1].strip() == "wgmma_fence_operand(part);"


def test_a_wait_that_retires_two_groups_pins_both_accumulators():
    """gemm into part, then other, then third; a statement reading part and other waits
    for both (wait_group 1: third goes on), and the CUDA pins both accumulators there."""
    src = TWO.replace("    local part: f32[BM, BN];\n", "    local part: f32[BM, BN];\n    local third: f32[BM, BN];\n")
    src = src.replace("        gemm(a, d, other);\n", "        gemm(a, d, other);\n        gemm(a, b, third);\n")
    src = src.replace("part[i, j] * f32(k + 1);", "part[i, j] * f32(k + 1) + other[i, j];")
    src = src.replace("    copy(other, E[by * BM, bx * BN]);", "    copy(third, E[by * BM, bx * BN]);")
    text = lines(after(src))
    at = text.index(next(x for x in text if x.startswith("gemm a, b, third")))
    assert text[at + 1] == "wgmma.wait_group 1  (other, part done)"
    cuda = tilec.compile(src, arch="sm_90a").cuda_source
    after_wait = cuda[cuda.index("wgmma_wait_group<1>();"):].splitlines()[1:3]
    assert [x.strip() for x in after_wait] == ["wgmma_fence_operand(other);", "wgmma_fence_operand(part);"]


def test_threads_overwrite_an_operand_after_the_wait_and_a_block_barrier():
    text = lines(after(OVERWRITE))
    second = text.index("parallel (i, c) in (128, 64) {  // line 16")
    assert text[second - 3:second] == ["gemm p, b, acc on 2 warpgroups x 1 m64 tiles  // line 15",
                                       "wgmma.wait_group 0", "barrier.sync  // line 16"]


@pytest.mark.parametrize("consts", CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
@pytest.mark.parametrize("m, n, k", SHAPES, ids=lambda x: str(x))
def test_two_accumulators_in_the_interpreter(consts, m, n, k):
    a, b, d = operands(m, n, k, seed=m + n + k)
    c, e = guarded((m, n), np.float32, like="numpy"), guarded((m, n), np.float32, like="numpy")
    tilec.compile(TWO, backend="interpret", **consts)(a, b, d, c.view, e.view)
    c.check()
    e.check()
    want_c, want_e = two_reference(a, b, d)
    assert np.array_equal(c.view, want_c) and np.array_equal(e.view, want_e)


def test_an_overwritten_operand_in_the_interpreter():
    a, b, _ = operands(200, 72, 64, seed=1)
    c = guarded((200, 72), np.float32, like="numpy")
    tilec.compile(OVERWRITE, backend="interpret")(a, b, c.view)
    c.check()
    assert np.array_equal(c.view, 5 * (a.astype(np.float64) @ b.astype(np.float64)))


@pytest.mark.gpu
@pytest.mark.parametrize("consts", CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
@pytest.mark.parametrize("m, n, k", SHAPES + [(1000, 1032, 512)], ids=lambda x: str(x))
def test_two_accumulators_on_the_gpu(consts, m, n, k):
    import torch
    a, b, d = operands(m, n, k, seed=m + n + k)
    c, e = guarded((m, n), "f32", fill=float("nan")), guarded((m, n), "f32", fill=float("nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(TWO, fallback=False, **consts)(*(torch.from_numpy(x).cuda() for x in (a, b, d)),
                                                    c.view, e.view)
    torch.cuda.synchronize()
    c.check()
    e.check()
    want_c, want_e = two_reference(a, b, d)
    assert np.array_equal(c.view.cpu().numpy(), want_c) and np.array_equal(e.view.cpu().numpy(), want_e)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(128, 64), (300, 200)])
def test_an_overwritten_operand_on_the_gpu(m, n):
    import torch
    a, b, _ = operands(m, n, 64, seed=m)
    c = guarded((m, n), "f32", fill=float("nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(OVERWRITE, fallback=False)(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), c.view)
    torch.cuda.synchronize()
    c.check()
    assert np.array_equal(c.view.cpu().numpy(), 5 * (a.astype(np.float64) @ b.astype(np.float64)))


def _barrier_first(body):
    """`body` with each wgmma.wait_group that a block barrier follows moved after it."""
    out = []
    for s in body:
        nested = {f: _barrier_first(getattr(s, f)) for f in ir.STMT_BLOCK_FIELDS.get(type(s), ())}
        s = replace(s, **nested) if nested else s
        if isinstance(s, ir.SyncThreads) and out and isinstance(out[-1], ir.WgmmaWait):
            out.insert(len(out) - 1, s)
        else:
            out.append(s)
    return tuple(out)


def _drop_waits(pending):
    """`body` without the wgmma.wait_groups that leave `pending` (None: any) groups in flight."""
    return lambda body: _without(body, lambda s: isinstance(s, ir.WgmmaWait) and pending in (None, s.pending))


@pytest.mark.parametrize("src, edit, broken", [
    (TWO, _drop_waits(1), "threads use 'part' while a wgmma may still write it"),
    (TWO, _drop_waits(0), "TMA load overwrites 'a' while a wgmma may still read it"),
    (OVERWRITE, _drop_waits(None), "threads overwrite 'p' while a wgmma may still read it"),
    (OVERWRITE, _barrier_first, "threads overwrite 'p', which a wgmma read, without a block barrier after every "
                                "warpgroup's wgmma.wait_group"),
    (TWO, _barrier_first, "TMA load overwrites 'a', which threads used, without a block barrier"),
], ids=["accumulator", "refill", "operand", "operand, barrier first", "refill, barrier first"])
def test_check_barriers_catches_a_wait_left_out_or_after_the_barrier(src, edit, broken):
    k = after(src)
    check_barriers.run(k, Options())
    with pytest.raises(BarrierBug, match=broken):
        check_barriers.run(replace(k, body=edit(k.body)), Options())
