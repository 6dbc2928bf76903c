"""check-barriers on warp-specialised kernels (`pipelined(..., producer = 1)`):
the producer warpgroup's program and the consumers' run concurrently in the
checker; tilec's own kernels pass, and a broken ring protocol is rejected."""
import re
import time
from dataclasses import replace

import pytest

from tilec.compiler import lower
from tilec.errors import Source
from tilec.ir import nodes as ir
from tilec.passes import Options, check_barriers
from tilec.passes.check_barriers import BarrierBug
from conftest import ROOT
from test_check_barriers import mutate


def specialized_ir(name, consts=None):
    """examples/<name>.tile with a producer warpgroup on its ring (the `tune` line
    dropped: the consts pick the variant), after insert-barriers."""
    text = (ROOT / f"examples/{name}.tile").read_text()
    text = re.sub(r"stages = STAGES(, producer = PRODUCER)?\)", "stages = STAGES, producer = 1)", text)
    assert "producer = 1" in text
    text = re.sub(r"^ *tune [^;]*;[^\n]*\n", "", text, flags=re.M)
    k = lower(Source(f"{name}.tile", text), consts).stages["insert-barriers"]
    assert any(isinstance(s, ir.Specialized) for s in k.body)
    return k


def sides(k):
    return next(s for s in k.body if isinstance(s, ir.Specialized))


def with_sides(k, producer=None, consumers=None):
    """`k` with its Specialized block's producer or consumers program replaced."""
    old = sides(k)
    new = replace(old, producer=old.producer if producer is None else producer,
                  consumers=old.consumers if consumers is None else consumers)
    assert new != old, "the mutation found nothing to change"
    return replace(k, body=tuple(new if s is old else s for s in k.body))


def rejected(k):
    with pytest.raises(BarrierBug) as err:
        check_barriers.run(k, Options())
    return err.value


VARIANTS = [("gemm", {"STAGES": s}) for s in (2, 3, 4)] + \
           [("gemm_persistent", {"STAGES": s}) for s in (2, 3, 4)] + \
           [("conv2d", {"STAGES": s}) for s in (2, 3, 4)]
# the ring's line in each example
RING_LINE = {"gemm": 10, "gemm_persistent": 17}


@pytest.mark.parametrize("name, consts", VARIANTS, ids=[f"{n}-S{c['STAGES']}" for n, c in VARIANTS])
def test_specialized_examples_pass(name, consts):
    check_barriers.run(specialized_ir(name, consts), Options())


def test_checker_is_quick_on_the_persistent_gemm():
    k = specialized_ir("gemm_persistent", {"STAGES": 3})
    start = time.perf_counter()
    check_barriers.run(k, Options())
    assert time.perf_counter() - start < 2.0


@pytest.fixture(params=["gemm", "gemm_persistent"])
def kernel(request):
    return request.param, specialized_ir(request.param, {"STAGES": 3})


def test_refill_without_waiting_for_the_release(kernel):
    name, k = kernel
    producer = mutate(sides(k).producer, lambda s: isinstance(s, ir.MbarrierWait), lambda s: None)
    err = rejected(with_sides(k, producer=producer))
    assert "TMA load overwrites 'a@0', which threads used" in err.message
    assert "a wait on the release of its stage" in err.message
    assert err.span.line == RING_LINE[name] + 1


@pytest.mark.parametrize("skew, outcome", [(16, "never complete"), (-16, "complete early")])
def test_wrong_expect_tx_in_the_producer(kernel, skew, outcome):
    name, k = kernel
    producer = mutate(sides(k).producer, lambda s: isinstance(s, ir.ArriveExpectTx),
                      lambda s: replace(s, bytes=s.bytes + skew))
    err = rejected(with_sides(k, producer=producer))
    assert "mbarrier full0[0]: expect-tx is" in err.message and outcome in err.message
    assert err.span.line == RING_LINE[name]


def test_consumers_never_release_a_stage(kernel):
    name, k = kernel
    consumers = sides(k).consumers
    for _ in range(2):      # the arrive in the loop and the one after it
        consumers = mutate(consumers, lambda s: isinstance(s, ir.MbarrierArrive), lambda s: None)
    assert not any(isinstance(s, ir.MbarrierArrive) for s in ir.walk_stmts(consumers))
    err = rejected(with_sides(k, consumers=consumers))
    assert "the producer warpgroup and the consumers wait on each other" in err.message
    assert "full0[0] (parity 1)" in err.message and "empty1[0] (parity 0)" in err.message
    assert "it would hang" in err.message


def test_persistent_consumers_skip_the_release_after_the_ring():
    k = specialized_ir("gemm_persistent", {"STAGES": 3})
    after = lambda s: isinstance(s, ir.If) and any(isinstance(x, ir.MbarrierArrive) for x in s.then) and \
        "cdiv" in str(s.cond)
    err = rejected(with_sides(k, consumers=mutate(sides(k).consumers, after, lambda s: None)))
    assert "wait on each other" in err.message and "it would hang" in err.message


def test_wrong_full_parity_in_the_consumers(kernel):
    name, k = kernel
    consumers = mutate(sides(k).consumers, lambda s: isinstance(s, ir.MbarrierWait),
                       lambda s: replace(s, parity=ir.BinOp("-", ir.Int(1), s.parity)))
    err = rejected(with_sides(k, consumers=consumers))
    assert "waits on mbarrier full0[0] with parity 1, but the phase in flight has parity 0" in err.message
    assert err.span.line == RING_LINE[name]


def test_release_before_the_wgmma_retired(kernel):
    name, k = kernel
    consumers = mutate(sides(k).consumers, lambda s: isinstance(s, ir.WgmmaWait) and s.pending == 1,
                       lambda s: replace(s, pending=2))
    err = rejected(with_sides(k, consumers=consumers))
    assert "stage 0 is released on mbarrier empty1[0] while a wgmma may still read" in err.message


def test_block_barrier_in_the_producer(kernel):
    name, k = kernel
    producer = sides(k).producer
    err = rejected(with_sides(k, producer=(ir.SyncThreads(span=producer[0].span),) + producer))
    assert "a block barrier in the program of the producer warpgroup deadlocks" in err.message
    inner = mutate(producer, lambda s: isinstance(s, ir.ArriveExpectTx), lambda s: ir.SyncThreads(span=s.span))
    err = rejected(with_sides(k, producer=inner))
    assert "a block barrier in the program of the producer warpgroup deadlocks" in err.message
    assert err.span.line == RING_LINE[name] + 1


def test_consumers_block_barrier_does_not_release_a_stage():
    """The consumers' barrier.sync is theirs alone: it does not order the
    producer's refill of a stage after their wgmma read it."""
    k = specialized_ir("gemm", {"STAGES": 3})
    s = sides(k)
    producer = mutate(s.producer, lambda x: isinstance(x, ir.MbarrierWait), lambda x: None)
    consumers = mutate(s.consumers, lambda x: isinstance(x, ir.MbarrierArrive), lambda x: ir.SyncThreads(span=x.span))
    err = rejected(with_sides(k, producer=producer, consumers=consumers))
    assert "TMA load overwrites 'a@0', which threads used" in err.message


def test_staged_epilogue_waits_for_its_chunk_only():
    """With a producer the persistent gemm stages its 128x256 accumulator in four
    64-column chunks through two tiles: before writing a tile, thread 0 waits
    until the store that read it last has (wait_group.read 1: the other tile's
    store stays in flight). Waiting for one group fewer is a race."""
    k = specialized_ir("gemm_persistent", {"STAGES": 4})
    waits = [s for s in ir.walk_stmts(sides(k).consumers) if isinstance(s, ir.BulkWait)]
    assert [w.pending for w in waits] == [1, 1, 1, 1, 0]      # one per chunk, and all before the block exits
    consumers = mutate(sides(k).consumers, lambda s: isinstance(s, ir.BulkWait) and s.pending == 1,
                       lambda s: replace(s, pending=2))
    err = rejected(with_sides(k, consumers=consumers))
    assert "threads write 'tl_acc_out0' while a TMA store may still be reading it" in err.message
    assert err.span.line == 22


def test_staged_epilogue_is_checked_quickly():
    """Each trip tries its chunks' store tails all run or none (not each chunk
    alone: they are fenced by barriers of their own)."""
    k = specialized_ir("gemm_persistent", {"STAGES": 4})
    start = time.perf_counter()
    check_barriers.run(k, Options())
    assert time.perf_counter() - start < 2.0


def test_a_fork_of_a_path_goes_on_from_its_choice(monkeypatch):
    """gemm.tile's deepest candidate (stream-K over an 8-stage producer ring) has 2300
    paths through its warp-specialised block. A path forks at each choice, and the
    copy runs only what comes after it: 73,510 statements stepped in all. Replayed
    from the start with the earlier choices (as before 2026-11-26), 362,940. Since
    2026-12-03 a run that meets another at a store tail's choice stops there
    (test_check_barriers): 1316 paths run to their end, 56,578 steps."""
    consts = dict(BM=64, BN=128, STAGES=8, PRODUCER=1, PERSISTENT=1, STREAM_K=1)
    k = lower(Source("gemm.tile", (ROOT / "examples/gemm.tile").read_text()), consts).stages["insert-barriers"]
    steps, paths = [0], []
    step, specialized = check_barriers._Checker.step, check_barriers._Checker.specialized

    def counting_step(self, *args):
        steps[0] += 1
        return step(self, *args)

    def counting_specialized(self, s, st):
        out = specialized(self, s, st)
        paths.append(len(out))
        return out
    monkeypatch.setattr(check_barriers._Checker, "step", counting_step)
    monkeypatch.setattr(check_barriers._Checker, "specialized", counting_specialized)
    check_barriers.run(k, Options())
    assert paths == [1316]
    assert steps[0] < 100_000
