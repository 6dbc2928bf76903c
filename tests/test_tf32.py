"""gemm on f32 operands, read by the tensor cores as tf32 (`tf32 = true`):
examples/gemm_tf32.tile in the interpreter and on the GPU against numpy's product
of the operands as tf32 (each f32's lower 13 mantissa bits cleared), outputs
guarded (tests/guard.py); the rules told at the gemm's line."""
import numpy as np
import pytest

import tilec
from conftest import ROOT, compile_error
from guard import guarded

EXAMPLE = ROOT / "examples" / "gemm_tf32.tile"
SRC = EXAMPLE.read_text()
GEMM_LINE = next(i for i, x in enumerate(SRC.splitlines(), 1) if "gemm(a, b, acc" in x)

# fixed consts beside the tune's pick: one warpgroup on a plain grid without a producer, stream-K,
# three warpgroups over 192 rows, a 16-row tile (swapped: acc^T = b^T @ a^T, both K-major)
CONFIGS = [dict(BM=64, BN=128, STAGES=3, PRODUCER=0, PERSISTENT=0),
           dict(BM=128, BN=256, STAGES=4, STREAM_K=1),
           dict(BM=192, BN=128, STAGES=3),
           dict(BM=16, BN=128, STAGES=4, PERSISTENT=0)]
CONFIG_IDS = ["bm64-plain", "bm128-bn256-streamk", "bm192", "bm16-swapped"]


def tf32(x):
    """x (f32) as the tensor cores read it: the lower 13 mantissa bits cleared."""
    return (np.ascontiguousarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def operands(m, n, k, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)


def expect(got, a, bt):
    """got is tf32(a) @ tf32(bt)^T summed in f32: within 2^-20 of the sum of the
    products' magnitudes, far below what reading full f32 would change."""
    want = tf32(a).astype(np.float64) @ tf32(bt).astype(np.float64).T
    bound = 2.0 ** -20 * (np.abs(tf32(a)).astype(np.float64) @ np.abs(tf32(bt)).astype(np.float64).T) + 1e-30
    err = np.abs(np.asarray(got, np.float64) - want)
    assert (err <= bound).all(), f"{int((err > bound).sum())} elements off; worst {err.max()} (bound there " \
                                 f"{bound.flat[err.argmax()]})"
    full = a.astype(np.float64) @ bt.astype(np.float64).T
    assert np.abs(full - want).max() > 4 * bound.max(), "these operands do not tell tf32 from f32"


@pytest.mark.parametrize("edits, message, col", [
    (((", tf32 = true", ""),), "gemm of f32 operands runs on the tensor cores in tf32 (10 bits of mantissa, the lower "
     "13 of each element ignored; f32 accumulation): say so with gemm(a, b, acc, transpose_b = true, tf32 = true), "
     "or convert the operands to f16 or bf16", 9),
    ((("transpose_b = true, ", ""), ("B: f32[N, K]", "B: f32[K, N]"), ("shared b: f32[BN, BK]", "shared b: f32[BK, BN]"),
      ("copy(B[bx * BN, k * BK], b)", "copy(B[k * BK, bx * BN], b)")), "a tf32 gemm reads a and b K-major (wgmma takes tf32 operands in no other order): "
     "declare a as [M, K] and b as [N, K] and write gemm(a, b, acc, transpose_b = true, tf32 = true)", 9),
    ((("tf32 = true", "tf32 = 2"),), "tf32 must be true or false", 52),
    ((("tf32 = true", "tf32 = false"),), "gemm of f32 operands runs on the tensor cores in tf32", 9),
])
def test_the_rules_are_told_at_the_gemm(edits, message, col):
    error = compile_error(SRC, edits, BM=128, BN=128)
    assert error.startswith(f"<string>:{GEMM_LINE}:{col}: error: {message}"), error


def test_tf32_takes_f32_operands_only():
    error = compile_error(SRC, [("f32[M, K], B: f32[N, K]", "f16[M, K], B: f16[N, K]"), ("shared a: f32", "shared a: f16"),
                                ("shared b: f32", "shared b: f16"), ("BK = 32", "BK = 64")], BM=128, BN=128)
    assert error.startswith(f"<string>:{GEMM_LINE}:9: error: gemm: tf32 = true reads f32 operands as tf32; "
                            "'a' and 'b' are f16"), error


def test_a_tf32_a_is_not_read_from_registers():
    src = """kernel g(A: f32[M, K], B: f32[N, K], C: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 64), cdiv(M, 64));
    threads 128;
    shared s: f32[64, 32];
    local a: f32[64, 32];
    shared b: f32[64, 32];
    local acc: f32[64, 64];
    fill(acc, 0);
    copy(A[by * 64, 0], s);
    copy(B[bx * 64, 0], b);
    copy(s, a);
    gemm(a, b, acc, transpose_b = true, tf32 = true);
    copy(acc, C[by * 64, bx * 64]);
}"""
    error = compile_error(src)
    assert error.startswith("<string>:12:5: error: gemm: a local a ('a', wgmma's A from registers) must be "
                            "f16 or bf16: a tf32 A's register fragments are not an accumulator's layout"), error


def test_the_example_compiles_every_candidate_with_an_empty_log():
    k = tilec.compile(EXAMPLE, arch="sm_90a")
    assert "wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32" in k.cuda_source
    for consts in CONFIGS:
        c = tilec.compile(EXAMPLE, arch="sm_90a", **consts)
        assert c.compile_log == "" and c.fallback.compile_log == ""


@pytest.mark.parametrize("consts", CONFIGS, ids=CONFIG_IDS)
@pytest.mark.parametrize("m, n, k", [(200, 136, 96), (64, 256, 160), (33, 40, 64)], ids=str)
def test_in_the_interpreter(consts, m, n, k):
    a, bt = operands(m, n, k, seed=m * n + k)
    c = guarded((m, n), "f32", like="numpy")
    tilec.compile(EXAMPLE, backend="interpret", **consts)(a, bt, c.view)
    c.check()
    expect(c.view, a, bt)


def test_rows_no_multiple_of_16_bytes_run_the_thread_copy_variant_in_the_interpreter():
    a, bt = operands(130, 72, 99, seed=3)       # K = 99 f32: 396-byte rows, no TMA map describes them
    c = guarded((130, 72), "f32", like="numpy")
    with pytest.warns(tilec.TmaFallbackWarning, match="argument A"):
        tilec.compile(EXAMPLE, backend="interpret", BM=64, BN=128, PERSISTENT=0)(a, bt, c.view)
    c.check()
    expect(c.view, a, bt)


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_the_tensor_cores_clear_the_lower_13_bits_on_the_gpu():
    """What `tf32` means on the H100: an operand's lower 13 mantissa bits are dropped
    (toward zero), not rounded: 1 + 3 * 2^-12 times 1 is 1, and -(1 + 3 * 2^-12) is -1."""
    import torch
    kern = tilec.compile(EXAMPLE, fallback=False, BM=128, BN=128, STAGES=3)
    x = 1 + 3 * 2.0 ** -12
    a = torch.full((128, 32), x, device="cuda")
    a[64:] = -x
    bt = torch.zeros(128, 32, device="cuda")
    bt[:, 0] = 1
    c = guarded((128, 128), "f32")
    kern(a, bt, c.view)
    torch.cuda.synchronize()
    c.check()
    assert (c.view[:64] == 1).all() and (c.view[64:] == -1).all(), c.view[[0, 64], :4]


@pytest.mark.gpu
@pytest.mark.parametrize("consts", [{}] + CONFIGS, ids=["tuned"] + CONFIG_IDS)
@pytest.mark.parametrize("m, n, k", [(128, 256, 128), (1000, 1000, 1024), (200, 72, 384), (4095, 4097, 512)],
                         ids=lambda s: str(s))
def test_on_the_gpu(consts, m, n, k):
    import torch
    a, bt = operands(m, n, k, seed=m + n + k)
    kern = tilec.compile(EXAMPLE, fallback=False, **consts)
    c = guarded((m, n), "f32")
    kern(torch.from_numpy(a).cuda(), torch.from_numpy(bt).cuda(), c.view)
    torch.cuda.synchronize()
    c.check()
    expect(c.view.cpu().numpy(), a, bt)


@pytest.mark.gpu
def test_rows_no_multiple_of_16_bytes_run_the_thread_copy_variant_on_the_gpu():
    import torch
    a, bt = operands(130, 72, 99, seed=3)
    c = guarded((130, 72), "f32")
    with pytest.warns(tilec.TmaFallbackWarning, match="argument A"):
        tilec.compile(EXAMPLE, BM=64, BN=128, PERSISTENT=0)(torch.from_numpy(a).cuda(), torch.from_numpy(bt).cuda(),
                                                             c.view)
    torch.cuda.synchronize()
    c.check()
    expect(c.view.cpu().numpy(), a, bt)
