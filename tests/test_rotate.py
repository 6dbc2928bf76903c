"""Rotating pipelines: a `pipelined` loop whose body is TMA loads and then anything
that loads nothing (no gemm) gets S copies of its loaded tiles, iteration k using
copy k % S, its loads issued S - 1 iterations ahead (plan-pipeline marks the loop,
insert-barriers unrolls it by S). Which loops rotate, the IR they become, the
interpreter against numpy over trip counts around S, and check-barriers catching a
broken one. tests/test_gpu_rotate.py runs the same kernels on the GPU."""
import warnings
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tilec
from tilec.compiler import lower
from tilec.ir import nodes as ir
from tilec.ir.printer import kernel as show
from tilec.passes import Options, check_barriers
from tilec.passes.check_barriers import BarrierBug

from conftest import ROOT

from guard import guarded

# Y[i, j] = A[0, i, j] + A[1, i, j] + ... in float, k in order: every iteration must
# see its own tile (a stale copy, or the next one, changes the bits)
KSUM = """
kernel ksum(A: f32[K, M, N], Y: f32[M, N]) {{
    const BM = 8, BN = 32;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared a: f32[BM, BN];
    local acc: f32[BM, BN];
    fill(acc, 0.0);
    for k in {loop} {{
        copy(A[k, by * BM, bx * BN], a);
        parallel (i, j) in (BM, BN) {{
            acc[i, j] = acc[i, j] + a[i, j];
        }}
    }}
    copy(acc, Y[by * BM, bx * BN]);
}}
"""


# Y[k] = 2 * A[k], tile by tile: a store in the rotating body, from another tile
# (`y`) or from the rotating tile itself (`a`, whose next refill must wait for it)
TWICE = """
kernel twice(A: f32[K, M, N], Y: f32[K, M, N]) {{
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared a: f32[8, 32];
    shared {out}: f32[8, 32];
    for k in pipelined(K, stages = {stages}) {{
        copy(A[k, by * 8, bx * 32], a);
        parallel (i, j) in (8, 32) {{
            {out}[i, j] = a[i, j] * 2.0;
        }}
        copy({out}, Y[k, by * 8, bx * 32]);
    }}
}}
"""


# Y[r] = A[r] + A[r + 1] + ... + A[K - 1]: a rotating loop inside another loop, of
# a different count on every trip, so the copies' barriers complete different
# numbers of phases per trip (their phase registers carry them from trip to trip)
NESTED = """
kernel tails(A: f32[K, M, N], Y: f32[R, M, N]) {{
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared a: f32[8, 32];
    local acc: f32[8, 32];
    for r in range(R) {{
        fill(acc, 0.0);
        for k in pipelined(K - r, stages = {stages}) {{
            copy(A[k + r, by * 8, bx * 32], a);
            parallel (i, j) in (8, 32) {{
                acc[i, j] = acc[i, j] + a[i, j];
            }}
        }}
        copy(acc, Y[r, by * 8, bx * 32]);
    }}
}}
"""


# A[k + 1] = A[k] + 1 down the loop (CHAIN: each iteration reads what the one
# before wrote, so its load cannot go out early), or A[k] *= 2 in place (RMW: each
# iteration reads its tile before it writes it, and no other iteration touches it)
CHAIN = """
kernel chain(A: f32[K, M, N]) {{
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared a: f32[8, 32];
    {ydecl} y: f32[8, 32];
    for k in pipelined(K - 1, stages = 2) {{
        copy(A[k, by * 8, bx * 32], a);
        parallel (i, j) in (8, 32) {{
            y[i, j] = a[i, j] + 1.0;
        }}
        copy(y, A[k + 1, by * 8, bx * 32]);
    }}
}}
"""

RMW = """
kernel rmw(A: f32[K, M, N]) {
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared a: f32[8, 32];
    for k in pipelined(K, stages = 2) {
        copy(A[k, by * 8, bx * 32], a);
        parallel (i, j) in (8, 32) {
            a[i, j] = a[i, j] * 2.0;
        }
        copy(a, A[k, by * 8, bx * 32]);
    }
}
"""


def chain(ydecl):
    return CHAIN.format(ydecl=ydecl)


def nested(stages):
    return NESTED.format(stages=stages)


def tails_reference(a, rows):
    return np.stack([ksum_reference(a[r:]) for r in range(rows)]) if rows else np.zeros((0,) + a.shape[1:],
                                                                                         np.float32)


def twice(stages, out):
    src = TWICE.format(stages=stages, out=out)
    return src.replace("    shared a: f32[8, 32];\n    shared a: f32[8, 32];\n", "    shared a: f32[8, 32];\n")


def ksum(stages):
    return KSUM.format(loop=f"pipelined(K, stages = {stages})" if stages else "range(K)")


def ksum_reference(a):
    """The float sum over k in order (np.add.accumulate runs left to right)."""
    out = np.zeros(a.shape[1:], np.float32)
    for x in a:
        out = out + x
    return out


def buffers(src, **consts):
    return {b.name for b in lower(src, consts).kernel.buffers}


def after(src, name):
    return lower(src).stages[name]


# ---------------------------------------------------------------- which loops rotate

@pytest.mark.parametrize("stages", [2, 3, 4])
def test_a_pipelined_loop_of_another_body_gets_a_copy_per_stage(stages):
    assert buffers(ksum(stages)) == {"a", "acc"} | {f"tl_a_stage{j}" for j in range(1, stages)}
    loop = next(s for s in after(ksum(stages), "plan-pipeline").body if isinstance(s, ir.For))
    assert loop.rotate and not loop.ring


@pytest.mark.parametrize("src", [
    ksum(None),                                                         # range: a plain loop
    ksum(1),                                                            # one stage: nothing to rotate
    ksum(2).replace("    copy(acc, Y", "    copy(a, Y[0, 0]);\n    copy(acc, Y"),   # a used after the loop
    ksum(2).replace("            acc[i, j] = acc[i, j] + a[i, j];\n        }",
                    "            acc[i, j] = acc[i, j] + a[i, j];\n        }\n        copy(A[k, 0, 0], a);"),
], ids=["range", "one stage", "used after", "loads after"])
def test_loops_that_do_not_rotate_run_plain(src):
    try:
        names = buffers(src)
    except tilec.TilecError:        # a load after the body's first statements may be refused elsewhere
        return
    assert not any(n.startswith("tl_a_stage") for n in names)


def plain_loop_warnings(src, **consts):
    """The tilec.PipelineWarning messages of compiling `src` (the TMA variant)."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        lower(src, consts)
    return [str(w.message) for w in said if issubclass(w.category, tilec.PipelineWarning)]


LOOP = ":9:5: this pipelined loop (stages = 2) runs as a plain loop: "


@pytest.mark.parametrize("src, why", [
    (ksum(2).replace("    copy(acc, Y", "    copy(a, Y[0, 0]);\n    copy(acc, Y"),
     "tile 'a', which it loads, is used outside the loop as well"),
    (ksum(2).replace("            acc[i, j] = acc[i, j] + a[i, j];\n        }",
                     "            acc[i, j] = acc[i, j] + a[i, j];\n        }\n        copy(A[k, 0, 0], a);"),
     "the load into tile 'a' (line 14) cannot move ahead of line 11, which reads tile 'a' (only loads that start "
     "the body, or can move there, run ahead)"),
    (ksum(2).replace("        copy(A[k, by * BM, bx * BN], a);\n", "        fill(a, 1.0);\n"),
     "its body does not start with a TMA load (a copy from a tensor into a shared tile)"),
    (ksum(2).replace("        copy(A[k, by * BM, bx * BN], a);\n",
                     "        copy(A[k, by * BM, bx * BN], a);\n        copy(A[k, by * BM, bx * BN], a);\n"),
     "it loads tile 'a' more than once"),
    (chain("shared"), "it loads from A, which the kernel also writes other than in place"),
], ids=["used after", "loads after", "no load first", "loaded twice", "reads what it wrote"])
def test_a_loop_that_runs_plain_says_why(src, why):
    """A pipelined loop of 2 or more stages that runs as a plain loop is a
    tilec.PipelineWarning at the loop's line and column, with the reason."""
    said = plain_loop_warnings(src)
    loop = LOOP.replace(":9:", ":7:") if "kernel chain" in src else LOOP
    assert len(said) == 1 and loop + why in said[0], said


TWO_LOOPS = """
kernel two(A: f32[K, M, N], Y: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 128), cdiv(M, 128));
    threads 128;
    shared a: f32[128, 128];
    shared b: f32[8, 32];
    local acc: f32[128, 128];
    local acc2: f32[8, 32];
    fill(acc, 0.0);
    fill(acc2, 0.0);
    for k in pipelined(K, stages = 4) {
        copy(A[k, by * 128, bx * 128], a);
        parallel (i, j) in (128, 128) {
            acc[i, j] = acc[i, j] + a[i, j];
        }
    }
    for k in pipelined(K, stages = 2) {
        copy(A[k, by * 8, bx * 32], b);
        parallel (i, j) in (8, 32) {
            acc2[i, j] = acc2[i, j] + b[i, j];
        }
    }
    copy(b, Y[0, 0]);
    copy(acc2, Y[0, 32]);
    copy(acc, Y[by * 128, bx * 128]);
}
"""


def test_each_plain_loop_gives_its_own_reason():
    """The first loop's 4 copies of a 64 KiB tile do not fit (so no loop rotates); the
    second would not rotate anyway, and says its own reason."""
    said = plain_loop_warnings(TWO_LOOPS)
    assert [m.split(": ", 1)[1].split(": ", 1) for m in said] == [
        ["this pipelined loop (stages = 4) runs as a plain loop", "the stages' copies of the tiles it loads do not "
         "fit in shared memory (shared tiles need 263168 bytes, and 1024 more for 1 mbarrier (static shared memory "
         "counts in 1024-byte steps); a Hopper block has at most 232448 bytes of shared memory)"],
        ["this pipelined loop (stages = 2) runs as a plain loop", "tile 'b', which it loads, is used outside the "
         "loop as well (line 23), where it could read what the loop leaves in it (elsewhere it may be used only "
         "in loops whose bodies start by loading it and hold no gemm)"]], said
    assert [m.split(": ")[0] for m in said] == ["<string>:11:5", "<string>:17:5"]


# acc = A[0] + ... + A[K - 1], then acc = acc * 0.5 + A[k] for k from K - 1 down to 0:
# two loops that load the same tile `a`, each iteration all of it before reading it,
# so what one leaves in `a` is never read and both rotate over the tile's copies
SHARED = """
kernel shared_tile(A: f32[K, M, N], Y: f32[M, N]) {{
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared a: f32[8, 32];
    local acc: f32[8, 32];
    fill(acc, 0.0);
    for k in {first} {{
        copy(A[k, by * 8, bx * 32], a);
        parallel (i, j) in (8, 32) {{
            acc[i, j] = acc[i, j] + a[i, j];
        }}
    }}
    for k in {second} {{
        copy(A[K - 1 - k, by * 8, bx * 32], a);
        parallel (i, j) in (8, 32) {{
            acc[i, j] = acc[i, j] * 0.5 + a[i, j];
        }}
    }}
    copy(acc, Y[by * 8, bx * 32]);
}}
"""


def shared_tile(first, second):
    """SHARED with each loop `pipelined` of that many stages, or `range` for None."""
    loop = {s: f"pipelined(K, stages = {s})" if s else "range(K)" for s in (first, second)}
    return SHARED.format(first=loop[first], second=loop[second])


def shared_tile_reference(a):
    acc = ksum_reference(a)
    for x in a[::-1]:
        acc = acc * np.float32(0.5) + x
    return acc


@pytest.mark.parametrize("first, second", [(2, 3), (3, 2), (2, 2), (None, 3), (3, None)])
def test_loops_that_load_a_tile_first_share_its_copies(first, second):
    """Each loop that asks for stages rotates; the tile has as many copies as the
    deepest of them asks for; no warning."""
    src = shared_tile(first, second)
    copies = max(first or 1, second or 1)
    assert buffers(src) == {"a", "acc"} | {f"tl_a_stage{j}" for j in range(1, copies)}
    loops = [s for s in after(src, "plan-pipeline").body if isinstance(s, ir.For)]
    assert [x.rotate for x in loops] == [first is not None, second is not None]
    assert plain_loop_warnings(src) == []


@pytest.mark.parametrize("first, second", [(2, 3), (3, 2), (4, 2), (None, 3), (3, None)])
@pytest.mark.parametrize("trips", [0, 1, 2, 3, 5, 7])
def test_loops_that_share_a_tile_each_see_their_own_tiles(first, second, trips):
    a = np.random.default_rng(trips).standard_normal((trips, 20, 72)).astype(np.float32)
    y = guarded((20, 72), np.float32, like="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error" if trips else "ignore", tilec.TmaFallbackWarning)
        tilec.compile(shared_tile(first, second), backend="interpret")(a, y.view)
    y.check()
    assert np.array_equal(y.view, shared_tile_reference(a))


@pytest.mark.parametrize("src, line, loop", [
    # the second loop reads `a` before it loads it: its first iteration reads what
    # the first loop left (which copy that is depends on K)
    (shared_tile(2, 2).replace("        copy(A[K - 1 - k, by * 8, bx * 32], a);\n", "").replace(
        "acc[i, j] * 0.5 + a[i, j];\n        }\n",
        "acc[i, j] * 0.5 + a[i, j];\n        }\n        copy(A[K - 1 - k, by * 8, bx * 32], a);\n"), 16, "8:5"),
    # a loop that loads `a` first holds the rotating loop, and reads `a` after it
    ("""
kernel outer(A: f32[K, M, N], Y: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared a: f32[8, 32];
    local acc: f32[8, 32];
    fill(acc, 0.0);
    for r in range(2) {
        copy(A[r, by * 8, bx * 32], a);
        for k in pipelined(K, stages = 2) {
            copy(A[k, by * 8, bx * 32], a);
            parallel (i, j) in (8, 32) {
                acc[i, j] = acc[i, j] + a[i, j];
            }
        }
        parallel (i, j) in (8, 32) {
            acc[i, j] = acc[i, j] + a[i, j];
        }
    }
    copy(acc, Y[by * 8, bx * 32]);
}
""", 17, "10:9"),
], ids=["read before its load", "loop inside a loop that loads it"])
def test_a_tile_read_where_a_rotation_left_it_runs_plain(src, line, loop):
    said = [m for m in plain_loop_warnings(src) if f":{loop}: " in m]
    assert len(said) == 1 and said[0].endswith(
        f"tile 'a', which it loads, is used outside the loop as well (line {line}), where it could read what the "
        "loop leaves in it (elsewhere it may be used only in loops whose bodies start by loading it and hold no gemm)"), said
    assert not any(n.startswith("tl_a_stage") for n in buffers(src))


def test_a_disk_cache_hit_says_it_again(tmp_path, monkeypatch):
    """The warning comes with every compile, from NVRTC or from the disk cache; the
    thread-copy variant (every loop plain, by design) adds none."""
    from tilec.errors import Source
    from tilec.kernel import _CACHE
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path))
    src = Source("ksum.tile", ksum(2).replace("    copy(acc, Y", "    copy(a, Y[0, 0]);\n    copy(acc, Y"))
    for hit in (False, True):
        _CACHE.clear()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            k = tilec.compile(src, arch="sm_90a")
            assert k.fallback.cubin
        assert k.from_disk_cache == hit
        plain = [str(w.message) for w in said if issubclass(w.category, tilec.PipelineWarning)]
        assert plain == ["ksum.tile:9:5: this pipelined loop (stages = 2) runs as a plain loop: tile 'a', which it "
                         "loads, is used outside the loop as well (line 15), where it could read what the loop "
                         "leaves in it (elsewhere it may be used only in loops whose bodies start by loading it and hold no gemm)"], plain


@pytest.mark.parametrize("src", [ksum(None), ksum(1), ksum(2), ksum(3), RMW], ids=["range", "one stage", "2", "3", "rmw"])
def test_loops_that_rotate_or_ask_for_one_stage_say_nothing(src):
    assert plain_loop_warnings(src) == []


def test_the_gemm_examples_say_nothing():
    """Every candidate of gemm.tile's tune space that its where clause admits for a
    big gemm is a ring: none warns."""
    for consts in (dict(BM=128, BN=256, STAGES=4, PRODUCER=1, PERSISTENT=1, STREAM_K=0, BK=64),
                   dict(BM=192, BN=128, STAGES=3, PRODUCER=0, PERSISTENT=0, STREAM_K=0, BK=64)):
        assert plain_loop_warnings((ROOT / "examples/gemm.tile").read_text(), **consts) == []


@pytest.mark.parametrize("stages", [2, 3])
def test_a_loop_inside_another_loop_rotates(stages):
    assert buffers(nested(stages)) == {"a", "acc"} | {f"tl_a_stage{j}" for j in range(1, stages)}


def test_a_kernel_with_a_producer_warpgroup_rotates_nothing():
    """Its consumers' one-thread blocks are not thread 0's: a rotating loop beside a
    producer's ring runs plain."""
    src = (ROOT / "examples/gemm.tile").read_text()
    k = lower(src, dict(BM=128, BN=128, STAGES=3, PRODUCER=1, PERSISTENT=1, STREAM_K=0, BK=64)).kernel
    assert not any("_stage" in b.name for b in k.buffers)


@pytest.mark.parametrize("ydecl", ["shared", "local"])
def test_a_loop_that_reads_what_it_wrote_runs_plain(ydecl):
    """Iteration k + 1 loads the tile iteration k stored: issued early, that load
    would read A before the store (on the H100: 20 of 20 runs wrong). The kernel
    writes A in other tiles than it reads, so the loop does not rotate."""
    assert buffers(chain(ydecl)) == {"a", "y"}
    a = np.zeros((6, 20, 72), np.float32)
    tilec.compile(chain(ydecl), backend="interpret")(a)
    assert np.array_equal(a, np.broadcast_to(np.arange(6, dtype=np.float32)[:, None, None], a.shape))


def test_a_loop_in_place_tile_by_tile_still_rotates():
    assert "tl_a_stage1" in buffers(RMW)
    a = np.random.default_rng(0).standard_normal((5, 20, 72)).astype(np.float32)
    want = a * 2
    tilec.compile(RMW, backend="interpret")(a)
    assert np.array_equal(a, want)


def test_copies_that_do_not_fit_leave_a_plain_loop():
    """64 KiB tiles: 3 copies fit a block's shared memory, 4 do not (the loop then
    runs plain, as before rotation, instead of failing to compile)."""
    big = ksum(3).replace("const BM = 8, BN = 32;", "const BM = 128, BN = 128;")
    assert "tl_a_stage2" in buffers(big)
    names = buffers(big.replace("stages = 3", "stages = 4"))
    assert names == {"a", "acc"}
    said = plain_loop_warnings(big.replace("stages = 3", "stages = 4"))
    assert len(said) == 1 and ":9:5: this pipelined loop (stages = 4) runs as a plain loop: the stages' copies of " \
        "the tiles it loads do not fit in shared memory (" in said[0], said


def test_a_gemm_loop_is_still_a_ring():
    k = lower(ROOT / "examples/gemm.tile", dict(BM=128, BN=128, STAGES=3, PRODUCER=0, PERSISTENT=0, STREAM_K=0,
                                                  BK=64)).kernel
    assert not any(b.name.startswith("tl_") and "_stage" in b.name for b in k.buffers)


# ---------------------------------------------------------------- the IR

def test_the_ring_of_copies_in_the_ir():
    """Prologue: iterations 0 .. S-2 into copies 0 .. S-2; a trip loop unrolled by S:
    refill the previous copy S - 1 iterations ahead after a block barrier, wait on
    copy j's barrier with the parity in its phase register, the body on copy j."""
    text = show(after(ksum(3), "insert-barriers"))
    assert "for tl_k_trip in range((K + 2) / 3) {" in text
    for j in range(3):
        assert f"mbarrier full{j} arrivals 1 phase register" in text
        assert f"mbarrier.try_wait.parity full{j}, phase(full{j})  // line 9\n      phase(full{j}) ^= 1\n" in text
    assert "tma.load.tile tl_a_stage2 <- A[tl_k_trip * 3 + 2, by * 8, bx * 32]" in text
    assert "acc[i, j] = acc[i, j] + tl_a_stage1[i, j]" in text


# ---------------------------------------------------------------- the interpreter

@pytest.mark.parametrize("stages", [None, 2, 3, 4])
@pytest.mark.parametrize("trips", [0, 1, 2, 3, 4, 5, 9])
def test_every_iteration_sees_its_own_tile(stages, trips):
    rng = np.random.default_rng(trips * 10 + (stages or 0))
    a = rng.standard_normal((trips, 20, 72)).astype(np.float32)      # rows of 288 bytes: TMA
    y = guarded((20, 72), np.float32, like="numpy")
    k = tilec.compile(ksum(stages), backend="interpret")
    with warnings.catch_warnings():
        # no trips: an empty A, which no tensor map describes (the thread-copy variant runs)
        warnings.simplefilter("error" if trips else "ignore", tilec.TmaFallbackWarning)
        k(a, y.view)
    y.check()
    assert np.array_equal(y.view, ksum_reference(a)) if trips else (y.view == 0).all()


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("trips, rows", [(0, 0), (0, 1), (1, 2), (3, 4), (4, 5), (5, 3), (7, 8), (9, 6)])
def test_a_nested_rotation_keeps_every_phase(stages, trips, rows):
    """Trip r of the outer loop runs K - r iterations: copy j's barrier completes a
    count of phases that changes from trip to trip (a parity computed from the
    inner trip alone would wait on a stale phase, or hang)."""
    rng = np.random.default_rng(trips * 10 + rows)
    a = rng.standard_normal((trips, 20, 72)).astype(np.float32)
    y = guarded((rows, 20, 72), np.float32, like="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error" if trips else "ignore", tilec.TmaFallbackWarning)
        tilec.compile(nested(stages), backend="interpret")(a, y.view)
    y.check()
    assert np.array_equal(y.view, tails_reference(a, rows))


def check_rowsum(k, shape):
    """Interpreted rowsum kernel `k` (it rotates) on a random [M, N] against numpy:
    sums within float rounding, maxima exact, no TMA fallback, outputs guarded."""
    assert "tl_x_stage1" in k.cuda_source
    x = (np.random.default_rng(1).standard_normal(shape) - 4).astype(np.float32)
    sums, maxes = guarded(shape[:1], np.float32, like="numpy"), guarded(shape[:1], np.float32, like="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        k(x, sums.view, maxes.view)
    sums.check()
    maxes.check()
    np.testing.assert_allclose(sums.view, x.astype(np.float64).sum(1), rtol=1e-4, atol=1e-3)
    assert np.array_equal(maxes.view, x.max(1))


@pytest.mark.parametrize("shape", [(9, 700), (4, 2000), (7, 256), (2, 5000), (1, 4)])
def test_rowsum_example_rotates(shape):
    check_rowsum(tilec.compile(str(ROOT / "examples/rowsum.tile"), backend="interpret"), shape)


@pytest.mark.parametrize("out", ["y", "a"])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("trips", [0, 1, 2, 3, 5])
def test_a_store_in_the_rotating_body(out, stages, trips):
    """The store's tile (another one, or the rotating copy itself) is read by TMA
    after the body: check-barriers proves the waits (wait_group.read before a
    refill overwrites a copy a store still reads), the interpreter gives 2 * A."""
    src = twice(stages, out)
    assert "tl_a_stage1" in buffers(src)
    a = np.random.default_rng(trips).standard_normal((trips, 20, 72)).astype(np.float32)
    y = guarded((trips, 20, 72), np.float32, like="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error" if trips else "ignore", tilec.TmaFallbackWarning)
        tilec.compile(src, backend="interpret")(a, y.view)
    y.check()
    assert np.array_equal(y.view, a * 2)


@pytest.mark.parametrize("src", [ksum(3), twice(2, "a"), twice(3, "y"), nested(3)],
                         ids=["ksum", "twice a", "twice y", "nested"])
def test_rotating_kernels_compile_with_an_empty_log(src):
    k = tilec.compile(src, arch="sm_90a")
    assert k.compile_log == ""
    assert "tl_full0" in k.cuda_source


# ---------------------------------------------------------------- check-barriers

def _without(body, drop):
    out = []
    for s in body:
        if drop(s):
            continue
        nested = {f: _without(getattr(s, f), drop) for f in ir.STMT_BLOCK_FIELDS.get(type(s), ())}
        out.append(replace(s, **nested) if nested else s)
    return tuple(out)


@pytest.mark.parametrize("src", [ksum(3), nested(3), shared_tile(2, 3)], ids=["ksum", "nested", "shared tile"])
@pytest.mark.parametrize("what, drop", [
    ("a wait", lambda s: isinstance(s, ir.MbarrierWait) and s.barrier == "full1"),
    ("a phase flip", lambda s: isinstance(s, ir.FlipPhase) and s.barrier == "full2"),
    ("the block barrier before a refill", lambda s: isinstance(s, ir.SyncThreads)),
])
def test_check_barriers_catches_a_broken_rotation(src, what, drop):
    k = after(src, "insert-barriers")
    check_barriers.run(k, Options())
    broken = replace(k, body=_without(k.body, drop))
    with pytest.raises(BarrierBug):
        check_barriers.run(broken, Options())


def _parity_of_the_trip(body):
    """`body` with each rotating wait's phase register replaced by tl_k_trip % 2."""
    out = []
    for s in body:
        if isinstance(s, ir.FlipPhase):
            continue
        if isinstance(s, ir.MbarrierWait) and s.parity is None:
            s = replace(s, parity=ir.BinOp("%", ir.Var("tl_k_trip", "loop"), ir.Int(2)))
        nested_ = {f: _parity_of_the_trip(getattr(s, f)) for f in ir.STMT_BLOCK_FIELDS.get(type(s), ())}
        out.append(replace(s, **nested_) if nested_ else s)
    return tuple(out)


def test_a_parity_from_the_inner_trip_holds_only_outside_other_loops():
    """Waiting with parity tl_k_trip % 2 is right for a loop that runs once per
    block, and wrong inside another loop whose trips run different counts: the
    phase registers are what makes the nested rotation right."""
    flat = after(ksum(3), "insert-barriers")
    check_barriers.run(replace(flat, body=_parity_of_the_trip(flat.body)), Options())
    k = after(nested(3), "insert-barriers")
    with pytest.raises(BarrierBug, match="parity"):
        check_barriers.run(replace(k, body=_parity_of_the_trip(k.body)), Options())


# ---------------------------------------------------------------- a gemm in a rotating body

# C = sum over K blocks k of (A_k @ B_k^T) * SA[k, i] * SB[k, j]: each K block's gemm
# into `part`, then threads add it to `acc` with a per-row and a per-column scale (a
# block-scaled fp8 gemm: no ring, as the body does more than gemms; it rotates)
SCALED = """
kernel scaled(A: f8e4m3[M, K], B: f8e4m3[N, K], SA: f32[KB, M], SB: f32[KB, N], C: f16[M, N]) {
    const BM = 128, BN = 128, BK = 128, STAGES = 3;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128 * BM / 64;
    shared a: f8e4m3[BM, BK];
    shared b: f8e4m3[BN, BK];
    shared sa: f32[BM];
    shared sb: f32[BN];
    local part: f32[BM, BN];
    local acc: f32[BM, BN];
    fill(acc, 0.0);
    for k in pipelined(cdiv(K, BK), stages = STAGES) {
        copy(A[by * BM, k * BK], a);
        copy(B[bx * BN, k * BK], b);
        copy(SA[k, by * BM], sa);
        copy(SB[k, bx * BN], sb);
        fill(part, 0.0);
        gemm(a, b, part, transpose_b = true);
        parallel (i, j) in (BM, BN) {
            acc[i, j] = acc[i, j] + part[i, j] * (sa[i] * sb[j]);
        }
    }
    copy(acc, C[by * BM, bx * BN]);
}
"""


def scaled_operands(m, n, kdim, seed=0):
    import ml_dtypes
    rng = np.random.default_rng(seed)
    kb = -(-kdim // 128)
    return (rng.standard_normal((m, kdim)).astype(ml_dtypes.float8_e4m3fn),
            rng.standard_normal((n, kdim)).astype(ml_dtypes.float8_e4m3fn),
            rng.uniform(0.5, 2, (kb, m)).astype(np.float32), rng.uniform(0.5, 2, (kb, n)).astype(np.float32))


def scaled_reference(a, b, sa, sb):
    """In float64: each K block's product, scaled by its row's and column's scales."""
    out = np.zeros((a.shape[0], b.shape[0]))
    for k in range(sa.shape[0]):
        s = slice(k * 128, (k + 1) * 128)
        out += (a[:, s].astype(np.float64) @ b[:, s].astype(np.float64).T) * sa[k][:, None] * sb[k][None, :]
    return out


@pytest.mark.parametrize("bm", [64, 128])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_a_gemm_and_more_in_the_body_rotates(bm, stages):
    """Loads, a gemm and a `parallel`: no ring (the body does more than gemms), but
    its loads run ahead over `stages` copies of every loaded tile, swizzled gemm
    operands included; no warning."""
    src = SCALED
    assert plain_loop_warnings(src, BM=bm, STAGES=stages) == []
    k = lower(src, dict(BM=bm, STAGES=stages)).kernel
    loop = next(s for s in lower(src, dict(BM=bm, STAGES=stages)).stages["plan-pipeline"].body
                if isinstance(s, ir.For))
    assert loop.rotate and not loop.ring
    copies = {b.name: b for b in k.buffers if b.name.startswith("tl_") and "_stage" in b.name}
    assert set(copies) == {f"tl_{t}_stage{j}" for t in ("a", "b", "sa", "sb") for j in range(1, stages)}
    assert all(copies[f"tl_a_stage{j}"].layout == k.buffer("a").layout for j in range(1, stages))


@pytest.mark.parametrize("bm, stages", [(64, 2), (128, 3), (64, 4), (128, 1)])
@pytest.mark.parametrize("shape", [(128, 128, 384), (200, 136, 304), (64, 128, 128), (72, 8, 720)])
def test_a_rotating_gemm_body_in_the_interpreter(bm, stages, shape):
    m, n, kdim = shape
    a, b, sa, sb = scaled_operands(m, n, kdim, seed=kdim)
    c = guarded((m, n), np.float16, like="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(SCALED, backend="interpret", BM=bm, STAGES=stages)(a, b, sa, sb, c.view)
    c.check()
    want = scaled_reference(a, b, sa, sb)
    np.testing.assert_allclose(c.view.astype(np.float64), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


# a rotating body whose threads never touch the accumulator: only the next refill
# of the operands can race the wgmma
COUNTED = """
kernel counted(A: f16[M, K], B: f16[K, N], C: f32[M, N], R: f32[M]) {
    grid (bx, by) = (cdiv(N, 64), cdiv(M, 64));
    threads 128;
    shared a: f16[64, 64];
    shared b: f16[64, 64];
    shared rows: f32[64];
    local acc: f32[64, 64];
    fill(acc, 0.0);
    fill(rows, 0.0);
    for k in pipelined(cdiv(K, 64), stages = 2) {
        copy(A[by * 64, k * 64], a);
        copy(B[k * 64, bx * 64], b);
        gemm(a, b, acc);
        parallel (i) in (64) {
            rows[i] = rows[i] + f32(a[i, 0]);
        }
    }
    copy(acc, C[by * 64, bx * 64]);
    copy(rows, R[by * 64]);
}
"""


@pytest.mark.parametrize("src, broken", [
    (SCALED, "threads use 'part' while a wgmma may still write it"),
    (COUNTED, "TMA load overwrites 'a' while a wgmma may still read it"),
], ids=["accumulator read", "operand refilled"])
def test_check_barriers_catches_a_gemm_left_in_flight(src, broken):
    """Without the wgmma.wait_group after the gemm, threads would read the
    accumulator while the tensor cores write it, or TMA refill an operand they
    still read."""
    k = after(src, "insert-barriers")
    check_barriers.run(k, Options())
    with pytest.raises(BarrierBug, match=broken):
        check_barriers.run(replace(k, body=_without(k.body, lambda s: isinstance(s, ir.WgmmaWait))), Options())


def counted_operands(m, n, kdim):
    rng = np.random.default_rng(kdim)
    return rng.standard_normal((m, kdim)).astype(np.float16), rng.standard_normal((kdim, n)).astype(np.float16)


def counted_reference(a, b):
    """C = A @ B in float64, R[i] = A[i, 0] + A[i, 64] + ... in f32, in order."""
    rows = np.zeros(a.shape[0], np.float32)
    for k in range(0, a.shape[1], 64):
        rows = rows + a[:, k].astype(np.float32)
    return a.astype(np.float64) @ b.astype(np.float64), rows


@pytest.mark.parametrize("shape", [(64, 64, 64), (100, 72, 320), (128, 200, 200)])
def test_a_rotating_gemm_body_reads_its_operand(shape):
    """The body's threads read elements of a swizzled operand the gemm also reads."""
    m, n, kdim = shape
    a, b = counted_operands(m, n, kdim)
    c, r = guarded((m, n), np.float32, like="numpy"), guarded((m,), np.float32, like="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(COUNTED, backend="interpret")(a, b, c.view, r.view)
    c.check()
    r.check()
    want_c, want_r = counted_reference(a, b)
    np.testing.assert_allclose(c.view, want_c, rtol=1e-3, atol=1e-3 * np.abs(want_c).max())
    assert np.array_equal(r.view, want_r)


@pytest.mark.parametrize("fill, folded", [("0.0", True), ("0", True), ("-0.0", False), ("1.0", False)])
def test_a_zero_fill_just_before_a_gemm_folds_into_it(fill, folded):
    """`fill(part, 0); gemm(a, b, part)` is one gemm whose first K step's wgmmas
    ignore part (scale-d 0): no thread zeroes its registers. Another value, or
    -0.0 (whose sum with a -0.0 product stays -0.0), stays a fill."""
    src = SCALED.replace("fill(part, 0.0);", f"fill(part, {fill});")
    k = lower(src, dict(BM=64, STAGES=2)).stages["plan-gemm"]
    loop = next(s for s in k.body if isinstance(s, ir.For))
    gemm = next(s for s in loop.body if isinstance(s, ir.Gemm))
    assert gemm.zero == folded
    assert any(isinstance(s, ir.Fill) and s.buffer == "part" for s in loop.body) != folded
    cuda = tilec.compile(src, arch="sm_90a", BM=64, STAGES=2).cuda_source
    # per copy of the unrolled body: the first of its 4 K steps (k32 each) zeroes, the other 3 add
    assert cuda.count("wgmma_m64n128k32_f8e4m3_bk_zero(part") == (2 if folded else 0)
    assert cuda.count("wgmma_m64n128k32_f8e4m3_bk(part") == (6 if folded else 8)


def test_a_fill_apart_from_the_gemm_stays():
    src = SCALED.replace("        fill(part, 0.0);\n", "").replace(
        "        copy(SA[k, by * BM], sa);\n", "        copy(SA[k, by * BM], sa);\n        fill(part, 0.0);\n"
        "        parallel (i) in (BM) {\n            sa[i] = sa[i] * 2.0;\n        }\n")
    k = lower(src, dict(BM=64, STAGES=2)).stages["plan-gemm"]
    assert not any(isinstance(s, ir.Gemm) and s.zero for s in ir.walk_stmts(k.body))


# ---------------------------------------------------------------- a tile shared between loops, at random

SHARED_PIECES = {
    # a loop that loads `a` first, forward or backward over A, its stages drawn
    "loop": "    for k in {loop} {{\n        copy(A[{k}, by * 8, bx * 32], a);\n"
            "        parallel (i, j) in (8, 32) {{\n            acc[i, j] = acc[i, j] * 0.5 + a[i, j];\n        }}\n"
            "    }}\n",
    # the same loop inside another one
    "nested": "    for z in range(2) {{\n        for k in {loop} {{\n            copy(A[{k}, by * 8, bx * 32], a);\n"
              "            parallel (i, j) in (8, 32) {{\n                acc[i, j] = acc[i, j] - a[i, j];\n"
              "            }}\n        }}\n    }}\n",
    # a loop that loads `a` first and holds a loop loading it, then reads what that one left
    "holds": "    for z in range(2) {{\n        copy(A[0, by * 8, bx * 32], a);\n        for k in {loop} {{\n"
             "            copy(A[{k}, by * 8, bx * 32], a);\n            parallel (i, j) in (8, 32) {{\n"
             "                acc[i, j] = acc[i, j] + a[i, j];\n            }}\n        }}\n"
             "        parallel (i, j) in (8, 32) {{\n            acc[i, j] = acc[i, j] * 3.0 + a[i, j];\n"
             "        }}\n    }}\n",
    # a loop that reads `a` before loading it (what the statement before left in it)
    "reads first": "    for k in {loop} {{\n        parallel (i, j) in (8, 32) {{\n"
                   "            acc[i, j] = acc[i, j] + a[i, j] * 0.25;\n        }}\n"
                   "        copy(A[{k}, by * 8, bx * 32], a);\n    }}\n",
    # statements outside every loop that read or write `a`
    "read": "    parallel (i, j) in (8, 32) {{\n        acc[i, j] = acc[i, j] * 2.0 + a[i, j];\n    }}\n",
    "write": "    parallel (i, j) in (8, 32) {{\n        a[i, j] = acc[i, j] * 0.125 + 1.0;\n    }}\n",
}


def shared_pieces_source(pieces):
    """A kernel of `pieces` ((name, loop text, forward) each) on one shared tile a,
    which starts as A[0] (loaded by a loop, which may share it); Y gets acc."""
    body = "".join(SHARED_PIECES[name].format(loop=loop, k="k" if forward else "K - 1 - k")
                   for name, loop, forward in pieces)
    return ("kernel pieces(A: f32[K, M, N], Y: f32[M, N]) {\n    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));\n"
            "    threads 128;\n    shared a: f32[8, 32];\n    local acc: f32[8, 32];\n    fill(acc, 0.0);\n"
            "    for z in range(1) {\n        copy(A[0, by * 8, bx * 32], a);\n    }\n" + body + "    copy(acc, Y[by * 8, bx * 32]);\n}\n")


@st.composite
def shared_pieces(draw):
    names = draw(st.lists(st.sampled_from(sorted(SHARED_PIECES)), min_size=1, max_size=5))
    return [(n, draw(st.sampled_from(["range(K)", "pipelined(K, stages = 1)", "pipelined(K, stages = 2)",
                                      "pipelined(K, stages = 3)"])), draw(st.booleans())) for n in names]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(shared_pieces(), st.integers(0, 5), st.integers(0, 2**32 - 1))
def test_loops_sharing_a_tile_compute_what_plain_loops_do(pieces, trips, seed):
    """Whatever mix of loops loading `a`, loops reading it first and statements
    reading or writing it outside loops, the pipelined program (loops rotating
    where plan-pipeline allows) computes bit for bit what the same program with
    every loop a `range` computes: a rotation allowed wrongly would leave a later
    reader a copy other than the last one loaded."""
    src = shared_pieces_source(pieces)
    plain = shared_pieces_source([(n, "range(K)", fwd) for n, _, fwd in pieces])
    a = np.random.default_rng(seed).integers(-8, 9, (trips, 20, 72)).astype(np.float32)
    outs = []
    for text in (plain, src):
        y = guarded((20, 72), np.float32, like="numpy")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tilec.PipelineWarning)
            warnings.simplefilter("error" if trips else "ignore", tilec.TmaFallbackWarning)
            tilec.compile(text, backend="interpret")(a, y.view)
        y.check()
        outs.append(y.view.copy())
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32)), src


def straight(stages, after):
    return f"""kernel straight(A: f32[K, M, N], B: f32[M, N], Y: f32[M, N]) {{
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared a: f32[8, 32];
    local acc: f32[8, 32];
    copy(B[by * 8, bx * 32], a);
    parallel (i, j) in (8, 32) {{
        acc[i, j] = a[i, j] * 2.0;
    }}
    for k in pipelined(K, stages = {stages}) {{
        copy(A[k, by * 8, bx * 32], a);
        parallel (i, j) in (8, 32) {{
            acc[i, j] = acc[i, j] * 0.5 + a[i, j];
        }}
    }}
{after}    copy(acc, Y[by * 8, bx * 32]);
}}
"""


RELOAD = """    copy(B[by * 8, bx * 32], a);
    parallel (i, j) in (8, 32) {
        acc[i, j] = acc[i, j] + a[i, j];
    }
"""


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("after", ["", RELOAD], ids=["nothing after", "a reload after"])
@pytest.mark.parametrize("trips", [0, 1, 2, 5])
def test_a_tile_loaded_before_it_is_read_outside_loops_still_rotates(stages, after, trips):
    """Statements outside the loop that load the tile and then read it (before the
    loop, or after it in a block of their own) read the load, not what the rotation
    left: the loop rotates, and the interpreter computes what numpy does."""
    src = straight(stages, after)
    assert plain_loop_warnings(src) == []
    assert f"tl_a_stage{stages - 1}" in buffers(src)
    rng = np.random.default_rng(trips)
    a = rng.standard_normal((trips, 20, 72)).astype(np.float32)
    b = rng.standard_normal((20, 72)).astype(np.float32)
    y = guarded((20, 72), np.float32, like="numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.TmaFallbackWarning)    # (72 f32 columns: TMA takes them)
        tilec.compile(src, backend="interpret")(a, b, y.view)
    y.check()
    want = b * np.float32(2)
    for k in range(trips):
        want = want * np.float32(0.5) + a[k]
    if after:
        want = want + b
    assert np.array_equal(y.view, want)


def test_a_read_after_the_loop_without_a_reload_still_stops_it():
    src = straight(2, "    parallel (i, j) in (8, 32) {\n        acc[i, j] = acc[i, j] + a[i, j];\n    }\n")
    assert plain_loop_warnings(src) == [
        "<string>:10:5: this pipelined loop (stages = 2) runs as a plain loop: tile 'a', which it loads, is used "
        "outside the loop as well (line 17), where it could read what the loop leaves in it (elsewhere it may be "
        "used only in loops whose bodies start by loading it and hold no gemm)"]
