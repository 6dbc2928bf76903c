"""Two pipelined gemm loops one after the other (found by session 42's fuzzing:
the second ring's first loads overwrote stage 0 of 'a' with no block barrier after
the first ring's wgmmas, and check-barriers refused the program as a tilec bug).
The second ring now waits for every warpgroup first (insert-barriers'
before_tma_writes, as a ring inside an outer loop did); with producer warpgroups
two rings may not share a tile, and say so."""
import numpy as np
import pytest

import tilec
from tilec.compiler import lower

from guard import guarded

SRC = """kernel twice(A: f16[M, K], B: f16[K, N], C: f16[M, N]) {
    const BN = 128, WG = 1, PRODUCER = 0, S1 = 2, S2 = 3;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, 64 * WG));
    threads 128 * WG;
    shared a: f16[64 * WG, 64];
    shared b: f16[64, BN];
    shared a2: f16[64 * WG, 64];
    shared b2: f16[64, BN];
    local acc: f32[64 * WG, BN];
    fill(acc, 0);
    for k in pipelined(cdiv(K, 64), stages = S1, producer = PRODUCER) {
        copy(A[by * 64 * WG, k * 64], a);
        copy(B[k * 64, bx * BN], b);
        gemm(a, b, acc);
    }
    for k in pipelined(cdiv(K, 64), stages = S2, producer = PRODUCER) {
        copy(A[by * 64 * WG, k * 64], SECOND_A);
        copy(B[k * 64, bx * BN], SECOND_B);
        gemm(SECOND_A, SECOND_B, acc);
    }
    copy(acc, C[by * 64 * WG, bx * BN]);
}
"""
SAME = SRC.replace("SECOND_A", "a").replace("SECOND_B", "b")
OWN = SRC.replace("SECOND_A", "a2").replace("SECOND_B", "b2")
PERSISTENT = OWN.replace("cdiv(M, 64 * WG));", "cdiv(M, 64 * WG)), persistent = 1;")
CASES = {"same tiles": (SAME, {}), "same tiles, 2 warpgroups": (SAME, dict(WG=2)),
         "own tiles": (OWN, {}), "own tiles, producers": (OWN, dict(PRODUCER=1)),
         "own tiles, producers, 2 warpgroups": (OWN, dict(PRODUCER=1, WG=2)),
         "same tiles, fewer stages second": (SAME, dict(S1=3, S2=1)),
         "same tiles, fewer stages second, 2 warpgroups": (SAME, dict(S1=4, S2=2, WG=2)),
         "own tiles, producers, persistent": (PERSISTENT, dict(PRODUCER=1)),
         "own tiles, producers, persistent, 2 warpgroups": (PERSISTENT, dict(PRODUCER=1, WG=2, S1=3, S2=2)),
         "same tiles, persistent": (SAME.replace("cdiv(M, 64 * WG));", "cdiv(M, 64 * WG)), persistent = 1;"),
                                    dict(S1=3, S2=2))}


def test_the_verifier_refuses_a_ring_over_fewer_copies():
    from dataclasses import replace
    from tilec.ir.verify import VerifyError, verify
    k = lower(SAME, dict(S1=3, S2=1)).stages["plan-pipeline"]
    verify(k, "plan-pipeline")
    fewer = replace(k, buffers=tuple(replace(b, stages=1) if b.name == "a" else b for b in k.buffers))
    with pytest.raises(VerifyError, match="after plan-pipeline: a ring of 3 stages loads 'a', which has 1"):
        verify(fewer, "plan-pipeline")


def test_a_release_frees_its_own_rings_tiles_only():
    """With a persistent grid and producer warpgroups, the consumers' release of
    ring 2's stage 0 also counted as the release of ring 1's stage 0 in
    check-barriers, which then said the producer's next load of 'a@0' had no wait on
    its release (a BarrierBug: a false alarm; session 43's fuzzing). Each ring's
    empty barrier names the tiles it releases."""
    text = lower(PERSISTENT, dict(PRODUCER=1)).ir_text("check-barriers")
    assert "mbarrier empty1[2] arrivals 1 releases a, b\n" in text
    assert "mbarrier empty3[3] arrivals 1 releases a2, b2\n" in text


@pytest.mark.parametrize("s1, s2", [(2, 3), (3, 1), (4, 2), (1, 4)])
def test_a_tile_two_rings_load_has_the_stages_of_the_longer(s1, s2):
    """The ring that came last set the tiles' stages: a 3-stage ring then a 1-stage
    one placed one copy of each tile, and the first ring's TMA loads wrote past
    shared memory (CUDA_ERROR_ILLEGAL_ADDRESS; session 43's fuzzing)."""
    k = lower(SAME, dict(S1=s1, S2=s2)).stages["plan-smem"]
    assert {b.name: b.stages for b in k.buffers if b.name in "ab"} == {"a": max(s1, s2), "b": max(s1, s2)}


def test_the_second_ring_waits_for_every_warpgroup_before_its_first_loads():
    ir_text = lower(SAME, {}).ir_text("insert-barriers")
    between = ir_text[ir_text.index("wgmma.wait_group 0"):ir_text.index("mbarrier.arrive.expect_tx full2")]
    assert "barrier.sync  // line 16" in between, between


def test_two_producer_rings_may_not_share_a_tile():
    with pytest.raises(tilec.TilecError) as e:
        lower(SAME, dict(PRODUCER=1))
    assert str(e.value).splitlines()[0] == (
        "<string>:17:9: error: producer = 1: 'a' is loaded by the producer warpgroup's ring of line 11 and by this "
        "one; with a producer a ring's tiles are its own: give each loop tiles of its own")


def operands(m, n, k, like):
    rng = np.random.default_rng(m + n + k)     # small integers: every sum is exact
    a, b = guarded((m, k), "f16", like=like), guarded((k, n), "f16", like=like)
    av, bv = rng.integers(-3, 4, (m, k)).astype(np.float16), rng.integers(-3, 4, (k, n)).astype(np.float16)
    if like == "numpy":
        a.view[...], b.view[...] = av, bv
    else:
        import torch
        a.view.copy_(torch.from_numpy(av)), b.view.copy_(torch.from_numpy(bv))
    return a, b, guarded((m, n), "f16", like=like), 2 * (av.astype(np.float64) @ bv.astype(np.float64))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("m, n, k", [(100, 200, 192), (64, 128, 64), (130, 8, 0)])
def test_in_the_interpreter(case, m, n, k):
    src, consts = CASES[case]
    a, b, c, want = operands(m, n, k, "numpy")
    tilec.compile(src, backend="interpret", **consts)(a.view, b.view, c.view)
    c.check()
    assert np.array_equal(c.view.astype(np.float64), want)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("m, n, k", [(100, 200, 192), (1000, 1030, 512), (130, 8, 0)])
def test_on_the_gpu(case, m, n, k):
    import torch
    src, consts = CASES[case]
    a, b, c, want = operands(m, n, k, "torch")
    tilec.compile(src, **consts)(a.view, b.view, c.view)
    torch.cuda.synchronize()
    c.check()
    assert np.array_equal(c.view.cpu().numpy().astype(np.float64), want)


HOISTED = """kernel f(A: f16[M, K], B: f16[K, N], C: f16[M, N]) {
    const BM = 64, BN = 128, BK = 64;
    grid (pid) = (cdiv(M, BM) * cdiv(N, BN));
    threads 128;
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    local acc: f32[BM, BN];
    let row = pid / cdiv(N, BN) * BM;
    let col = pid % cdiv(N, BN) * BN;
    fill(acc, 0);
    for k in pipelined(cdiv(K, BK), stages = 2) {
        copy(A[row, k * BK], a);
        copy(B[k * BK, col], b);
        gemm(a, b, acc);
    }
    for k in pipelined(cdiv(K, BK), stages = 3) {
        copy(A[row, k * BK], a);
        copy(B[k * BK, col], b);
        gemm(a, b, acc);
    }
    copy(acc, C[row, col]);
}
"""


def test_two_loops_of_one_variable_keep_their_hoisted_values_apart():
    """Both rings compute their tile's row and column (a division by cdiv(N, BN))
    before the loop as tl_k_inv0 and tl_k_inv1: the second pair, in a block of its
    own, was an NVRTC error ('already been declared'; session 42's second fuzz)."""
    k = tilec.compile(HOISTED)
    assert k.cubin[:4] == b"\x7fELF" and k.compile_log == ""
    assert k.cuda_source.count("const int tl_k_inv0 = ") == 2
    assert "{  // the values before this loop, in a scope of their own" in k.cuda_source
    a, b, c, want = operands(100, 200, 192, "numpy")
    tilec.compile(HOISTED, backend="interpret")(a.view, b.view, c.view)
    c.check()
    assert np.array_equal(c.view.astype(np.float64), want)


@pytest.mark.gpu
def test_two_loops_of_one_variable_on_the_gpu():
    import torch
    a, b, c, want = operands(1000, 1030, 512, "torch")
    tilec.compile(HOISTED)(a.view, b.view, c.view)
    torch.cuda.synchronize()
    c.check()
    assert np.array_equal(c.view.cpu().numpy().astype(np.float64), want)
