"""The peer for tuned gemms: a Triton matmul autotuned over the usual Hopper
configurations (the shape of Triton's own tutorial kernel: one C tile per
program, grouped tile order for L2 reuse, f32 accumulation with tl.dot).

f16 and bf16 (C gets the operands' dtype; Triton's autotuner adds the tensors'
dtypes to the key, so each dtype is tuned on its own); any row and column
strides, so views into padded buffers work. `chosen()` names the
configuration picked for the last call."""
import torch
import triton
import triton.language as tl

CONFIGS = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP": 8}, num_stages=s, num_warps=w)
           for bm, bn, bk, s, w in ((128, 256, 64, 3, 8), (256, 128, 64, 3, 8), (128, 128, 64, 4, 4),
                                    (128, 128, 64, 3, 8), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                                    (128, 256, 32, 4, 8), (256, 128, 32, 4, 8), (128, 128, 32, 5, 4))]


@triton.autotune(configs=CONFIGS, key=["M", "N", "K"])
@triton.jit
def _matmul(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = GROUP * tiles_n
    first_m = (pid // per_group) * GROUP
    group_rows = min(tiles_m - first_m, GROUP)
    tm = first_m + (pid % per_group) % group_rows
    tn = (pid % per_group) // group_rows
    rm = (tm * BM + tl.arange(0, BM)) % M
    rn = (tn * BN + tl.arange(0, BN)) % N
    rk = tl.arange(0, BK)
    pa = a + rm[:, None] * sam + rk[None, :] * sak
    pb = b + rk[:, None] * sbk + rn[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        left = K - k * BK
        acc += tl.dot(tl.load(pa, mask=rk[None, :] < left, other=0.0), tl.load(pb, mask=rk[:, None] < left, other=0.0))
        pa += BK * sak
        pb += BK * sbk
    om = tm * BM + tl.arange(0, BM)
    on = tn * BN + tl.arange(0, BN)
    tl.store(c + om[:, None] * scm + on[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(om[:, None] < M) & (on[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    grid = lambda meta: (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)  # noqa: E731
    _matmul[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    return c


def chosen() -> str:
    """The configuration the autotuner picked for the last call: BMxBNxBK, stages, warps."""
    cfg = getattr(_matmul, "best_config", None)
    if cfg is None:
        return "?"
    return f"{cfg.kwargs['BM']}x{cfg.kwargs['BN']}x{cfg.kwargs['BK']} s{cfg.num_stages} w{cfg.num_warps}"
