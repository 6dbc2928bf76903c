"""GPU: blocks that read what they wrote to global memory (tests/test_rereads.py's
kernels), repeated, against the sequential answer; the tensors are guarded views.
Marked gpu: `python -m pytest -m gpu tests/test_gpu_rereads.py`."""
import pytest

import tilec
from guard import guarded
from test_rereads import READBACK
from test_rotate import chain

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("loop", ["range(K - 1)", "pipelined(K - 1, stages = 2)"])
@pytest.mark.parametrize("ydecl", ["shared", "local"])
def test_a_chain_down_a_loop_on_the_gpu(ydecl, loop):
    """A[k + 1] = A[k] + 1: each trip loads the tile the trip before stored (by TMA
    from shared y, or by thread copies from local y), 10 runs."""
    import torch
    k = tilec.compile(chain(ydecl).replace("pipelined(K - 1, stages = 2)", loop))
    want = torch.arange(40, device="cuda", dtype=torch.float32)[:, None, None].expand(40, 64, 250)
    for _ in range(10):
        a = guarded((40, 64, 250), "f32", fill=0.0)
        k(a.view)
        torch.cuda.synchronize()
        a.check()
        assert torch.equal(a.view, want)


def test_readback_on_the_gpu():
    import torch
    a0 = torch.randn(64, 1000, device="cuda")
    for _ in range(5):
        a, b = guarded((64, 1000), "f32", fill=a0), guarded((64, 1000), "f32", fill=0.0)
        tilec.compile(READBACK)(a.view, b.view)
        torch.cuda.synchronize()
        a.check()
        b.check()
        assert torch.equal(b.view[:, 32:], a0[:, :968]) and not b.view[:, :32].any()
        # A's column c comes back from B's column c + 32: zeros past B's end
        assert torch.equal(a.view[:, :968], a0[:, :968]) and not a.view[:, 968:].any()
