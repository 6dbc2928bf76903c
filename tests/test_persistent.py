"""Pipelined loops inside loops: a persistent gemm (examples/gemm_persistent.tile,
P blocks looping over output tiles) and a batch loop. The ring's stages and
mbarrier phases carry on across trips (RingAdvance); check-barriers proves it
for 0-3 trips of each loop, the interpreter runs it (and would report a hang),
and a protocol with the last stage left unreleased is caught."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as hs

import tilec
from tilec.ir import nodes as ir
from conftest import ROOT
from guard import guarded

PERSISTENT = str(ROOT / "examples/gemm_persistent.tile")

BATCHED = """
kernel bgemm(A: f16[BATCH, M, K], B: f16[BATCH, K, N], C: f32[BATCH, M, N]) {
    const BM = 64, BN = 64, BK = 16, STAGES = 3;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    local acc: f32[BM, BN];
    for z in range(BATCH) {
        fill(acc, 0);
        for k in pipelined(cdiv(K, BK), stages = STAGES) {
            copy(A[z, by * BM, k * BK], a);
            copy(B[z, k * BK, bx * BN], b);
            gemm(a, b, acc);
        }
        copy(acc, C[z, by * BM, bx * BN]);
    }
}
"""


def test_the_ring_carries_on_across_trips():
    ir_text = tilec.compile(PERSISTENT, arch="sm_90a").ir("check-barriers")
    # stages and parities follow the ring's count, which each trip advances
    assert "mbarrier.try_wait.parity full0[(tl_full0_base + k) % 4], (tl_full0_base + k) / 4 % 2" in ir_text
    assert "if tl_full0_base >= 4 {" in ir_text
    assert "mbarrier.arrive empty1[(tl_full0_base + cdiv(K, 64) - 1) % 4]" in ir_text
    assert "tl_full0_base += cdiv(K, 64)" in ir_text
    # the epilogue stages through the ring, so the next trip waits for its stores first
    assert "thread.copy acc -> tl_acc_out" in ir_text
    head = ir_text[ir_text.index("fill acc, 0"):ir_text.index("if 0 < cdiv(K, 64)")]
    assert "cp.async.bulk.wait_group.read 0" in head


def test_persistent_example_compiles_cleanly():
    k = tilec.compile(PERSISTENT, arch="sm_90a")
    assert k.compile_log == "" and k.fallback.compile_log == ""
    assert "int tl_full0_base = 0;" in k.cuda_source
    assert "tl_full0_base += tl_cdiv(K, 64);" in k.cuda_source
    # the tile's row and columns divide by a run-time value: computed once per trip, not per refill
    cuda = k.cuda_source
    assert "const int tl_k_inv0 = (pid + tl_t_iter * P) / tl_cdiv(N, 256) * 128;" in cuda
    loop = cuda[cuda.index("for (int k = 0;"):]
    assert "/ tl_cdiv(N, 256)" not in loop[:loop.index("wgmma_wait_group<0>")]
    assert "&tl_tmap_A, &tl_full0[(tl_full0_base + (k + 3)) % 4], (k + 3) * 64, tl_k_inv0);" in loop


def test_a_ring_left_unreleased_is_caught(monkeypatch):
    """Without the arrive that releases a trip's last stage, the next trip's
    producer would wait for ever: check-barriers must say so."""
    from tilec.passes import insert_barriers
    real = insert_barriers._Inserter.pipeline

    def without_last_release(self, s, st, out, in_loop=False):
        real(self, s, st, out, in_loop)
        release = [i for i, x in enumerate(out) if isinstance(x, ir.If)
                   and any(isinstance(y, ir.MbarrierArrive) for y in x.then)]
        del out[release[-1]]
    monkeypatch.setattr(insert_barriers._Inserter, "pipeline", without_last_release)
    with pytest.raises(tilec.TilecError, match="would hang"):
        tilec.compile(PERSISTENT, arch="sm_90a", STAGES=2)


def _run_persistent(m, n, kk, p, consts):
    k = tilec.compile(PERSISTENT, backend="interpret", **consts)
    rng = np.random.default_rng(m * 7 + n * 3 + kk + p)
    a = rng.standard_normal((m, kk)).astype(np.float16)
    b = rng.standard_normal((kk, n)).astype(np.float16)
    c = guarded((m, n), "f16", like="numpy")
    k(a, b, c.view, p)
    want = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(c.view.astype(np.float32), want, rtol=2e-2, atol=5e-2)
    c.check()


@settings(max_examples=25, deadline=None)
@given(tiles_m=hs.integers(1, 3), tiles_n=hs.integers(1, 3), ksteps=hs.integers(1, 9), p=hs.integers(1, 5),
       stages=hs.integers(1, 4), ragged=hs.booleans())
def test_persistent_interpreted_equals_numpy(tiles_m, tiles_n, ksteps, p, stages, ragged):
    """Any number of tiles per block (0 included: p > tiles), K trips below, at and
    above the ring (stage reuse across tiles with every phase offset)."""
    m, n = tiles_m * 64 - (8 if ragged else 0), tiles_n * 64 - (8 if ragged else 0)
    _run_persistent(m, n, ksteps * 16, p, dict(BM=64, BN=64, BK=16, STAGES=stages))


def test_batch_loop_interpreted_equals_numpy():
    k = tilec.compile(BATCHED, backend="interpret")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 100, 80)).astype(np.float16)
    b = rng.standard_normal((3, 80, 72)).astype(np.float16)
    c = guarded((3, 100, 72), "f32", like="numpy")
    k(a, b, c.view)
    np.testing.assert_allclose(c.view, np.einsum("zmk,zkn->zmn", a.astype(np.float32), b.astype(np.float32)),
                               rtol=1e-3, atol=1e-3)
    c.check()
