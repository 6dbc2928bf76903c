"""gemm on 8-bit integers (i8, u8, either on either side) summed in i32:
examples/gemm_i8.tile in the interpreter and on the GPU against numpy's exact
integer product, outputs guarded (tests/guard.py); the sums wrap as i32 adds do;
the rules told at the gemm's line."""
from pathlib import Path

import numpy as np
import pytest

import tilec
from conftest import ROOT, compile_error
from guard import guarded

EXAMPLE = ROOT / "examples" / "gemm_i8.tile"
SRC = EXAMPLE.read_text()
GEMM_LINE = next(i for i, x in enumerate(SRC.splitlines(), 1) if "gemm(a, b, acc" in x)
LOW = {"i8": -128, "u8": 0}

# fixed consts beside the tune's pick: one warpgroup on a plain grid without a producer, stream-K,
# three warpgroups over 192 rows, a 16-row tile (swapped: acc^T = b^T @ a^T), a tile padded to m64 rows
CONFIGS = [dict(BM=64, BN=128, STAGES=3, PRODUCER=0, PERSISTENT=0),
           dict(BM=128, BN=256, STAGES=4, STREAM_K=1),
           dict(BM=192, BN=128, STAGES=3),
           dict(BM=16, BN=128, STAGES=4, PERSISTENT=0),
           dict(BM=32, BN=48, STAGES=3, PERSISTENT=0)]
CONFIG_IDS = ["bm64-plain", "bm128-bn256-streamk", "bm192", "bm16-swapped", "bm32-bn48-padded"]


def program(ta="i8", tb="i8", out="i32"):
    return SRC.replace("A: i8[M, K], B: i8[N, K], C: i32[M, N]", f"A: {ta}[M, K], B: {tb}[N, K], C: {out}[M, N]") \
        .replace("shared a: i8", f"shared a: {ta}").replace("shared b: i8", f"shared b: {tb}")


def operands(m, n, k, seed, ta="i8", tb="i8"):
    rng = np.random.default_rng(seed)
    np_t = {"i8": np.int8, "u8": np.uint8}
    return (rng.integers(LOW[ta], LOW[ta] + 256, (m, k)).astype(np_t[ta]),
            rng.integers(LOW[tb], LOW[tb] + 256, (n, k)).astype(np_t[tb]))


def product(a, bt):
    """The i32 sums, wrapped as the GPU's (two's complement)."""
    return (a.astype(np.int64) @ bt.astype(np.int64).T).astype(np.int32)


@pytest.mark.parametrize("edits, message", [
    ((("local acc: i32", "local acc: f32"),), "gemm accumulates i8 products in i32; 'acc' is f32"),
    ((("transpose_b = true", "transpose_b = false"), ("B: i8[N, K]", "B: i8[K, N]"), ("b: i8[BN, BK]", "b: i8[BK, BN]"),
      ("copy(B[bx * BN, k * BK], b)", "copy(B[k * BK, bx * BN], b)")),
     "an i8 gemm reads a and b K-major (wgmma takes 8-bit operands in no other order): declare a as [M, K] and b "
     "as [N, K] and write gemm(a, b, acc, transpose_b = true)"),
    ((("B: i8[N, K]", "B: f8e4m3[N, K]"), ("b: i8[BN, BK]", "b: f8e4m3[BN, BK]")),
     "gemm takes f16, bf16, f8e4m3 or f8e5m2 operands of one dtype, i8 or u8 ones, or f32 ones with tf32 = true; "
     "not i8 and f8e4m3"),
])
def test_the_rules_are_told_at_the_gemm(edits, message):
    error = compile_error(SRC, edits, BM=128, BN=128)
    assert error.startswith(f"<string>:{GEMM_LINE}:9: error: {message}"), error


def test_the_wgmmas_are_s32_and_the_epilogue_stages_i32_pairs():
    cuda = tilec.compile(program("u8", "i8"), arch="sm_90a", BM=128, BN=256, STAGES=4, STREAM_K=1).cuda_source
    assert "wgmma.mma_async.sync.aligned.m64n256k32.s32.u8.s8 " in cuda
    assert "int acc[128];  // local acc: i32[128, 256] as wgmma accumulator fragments" in cuda
    assert "*reinterpret_cast<tl_i32x2*>(&tl_acc_out" in cuda              # staged, TMA-stored
    assert "make_int4(acc[tl_r]" in cuda and "make_float4" not in cuda     # stream-K's partial sums stay integers
    assert "wgmma_fence_operand(int (&acc)[N])" in cuda and "wgmma_fence_operand(float" not in cuda


@pytest.mark.parametrize("ta, tb, out", [("i8", "i8", "i32"), ("u8", "i8", "i32"), ("i8", "u8", "f32"),
                                         ("u8", "u8", "i32")])
def test_every_pairing_compiles_cleanly(ta, tb, out):
    for consts in CONFIGS:
        k = tilec.compile(program(ta, tb, out), arch="sm_90a", **consts)
        assert k.compile_log == "" and k.fallback.compile_log == "", (consts, k.compile_log, k.fallback.compile_log)


@pytest.mark.parametrize("consts", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("ta, tb", [("i8", "i8"), ("u8", "i8")])
@pytest.mark.parametrize("m, n, k", [(200, 136, 384), (33, 40, 128)], ids=str)
def test_in_the_interpreter(consts, ta, tb, m, n, k):
    a, bt = operands(m, n, k, seed=m * n + k, ta=ta, tb=tb)
    c = guarded((m, n), "i32", like="numpy")
    tilec.compile(program(ta, tb), backend="interpret", **consts)(a, bt, c.view)
    c.check()
    assert np.array_equal(c.view, product(a, bt))


def test_an_f32_output_converts_the_sums_in_the_interpreter():
    a, bt = operands(130, 72, 256, seed=4, ta="i8", tb="u8")
    c = guarded((130, 72), "f32", like="numpy")
    tilec.compile(program("i8", "u8", "f32"), backend="interpret", BM=64, BN=128)(a, bt, c.view)
    c.check()
    assert np.array_equal(c.view, product(a, bt).astype(np.float32))


def test_rows_no_multiple_of_16_bytes_run_the_thread_copy_variant_in_the_interpreter():
    a, bt = operands(130, 72, 200, seed=3)       # K = 200 i8: 200-byte rows, no TMA map describes them
    c = guarded((130, 72), "i32", like="numpy")
    with pytest.warns(tilec.TmaFallbackWarning, match="argument A"):
        tilec.compile(EXAMPLE, backend="interpret", BM=64, BN=128, PERSISTENT=0)(a, bt, c.view)
    c.check()
    assert np.array_equal(c.view, product(a, bt))


# ---------------------------------------------------------------- GPU

def _run_gpu(src, a, bt, out, **consts):
    import torch
    c = guarded((a.shape[0], bt.shape[0]), out)
    tilec.compile(src, fallback=False, **consts)(torch.from_numpy(a).cuda(), torch.from_numpy(bt).cuda(), c.view)
    torch.cuda.synchronize()
    c.check()
    return c.view.cpu().numpy()


@pytest.mark.gpu
def test_the_sums_wrap_past_2_to_the_31_on_the_gpu():
    """wgmma's s32 sums (no .satfinite) wrap as the interpreter's: 135168 products of
    127 x 127 are 2180124672, which is -2114842624 in i32."""
    k = 135168
    a = np.full((64, k), 127, np.int8)
    bt = np.full((64, k), 127, np.int8)
    got = _run_gpu(SRC, a, bt, "i32", BM=64, BN=128, STAGES=4, PERSISTENT=0)
    assert (got == np.int32(-2114842624)).all(), got[:2, :4]


@pytest.mark.gpu
@pytest.mark.parametrize("consts", [{}] + CONFIGS, ids=["tuned"] + CONFIG_IDS)
@pytest.mark.parametrize("m, n, k", [(128, 256, 128), (1000, 1000, 1024), (200, 72, 384), (4095, 4097, 512)],
                         ids=lambda s: str(s))
def test_on_the_gpu(consts, m, n, k):
    a, bt = operands(m, n, k, seed=m + n + k)
    assert np.array_equal(_run_gpu(SRC, a, bt, "i32", **consts), product(a, bt))


@pytest.mark.gpu
@pytest.mark.parametrize("ta, tb, out", [("u8", "i8", "i32"), ("i8", "u8", "i32"), ("u8", "u8", "i32"),
                                         ("i8", "i8", "f32"), ("i8", "i8", "f16")])
def test_mixed_signs_and_float_outputs_on_the_gpu(ta, tb, out):
    a, bt = operands(300, 264, 640, seed=7, ta=ta, tb=tb)
    got = _run_gpu(program(ta, tb, out), a, bt, out, BM=128, BN=256, STAGES=4, STREAM_K=1)
    assert np.array_equal(got, product(a, bt).astype(got.dtype))


ROWS = """kernel rows(A: i8[M, K], B: i8[N, K], C: i32[M, N]) {
    const BM = 128, BN = 128, BK = 128;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 256;
    shared a: i8[BM, BK];
    shared b: i8[BN, BK];
    local acc: i32[BM, BN];
    local r: i32[BM];
    fill(acc, 0);
    for k in pipelined(cdiv(K, BK), stages = 3) {
        copy(A[by * BM, k * BK], a);
        copy(B[bx * BN, k * BK], b);
        gemm(a, b, acc, transpose_b = true);
    }
    reduce(acc, r, axis = 1, op = OP);
    parallel (i, j) in (BM, BN) {
        acc[i, j] = acc[i, j] * 3 - r[i];
    }
    copy(acc, C[by * BM, bx * BN]);
}
"""


def rows_reference(a, bt, op):
    """Each tile's rows less their sum / maximum over the tile's 128 columns (N = 128 here)."""
    p = product(a, bt).astype(np.int64)
    r = p.sum(axis=1, keepdims=True) if op == "sum" else p.max(axis=1, keepdims=True)
    return (p * 3 - r).astype(np.int32)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_a_row_reduce_of_an_i32_accumulator_in_the_interpreter(op):
    a, bt = operands(200, 128, 256, seed=11)
    c = guarded((200, 128), "i32", like="numpy")
    tilec.compile(ROWS.replace("OP", op), backend="interpret")(a, bt, c.view)
    c.check()
    assert np.array_equal(c.view, rows_reference(a, bt, op))


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sum", "max"])
def test_a_row_reduce_of_an_i32_accumulator_on_the_gpu(op):
    a, bt = operands(200, 128, 256, seed=11)
    assert np.array_equal(_run_gpu(ROWS.replace("OP", op), a, bt, "i32"), rows_reference(a, bt, op))


DEQUANT = (Path(__file__).parent / "filecheck" / "gemm_i8_dequant.tile")


def dequant_case():
    a, bt = operands(200, 256, 256, seed=12)
    scale_b = (np.random.default_rng(13).random(256) * 1e-3).astype(np.float32)
    want = (product(a, bt).astype(np.float32) * np.float32(0.01) * scale_b[None, :]).astype(np.float16)
    return a, bt, scale_b, want


def test_a_dequantizing_epilogue_in_the_interpreter():
    """W8A8's usual end: the i32 sums times A's scale and B's column scales, to f16."""
    a, bt, scale_b, want = dequant_case()
    c = guarded(want.shape, "f16", like="numpy")
    tilec.compile(DEQUANT, backend="interpret")(a, bt, scale_b, c.view, np.float32(0.01))
    c.check()
    assert np.array_equal(c.view, want)


@pytest.mark.gpu
def test_a_dequantizing_epilogue_on_the_gpu():
    import torch
    a, bt, scale_b, want = dequant_case()
    c = guarded(want.shape, "f16")
    tilec.compile(DEQUANT, fallback=False)(*(torch.from_numpy(x).cuda() for x in (a, bt, scale_b)), c.view, 0.01)
    torch.cuda.synchronize()
    c.check()
    assert np.allclose(c.view.cpu().numpy().astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=0)
