"""A gemm whose a is a local tile: wgmma's A from registers. The tile's fragments are
laid out as an [M, K] accumulator's, which is wgmma's A fragment layout k16 slice by
k16 slice, so threads write it in a `parallel` (or convert an accumulator into it) and
no shared memory, proxy fence or block barrier stands between them and the gemm
(tests/attention.tile's P). The errors for what cannot be so, the IR and CUDA, the
waits before threads overwrite it, check-barriers catching one left out, and the
interpreter and the GPU against exact integer products (guarded outputs)."""
import warnings
from dataclasses import replace

import numpy as np
import pytest

import tilec
from tilec.errors import SemanticError
from tilec.ir import nodes as ir
from tilec.passes import Options, check_barriers
from tilec.passes.check_barriers import BarrierBug

from guard import guarded
from test_rotate import _without
from test_wgmma_waits import OVERWRITE, after, lines, operands

# C = sum over K blocks k of (k + 1) * A_k B_k, the scaled block of A built in registers
SCALED = """kernel scaled(A: f16[M, K], B: f16[K, N], C: f32[M, N]) {
    const BM = 64, BN = 64, BK = 64, WG = 1, STAGES = 2;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128 * WG;
    shared a: f16[BM, BK];
    shared b: f16[BK, BN];
    local p: f16[BM, BK];
    local acc: f32[BM, BN];
    fill(acc, 0.0);
    for k in pipelined(cdiv(K, BK), stages = STAGES) {
        copy(A[by * BM, k * BK], a);
        copy(B[k * BK, bx * BN], b);
        parallel (i, c) in (BM, BK) {
            p[i, c] = f16(f32(a[i, c]) * f32(k + 1));
        }
        gemm(p, b, acc);
    }
    copy(acc, C[by * BM, bx * BN]);
}
"""

# test_wgmma_waits' OVERWRITE with p local: p rewritten between two gemms that read it, the
# second write waits for the first gemm (C = 5 * A[:, :64] B[:64, :]); no block barrier:
# p is each thread's own
TWICE = OVERWRITE.replace("    shared p: f16[BM, 64];\n    shared b: f16[64, BN];\n",
                          "    shared b: f16[64, BN];\n    local p: f16[BM, 64];\n")
assert TWICE != OVERWRITE

# one gemm after fill(acc, 0): the fill folds into its first wgmma (acc's old value ignored)
ONCE = """kernel once(A: f16[M, K], B: f16[K, N], C: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 64), cdiv(M, 64));
    threads 128;
    shared a: f16[64, 64];
    shared b: f16[64, 64];
    local p: f16[64, 64];
    local acc: f32[64, 64];
    copy(A[by * 64, 0], a);
    copy(B[0, bx * 64], b);
    parallel (i, c) in (64, 64) {
        p[i, c] = f16(f32(a[i, c]) * 3.0);
    }
    fill(acc, 0.0);
    gemm(p, b, acc);
    copy(acc, C[by * 64, bx * 64]);
}
"""

CONFIGS = [dict(BM=64, WG=1, STAGES=2), dict(BM=128, WG=1, STAGES=3), dict(BM=128, WG=2, STAGES=2),
           dict(BM=64, BN=256, BK=32, WG=1, STAGES=2)]
SHAPES = [(64, 64, 64), (100, 72, 320), (200, 264, 200)]


def scaled_reference(a, b, bk):
    c = np.zeros((a.shape[0], b.shape[1]))
    for k0 in range(0, a.shape[1], bk):
        c += (k0 // bk + 1) * (a[:, k0:k0 + bk].astype(np.float64) @ b[k0:k0 + bk].astype(np.float64))
    return c


def test_the_ir_and_the_cuda_read_a_from_registers():
    text = lines(after(SCALED))
    assert any(x.startswith("gemm p, b, acc on 1 warpgroups x 1 m64 tiles, p from registers") for x in text)
    cuda = tilec.compile(SCALED, arch="sm_90a").cuda_source
    assert "f16_t p[32];  // local p: f16[64, 64] as wgmma accumulator fragments" in cuda
    calls = [x.strip() for x in cuda.splitlines() if x.strip().startswith("wgmma_m64n64k16_f16_arbn(")]
    assert [c.split(", ")[1] for c in calls[:4]] == ["p + 0", "p + 8", "p + 16", "p + 24"]   # a k16 slice each
    assert "{%32, %33, %34, %35}, %36, accumulate, 1, 1, 1;" in cuda     # A in 4 registers, B N-major
    between = cuda[cuda.index("// <string>:13: parallel"):cuda.index("// <string>:16: gemm(p, b, acc);")]
    assert "p[tl_r] = f16_t(" in between and "sync" not in between and "fence" not in between  # registers: no barrier


def test_threads_overwrite_it_after_the_wait_and_no_block_barrier():
    text = lines(after(TWICE))
    second = text.index("parallel (i, c) in (128, 64) {  // line 16")
    assert text[second - 2:second] == ["gemm p, b, acc on 2 warpgroups x 1 m64 tiles, p from registers  // line 15",
                                       "wgmma.wait_group 0"]


def test_check_barriers_catches_the_wait_left_out():
    k = after(TWICE)
    check_barriers.run(k, Options())
    dropped = _without(k.body, lambda s: isinstance(s, ir.WgmmaWait))
    with pytest.raises(BarrierBug, match="threads overwrite 'p' while a wgmma may still read it"):
        check_barriers.run(replace(k, body=dropped), Options())


@pytest.mark.parametrize("edit, message", [
    (("f16", "f8e4m3"), "an 8-bit A's register fragments are not an accumulator's layout"),
    (("gemm(p, b, acc);", "gemm(p, b, acc, transpose_a = true);"), "cannot be used with transpose_a"),
    (("const BM = 64,", "const BM = 32,"), r"cannot be used with 32 rows, not a multiple of 64 \(a swapped gemm\)"),
    (("const BM = 64, BN = 64,", "const BM = 32, BN = 72,"),
     r"cannot be used with 32 rows, not a multiple of 64 \(padded to m64 tiles\)"),
    (("WG = 1,", "WG = 2,"), "needs each warpgroup to own whole rows of 'acc', but its 64 columns are split over 2"),
])
def test_what_cannot_be_read_from_registers_is_an_error_at_the_gemm(edit, message):
    src = SCALED.replace(*edit)
    if edit[1] == "f8e4m3":
        src = src.replace("gemm(p, b, acc);", "gemm(p, bt, acc, transpose_b = true);").replace(
            "shared b: f8e4m3[BK, BN];", "shared bt: f8e4m3[BN, BK];").replace(
            "copy(B[k * BK, bx * BN], b);", "copy(B[bx * BN, k * BK], bt);").replace("B: f8e4m3[K, N]", "B: f8e4m3[N, K]")
    with pytest.raises(SemanticError, match=message) as e:
        tilec.compile(src, arch="sm_90a")
    assert str(e.value).startswith("<string>:16:9: error: gemm: ")


def test_a_zero_fill_folds_into_the_first_wgmma():
    assert any(x.startswith("gemm p, b, acc on 1 warpgroups x 1 m64 tiles, p from registers, acc = product")
               for x in lines(after(ONCE)))
    cuda = tilec.compile(ONCE, arch="sm_90a").cuda_source
    assert "wgmma_m64n64k16_f16_arbn_zero(acc + 0, p + 0, " in cuda
    assert "wgmma_m64n64k16_f16_arbn(acc + 0, p + 8, " in cuda


@pytest.mark.parametrize("consts", CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
@pytest.mark.parametrize("m, n, k", SHAPES, ids=lambda x: str(x))
def test_in_the_interpreter(consts, m, n, k):
    a, b, _ = operands(m, n, k, seed=m + n + k)
    c = guarded((m, n), np.float32, like="numpy")
    tilec.compile(SCALED, backend="interpret", **consts)(a, b, c.view)
    c.check()
    assert np.array_equal(c.view, scaled_reference(a, b, consts.get("BK", 64)))


@pytest.mark.gpu
@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("consts", CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
@pytest.mark.parametrize("m, n, k", SHAPES + [(1000, 1032, 512)], ids=lambda x: str(x))
def test_on_the_gpu(consts, m, n, k, dt):
    import torch
    a, b, _ = operands(m, n, k, seed=m + n + k)
    src = SCALED.replace("f16", dt)
    c = guarded((m, n), "f32", fill=float("nan"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        tilec.compile(src, fallback=False, **consts)(*(torch.from_numpy(x).cuda().to(getattr(torch, {
            "f16": "float16", "bf16": "bfloat16"}[dt])) for x in (a, b)), c.view)
    torch.cuda.synchronize()
    c.check()
    assert np.array_equal(c.view.cpu().numpy(), scaled_reference(a, b, consts.get("BK", 64)))


@pytest.mark.gpu
@pytest.mark.parametrize("m, n", [(128, 64), (300, 200)])
def test_rewritten_between_two_gemms_on_the_gpu(m, n):
    import torch
    a, b, _ = operands(m, n, 64, seed=m)
    c = guarded((m, n), "f32", fill=float("nan"))
    tilec.compile(TWICE, fallback=False)(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), c.view)
    torch.cuda.synchronize()
    c.check()
    assert np.array_equal(c.view.cpu().numpy(), 5 * (a.astype(np.float64) @ b.astype(np.float64)))


@pytest.mark.gpu
def test_a_zero_filled_accumulator_on_the_gpu():
    import torch
    a, b, _ = operands(150, 128, 64, seed=7)
    c = guarded((150, 128), "f32", fill=float("nan"))
    tilec.compile(ONCE, fallback=False)(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), c.view)
    torch.cuda.synchronize()
    c.check()
    assert np.array_equal(c.view.cpu().numpy(), 3 * (a.astype(np.float64) @ b.astype(np.float64)))
