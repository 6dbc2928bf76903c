"""GPU: the persistent gemm (examples/gemm_persistent.tile) and a batch loop
around a pipelined loop equal torch.matmul, for block counts below, at and
above the tile count and K trips that leave the ring at every phase offset;
outputs guarded (tests/guard.py)."""
import pytest

import tilec
from tilec.errors import Source
from conftest import ROOT
from guard import guarded
from test_persistent import BATCHED

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("p", [1, 7, 132, 1000])
@pytest.mark.parametrize("mnk", [(1000, 1032, 520), (4096, 4096, 4096), (256, 256, 64), (384, 512, 832)],
                         ids=lambda s: "x".join(map(str, s)))
def test_persistent_gemm_equals_matmul(p, mnk):
    kern = tilec.compile(ROOT / "examples/gemm_persistent.tile", fallback=False)
    _check_persistent(kern, *mnk, p)


@pytest.mark.parametrize("stages", [1, 2, 3, 5])
def test_persistent_stages(stages):
    m, n, k = 700, 1000, 1088      # 17 K steps: the ring's offset moves every tile
    kern = tilec.compile(ROOT / "examples/gemm_persistent.tile", fallback=False, BN=128, STAGES=stages)
    _check_persistent(kern, m, n, k, 5)


def _check_persistent(kern, m, n, k, p):
    """kern(a, b, c, p) equals a @ b, with c guarded."""
    import torch
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(k, n, device="cuda").half()
    c = guarded((m, n), "f16", fill=float("nan"))
    kern(a, b, c.view, p)
    torch.cuda.synchronize()
    want = a.float() @ b.float()
    err = ((c.view.float() - want).norm() / want.norm()).item()
    assert err < 2e-3, err
    c.check()


def test_batch_loop_equals_bmm():
    import torch
    kern = tilec.compile(BATCHED, fallback=False)
    a = torch.randn(5, 300, 200, device="cuda").half()
    b = torch.randn(5, 200, 136, device="cuda").half()
    c = guarded((5, 300, 136), "f32", fill=float("nan"))
    kern(a, b, c.view)
    torch.cuda.synchronize()
    want = torch.bmm(a.float(), b.float())
    assert ((c.view - want).norm() / want.norm()).item() < 1e-4
    c.check()


def _with_producer():
    """examples/gemm_persistent.tile with its ring on a producer warpgroup
    (pipelined(..., producer = 1)): the producer loads the next tile while the
    consumers store this one."""
    text = (ROOT / "examples/gemm_persistent.tile").read_text()
    assert "stages = STAGES)" in text
    return Source("gemm_persistent_producer.tile", text.replace("stages = STAGES)",
                                                                  "stages = STAGES, producer = 1)"))


@pytest.mark.parametrize("stages,bn", [(1, 128), (2, 256), (3, 256), (5, 128)])
@pytest.mark.parametrize("p", [1, 5, 132, 1000])
def test_persistent_gemm_with_a_producer_warpgroup(stages, bn, p):
    kern = tilec.compile(_with_producer(), fallback=False, BN=bn, STAGES=stages)
    assert "setmaxnreg_dec" in kern.cuda_source
    _check_persistent(kern, 700, 1000, 1088, p)     # 17 K steps: the ring's offset moves every tile
