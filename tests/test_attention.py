"""tests/attention.tile, a flash-attention forward: two gemms in a rotating K/V loop,
the scores reduced in the accumulator's fragments and converted to f16 into a local
tile that the second gemm reads as wgmma's A from registers, and
tests/attention_overlap.tile, two blocks of keys a trip, each gemm running under the
threads' work on the other block. SHARED_P is attention.tile with P in a shared tile
instead (the threads write it in wgmma's swizzled layout, then a proxy fence and a
block barrier). The interpreter against float64 over tile shapes, stages and ragged
lengths; the GPU against float64 and torch's scaled_dot_product_attention, and the
three programs bit for bit; check-barriers catching the fence left out."""
import warnings
from dataclasses import replace

import numpy as np
import pytest

import tilec
from tilec.compiler import lower
from tilec.ir import nodes as ir
from tilec.passes import Options, check_barriers
from tilec.passes.check_barriers import BarrierBug

from conftest import ROOT
from guard import guarded
from test_rotate import _without

SRC = ROOT / "tests" / "attention.tile"
OVERLAP = ROOT / "tests" / "attention_overlap.tile"
SHARED_P = SRC.read_text().replace("    local p: f16[BM, BN];", "    shared p: f16[BM, BN];")
assert SHARED_P != SRC.read_text()
PROGRAMS = [SRC, OVERLAP]
CONFIGS = [dict(BM=64, BN=64, STAGES=2), dict(BM=128, BN=64, STAGES=3), dict(BM=64, BN=128, STAGES=3),
           dict(BM=128, BN=128, STAGES=2), dict(BM=64, BN=128, STAGES=1)]


def operands(h, lq, s, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((h, n, 64)).astype(np.float16) for n in (lq, s, s))


def reference(q, k, v, scale):
    """softmax(q k^T * scale) v per head, in float64."""
    sc = np.einsum("hld,hsd->hls", q.astype(np.float64), k.astype(np.float64)) * scale
    p = np.exp(sc - sc.max(-1, keepdims=True))
    return np.einsum("hls,hsd->hld", p / p.sum(-1, keepdims=True), v.astype(np.float64))


def test_it_rotates_and_reads_p_from_registers():
    k = tilec.compile(SRC, arch="sm_90a", BM=64, BN=64, STAGES=2)
    assert k.pipeline_notes == () and k.compile_log == ""
    assert "tl_k_stage1" in k.cuda_source and "tl_v_stage1" in k.cuda_source
    assert "wgmma_m64n64k16_f16_arbk_zero(s + 0, qr + 0, " in k.cuda_source   # fill(s, 0) folded into the first gemm
    assert "wgmma_m64n64k16_f16_arbn(o + 0, p + 24, " in k.cuda_source      # P's fourth k16 slice
    cuda = k.cuda_source
    between = cuda[cuda.index("attention.tile:64: copy(s, p);"):cuda.index("attention.tile:65: gemm(p, v, o);")]
    assert "p[tl_r] = f16_t(" in between and "fence" not in between and "sync" not in between   # no barrier


def test_p_in_shared_memory_is_written_through_its_swizzle():
    k = tilec.compile(SHARED_P, arch="sm_90a", BM=64, BN=64, STAGES=2)
    assert k.pipeline_notes == () and k.compile_log == ""
    assert "&p[tl_sw128(" in k.cuda_source             # copy(s, p): f16 pairs at swizzled addresses


def test_the_overlapping_form_waits_for_each_gemm_where_its_result_is_first_used():
    from tilec.ir.printer import kernel as show
    for consts in CONFIGS:
        k = tilec.compile(OVERLAP, arch="sm_90a", **consts)
        assert k.compile_log == ""          # no wgmma serialized (C7514 / C7515)
    text = [x.strip() for x in show(lower(OVERLAP.read_text(), CONFIGS[0]).kernel).splitlines()]
    qk = text.index(next(x for x in text if x.startswith("gemm q, k1, s1")))
    assert text[qk + 1] == "wgmma.wait_group 1  (s0 done)"         # S1 goes on under S0's softmax
    pv = text.index(next(x for x in text if x.startswith("gemm p0, v0, o")))
    assert text[pv + 1] == "wgmma.wait_group 1  (s1 done)"         # O += P0 v0 goes on under S1's


@pytest.mark.parametrize("src", PROGRAMS, ids=lambda p: p.stem)
@pytest.mark.parametrize("consts", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("h, lq, s", [(1, 64, 64), (2, 100, 200), (1, 130, 70), (2, 64, 1)])
def test_attention_in_the_interpreter(src, consts, h, lq, s):
    q, k, v = operands(h, lq, s, seed=lq + s)
    o = guarded((h, lq, 64), np.float16, like="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(src, backend="interpret", **consts)(q, k, v, o.view, 0.125)
    o.check()
    np.testing.assert_allclose(o.view.astype(np.float64), reference(q, k, v, 0.125), atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize("drop, broken", [
    (lambda s: isinstance(s, ir.ProxyFence), "gemm reads 'p', which threads wrote, without fence.proxy.async"),
    (lambda s: isinstance(s, ir.WgmmaWait), "while a wgmma may still write it"),
], ids=["fence", "wgmma wait"])
def test_check_barriers_catches_a_broken_attention(drop, broken):
    k = lower(SHARED_P, dict(BM=64, BN=64, STAGES=2)).stages["insert-barriers"]
    check_barriers.run(k, Options())
    with pytest.raises(BarrierBug, match=broken):
        check_barriers.run(replace(k, body=_without(k.body, drop)), Options())


def test_a_gemm_operand_is_not_copied_out():
    src = SHARED_P.replace("    copy(o, O[bh, by * BM, 0]);", "    copy(o, O[bh, by * BM, 0]);\n"
                                  "    copy(p, O[bh, by * BM, 0]);")
    with pytest.raises(tilec.TilecError, match="'p' is a gemm operand \\(swizzled for wgmma\\): it cannot be "
                                               "copied out; read its elements in a parallel body instead"):
        lower(src, dict(BM=64, BN=64, STAGES=2))


@pytest.mark.gpu
@pytest.mark.parametrize("consts", CONFIGS + [{}], ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()) or "tuned")
@pytest.mark.parametrize("h, lq, s", [(1, 64, 64), (2, 100, 200), (3, 130, 70), (4, 1000, 1030), (2, 64, 1)])
def test_attention_on_the_gpu(consts, h, lq, s):
    import torch
    q, k, v = operands(h, lq, s, seed=lq + s)
    o, o2, o3 = (guarded((h, lq, 64), "f16", fill=float("nan")) for _ in range(3))
    args = [torch.from_numpy(x).cuda() for x in (q, k, v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        one = tilec.compile(SRC, fallback=False, **consts)
        one(*args, o.view, 0.125)
        # the same per-block arithmetic with the gemms overlapped, on the same tiles
        tilec.compile(OVERLAP, fallback=False, **(consts or one.best_config))(*args, o2.view, 0.125)
        # and with P through shared memory
        tilec.compile(SHARED_P, fallback=False, **(consts or one.best_config))(*args, o3.view, 0.125)
    torch.cuda.synchronize()
    for out in (o, o2, o3):
        out.check()
    assert torch.equal(o.view, o2.view) and torch.equal(o.view, o3.view)
    got = o.view.cpu().numpy().astype(np.float64)
    np.testing.assert_allclose(got, reference(q, k, v, 0.125), atol=3e-3, rtol=3e-3)
    peer = torch.nn.functional.scaled_dot_product_attention(*[x[None] for x in args], scale=0.125)[0]
    np.testing.assert_allclose(got, peer.cpu().numpy().astype(np.float64), atol=3e-3, rtol=3e-3)
