"""Known miscompilations of the NVRTC in use (tilec/runtime/nvrtc.py: known_miscompiles) are
said as tilec.ToolchainWarning when a kernel that holds one is compiled or loaded; on the GPU,
a kernel with one is either warned about or right."""
import warnings

import numpy as np
import pytest

import tilec
from guard import guarded
from tilec import kernel as kernel_mod
from tilec.runtime import nvrtc

MIN_MAX = """
kernel m3(A: i32[N], C: i32[N], Y0: i32[N], Y1: i32[N], Y2: i32[N]) {
    grid (bx) = (cdiv(N, 128));
    threads 128;
    local a: i32[128];
    local c: i32[128];
    local o0: i32[128];
    local o1: i32[128];
    local o2: i32[128];
    copy(A[bx * 128], a);
    copy(C[bx * 128], c);
    parallel (i) in (128) {
        o0[i] = min(min(a[i], -a[i]), c[i]);
        o1[i] = max(max(a[i], -a[i]), c[i]);
        o2[i] = min(-a[i], a[i]);
        if (o2[i] >= 0) {
            o2[i] = 0;
        }
    }
    copy(o0, Y0[bx * 128]);
    copy(o1, Y1[bx * 128]);
    copy(o2, Y2[bx * 128]);
}
"""
PLAIN = MIN_MAX.replace("-a[i]", "-c[i]")


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
    kernel_mod._CACHE.clear()


def ptx(src):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.ToolchainWarning)
        return tilec.compile(src, arch="sm_90a").ptx


def test_min_or_max_of_x_and_minus_x_before_nvrtc_13_4():
    """NVRTC 13.0-13.3 drop the negation (H100, benchmarks/probes/min3_probe.py)."""
    found = nvrtc.known_miscompiles(ptx(MIN_MAX), "sm_90a", (13, 0))
    assert len(found) == 1 and "min(min(a, -a), b) computes min(a, b)" in found[0]
    assert "NVRTC 13.0" in found[0] and "nvidia-cuda-nvrtc>=13.4" in found[0]
    assert nvrtc.known_miscompiles(ptx(MIN_MAX), "sm_90a", (13, 3))
    assert nvrtc.known_miscompiles(ptx(MIN_MAX), "sm_90a", (13, 4)) == []
    assert nvrtc.known_miscompiles(ptx(MIN_MAX), "sm_100a", (13, 0)) == []
    assert nvrtc.known_miscompiles(ptx(PLAIN), "sm_90a", (13, 0)) == []


def test_the_warning_at_compile_and_at_a_disk_cache_load(monkeypatch, fresh_cache):
    monkeypatch.setattr(nvrtc, "version", lambda: (13, 0))
    for _ in range(2):
        with pytest.warns(tilec.ToolchainWarning, match=r"kernel m3: NVRTC 13\.0 .* miscompiles"):
            k = tilec.compile(MIN_MAX, arch="sm_90a", fallback=False)
        kernel_mod._CACHE.clear()
    assert k.from_disk_cache
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.ToolchainWarning)
        tilec.compile(PLAIN, arch="sm_90a", fallback=False)


@pytest.mark.gpu
def test_gpu_min_max_of_x_and_minus_x_is_right_or_warned(fresh_cache):
    import torch
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", tilec.ToolchainWarning)
        k = tilec.compile(MIN_MAX, fallback=False)
    warned = [w for w in said if issubclass(w.category, tilec.ToolchainWarning)]
    assert bool(warned) == (nvrtc.version() < nvrtc.NEG_MIN_MAX_FIXED), (nvrtc.version(), warned)
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-1000, 1000, (1000,), generator=g, dtype=torch.int32)
    c = torch.randint(-1000, 1000, (1000,), generator=g, dtype=torch.int32)
    ys = [guarded((1000,), torch.int32, device="cuda") for _ in range(3)]
    k(a.cuda(), c.cuda(), *[y.view for y in ys])
    torch.cuda.synchronize()
    for y in ys:
        y.check()
    A, C = a.numpy(), c.numpy()
    want = [np.minimum(np.minimum(A, -A), C), np.maximum(np.maximum(A, -A), C), np.minimum(np.minimum(-A, A), 0)]
    right = all(np.array_equal(y.view.cpu().numpy(), w) for y, w in zip(ys, want))
    assert right or warned, f"wrong results without a ToolchainWarning (NVRTC {nvrtc.version()})"


def test_the_cache_key_names_the_nvrtc_this_process_mapped(monkeypatch, tmp_path):
    """A process that preloads another libnvrtc (LD_PRELOAD) must not be served the
    cubins of the wheel's NVRTC: the disk-cache key names the library mapped first."""
    other = tmp_path / "lib" / "libnvrtc.so.13"
    other.parent.mkdir()
    other.write_bytes(b"not the wheel's")
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f10 r-xp 00000000 08:01 42    {tmp_path}/lib/libnvrtc-builtins.so.13.5\n"
                    f"7f10-7f20 r-xp 00000000 08:01 43    {other}\n"
                    "7f20-7f30 rw-p 00000000 00:00 0 \n")
    assert nvrtc.mapped_library("libnvrtc.so", str(maps)) == str(other)
    assert nvrtc.mapped_library("libnvrtc.so", str(tmp_path / "none")) is None
    wheel = nvrtc.identity()
    try:
        nvrtc.identity.cache_clear()
        monkeypatch.setattr(nvrtc, "mapped_library", lambda prefix: str(other))
        assert nvrtc.identity().startswith(f"{other}:{other.stat().st_size}:")
        assert nvrtc.identity() != wheel
    finally:
        nvrtc.identity.cache_clear()
