"""GPU: the conv2d example (implicit GEMM over a TMA im2col view, wgmma) equals
torch.nn.functional.conv2d on channels-last inputs (marked gpu). The output is a
view inside a sentinel-filled buffer (tests/guard.py): nothing around it may be
written."""
import pytest

import tilec
from conftest import ROOT
from guard import guarded

pytestmark = pytest.mark.gpu


def run(n, h, w, c, f, k=3, s=1, p=1, d=1, stages=3, src=None, **consts):
    import torch
    import torch.nn.functional as F
    kern = tilec.compile(src or ROOT / "examples/conv2d.tile", tune=False, KH=k, KW=k, S=s, P=p, D=d,
                         **consts)   # declared tiles, unless `consts`
    x = torch.randn(n, h, w, c, device="cuda").half()
    weight = torch.randn(f, c, k, k, device="cuda").half() / (c * k * k) ** 0.5
    wt = weight.permute(2, 3, 1, 0).reshape(k * k * c, f).contiguous()      # rows (kh, kw, c)
    oh = (h + 2 * p - d * (k - 1) - 1) // s + 1
    ow = (w + 2 * p - d * (k - 1) - 1) // s + 1
    out = guarded((n * oh * ow, f), "f16", fill=float("nan"))
    y = out.view
    kern(x, wt, y)
    torch.cuda.synchronize()
    out.check()
    want = F.conv2d(x.permute(0, 3, 1, 2).float(), weight.float(), stride=s, padding=p, dilation=d)
    want = want.permute(0, 2, 3, 1).reshape(-1, f)
    err = ((y.float() - want).norm() / want.norm()).item()
    assert torch.isfinite(y.float()).all()
    assert err < 2e-3, f"relative error {err:.2e}"
    return kern, x, wt, y


@pytest.mark.parametrize("layer", [
    (8, 56, 56, 64, 64, 3, 1, 1), (8, 28, 28, 128, 128, 3, 1, 1), (8, 14, 14, 256, 256, 3, 1, 1),
    (8, 7, 7, 512, 512, 3, 1, 1), (8, 56, 56, 128, 128, 3, 2, 1),
], ids=lambda l: "n{}-{}x{}-c{}-f{}-k{}-s{}-p{}".format(*l))
def test_resnet_layers(layer):
    run(*layer)


@pytest.mark.parametrize("case", [
    (3, 13, 17, 64, 64, 3, 1, 1, 1), (2, 15, 9, 64, 128, 3, 2, 0, 1), (2, 11, 11, 128, 64, 3, 1, 2, 1),
    (2, 20, 20, 64, 64, 3, 1, 2, 2), (1, 5, 5, 64, 8, 3, 1, 1, 1), (2, 9, 9, 64, 200, 1, 1, 0, 1),
], ids=lambda c: "n{}-{}x{}-c{}-f{}-k{}-s{}-p{}-d{}".format(*c))
def test_ragged_convolutions(case):
    run(*case)


@pytest.mark.parametrize("case", [(2, 13, 17, 64, 64, 3, 1, 1, 1), (2, 15, 9, 64, 128, 3, 2, 0, 1)],
                         ids=lambda c: "n{}-{}x{}-c{}-f{}-k{}-s{}-p{}-d{}".format(*c))
@pytest.mark.parametrize("bm", [16, 32])
def test_few_row_tiles_of_an_im2col_view(case, bm):
    """conv2d.tile with 16- or 32-row tiles (one warpgroup): the gemm runs swapped
    (acc^T = b^T @ a^T), the im2col tile as wgmma's K-major b."""
    src = (ROOT / "examples/conv2d.tile").read_text()
    assert "threads 2 * BM;" in src
    run(*case, src=src.replace("threads 2 * BM;", "threads 2 * max(BM, 64);"), BM=bm, BN=64)


@pytest.mark.parametrize("case, bk", [
    ((2, 20, 20, 32, 64, 3, 1, 1, 1), 32), ((2, 13, 17, 16, 64, 3, 1, 1, 1), 16), ((2, 15, 9, 64, 128, 3, 2, 0, 1), 32),
    ((2, 11, 11, 16, 128, 1, 1, 0, 1), 16),
], ids=lambda c: "n{}-{}x{}-c{}-f{}-k{}-s{}-p{}-d{}".format(*c) if isinstance(c, tuple) else f"bk{c}")
def test_narrow_im2col_tiles(case, bk):
    """Convolutions of 16 or 32 channels on tensor cores: im2col K tiles of 32 or 64
    bytes (BK = 16 / 32 f16 channels, TMA's 32- and 64-byte swizzles, wgmma's layout
    types 3 and 2), and a 64-channel layer in two such tiles per filter tap."""
    run(*case, BK=bk)


@pytest.mark.parametrize("case", [(2, 20, 20, 32, 64, 3, 1, 1, 1), (2, 13, 17, 16, 64, 3, 1, 1, 1),
                                  (2, 15, 9, 32, 128, 3, 2, 0, 1), (2, 20, 20, 8, 64, 3, 1, 1, 1),
                                  (2, 13, 17, 24, 64, 3, 1, 1, 1), (2, 15, 9, 96, 128, 3, 2, 0, 1)],
                         ids=lambda c: "n{}-{}x{}-c{}-f{}-k{}-s{}-p{}-d{}".format(*c))
@pytest.mark.parametrize("tiles", [dict(BM=128, BN=64, STAGES=4, PRODUCER=1, PERSISTENT=1), dict(BM=64, BN=128)],
                         ids=["128x64pr", "64x128"])
def test_k_tiles_spanning_filter_taps(case, tiles):
    """conv2d.tile with its channel count fixed in the header (16 or 32) and BK = 64:
    each K tile spans 2 or 4 filter taps, one swizzled chunk (32 or 64 bytes) and one
    TMA im2col load per tap, read by wgmma with that swizzle (plan-gemm, plan-tma).
    8 or 24 channels: chunks of 16-byte rows, not swizzled (wgmma's layout type 0),
    one or three a tap; 96 channels, no multiple of BK: 64-byte chunks, three a tap."""
    c = case[3]
    src = (ROOT / "examples/conv2d.tile").read_text()
    assert src.count("X: f16[N, H, W, C]") == 1 and src.count("KH * KW * C") >= 2   # Wt, the K loop, the tune
    src = src.replace("X: f16[N, H, W, C]", f"X: f16[N, H, W, {c}]").replace("KH * KW * C", f"KH * KW * {c}")
    kern = run(*case, src=src, **tiles)[0]
    ir_text = kern.ir("plan-smem")
    chunk = next(b for b in (128, 64, 32, 16) if c * 2 % b == 0)
    assert f"channels_per_pixel {chunk // 2} " in ir_text
    assert f"swizzle {chunk}B" in ir_text if chunk > 16 else "swizzle none" in ir_text


@pytest.mark.parametrize("case, bk", [
    ((2, 13, 17, 64, 64, 3, 1, 1, 1), 128), ((2, 15, 9, 128, 128, 3, 2, 0, 1), 128),
    ((2, 11, 11, 64, 64, 3, 1, 1, 1), 48), ((2, 9, 9, 32, 64, 3, 1, 1, 1), 96),
], ids=lambda c: "n{}-{}x{}-c{}-f{}-k{}-s{}-p{}-d{}".format(*c) if isinstance(c, tuple) else f"bk{c}")
def test_im2col_k_tiles_of_several_chunks(case, bk):
    """conv2d.tile with a K tile wider than one swizzled chunk: BK = 128 is two
    128-byte chunks of 64 channels, BK = 48 three 32-byte chunks of 16 channels
    (96 bytes take no wider swizzle), BK = 96 three 64-byte chunks of 32, one TMA
    im2col load each; C need only be a multiple of the chunk (64 channels over
    BK = 48 tiles: the chunks of a K tile fall in two filter taps)."""
    kern = run(*case, BK=bk)[0]
    width = {128: 64, 48: 16, 96: 32}[bk]
    assert f"channels_per_pixel {width} " in kern.ir("plan-smem")
