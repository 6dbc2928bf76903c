"""A block that reads what it wrote to global memory (Kernel.rereads: a tensor the
kernel writes other than in place with itself). TMA stores are asynchronous, and
thread writes go through the generic proxy, so insert-barriers orders each read of
such a tensor after the block's writes of it: thread 0 waits for its TMA stores to
complete (`cp.async.bulk.wait_group 0`), the threads' writes meet at a block
barrier, after `fence.proxy.async.global` where TMA reads next. Kernels that write
a tensor only in place (each tile read before the same step writes it) get none of
it. tests/test_gpu_rotate.py runs the chains on the GPU."""
import re

import numpy as np
import pytest

import tilec
from tilec.compiler import lower
from tilec.ir.printer import kernel as show
from tilec.passes import Options, check_barriers

from conftest import ROOT
from test_rotate import RMW, chain


def ir(src, stage="insert-barriers"):
    return show(lower(src).stages[stage])


def loop_body(text):
    return text[text.index("  for k in"):]


@pytest.mark.parametrize("loop", ["range(K - 1)", "pipelined(K - 1, stages = 2)"])
def test_a_tma_store_completes_before_the_next_load_of_its_tensor(loop):
    text = ir(chain("shared").replace("pipelined(K - 1, stages = 2)", loop))
    assert "  rereads A\n" in text
    body = loop_body(text)
    # the store's tail (the columns past the last whole granule, by threads) is fenced too
    assert re.search(r"\{  // line 7\n\s+one_thread \{\n\s+cp\.async\.bulk\.wait_group 0\n\s+\}\n"
                     r"\s+fence\.proxy\.async\.global  // line 8\n\s+barrier\.sync  // line 8\n\s+one_thread \{\n"
                     r"\s+mbarrier\.arrive\.expect_tx bar0", body)


def test_thread_writes_are_fenced_before_the_next_tma_load_of_their_tensor():
    body = loop_body(ir(chain("local").replace("pipelined(K - 1, stages = 2)", "range(K - 1)")))
    assert re.search(r"for k in range\(K - 1\) \{  // line 7\n\s+fence\.proxy\.async\.global  // line 8\n"
                     r"\s+barrier\.sync  // line 8\n\s+one_thread \{\n\s+mbarrier\.arrive\.expect_tx", body)
    assert "wait_group 0" not in body


# a thread copy reads back, in the same trip, the tile a TMA store wrote
READBACK = """
kernel readback(A: f32[M, N], B: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared a: f32[8, 32];
    local r: f32[8, 32];
    copy(A[by * 8, bx * 32], a);
    copy(a, B[by * 8, bx * 32 + 32]);
    copy(B[by * 8, bx * 32 + 32], r);
    copy(r, A[by * 8, bx * 32]);
}
"""


def test_a_thread_read_after_a_tma_store_waits_and_meets():
    text = ir(READBACK)
    assert "  rereads B\n" in text
    after = text[text.index("store.tail B"):]
    assert re.search(r"\n\s+one_thread \{\n\s+cp\.async\.bulk\.wait_group 0\n\s+\}\n\s+barrier\.sync  // line 9\n"
                     r"\s+thread\.copy B", after)


@pytest.mark.parametrize("src", [RMW, (ROOT / "examples/scale.tile").read_text(),
                                 (ROOT / "examples/rowsum.tile").read_text()], ids=["rmw", "scale", "rowsum"])
def test_kernels_that_write_in_place_or_elsewhere_get_nothing(src):
    text = ir(src)
    assert "rereads" not in text and "wait_group 0" not in text and "fence.proxy.async.global" not in text


@pytest.mark.parametrize("src", [chain("shared"), chain("local"), READBACK])
def test_the_ordered_kernels_pass_check_barriers_and_compile(src):
    check_barriers.run(lower(src).kernel, Options())
    k = tilec.compile(src, arch="sm_90a")
    assert k.compile_log == ""
    assert "bulk_wait_group<0>();" in k.cuda_source or "fence_proxy_async_global();" in k.cuda_source


def test_readback_in_the_interpreter():
    """Block bx stores A's tile bx as B's tile bx + 1 and reads that back into A's
    tile bx: the last block's lies past B's end (clipped on store, zeros on load)."""
    a = np.random.default_rng(0).standard_normal((16, 96)).astype(np.float32)
    b = np.zeros((16, 96), np.float32)
    a0 = a.copy()
    tilec.compile(READBACK, backend="interpret")(a, b)
    assert np.array_equal(b[:, 32:], a0[:, :64]) and not b[:, :32].any()
    assert np.array_equal(a[:, :64], a0[:, :64]) and not a[:, 64:].any()


def test_a_producer_ring_that_loads_what_the_kernel_writes_is_refused():
    src = (ROOT / "examples/gemm_128x256.tile").read_text()
    src = src.replace("copy(acc, C[by * BM, bx * BN]);", "copy(acc, A[by * BM, bx * BN]);")
    src = src.replace("stages = STAGES)", "stages = STAGES, producer = 1)")
    with pytest.raises(tilec.SemanticError, match="producer = 1: the ring loads A, which the kernel also writes"):
        lower(src)


BRANCHES = """kernel twice(X: f32[M, N], Y: f32[M, N], flag: i32) {
    grid (by) = (cdiv(M, 8));
    threads 128;
    shared t: f32[8, N0];
    if flag > 0 {
        copy(X[by * 8, 0], t);
        copy(t, Y[by * 8, 0]);
    } else {
        copy(X[by * 8, 0], t);
        parallel (i, j) in (8, N0) {
            t[i, j] = t[i, j] * 2.0;
        }
        copy(t, Y[by * 8, 0]);
    }
AFTER}
""".replace("N0", "64")


@pytest.mark.parametrize("after, why", [
    ("", None),
    ("    copy(X[by * 8, 0], t);\n    copy(t, Y[by * 8, 0]);\n",
     "it writes Y (line 7) before it reads X (line 15), so it would read elements it already overwrote"),
], ids=["branches apart", "a read after the if"])
def test_a_write_in_one_branch_and_a_read_in_the_other_are_never_both_run(after, why):
    """mark-in-place orders each read of X before each write of Y, but for the two
    branches of one `if`: Y may be X (tests/softmax.tile's one-tile and two-pass
    paths); a read after the `if` still follows a write."""
    k = lower(BRANCHES.replace("AFTER", after)).stages["mark-in-place"]
    assert dict(k.in_place)[("Y", "X")] == why
