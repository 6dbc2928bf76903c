"""The static barrier checker (pass check-barriers): tilec's own kernels pass;
deliberately broken IR is rejected with the barrier and the .tile line."""
import os
import re
import subprocess
import sys
import warnings
from dataclasses import replace

import pytest

import tilec

from tilec.compiler import lower
from tilec.errors import Source
from tilec.ir import nodes as ir
from tilec.passes import Options, check_barriers
from tilec.passes.check_barriers import BarrierBug
from conftest import ROOT

LOOP = """kernel loop(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    shared s: f32[32, 128];
    for r in range(cdiv(M, 32)) {
        copy(A[r * 32, bx * 128], s);
        parallel (i, j) in (32, 128) {
            s[i, j] = s[i, j] * 2.0;
        }
        copy(s, B[r * 32, bx * 128]);
    }
}
"""
STORE_LOOP = """kernel loop2(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    shared s: f32[32, 128];
    for r in range(cdiv(M, 32)) {
        copy(A[r * 32, bx * 128], s);
        copy(s, B[r * 32, bx * 128]);
    }
}
"""
TWO_LOADS = """kernel two(A: f16[M, K], B: f32[K, N], C: f16[M, K]) {
    grid (bx, by) = (cdiv(N, 64), cdiv(M, 64));
    threads 128;
    shared a: f16[64, 64];
    shared b: f32[32, 64];
    copy(A[by * 64, 0], a);
    copy(B[0, bx * 64], b);
    parallel (i, j) in (64, 64) {
        a[i, j] = a[i, j] + b[i / 2, j];
    }
    copy(a, C[by * 64, 0]);
}
"""
READ_LOOP = """kernel rl(A: f32[M, N], B: f32[M, N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    shared s: f32[32, 128];
    local t: f32[32, 128];
    for r in range(cdiv(M, 32)) {
        copy(A[r * 32, bx * 128], s);
        copy(s, t);
        copy(t, B[r * 32, bx * 128]);
    }
}
"""
BRANCHY = """kernel br(A: f32[M, N], B: f32[M, N], flag: i32) {
    grid (bx, by) = (cdiv(N, 128), cdiv(M, 64));
    threads 128;
    shared s: f32[64, 128];
    if flag > 0 {
        copy(A[by * 64, bx * 128], s);
    } else {
        fill(s, 0.0);
    }
    copy(s, B[by * 64, bx * 128]);
}
"""


def barriers_ir(text):
    return lower(Source("k.tile", text)).stages["insert-barriers"]


def mutate(body, pick, change, seen=None):
    """Apply `change` to the first statement for which `pick` holds (None deletes it)."""
    seen = seen if seen is not None else [False]
    out = []
    for s in body:
        if not seen[0] and pick(s):
            seen[0] = True
            new = change(s)
            if new is not None:
                out.append(new)
            continue
        fields = ir.STMT_BLOCK_FIELDS.get(type(s), ())
        if fields:
            s = replace(s, **{f: mutate(getattr(s, f), pick, change, seen) for f in fields})
        out.append(s)
    return tuple(out)


def broken(text, pick, change=lambda s: None):
    k = barriers_ir(text)
    body = mutate(k.body, pick, change)
    assert body != k.body, "the mutation found nothing to change"
    return replace(k, body=body)


def rejected(k):
    with pytest.raises(BarrierBug) as err:
        check_barriers.run(k, Options())
    return err.value


@pytest.mark.parametrize("name", ["copy2d", "scale", "im2col"])
def test_examples_pass(name):
    k = lower(ROOT / f"examples/{name}.tile").stages["insert-barriers"]
    check_barriers.run(k, Options())


@pytest.mark.parametrize("text", [LOOP, STORE_LOOP, READ_LOOP, TWO_LOADS, BRANCHY])
def test_tilec_kernels_pass(text):
    check_barriers.run(barriers_ir(text), Options())


def test_expect_tx_off_by_16():
    err = rejected(broken(LOOP, lambda s: isinstance(s, ir.ArriveExpectTx), lambda s: replace(s, bytes=s.bytes + 16)))
    assert "mbarrier bar0: expect-tx is 16400 bytes but its TMA loads bring 16384" in err.message
    assert err.span.line == 7


def test_expect_tx_off_by_16_with_two_loads():
    err = rejected(broken(TWO_LOADS, lambda s: isinstance(s, ir.ArriveExpectTx),
                          lambda s: replace(s, bytes=s.bytes - 16)))
    assert "expect-tx is 16368 bytes but its TMA loads bring 16384" in err.message


def test_missing_wait():
    err = rejected(broken(LOOP, lambda s: isinstance(s, ir.MbarrierWait)))
    assert "'s'" in err.message and err.span.line in (6, 7, 8)


def test_missing_wait_before_store():
    err = rejected(broken(STORE_LOOP, lambda s: isinstance(s, ir.MbarrierWait)))
    assert "bar0" in err.message or "'s'" in err.message


def test_phase_bit_never_flipped():
    err = rejected(broken(LOOP, lambda s: isinstance(s, ir.FlipPhase)))
    assert "mbarrier bar0 with parity 0, but the phase in flight has parity 1" in err.message
    assert err.span.line == 7


def test_tile_refilled_before_threads_released_it():
    k = broken(READ_LOOP, lambda s: isinstance(s, ir.SyncThreads) and s.span is not None and s.span.line == 7)
    err = rejected(k)
    assert "TMA load overwrites 's', which threads used, without a block barrier" in err.message
    assert err.span.line == 7


def test_tile_refilled_while_a_store_reads_it():
    err = rejected(broken(STORE_LOOP, lambda s: isinstance(s, ir.BulkWait)))
    assert "TMA load overwrites 's' while a TMA store may still be reading it" in err.message


def test_missing_proxy_fence_before_store():
    err = rejected(broken((ROOT / "examples/scale.tile").read_text(), lambda s: isinstance(s, ir.ProxyFence)))
    assert "TMA store of 's', which threads wrote, without fence.proxy.async" in err.message
    assert err.span.line == 11


def test_missing_block_barrier_before_store():
    text = (ROOT / "examples/scale.tile").read_text()
    k = broken(text, lambda s: isinstance(s, ir.SyncThreads) and s.span is not None and s.span.line == 11)
    err = rejected(k)
    assert "TMA store of 's'" in err.message


def test_missing_wait_on_one_branch():
    err = rejected(broken(BRANCHY, lambda s: isinstance(s, ir.MbarrierWait)))
    assert "'s'" in err.message or "bar0" in err.message


def test_load_without_arrive():
    err = rejected(broken(LOOP, lambda s: isinstance(s, ir.ArriveExpectTx)))
    assert "signals mbarrier bar0, which has no arrive.expect_tx" in err.message


def test_wait_without_any_arrive_hangs():
    k = broken(LOOP, lambda s: isinstance(s, ir.TmaLoad))
    k = replace(k, body=mutate(k.body, lambda s: isinstance(s, ir.ArriveExpectTx), lambda s: None))
    err = rejected(k)
    assert "waits on mbarrier bar0 (parity 0) with no arrive on this path: it would hang" in err.message


def test_tilec_check_runs_the_checker():
    from tilec.passes import PASS_NAMES
    assert "check-barriers" in PASS_NAMES


def test_waits_leave_later_groups_in_flight():
    """insert-barriers' record of asynchronous groups not waited for (the tiles TMA
    stores still read; a gemm's accumulator and operands): a wait for some names
    leaves the groups issued after their last group in flight; where paths that
    issued them in other orders meet, a wait waits for everything."""
    from tilec.passes.insert_barriers import _InFlight
    x, y, z = frozenset("x"), frozenset("y"), frozenset("z")
    s = _InFlight().add("x").add("y").add("x").add("z")         # groups: x y x z -> x's last is second to last
    pending, done, left = s.wait({"x"})
    assert (pending, done, left.groups) == (1, (y, x), (z,))
    pending, done, left = s.wait({"y", "z"})
    assert (pending, left.groups) == (0, ())
    acc = _InFlight().add({"acc", "a", "b"}).add({"part", "a1", "b1"})
    assert acc.wait({"a"})[:2] == (1, (frozenset({"acc", "a", "b"}),))     # an operand: the later gemm goes on
    assert not acc.touching({"c"}) and acc.names() == {"acc", "a", "b", "part", "a1", "b1"}
    assert _InFlight((x, y)).join(_InFlight((y,))) == _InFlight((x, y))   # a suffix: the same count holds
    assert _InFlight((y,)).join(_InFlight()) == _InFlight((y,))
    mixed = _InFlight((x, y)).join(_InFlight((y, x)))
    assert not mixed.ordered and mixed.wait({"y"})[0] == 0


GEMM_FIXED_K = (ROOT / "examples/gemm.tile").read_text().replace(
    "for k in pipelined(cdiv(K, BK),", "for k in pipelined(4,")


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("producer", [0, 1])
def test_a_constant_extent_runs_its_own_trip_count(stages, producer):
    """`pipelined(4)`: the checker runs the ring 4 times, the count the kernel runs. It used
    to try 0 .. stages + 2 trips as for an unknown extent, and so reported the prologue's
    loads (issued for a known count without guards) as 'armed and never waited on' when it
    tried 0 trips, and took the literal 4 elsewhere for the trip count it tried."""
    assert "pipelined(4," in GEMM_FIXED_K
    k = lower(GEMM_FIXED_K, dict(BM=128, BN=128, STAGES=stages, PRODUCER=producer, PERSISTENT=0)).stages[
        "insert-barriers"]
    check_barriers.run(k, Options())


def test_a_constant_extent_is_checked_at_its_count():
    """A missing wait inside `for i in range(4)` is still found (exactly 4 trips run)."""
    text = STORE_LOOP.replace("range(cdiv(M, 32))", "range(4)")
    err = rejected(broken(text, lambda s: isinstance(s, ir.MbarrierWait)))
    assert "mbarrier" in err.message


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("producer", [0, 1])
def test_a_constant_extent_gemm_interpreted_equals_numpy(stages, producer):
    """The pipelined(4) gemm the checker now accepts computes C = A @ B (the interpreter, K = 256:
    four steps), writing nothing around C."""
    import numpy as np
    import tilec
    from guard import guarded
    k = tilec.compile(GEMM_FIXED_K, backend="interpret", BM=128, BN=128, STAGES=stages, PRODUCER=producer,
                      PERSISTENT=0)
    rng = np.random.default_rng(stages * 2 + producer)
    a = rng.standard_normal((130, 256)).astype(np.float16)
    b = rng.standard_normal((256, 136)).astype(np.float16)
    g = guarded((130, 136), "f16", like="numpy")
    k(a, b, g.view)
    g.check()
    assert np.allclose(g.view.astype(np.float32), a.astype(np.float32) @ b.astype(np.float32), rtol=2e-2, atol=5e-2)


LONG_LOOP = """kernel long_loop(A: f32[M, N], B: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 64), cdiv(M, 512));
    threads 128;
    shared s: f32[8, 64];
    for i in range(64) {
        if by * 512 + i * 8 < M && bx * 64 < N {
            copy(A[by * 512 + i * 8, bx * 64], s);
            copy(s, B[by * 512 + i * 8, bx * 64]);
        }
    }
}
"""


def test_a_long_constant_loop_runs_a_count_of_the_same_phase():
    """range(64) with an `if` of two unknowns inside: the check runs 2 + 62 % 2 = 2 trips
    (phases repeat every 2 trips here), not 64 (2^64 paths of that `if`: 22 s before)."""
    import time
    t = time.perf_counter()
    check_barriers.run(barriers_ir(LONG_LOOP), Options())
    assert time.perf_counter() - t < 5
    err = rejected(broken(LONG_LOOP, lambda s: isinstance(s, ir.MbarrierWait)))
    assert "mbarrier" in err.message


@pytest.mark.parametrize("extent", [64, 1000, 1001])
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("producer", [0, 1])
def test_long_constant_rings_pass_and_a_dropped_wait_is_found(extent, stages, producer):
    """pipelined(64 / 1000 / 1001): the producer's plain loop and the consumers' ring run the
    same shortened count (the rings' fill and period are the kernel's), and a consumer's
    missing wait on the ring is still reported."""
    text = GEMM_FIXED_K.replace("pipelined(4,", f"pipelined({extent},")
    k = lower(text, dict(BM=128, BN=128, STAGES=stages, PRODUCER=producer, PERSISTENT=1)).stages[
        "insert-barriers"]
    check_barriers.run(k, Options())
    with pytest.raises(BarrierBug):
        check_barriers.run(replace(k, body=mutate(k.body, lambda s: isinstance(s, ir.MbarrierWait) and
                                                  "full" in s.barrier, lambda s: None)), Options())


# stream-K: the per-unit lets (tl_k_steps, ...) run once per unit, so units of one block may run
# different numbers of K steps on one path
GEMM_SK = re.sub(r"\n\s*tune [^;]*;", "\n", (ROOT / "examples/gemm.tile").read_text())


def stream_k_ir(stages, producer):
    return lower(GEMM_SK, dict(BM=128, BN=128, STAGES=stages, PRODUCER=producer, PERSISTENT=1,
                               STREAM_K=1)).stages["insert-barriers"]


@pytest.mark.parametrize("stages", [1, 2, 4])
@pytest.mark.parametrize("producer", [0, 1])
def test_stream_k_units_of_different_lengths_are_explored(stages, producer, monkeypatch):
    """Each run of `let tl_k_steps` is a new generation: some path's second unit runs
    another K-step count than its first (before, the first unit's count was pinned for the
    rest of the path)."""
    runs = []
    real = check_barriers._Checker.let

    def let(self, s, env):
        if s.name == "tl_k_steps":
            runs.append(env.get("tl_k_steps"))      # the count the previous unit ran (None: first)
        real(self, s, env)
    monkeypatch.setattr(check_barriers._Checker, "let", let)
    check_barriers.run(stream_k_ir(stages, producer), Options())
    assert any(prev is not None for prev in runs)
    counts = {n for n in runs if n is not None}
    assert {1, stages + 1} <= counts and len(counts) > 2


def test_a_warp_specialised_block_runs_on_from_each_configuration_once(monkeypatch):
    """A run of a producer's and consumers' interleaving that comes to a store tail's choice
    in a configuration (state, both sides' places, the choices fixed so far) that another run
    came to stops there: its future is that run's. The end states are the same set as when
    every run goes to its end, from fewer runs (gemm.tile with stream-K and a producer, 128 x
    128 tiles, 4 stages: 1036 runs and 26,846 statements stepped, against 1412 and 36,230)."""
    k = stream_k_ir(4, 1)
    real_specialized, real_interleave = check_barriers._Checker.specialized, check_barriers._Checker.interleave

    def outcome():
        ends, runs = set(), [0]

        def specialized(self, s, st):
            out = real_specialized(self, s, st)
            ends.update(check_barriers._fingerprint(x) for x in out)
            return out

        def interleave(self, run):
            runs[0] += 1
            return real_interleave(self, run)
        monkeypatch.setattr(check_barriers._Checker, "specialized", specialized)
        monkeypatch.setattr(check_barriers._Checker, "interleave", interleave)
        assert check_barriers.run(k, Options()).check_notes == ()
        return ends, runs[0]
    ends, runs = outcome()
    monkeypatch.setattr(check_barriers._Run, "config", lambda self: object())     # never seen before
    every_end, every_run = outcome()
    assert ends == every_end
    assert runs < 0.8 * every_run


def test_a_kernel_is_checked_alike_in_every_process():
    """The paths check-barriers runs do not depend on the order of a set of names, which
    follows their salted hashes (PYTHONHASHSEED): the dicts of a path's state that are
    filled from sets are filled in sorted order, so runs whose states are equal meet (and
    paths merge) in every process alike. Before, gemm.tile's 64x128 / 8-stage producer
    stream-K candidate ran 1326-1330 paths to their end, by the seed."""
    script = ("import sys; sys.path.insert(0, 'tests'); from test_check_barriers import stream_k_ir; "
              "from tilec.passes import check_barriers as cb, Options; n = [0]; real = cb._Checker.specialized\n"
              "def counted(self, s, st):\n    out = real(self, s, st); n[0] += len(out); return out\n"
              "cb._Checker.specialized = counted; cb.run(stream_k_ir(4, 1), Options()); print(n[0])")
    counts = {subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert len(counts) == 1 and int(counts.pop()) > 0


def _ring_as_if_units_were_equal(s):
    """`base += tl_k_steps` as `base = (tl_unit + 1) * tl_k_steps`: right only while every
    unit of the block runs the same number of K steps."""
    unit_plus_1 = ir.BinOp("+", ir.Var("tl_unit", "loop"), ir.Int(1))
    return replace(s, by=ir.BinOp("-", ir.BinOp("*", unit_plus_1, s.by), ir.Var(s.var, "let")))


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("producer", [0, 1])
def test_a_ring_that_assumes_equal_units_is_refused(stages, producer):
    """A ring carried across stream-K units as if they all ran the first unit's count hangs
    or reads a stale stage when a block's units differ (the partial tile, then a whole one);
    the check now finds it (it passed while the count was pinned once per path)."""
    k = stream_k_ir(stages, producer)
    body, done = k.body, []
    while True:
        new = mutate(body, lambda s: isinstance(s, ir.RingAdvance) and id(s) not in done, _ring_as_if_units_were_equal)
        if new == body:
            break
        done += [id(s) for s in ir.walk_stmts(new) if isinstance(s, ir.RingAdvance)]
        body = new
    assert sum(isinstance(s, ir.RingAdvance) for s in ir.walk_stmts(body)) == 1 + producer
    err = rejected(replace(k, body=body))
    assert "mbarrier" in err.message or "stage" in err.message or "tile" in err.message


def _many_branches(n):
    """n branches in a row, each on a run-time value of its own (`p{i} > 0`): the checker
    tries 8 values of each (pinned on the path, as a later `if` or loop may read them), so
    n branches make 8^n distinct paths, and the store tail's two cases double them."""
    params = "".join(f", p{i}: i32" for i in range(n))
    ifs = "".join(f"    if p{i} > 0 {{\n        fill(s, 0.0);\n    }}\n" for i in range(n))
    return f"""kernel many(A: f32[M, N], B: f32[M, N]{params}) {{
    grid (bx, by) = (cdiv(N, 128), cdiv(M, 64));
    threads 128;
    shared s: f32[64, 128];
    copy(A[by * 64, bx * 128], s);
{ifs}    copy(s, B[by * 64, bx * 128]);
}}
"""


def test_paths_past_the_limit_are_reported_not_dropped_silently(tmp_path, monkeypatch):
    """3 branches on run-time values of their own in a row (and the store tail's two cases):
    1024 paths, all checked, no note; 4: the first 4096 of 8192 are checked and the kernel
    carries a note that the rest were not, which every compile says as a
    CheckIncompleteWarning, a disk-cache hit included."""
    import warnings
    import tilec
    assert check_barriers.run(barriers_ir(_many_branches(3)), Options()).check_notes == ()
    with pytest.warns(tilec.CheckIncompleteWarning):       # lower() runs check-barriers too
        k4 = barriers_ir(_many_branches(4))
    notes = check_barriers.run(k4, Options()).check_notes
    assert len(notes) == 1 and notes[0].startswith("k.tile:1:1: check-barriers proved kernel many's barrier "
                                                   "protocol on its first 4096 paths only")
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path))
    from tilec.kernel import _CACHE
    for hit in (False, True):
        _CACHE.clear()
        with pytest.warns(tilec.CheckIncompleteWarning, match="protocol on its first 4096 paths only"):
            k = tilec.compile(Source("k.tile", _many_branches(4)), arch="sm_90a")
        assert k.from_disk_cache == hit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tilec.compile(Source("k.tile", _many_branches(3)), arch="sm_90a")


def test_branches_that_end_alike_are_one_path():
    """A branch on a value the rest of the kernel does not read, 12 in a row, and a store
    tail (two cases) on each of 27 trips of a loop nest: each fork's arms end in the same
    state, so the paths stay a handful and all are checked (before, 2^27 paths: the check
    ran for minutes and then covered the first 4096 only)."""
    ifs = "".join(f"    if flag > bx + {i} {{\n        fill(s, 0.0);\n    }}\n" for i in range(12))
    branches = f"""kernel many(A: f32[M, N], B: f32[M, N], flag: i32) {{
    grid (bx, by) = (cdiv(N, 128), cdiv(M, 64));
    threads 128;
    shared s: f32[64, 128];
    copy(A[by * 64, bx * 128], s);
{ifs}    copy(s, B[by * 64, bx * 128]);
}}
"""
    nest = """kernel nest(A: f32[M, N], B: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 128), cdiv(M, 64));
    threads 128;
    shared s: f32[64, 128];
    for j in range(3) { for q in range(3) { for r in range(3) {
        copy(A[by * 64, bx * 128], s);
        copy(s, B[by * 64, bx * 128]);
    } } }
}
"""
    for text in (branches, nest):
        checker = check_barriers.run(barriers_ir(text), Options())
        assert checker.check_notes == ()


@pytest.mark.parametrize("stages", [2, 4])
def test_a_long_loop_leaves_its_literal_alone(stages):
    """pipelined(64) runs its first and last trips (a multiple of the barriers' period left
    out) with `k` at its real values. It used to run a shorter count with the literal 64
    pinned to it for the rest of the path, so that a later `if 64 > 32` read `6 > 32` and
    skipped the branch: here a barrier armed there and never waited on is found."""
    text = GEMM_FIXED_K.replace("pipelined(4,", "pipelined(64,")
    k = lower(text, dict(BM=128, BN=128, STAGES=stages, PRODUCER=0, PERSISTENT=0)).stages["insert-barriers"]
    check_barriers.run(k, Options())
    arm = next(s for s in ir.walk_stmts(k.body) if isinstance(s, ir.ArriveExpectTx))
    late = ir.If(ir.BinOp(">", ir.Int(64), ir.Int(32)), (arm,), ())
    err = rejected(replace(k, body=k.body + (late,)))
    assert "armed" in err.message


def test_a_long_loop_runs_its_last_trips_at_their_real_indices():
    """The trips run of pipelined(1000) at 3 stages: the first 5 (the rings' fill), then the
    last ones from 1000 - tail; what is left out is a multiple of the period (lcm(2, 2 x 3))."""
    text = GEMM_FIXED_K.replace("pipelined(4,", "pipelined(1000,")
    k = lower(text, dict(BM=128, BN=128, STAGES=3, PRODUCER=0, PERSISTENT=0)).stages["insert-barriers"]
    ch = check_barriers._Checker(k)
    trips = list(ch.trips(1000))
    assert (ch.fill, ch.period) == (5, 6)
    assert trips[:5] == [0, 1, 2, 3, 4] and trips[-1] == 999 and trips[5] == 1000 - (len(trips) - 5)
    assert (1000 - len(trips)) % 6 == 0 and len(trips) - 5 >= 5
    assert list(ch.trips(16)) == list(range(16))          # up to 2 x fill + period: every trip
    assert len(ch.trips(17)) == 11


def test_an_epilogues_second_store_shares_the_first_ones_tail_choice(monkeypatch):
    """gemm.tile with stream-K and a second output (each tile's row maxima) after C: the
    second store's tail takes the TAIL choice of C's first one (each tail sits between
    barriers of its own), so the epilogue forks a path in two per trip, not in four; the
    check stays complete (before: past 4096 paths, a CheckIncompleteWarning), and the
    path that runs the tails runs both stores' tails."""
    from test_reduce import gemm_with_row_maxima
    consts = dict(BM=128, BN=128, STAGES=3, PRODUCER=1, PERSISTENT=1, STREAM_K=1)
    k = lower(gemm_with_row_maxima(), consts).stages["insert-barriers"]
    tails = [s for s in ir.walk_stmts(k.body) if isinstance(s, ir.StoreTail) and s.chunk == 0]
    assert [s.tensor for s in tails] == ["C", "R"]
    assert check_barriers._forking_tails(k.body) == {id(tails[0])}
    ran = []
    step = check_barriers._Checker.step

    def recording(self, s, st, classes):
        if isinstance(s, ir.StoreTail):
            ran.append(s.tensor)
        return step(self, s, st, classes)
    monkeypatch.setattr(check_barriers._Checker, "step", recording)
    assert check_barriers.run(k, Options()).check_notes == ()
    assert "C" in ran and "R" in ran


def nest(depth, extent):
    """`depth` loops of range(extent), one in the other, a TMA load and store in the
    innermost (the loads' row from the outermost variable, the stores' from the
    innermost)."""
    loops = "".join(f"for i{d} in range({extent}) {{ " for d in range(depth))
    return f"""kernel nest(A: f32[M, N], B: f32[M, N], n: i32) {{
    grid (bx) = (1);
    threads 128;
    shared s: f32[16, 16];
    {loops}copy(A[i0 * 16, 0], s); copy(s, B[i{depth - 1} * 16, 0]); {"} " * depth}
}}
"""


@pytest.mark.parametrize("extent", ["2", "4", "n", "cdiv(M, 16)"])
def test_a_nest_runs_each_loop_a_few_times_per_level(extent, monkeypatch):
    """A loop's run depends on the state it is entered with, and of the env only on what
    it reads: an inner loop entered again at the next trip of the loops around it, in a
    state that differs in their variables only, is run once (`_Checker.loop`), and a
    barrier's state is finite (the parity of its phases, not their count), so that the
    states of two trips a phase apart are equal. The loops run grow by a constant per
    level (3, and 9 where the first loop's extent is unknown). Before, each level ran the
    one inside it once per path of each of its trips: 3 nested range(4) took 20 s to
    check, 4 nested range(n) 15 s and 5 of them 80 s, 6 nested range(2) 70 s."""
    import time
    runs = [0]
    run_loop = check_barriers._Checker.run_loop

    def counted(self, *a):
        runs[0] += 1
        return run_loop(self, *a)
    monkeypatch.setattr(check_barriers._Checker, "run_loop", counted)
    counts = {}
    for depth in (3, 4, 8):
        k = barriers_ir(nest(depth, extent))
        runs[0] = 0
        start = time.perf_counter()
        assert check_barriers.run(k, Options()).check_notes == ()
        assert time.perf_counter() - start < 5
        counts[depth] = runs[0]
    step = counts[4] - counts[3]
    assert 0 < step <= 9 and counts[8] == counts[3] + 5 * step, counts


def _when(var, value):
    """A change wrapping a statement in `if var == value`."""
    return lambda s: ir.If(ir.BinOp("==", ir.Var(var, "loop"), ir.Int(value)), (s,), ())


@pytest.mark.parametrize("extent", ["2", "n"])
@pytest.mark.parametrize("pick, change, message", [
    (ir.MbarrierWait, None, "before its load on mbarrier bar0 was waited on"),
    (ir.FlipPhase, None, "with parity 0, but the phase in flight has parity 1"),
    (ir.ArriveExpectTx, lambda s: replace(s, bytes=s.bytes + 16), "expect-tx is 1040 bytes but its TMA loads bring"),
    (ir.BulkWait, None, "TMA load overwrites 's' while a TMA store may still be reading it"),
    # bugs on some trips of an outer loop only: the loops inside it run again where they read its variable
    (ir.BulkWait, _when("i0", 0), "TMA load overwrites 's' while a TMA store may still be reading it"),
    (ir.FlipPhase, _when("i0", 0), "(a phase bit that was not flipped)"),
    (ir.FlipPhase, _when("i5", 1), "(a phase bit that was not flipped)"),
    (ir.ArriveExpectTx, _when("i2", 1), "which has no arrive.expect_tx for it"),
])
def test_a_deep_nest_still_catches_a_broken_protocol(extent, pick, change, message):
    """Six nested loops (six of range(2): 70 s to check before), their protocol broken
    in the innermost body, everywhere or on some trips of an outer loop: rejected."""
    k = broken(nest(6, extent), lambda s: isinstance(s, pick), change or (lambda s: None))
    err = rejected(k)
    assert message in err.message, err.message
    assert err.span.line == 5


def test_a_deep_nest_still_catches_a_store_left_in_flight():
    k = barriers_ir(nest(6, "n"))
    last = k.body[-1]
    assert isinstance(last, ir.OneThread) and isinstance(last.body[-1], ir.BulkWait)
    err = rejected(replace(k, body=k.body[:-1] + (replace(last, body=last.body[:-1]),)))
    assert "the kernel can exit while a TMA store still reads shared memory" in err.message


def test_a_staging_tile_over_a_patch_the_next_trip_loads_into_is_a_race():
    """examples/conv2d_patch.tile at 48 channels: its rotating loop loads the next tile's
    patch before this tile's store. The epilogue's staging tile placed over the patch
    (what lower-copies once chose, session 54: garbage from the third tile on) races the
    loads into the patch twice, and the check names both (before: it saw only the tile's
    own name, and passed): first the next patch's load, issued while the store still reads
    the staging tile; with that store waited for, the staging write itself, into memory a
    TMA load is filling."""
    k = lower(ROOT / "examples/conv2d_patch.tile", dict(C=48)).stages["insert-barriers"]
    check_barriers.run(k, Options())
    over = replace(k, buffers=tuple(replace(b, alias="p") if b.name == "tl_acc_out" else b for b in k.buffers))
    err = rejected(over)
    assert err.message == ("TMA load overwrites 'p' while a TMA store may still be reading 'tl_acc_out', which "
                           "shares its memory (no wait_group.read)"), err.message
    assert err.span.line == 20
    loads = []

    def second_load_into_p(s):      # (the first is the prologue's, before any store)
        if isinstance(s, ir.OneThread) and any(isinstance(x, ir.TmaLoad) and x.buffer == "p" for x in s.body):
            loads.append(s)
            return len(loads) == 2
        return False
    waited = mutate(over.body, second_load_into_p, lambda s: replace(s, body=(ir.BulkWait(read=True),) + s.body))
    err = rejected(replace(over, body=waited))
    assert err.message == ("threads write 'tl_acc_out', placed over the memory of 'p', while a TMA load into 'p' "
                           "may still be writing it"), err.message
    assert err.span.line == 23


def stem_over_24_channels():
    """examples/conv2d_stem.tile at 24 channels: its loop runs plain (two patches do not
    fit), so the epilogue's staging tile lies over the patch, rightly: the next trip's
    load waits for the store (`wait_group.read`) and comes after the block barriers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.PipelineWarning)
        k = lower(ROOT / "examples/conv2d_stem.tile", dict(C=24)).stages["insert-barriers"]
    assert next(b for b in k.buffers if b.name == "tl_acc_out").alias == "p"
    check_barriers.run(k, Options())
    loop = next(i for i, s in enumerate(k.body) if isinstance(s, ir.For))
    return k, loop


def test_a_load_into_a_patch_while_a_store_reads_the_staging_tile_over_it_is_a_race():
    """Without the loop's `wait_group.read` the next trip's TMA load fills the patch while
    the store still reads the staging tile placed over it: named at the load (before, the
    check saw names only and caught the race later, at the next staging write)."""
    k, loop = stem_over_24_channels()
    body = mutate(k.body[loop].body, lambda s: isinstance(s, ir.BulkWait), lambda s: None)
    err = rejected(replace(k, body=k.body[:loop] + (replace(k.body[loop], body=body),) + k.body[loop + 1:]))
    assert err.message == ("TMA load overwrites 'p' while a TMA store may still be reading 'tl_acc_out', which "
                           "shares its memory (no wait_group.read)"), err.message
    assert err.span.line == 21


def test_a_load_into_a_patch_that_threads_wrote_through_a_staging_tile_needs_a_barrier():
    """The epilogue's staging write with nothing after it in the trip (no barrier, no
    store): the next trip's TMA load into the patch would race the threads still writing
    the staging tile over it. The old check passed this kernel."""
    k, loop = stem_over_24_channels()
    body = k.body[loop].body
    at = next(i for i, s in enumerate(body) if isinstance(s, ir.ThreadCopy))
    err = rejected(replace(k, body=k.body[:loop] + (replace(k.body[loop], body=body[:at + 1]),) + k.body[loop + 1:]))
    assert err.message == ("TMA load overwrites 'p', whose memory threads used through 'tl_acc_out', without a "
                           "block barrier in between"), err.message
    assert err.span.line == 21
