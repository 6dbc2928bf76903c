"""CPU: every wgmma tile shape plan-gemm takes compiles through NVRTC with an
empty log, its IR says how the warpgroups split, the interpreter's result equals
numpy's, and the shapes it cannot take are refused at the gemm's line."""
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tilec
from gemm_shapes import (BESIDE, DEEP, UNEVEN, UNEVEN_SPLITS, case_id, cases, padded, source, split, split_width, swapped,
                         swizzle, uneven_operands)
from guard import guarded

CASES = list(cases())


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_shape_compiles_cleanly(case):
    (bm, bn, bk, th), ta, tb = case
    src = source(bm, bn, bk, th, ta, tb)
    k = tilec.compile(src, arch="sm_90a")
    assert k.compile_log == "", k.compile_log
    assert "wgmma.mma_async" in k.ptx
    ir_text = k.ir("plan-smem")
    _, n, over_n = split(bm, bn, th)
    assert (f", {over_n} across N" in ir_text) == (over_n > 1)
    assert ("as acc^T = b^T @ a^T" in ir_text) == swapped(bm, bn, th)
    # a is wgmma's M-major a ([K, M], 128-byte rows, or a padded M's chunks), or swapped its N-major b (rows of
    # n / over_n columns)
    a_line = next(line for line in ir_text.splitlines() if line.startswith("  shared a:"))
    assert a_line.startswith(f"  shared a: f16[{bk}, {bm}]" if ta else f"  shared a: f16[{bm}, {bk}]")
    a_swizzle = swizzle(math.gcd(n, split_width(n, over_n)) * 2) if swapped(bm, bn, th) else \
        swizzle(math.gcd(bm, 64) * 2)
    a_swizzle = a_swizzle if ta else swizzle(bk * 2)
    assert f"layout sw{a_swizzle} " in a_line
    check_padding(ir_text, bm, bn, bk, th, ta, tb, 2)


def check_padding(ir_text, bm, bn, bk, threads, ta, tb, esize):
    """The accumulator's layout line (transposed, padded) as gemm_shapes models it, and the
    overrun of the operand that is wgmma's a (tile a, swapped tile b) where the product's
    rows are padded: the padding's rows of each K-major chunk, or as many M-major columns of
    K elements."""
    lines = {line.split(":")[0].split()[-1]: line for line in ir_text.splitlines() if line.startswith("  ")
             and ":" in line and line.split(":")[0].split()[0] in ("shared", "local")}
    swap, pad = swapped(bm, bn, threads), padded(bm, bn, threads)
    acc = lines["acc"]
    assert ("layout wgmma transposed" in acc) == swap, acc
    assert (f" padded to {pad} rows" in acc) == bool(pad), acc
    operand, real, k_major = (lines["b"], bn, tb) if swap else (lines["a"], bm, not ta)
    chunk = int(operand.split(" layout sw")[1].split()[0])
    over = (pad - real) * (chunk if k_major else bk * esize) if pad else 0
    assert (f" overrun {over}" in operand) == bool(over), (operand, over)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_shape_interpreted_equals_numpy(case):
    (bm, bn, bk, th), ta, tb = case
    k = tilec.compile(source(bm, bn, bk, th, ta, tb), backend="interpret")
    m, n, kk = bm + 40, bn + 24, 3 * bk + 16     # ragged, rows in whole 16-byte granules (TMA)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((kk, m) if ta else (m, kk)).astype(np.float16)
    b = rng.standard_normal((n, kk) if tb else (kk, n)).astype(np.float16)
    c = guarded((m, n), "f32", like="numpy")
    k(a, b, c.view)
    want = (a.T if ta else a).astype(np.float32) @ (b.T if tb else b).astype(np.float32)
    np.testing.assert_allclose(c.view, want, rtol=1e-3, atol=1e-3)
    c.check()


@pytest.mark.parametrize("ta", [False, True], ids=["a", "ta"])
@pytest.mark.parametrize("shape", DEEP, ids=lambda s: "x".join(map(str, s)))
def test_a_k_tile_over_256_rows_loads_in_parts_at_the_swizzle_period(shape, ta):
    """b's 272 rows of 32- or 64-byte swizzled chunks load as two boxes of 136, the
    second at byte 136 x the row's bytes (256- / 512-byte aligned: the pattern's period,
    8 rows); NVRTC's log stays empty and the interpreter's product equals numpy's."""
    bm, bn, bk, th = shape
    src = source(bm, bn, bk, th, ta, False)
    k = tilec.compile(src, arch="sm_90a")
    assert k.compile_log == "", k.compile_log
    loads = [line.split("<-")[0].split()[-1] for line in k.ir("plan-tma").splitlines() if "<- B[" in line]
    assert loads == ["b", f"b+{136 * bn * 2}"], loads
    k = tilec.compile(src, backend="interpret")
    m, n, kk = 72, bn + 8, 2 * bk + 16
    rng = np.random.default_rng(bn)
    a = rng.standard_normal((kk, m) if ta else (m, kk)).astype(np.float16)
    b = rng.standard_normal((kk, n)).astype(np.float16)
    c = guarded((m, n), "f32", like="numpy")
    k(a, b, c.view)
    np.testing.assert_allclose(c.view, (a.T if ta else a).astype(np.float32) @ b.astype(np.float32),
                               rtol=1e-3, atol=1e-3)
    c.check()


@pytest.mark.parametrize("bm, bn, bk, threads, message", [
    (100, 128, 64, 256, "gemm: the 100 rows of the tile must be a multiple of 8 (wgmma computes m64 tiles: of rows "
                        "a multiple of 64, or padded to them in 8-row groups, or with the tile's N a multiple of 64 "
                        "acc^T = b^T @ a^T)"),
    (100, 96, 64, 256, "gemm: the 100 rows of the tile must be a multiple of 8"),
    # a random program's row reduce on an 8 x 8 tile (session 53's hunt): its fragments' second rows, statically
    # padding in every thread, made ptxas serialize the wgmmas (C7511); N padded instead would do the same
    (8, 8, 16, 128, "gemm: neither the tile's 8 rows nor its N = 8 columns are a multiple of 64, and padded to "
                    "m64 tiles either way round, the last m64 tile's 8 rows leave the second row of each fragment "
                    "(lane / 4 + 8) padding in every thread, which makes ptxas serialize the wgmmas: make one side "
                    "16 more or fewer, or a multiple of 64"),
    (72, 136, 64, 128, "gemm: neither the tile's 72 rows nor its N = 136 columns are a multiple of 64, and padded"),
    # swapped, M = 8 over 4 warpgroups leaves the last none; M padded would leave 8 rows (as 8 x 8)
    (8, 64, 64, 512, "gemm: the tile's 8 rows are not a multiple of 64, so wgmma computes acc^T = b^T @ a^T, 64 "
                     "rows by 8 columns; 4 warpgroups over 64 rows are 1 over M and 4 over N, but the N = 8 "
                     "columns in steps of 8 (8 a warpgroup) leave the last warpgroup none: use fewer threads or a "
                     "wider tile"),
    (64, 8, 64, 256, "gemm: 2 warpgroups over 64 rows are 1 over M and 2 over N, but the N = 8 columns in steps of 8 "
                     "(8 a warpgroup) leave the last warpgroup none"),
    (64, 100, 64, 256, "gemm: 2 warpgroups over 64 rows are 1 over M and 2 over N: the N = 100 columns must be a "
                       "multiple of 8, and each warpgroup's share (N / 2 rounded up to a multiple of 8) at most 256 "
                       "(one wgmma m64nNk16 per warpgroup)"),
    (64, 520, 64, 256, "gemm: 2 warpgroups over 64 rows are 1 over M and 2 over N: the N = 520 columns must be"),
    (128, 512, 64, 128, "gemm: the tile width N = 512 must be a multiple of 8 of at most 256 (one wgmma m64nNk16 "
                        "per warpgroup)"),
    (128, 128, 24, 256, "gemm: the K depth 24 must be a multiple of 16"),
    (256, 256, 64, 512, "gemm: the accumulator fragments take 128 registers per thread (128 for 'acc') and a "
                        "wgmma needs about 26 more, over the 128 a thread of a 512-thread block can have"),
    (256, 224, 64, 512, "gemm: the accumulator fragments take 112 registers per thread"),
])
def test_shapes_that_cannot_be_done_are_refused_at_the_gemm(bm, bn, bk, threads, message):
    with pytest.raises(tilec.TilecError) as e:
        tilec.compile(source(bm, bn, bk, threads, transpose_b=True), arch="sm_90a")
    assert str(e.value).startswith("<string>:13:9: error: " + message), str(e.value)


def test_f8_operands_must_be_k_major():
    src = source(128, 128, 128, 256, transpose_a=True, transpose_b=True, dt="f8e4m3")
    with pytest.raises(tilec.TilecError, match=r"<string>:13:9: error: an f8e4m3 gemm reads a and b K-major"):
        tilec.compile(src, arch="sm_90a")


@pytest.mark.parametrize("bm", [16, 128], ids=["swapped", "bm128"])
@pytest.mark.parametrize("ot", ["f32", "f16"])
def test_a_local_beside_the_accumulator_takes_its_layout(bm, ot):
    """`out[i, j] = acc[i, j] * 2 + ...` in a parallel body: `out` takes acc's fragment
    layout (transposed too), so one thread holds element (i, j) of both; compiled
    cleanly and interpreted equal to numpy (the GPU run: tests/test_gpu_gemm.py)."""
    src = BESIDE.format(bm=bm, ot=ot)
    k = tilec.compile(src, arch="sm_90a")
    assert k.compile_log == "", k.compile_log
    layout = "layout wgmma transposed" if bm == 16 else "layout wgmma"
    assert f"  local out: {ot}[{bm}, 128] {layout}\n" in k.ir("plan-gemm"), k.ir("plan-gemm")
    a, b, c = interpret_beside(src, ot, seed=2)
    m, n = c.shape
    want = 2 * (a.astype(np.float32) @ b.astype(np.float32)) + np.arange(m)[:, None] - 0.5 * np.arange(n)[None, :]
    np.testing.assert_allclose(c.astype(np.float32), want, rtol=2e-3 if ot == "f16" else 1e-5,
                               atol=0.1 if ot == "f16" else 1e-3)


@pytest.mark.parametrize("value", ["acc[i, j] + f16(acc[i, j])", "bf16(acc[i, j]) * 2.0"])
def test_an_accumulator_narrowed_inside_an_expression_keeps_the_wgmmas_async(value):
    """f16(acc[i, j]) inside an f32 expression is a conversion reading the accumulator
    register too (C7514 in the thread-copy variant of a random f8 program, seed 2 of
    session 52's hunt): both variants multiply by 1 first and compile with empty logs."""
    src = BESIDE.format(bm=128, ot="f32").replace("acc[i, j] * 2.0 + (by * BM + i) - (bx * BN + j) * 0.5", value)
    k = tilec.compile(src, arch="sm_90a")
    for variant in (k, k.fallback):
        assert variant.compile_log == "", variant.compile_log
        assert "__fmul_rn(acc[tl_r], 1.0f)" in variant.cuda_source


def interpret_beside(src, ot, seed):
    """A BESIDE program in the interpreter on a 40 x 200 x 136 product of random f16
    operands: (a, b, the output), its guard checked."""
    m, n, kk = 40, 200, 136
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, kk)).astype(np.float16)
    b = rng.standard_normal((kk, n)).astype(np.float16)
    c = guarded((m, n), ot, like="numpy")
    tilec.compile(src, backend="interpret")(a, b, c.view)
    c.check()
    return a, b, c.view


@pytest.mark.parametrize("value", ["acc[i, j]", "f16(acc[i, j])", "bf16(acc[i, j])"])
@pytest.mark.parametrize("bm", [16, 128], ids=["swapped", "bm128"])
def test_an_accumulator_narrowed_as_it_is_keeps_the_wgmmas_async(value, bm):
    """`out[i, j] = acc[i, j]` into a 16-bit tile: a conversion reading an accumulator
    register itself makes ptxas serialize every wgmma of the kernel (C7514; found by
    test_every_program_compiles_to_a_cubin in CI), so codegen multiplies by 1 first
    (exact) and the log stays empty; the interpreter's values are the plain rounding."""
    ot = "bf16" if value.startswith("bf16") else "f16"
    src = BESIDE.format(bm=bm, ot=ot).replace("acc[i, j] * 2.0 + (by * BM + i) - (bx * BN + j) * 0.5", value)
    k = tilec.compile(src, arch="sm_90a")
    assert k.compile_log == "", k.compile_log
    assert "__fmul_rn(acc[tl_r], 1.0f)" in k.cuda_source
    a, b, c = interpret_beside(src, ot, seed=3)
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(c.astype(np.float32), want, rtol=1e-2 if ot == "bf16" else 2e-3, atol=1e-2)


@pytest.mark.parametrize("bm, bn, threads", UNEVEN_SPLITS)
def test_an_uneven_split_reads_and_writes_memory_only_inside_n(bm, bn, threads):
    """BM = 64 over 2 or 3 warpgroups and N no multiple of 8 x warpgroups, or neither BM nor
    BN a multiple of 64 (rows padded to m64 tiles): compiled with an empty log (no register
    set under a condition: ptxas would serialize the wgmmas), the operand read past its
    tile given `overrun` bytes, and interpreted equal to numpy (the GPU run:
    tests/test_gpu_gemm_shapes.py)."""
    src = UNEVEN.format(bm=bm, bn=bn, threads=threads)
    k = tilec.compile(src, arch="sm_90a")
    assert k.compile_log == "", k.compile_log
    assert "overrun" in k.ir("plan-smem")
    a, b, bias, want = uneven_operands(bm, bn)
    c = guarded(want.shape, "f32", like="numpy")
    tilec.compile(src, backend="interpret")(a, b, bias, c.view)
    c.check()
    np.testing.assert_array_equal(c.view, want)


@pytest.mark.parametrize("bm, bn, threads", UNEVEN_SPLITS)
def test_an_uneven_split_with_a_producer_warpgroup_compiles(bm, bn, threads):
    """With a producer warpgroup, plan-smem sizes the consumers' registers (setmaxnreg, the
    blocks an SM holds) from the fragments they hold, the last warpgroup's past N too: from
    elements / threads, ptxas had 32 registers for an m64n16 wgmma and refused (C7602)."""
    src = UNEVEN.format(bm=bm, bn=bn, threads=threads).replace("stages = 3)", "stages = 3, producer = 1)")
    k = tilec.compile(src, arch="sm_90a")
    for variant in (k, k.fallback):
        assert variant.compile_log == "", variant.compile_log


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bm=st.integers(1, 32).map(lambda x: 8 * x), bn=st.integers(1, 40).map(lambda x: 8 * x),
       bk=st.sampled_from([16, 32, 48, 64, 128]), threads=st.sampled_from([128, 256, 384, 512]),
       ta=st.booleans(), tb=st.booleans(), dt=st.sampled_from(["f16", "bf16", "f8e4m3"]))
def test_every_tile_shape_compiles_cleanly_or_is_refused_at_a_line(bm, bn, bk, threads, ta, tb, dt):
    """Any tile of multiples of 8 on any block: either a plan as gemm_shapes models it (swapped
    where M is no multiple of 64 and N is, M or N padded to m64 tiles where neither is; the
    overrun of wgmma's a the padding's bytes) that NVRTC compiles with an empty log, or an error at a line
    of the program (a rule of plan-gemm, TMA's box limits, shared memory), never a crash.
    8-bit operands are K-major ([M, K] and [N, K]), K a multiple of 32."""
    if dt == "f8e4m3":
        ta, tb, bk = False, True, 32 * -(-bk // 32)
    src = source(bm, bn, bk, threads, ta, tb, dt=dt)
    try:
        k = tilec.compile(src, arch="sm_90a")
    except tilec.TilecError as e:
        assert str(e).startswith("<string>:") and ": error: " in str(e).splitlines()[0], str(e)
        return
    assert k.compile_log == "", k.compile_log
    check_padding(k.ir("plan-smem"), bm, bn, bk, threads, ta, tb, 1 if dt == "f8e4m3" else 2)
