"""The interpreter runs warp-specialised kernels (`pipelined(..., producer = 1)`):
the producer's one thread and the consumers run concurrently, one at a time,
handing over at the ring's mbarriers. Results are the sums of the kernel
without a producer, bit for bit; a protocol that would hang says so at once,
and no Python thread is left behind, whatever a role raises."""
import re
import threading
import time
from dataclasses import replace

import numpy as np
import pytest

import tilec
from tilec.compiler import lower
from tilec.ir import nodes as ir
from tilec.runtime import interpret
from conftest import ROOT
from guard import guarded

GEMM = (ROOT / "examples/gemm.tile").read_text()
PERSISTENT = (ROOT / "examples/gemm_persistent.tile").read_text()


def with_producer(src):
    """The source with its pipelined loop on a producer warpgroup (and no tune line)."""
    out = re.sub(r"stages = STAGES(, producer = PRODUCER)?\)", "stages = STAGES, producer = 1)",
                 re.sub(r"^ *tune [^;]*;[^\n]*\n", "", src, flags=re.M))
    assert "producer = 1" in out
    return out


def operands(m, n, kk, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, kk)).astype(np.float16), rng.standard_normal((kk, n)).astype(np.float16))


def check_gemm(src, consts, m, n, kk, extra=()):
    """C = A @ B by the specialised kernel: near numpy's, bit for bit the kernel
    without a producer's, nothing written outside C."""
    k = tilec.compile(with_producer(src), backend="interpret", **consts)
    assert any(isinstance(s, ir.Specialized) for s in k.kernel_ir.body)
    a, b = operands(m, n, kk, seed=m + 3 * n + 7 * kk)
    c = guarded((m, n), "f16", like="numpy")
    k(a, b, c.view, *extra)
    c.check()
    want = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(c.view.astype(np.float32), want, rtol=2e-3, atol=2e-2 * np.sqrt(kk) / 16)
    plain = np.zeros((m, n), np.float16)
    tilec.compile(src, backend="interpret", **consts)(a, b, plain, *extra)
    assert np.array_equal(c.view.view(np.uint16), plain.view(np.uint16))


@pytest.mark.parametrize("consts", [{}, dict(BM=192, BN=128, STAGES=4), dict(BM=64, STAGES=1)])
@pytest.mark.parametrize("shape", [(256, 256, 512), (200, 136, 328), (64, 8, 40)])
def test_specialized_gemm_equals_numpy(consts, shape):
    """Aligned, ragged (M, N, K no multiples of the tile) and smaller than a tile;
    K over the ring (stages reused), 1 to 3 consumer warpgroups."""
    check_gemm(GEMM, consts, *shape)


@pytest.mark.parametrize("stages", [3, 2])
@pytest.mark.parametrize("shape, p", [((384, 520, 392), 2), ((300, 264, 200), 1)])
def test_specialized_persistent_gemm_equals_numpy(stages, shape, p):
    """P blocks under the number of tiles: each loops over several, its ring
    (counters in each role) wrapping across them."""
    check_gemm(PERSISTENT, dict(STAGES=stages), *shape, extra=(p,))


# ---------------------------------------------------------------- broken protocols

def edited(src, f, consts=None):
    """The lowered kernel with each statement s (nested ones first) replaced by the tuple f(s)."""
    def edit(body):
        out = []
        for s in body:
            s = replace(s, **{n: edit(getattr(s, n)) for n in ir.STMT_BLOCK_FIELDS.get(type(s), ())})
            out += f(s)
        return tuple(out)
    k = lower(with_producer(src), dict(consts or {})).kernel
    return replace(k, body=edit(k.body))


def drop(*types, pipelined=False):
    return lambda s: () if isinstance(s, types) or (pipelined and isinstance(s, ir.For) and s.producer) else (s,)


def shift(cls):
    """An innermost coordinate 1 element (2 bytes) off the 16-byte TMA alignment."""
    return lambda s: (replace(s, coords=(*s.coords[:-1], ir.BinOp("+", s.coords[-1], ir.Int(1))))
                      if isinstance(s, cls) else s,)


def raises_promptly(k, args, match):
    """The run raises InterpretError matching `match` within seconds, every thread it started ended."""
    before = threading.active_count()
    start = time.monotonic()
    with pytest.raises(interpret.InterpretError, match=match) as info:
        interpret.run(k, args)
    assert time.monotonic() - start < 5
    assert threading.active_count() == before
    return info.value


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what, match", [
    ("no release", r"would hang: block \(0, 0, 0\) waits on mbarrier empty1\[0\] with parity 0, a phase nothing "
                   r"completes \(2 arrival\(s\) missing\); the producer waiting there, the consumers waiting on "
                   r"mbarrier full0\[0\] with parity 1 \(1 arrival\(s\) missing\)"),
    ("no consumer loop", r"would hang: block \(0, 0, 0\) waits on mbarrier empty1\[0\] with parity 0, a phase "
                         r"nothing completes \(2 arrival\(s\) missing\); the producer waiting there, the consumers "
                         r"finished"),
])
def test_a_specialized_kernel_that_would_hang_says_so(what, match):
    """Without the consumers' arrives on `empty` the producer waits for a stage
    to refill and the consumers for its data: a hang, named. So is a producer
    left waiting by consumers that have finished."""
    f = drop(ir.MbarrierArrive, pipelined=what == "no consumer loop")
    k = edited(GEMM, f)
    assert not any(isinstance(s, ir.MbarrierArrive) for s in ir.walk_stmts(k.body))
    a, b = operands(128, 128, 512, seed=1)
    err = raises_promptly(k, (a, b, np.zeros((128, 128), np.float16)), match)
    assert err.span is not None


@pytest.mark.timeout(60)
def test_an_error_in_the_producer_reaches_the_caller():
    """A misaligned TMA load faults in the producer's thread, the consumers
    waiting for their first stage: raised to the caller, the consumers unwound."""
    k = edited(GEMM, shift(ir.TmaLoad))
    a, b = operands(128, 128, 256, seed=2)
    raises_promptly(k, (a, b, np.zeros((128, 128), np.float16)), "innermost coordinate 1 .2 bytes. is not 16-byte")


@pytest.mark.timeout(60)
def test_an_error_in_the_consumers_unwinds_the_waiting_producer():
    """A persistent block's first TMA store faults in the consumers while the
    producer, ahead on the next tile, waits for a stage: the error is raised,
    the producer's thread ends."""
    k = edited(PERSISTENT, shift(ir.TmaStore), dict(STAGES=2))
    a, b = operands(256, 256, 512, seed=3)
    raises_promptly(k, (a, b, np.zeros((256, 256), np.float16), 1), "innermost coordinate 1 .2 bytes. is not 16-byte")
