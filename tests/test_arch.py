"""Every architecture tilec compiles for (tilec.arch, docs/language.md
"Architectures"): the examples, the FileCheck programs and a few dtype variants
through NVRTC for sm_80, sm_86, sm_89, sm_90a, sm_100a and sm_120a (no GPU
needed). Each gives a clean cubin (an empty NVRTC log) or, for a gemm where
there is no wgmma, the documented error at the gemm's line; never an NVRTC
failure."""
import re
import shutil
import subprocess
import warnings

import numpy as np
import pytest

import tilec
from tilec import arch as arch_info
from tilec.errors import DeviceError, SemanticError, TilecError
from conftest import ROOT, TILEC

ELF = b"\x7fELF"
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a")
PRE_HOPPER = ("sm_80", "sm_86", "sm_89")
FAMILY = {"sm_80": "Ampere", "sm_86": "Ampere", "sm_89": "Ada", "sm_100a": "Blackwell", "sm_120a": "Blackwell"}
PROGRAMS = sorted((ROOT / "examples").glob("*.tile")) + sorted((ROOT / "tests" / "filecheck").glob("*.tile"))
# what an architecture without TMA must not get, in its CUDA or its PTX
HOPPER_ONLY = ("cp.async.bulk", "mbarrier", "fence.proxy.async", "wgmma", "__grid_constant__", "CUtensorMap",
               "setmaxnreg")

DTYPE_PROGRAM = """
kernel convert_{dt}(A: {dt}[M, N], B: {dt}[M, N], C: f32[M, N]) {{
    const BM = 32, BN = 64;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared s: {dt}[BM, BN];
    shared t: f32[BM, BN];
    copy(A[by * BM, bx * BN], s);
    parallel (i, j) in (BM, BN) {{
        t[i, j] = s[i, j] * 2.0;
        s[i, j] = t[i, j] + 1.0;
    }}
    copy(s, B[by * BM, bx * BN]);
    copy(t, C[by * BM, bx * BN]);
}}
"""
DTYPES = ("f16", "bf16", "f8e4m3", "f8e5m2", "f64", "i8")


def gemm_line(text: str):
    """(line, column) of the program's first gemm statement, or None."""
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(r"\s*gemm\(", line):
            return n, len(line) - len(line.lstrip()) + 1
    return None


def gemm_error(name: str, where, arch: str) -> str:
    return (f"{name}:{where[0]}:{where[1]}: error: gemm needs Hopper's warpgroup MMA (wgmma.mma_async), which "
            f"only sm_90a has; {arch} ({FAMILY[arch]}) has none: compile this kernel for sm_90a")


def check_matrix_entry(src, name: str, text: str, arch: str):
    """src compiled for arch: the documented gemm error, or a clean cubin with
    only what the architecture has."""
    where = gemm_line(text)
    if where and arch != "sm_90a":
        with pytest.raises(SemanticError) as e:
            tilec.compile(src, arch=arch)
        assert str(e.value).splitlines()[0] == gemm_error(name, where, arch)
        return
    k = tilec.compile(src, arch=arch)
    assert k.arch == arch
    assert k.cubin[:4] == ELF
    assert f".target {arch}" in k.ptx
    assert f"// Compile with NVRTC for {arch};" in k.cuda_source
    assert k.compile_log == "", k.compile_log        # no NVRTC warning, no ptxas advisory
    if arch in PRE_HOPPER:
        for word in HOPPER_ONLY:
            assert word not in k.cuda_source and word not in k.ptx, word
        assert not k.kernel_ir.tensor_maps and not k.kernel_ir.barriers
    elif arch != "sm_90a":
        # Blackwell: TMA and the mbarrier protocol exactly as on Hopper
        hopper = tilec.compile(src, arch="sm_90a")
        assert k.cuda_source == hopper.cuda_source.replace("NVRTC for sm_90a;", f"NVRTC for {arch};")
        assert ("cp.async.bulk.tensor" in k.ptx) == ("cp.async.bulk.tensor" in hopper.ptx)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_program_on_every_architecture(path, arch):
    check_matrix_entry(str(path), str(path), path.read_text(), arch)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dt", DTYPES)
def test_every_dtype_on_every_architecture(dt, arch):
    """bf16 and the fp8 types convert in software where the target has no cvt for them."""
    src = DTYPE_PROGRAM.format(dt=dt)
    check_matrix_entry(src, "<string>", src, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_debug_builds_on_every_architecture(arch):
    """debug=True bounds mbarrier waits where there are mbarriers (sm_90a and newer)."""
    k = tilec.compile(str(ROOT / "examples" / "copy2d.tile"), arch=arch, debug=True)
    assert k.cubin[:4] == ELF and k.compile_log == "", k.compile_log
    assert ("mbarrier_wait_bounded" in k.cuda_source) == (arch not in PRE_HOPPER)


def test_the_matrix_covers_examples_with_and_without_gemm():
    names = {p.stem for p in PROGRAMS}
    assert {"copy2d", "scale", "im2col", "rowsum", "gemm", "gemm_f8", "conv2d"} <= names
    assert len([p for p in PROGRAMS if gemm_line(p.read_text())]) >= 6


def test_gemm_on_ampere_is_refused_at_its_line():
    with pytest.raises(SemanticError) as e:
        tilec.compile(str(ROOT / "examples" / "gemm.tile"), arch="sm_80")
    assert str(e.value) == (
        f"{ROOT / 'examples' / 'gemm.tile'}:17:9: error: gemm needs Hopper's warpgroup MMA (wgmma.mma_async), "
        "which only sm_90a has; sm_80 (Ampere) has none: compile this kernel for sm_90a\n"
        "        gemm(a, b, acc);               // acc += a @ b on tensor cores\n"
        "        ^~~~~~~~~~~~~~~~")


@pytest.mark.parametrize("arch", ["sm_75", "sm_90", "sm_100", "sm_103a", "compute_90a", "", "SM_80"])
def test_other_architectures_are_refused_with_the_list(arch):
    with pytest.raises(TilecError) as e:
        tilec.compile(str(ROOT / "examples" / "copy2d.tile"), arch=arch)
    assert str(e.value) == (f"error: unknown architecture {arch!r}: tilec compiles for "
                            "sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_120a")


@pytest.mark.parametrize("name", ["copy2d", "scale", "im2col"])
def test_pre_hopper_lowering_is_the_thread_copy_variant(name):
    """What sm_80 / sm_86 / sm_89 get is, line for line, the thread-copy variant of
    the sm_90a kernel (k.fallback): what tests/test_gpu_prehopper.py runs on an H100."""
    path = str(ROOT / "examples" / f"{name}.tile")
    hopper = tilec.compile(path, arch="sm_90a").fallback
    for arch in PRE_HOPPER:
        k = tilec.compile(path, arch=arch)
        assert k.cuda_source == hopper.cuda_source.replace("NVRTC for sm_90a;", f"NVRTC for {arch};")
        assert k.host_source == hopper.host_source
        assert k.ir() and k.ir("lower-copies") == hopper.ir("lower-copies")
        assert "thread.copy" in k.ir("lower-copies") and "tma." not in k.ir("plan-smem")


def test_shared_memory_limit_is_the_architectures():
    src = """
kernel big(A: f32[M, N], B: f32[M, N]) {
    const BM = 128, BN = 256;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared s: f32[BM, BN];
    copy(A[by * BM, bx * BN], s);
    copy(s, B[by * BM, bx * BN]);
}
"""
    for arch in ("sm_80", "sm_90a", "sm_100a"):              # 128 KB fits
        assert tilec.compile(src, arch=arch).cubin[:4] == ELF
    for arch, limit, block in (("sm_86", 101376, "an sm_86 (Ampere) block"),
                               ("sm_89", 101376, "an sm_89 (Ada) block"),
                               ("sm_120a", 101376, "an sm_120a (Blackwell) block")):
        with pytest.raises(SemanticError) as e:
            tilec.compile(src, arch=arch)
        assert str(e.value).splitlines()[0] == (f"<string>:6:5: error: shared tiles need 131072 bytes; {block} "
                                                f"has at most {limit} bytes of shared memory")


def test_an_absurd_tile_names_the_architectures_limit():
    src = """
kernel huge(A: f32[M, N]) {
    grid (bx) = (1);
    threads 128;
    shared s: f32[4096, 4096];
    copy(A[0, 0], s);
}
"""
    for arch, block, limit in (("sm_90a", "a Hopper block", 232448), ("sm_86", "an sm_86 (Ampere) block", 101376)):
        with pytest.raises(SemanticError) as e:
            tilec.compile(src, arch=arch)
        assert str(e.value).splitlines()[0] == (f"<string>:5:5: error: shared tile 's' is 67108864 bytes; {block} "
                                                f"has at most {limit} bytes of shared memory")


def test_cache_keys_include_the_architecture():
    path = str(ROOT / "examples" / "copy2d.tile")
    a, b = tilec.compile(path, arch="sm_80"), tilec.compile(path, arch="sm_86")
    assert a is not b and a.arch == "sm_80" and b.arch == "sm_86"
    assert tilec.compile(path, arch="sm_80") is a


# ---------------------------------------------------------------- which cubin runs where

@pytest.mark.parametrize("cc, arch", [((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 7), "sm_86"), ((8, 9), "sm_89"),
                                      ((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((12, 0), "sm_120a")])
def test_target_arch_of_a_device(monkeypatch, cc, arch):
    from tilec.runtime import driver
    monkeypatch.setattr(driver, "have_gpu", lambda: True)
    monkeypatch.setattr(driver, "compute_capability", lambda device: cc)
    assert driver.target_arch() == arch
    assert arch_info.runs_on(arch, *cc)


@pytest.mark.parametrize("cc", [(7, 5), (10, 3), (12, 1), (11, 0)])
def test_target_arch_of_a_device_tilec_cannot_run_on(monkeypatch, cc):
    from tilec.runtime import driver
    monkeypatch.setattr(driver, "have_gpu", lambda: True)
    monkeypatch.setattr(driver, "compute_capability", lambda device: cc)
    with pytest.raises(DeviceError, match=rf"device 0 has compute capability {cc[0]}\.{cc[1]}, and tilec compiles "
                                          "for sm_80, sm_86, sm_89, sm_90a, sm_100a, sm_120a: none of their cubins "
                                          "runs on it"):
        driver.target_arch()


@pytest.mark.parametrize("cc, hint", [((8, 6), "compile it with arch='sm_86' (or leave arch out)"),
                                      ((7, 5), "no architecture tilec compiles for runs there")])
def test_a_cubin_for_another_architecture_is_refused_at_load(monkeypatch, cc, hint):
    pytest.importorskip("cuda.bindings.driver")
    from tilec.runtime import driver
    monkeypatch.setattr(driver, "compute_capability", lambda device: cc)
    with pytest.raises(DeviceError) as e:
        driver.LoadedKernel(b"", "copy2d", 0, 0, "sm_90a")
    assert str(e.value) == (f"error: kernel copy2d was compiled for sm_90a, which does not run on device 0 "
                            f"(compute capability {cc[0]}.{cc[1]}): {hint}")


def test_which_cubins_run_where():
    assert arch_info.runs_on("sm_80", 8, 9) and not arch_info.runs_on("sm_80", 9, 0)
    assert not arch_info.runs_on("sm_89", 8, 6)
    assert arch_info.runs_on("sm_90a", 9, 0) and not arch_info.runs_on("sm_90a", 10, 0)
    assert not arch_info.runs_on("sm_100a", 10, 3) and not arch_info.runs_on("sm_120a", 12, 1)


# ---------------------------------------------------------------- the command line

def tilec_cli(*args):
    return subprocess.run(TILEC + list(args), capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_cli_emit_and_check_take_arch():
    p = tilec_cli("emit", "examples/copy2d.tile", "--emit", "ptx", "--arch", "sm_86")
    assert p.returncode == 0, p.stderr
    assert ".target sm_86" in p.stdout and "cp.async.bulk" not in p.stdout
    p = tilec_cli("emit", "examples/copy2d.tile", "--emit", "ir", "--arch", "sm_100a")
    assert p.returncode == 0 and "tma.load.tile s <- A" in p.stdout
    p = tilec_cli("check", "examples/scale.tile", "--arch", "sm_120a")
    assert p.returncode == 0 and "cubin for sm_120a" in p.stdout


def test_cli_refuses_gemm_and_unknown_architectures():
    p = tilec_cli("check", "examples/gemm.tile", "--arch", "sm_89")
    assert p.returncode == 1
    assert p.stderr == (
        "examples/gemm.tile:17:9: error: gemm needs Hopper's warpgroup MMA (wgmma.mma_async), which only sm_90a "
        "has; sm_89 (Ada) has none: compile this kernel for sm_90a\n"
        "        gemm(a, b, acc);               // acc += a @ b on tensor cores\n"
        "        ^~~~~~~~~~~~~~~~\n")
    p = tilec_cli("emit", "examples/copy2d.tile", "--emit", "ir", "--arch", "sm_70")
    assert p.returncode == 1
    assert p.stderr == ("error: unknown architecture 'sm_70': tilec compiles for sm_80, sm_86, sm_89, sm_90a, "
                        "sm_100a, sm_120a\n")


# ---------------------------------------------------------------- fp8 without cvt (sm_80, sm_86)

def _soft_fp8_program() -> str:
    """The f8_soft primitives as host C++ (the one asm line, cvt.rni, as
    std::nearbyint: round to nearest even in the default rounding mode)."""
    from tilec.codegen.cuda import _env
    prim = _env().get_template("primitives.cu.j2").module
    code = str(prim.f8_soft("f8e4m3_t", "e4m3")) + "\n" + str(prim.f8_soft("f8e5m2_t", "e5m2"))
    code, n = re.subn(r'asm\("cvt\.rni\.f32\.f32 %0, %1;" : "=f"\(q\) : "f"\(units\)\);',
                      "q = std::nearbyint(units);", code)
    assert n == 2 and "asm" not in code
    return """#include <cmath>
#include <cstdio>
#include <cstring>
#define __device__
static unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
""" + code + """
int main() {
  unsigned u;
  while (std::scanf("%x", &u) == 1) {
    const float f = __uint_as_float(u);
    std::printf("%u %u\\n", f8e4m3_t(f).bits, f8e5m2_t(f).bits);
  }
  for (int c = 0; c < 256; ++c) {
    f8e4m3_t a; a.bits = static_cast<unsigned char>(c);
    f8e5m2_t b; b.bits = static_cast<unsigned char>(c);
    std::printf("%x %x\\n", __float_as_uint(float(a)), __float_as_uint(float(b)));
  }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the host copy of the primitives")
def test_software_fp8_conversions_match_the_interpreter(tmp_path):
    """Every fp8 code decodes, and floats (random, special, and every midpoint
    between fp8 values and its neighbours) encode, bit for bit as the
    interpreter's cvt.rn.satfinite model (tilec.runtime.interpret.numbers)."""
    from tilec.ir import nodes as ir
    from tilec.runtime.interpret import numbers
    (tmp_path / "f8.cc").write_text(_soft_fp8_program())
    subprocess.run(["g++", "-O1", "-std=c++17", "-o", str(tmp_path / "f8"), str(tmp_path / "f8.cc")], check=True)
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal(4000).astype(np.float32) * s for s in (1e-5, 1e-3, 1, 30, 1e3, 1e5)]
    parts.append(np.array([0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 448, 449, 464, 465, 480, 1e6, 57344, 61439,
                           61440, 65536, 1e-9, -1e-9, 2 ** -9, 2 ** -10, 3 * 2 ** -10, 2 ** -16, 2 ** -17,
                           3 * 2 ** -17, 1e-45], np.float32))
    for name in ("f8e4m3", "f8e5m2"):
        v = numbers.decode(np.arange(256, dtype=np.uint8), ir.DTYPES[name]).astype(np.float64)
        v = np.unique(v[np.isfinite(v)])
        mids = ((v[1:] + v[:-1]) / 2).astype(np.float32)
        parts += [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
                  v.astype(np.float32)]
    f = np.concatenate(parts)
    out = subprocess.run([str(tmp_path / "f8")], input="\n".join(f"{b:x}" for b in f.view(np.uint32)),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    encoded = np.array([[int(x) for x in line.split()] for line in out[:len(f)]])
    decoded = np.array([[int(x, 16) for x in line.split()] for line in out[len(f):]], dtype=np.uint32)
    assert decoded.shape == (256, 2)
    for i, name in enumerate(("f8e4m3", "f8e5m2")):
        want = numbers.encode(f, ir.DTYPES[name])
        bad = np.nonzero(encoded[:, i] != want)[0]
        assert bad.size == 0, [(float(f[j]), int(encoded[j, i]), int(want[j])) for j in bad[:5]]
        ref = numbers.decode(np.arange(256, dtype=np.uint8), ir.DTYPES[name])
        got = decoded[:, i].view(np.float32)
        same = (got == ref) & (np.signbit(got) == np.signbit(ref)) | (np.isnan(got) & np.isnan(ref))
        assert same.all(), np.nonzero(~same)[0][:10]


def test_fp8_on_ampere_uses_the_software_conversions():
    src = DTYPE_PROGRAM.format(dt="f8e4m3")
    assert "cvt.rn.satfinite.e4m3x2.f32" in tilec.compile(src, arch="sm_89").cuda_source
    for arch in ("sm_80", "sm_86"):
        cuda = tilec.compile(src, arch=arch).cuda_source
        assert "satfinite" not in cuda and "This target has no fp8 cvt" in cuda


# ---------------------------------------------------------------- each lowering on the CPU interpreter

@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_100a"])
def test_the_interpreter_runs_each_architectures_lowering(arch):
    """tilec.compile(..., backend="interpret", arch=...) runs the IR lowered for
    that architecture: thread copies before sm_90, TMA from it; same results."""
    rng = np.random.default_rng(1)
    copy2d = tilec.compile(str(ROOT / "examples" / "copy2d.tile"), backend="interpret", arch=arch)
    assert copy2d.arch == arch and ("tma.load" in copy2d.ir("plan-smem")) == (arch not in PRE_HOPPER)
    a = rng.standard_normal((333, 516)).astype(np.float32)     # rows TMA can copy: no fallback
    b = np.zeros_like(a)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tilec.TmaFallbackWarning)
        copy2d(a, b)
    assert np.array_equal(a, b)
    if arch in PRE_HOPPER:      # no TMA, so no TMA rule: rows of 2068 bytes run as they are, no warning
        a7 = rng.standard_normal((33, 517)).astype(np.float32)
        b7 = np.zeros_like(a7)
        with warnings.catch_warnings():
            warnings.simplefilter("error", tilec.TmaFallbackWarning)
            copy2d(a7, b7)
        assert np.array_equal(a7, b7)

    scale = tilec.compile(str(ROOT / "examples" / "scale.tile"), backend="interpret", arch=arch)
    y = np.zeros_like(a)
    scale(a, y, 2.0)
    assert np.array_equal(y, a * 2 + 1)

    im2col = str(ROOT / "examples" / "im2col.tile")
    x = rng.standard_normal((2, 9, 9, 64)).astype(np.float16)
    got, want = np.zeros((2 * 9 * 9, 9 * 64), np.float16), np.ones((2 * 9 * 9, 9 * 64), np.float16)
    tilec.compile(im2col, backend="interpret", arch=arch)(x, got)
    tilec.compile(im2col, backend="interpret", arch="sm_90a")(x, want)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("dt", ["bf16", "f8e4m3", "f8e5m2"])
def test_the_interpreter_agrees_across_architectures_on_narrow_floats(dt):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    np_dt = {"bf16": ml_dtypes.bfloat16, "f8e4m3": ml_dtypes.float8_e4m3fn, "f8e5m2": ml_dtypes.float8_e5m2}[dt]
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((70, 128)) * 8).astype(np_dt)
    outs = []
    for arch in ("sm_80", "sm_90a"):
        b, c = np.zeros_like(a), np.zeros(a.shape, np.float32)
        tilec.compile(DTYPE_PROGRAM.format(dt=dt), backend="interpret", arch=arch)(a, b, c)
        outs.append((b.view(np.uint8 if a.itemsize == 1 else np.uint16), c))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][1], outs[1][1])
    assert np.array_equal(outs[0][1], a.astype(np.float32) * 2)


def test_the_interpreter_refuses_gemm_and_unknown_architectures():
    with pytest.raises(SemanticError, match="gemm needs Hopper's warpgroup MMA"):
        tilec.compile(str(ROOT / "examples" / "gemm.tile"), backend="interpret", arch="sm_86")
    with pytest.raises(TilecError, match="unknown architecture 'sm_75'"):
        tilec.compile(str(ROOT / "examples" / "copy2d.tile"), backend="interpret", arch="sm_75")


# ---------------------------------------------------------------- the thread copies' CUDA, run on the CPU

_CPU_SHIM = r"""
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <cmath>
#include <math.h>
// fminf / fmaxf / fmin / fmax as the GPU computes them (IEEE 754-2019 minimumNumber /
// maximumNumber): a NaN gives the other operand, two NaNs the canonical NaN (doubles: b), and
// -0 < +0 (the C library may return either zero of a pair and a NaN operand's own payload)
template <class T, class U> T tl_host_min_max(T a, T b, bool max) {
  if (std::isnan(a) && std::isnan(b)) {
    const U bits = ~U(0) >> 1;
    T t;
    memcpy(&t, &bits, sizeof t);
    return sizeof(T) == 4 ? t : b;
  }
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? b : a;
  const bool below = a < b || (a == b && std::signbit(a) && !std::signbit(b));
  return below == max ? b : a;
}
#define fminf(a, b) tl_host_min_max<float, uint32_t>(a, b, false)
#define fmaxf(a, b) tl_host_min_max<float, uint32_t>(a, b, true)
#define fmin(a, b) tl_host_min_max<double, uint64_t>(a, b, false)
#define fmax(a, b) tl_host_min_max<double, uint64_t>(a, b, true)
struct tl_dim3 { unsigned x, y, z; };
thread_local tl_dim3 threadIdx;
tl_dim3 blockIdx;
std::barrier<>* tl_block_barrier;
inline void __syncthreads() { tl_block_barrier->arrive_and_wait(); }
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
alignas(1024) unsigned char tl_cpu_smem[1 << 18];
template <int N> void tl_cp_async(void* dst, const void* src, int bytes) {  // cp.async: `bytes` read, the rest zeros
  if (bytes < 0 || bytes > N) abort();
  memcpy(dst, src, bytes);
  memset(static_cast<unsigned char*>(dst) + bytes, 0, N - bytes);
}
inline void tl_cp_async4(void* dst, const void* src, int bytes) { tl_cp_async<4>(dst, src, bytes); }
inline void tl_cp_async8(void* dst, const void* src, int bytes) { tl_cp_async<8>(dst, src, bytes); }
inline void tl_cp_async16(void* dst, const void* src, int bytes) { tl_cp_async<16>(dst, src, bytes); }
inline void tl_cp_async_wait_all() {}
template <class T> T tl_load_if(const T* p, bool in) {  // a predicated load: zero bits where `in` does not hold
  T v;
  if (in) memcpy(&v, p, sizeof v); else memset(&v, 0, sizeof v);
  return v;
}
#define TL_LOAD_IF(n) template <class T> T tl_load_if##n(const T* p, bool in) { \
  static_assert(sizeof(T) == n); return tl_load_if(p, in); }
TL_LOAD_IF(1) TL_LOAD_IF(2) TL_LOAD_IF(4) TL_LOAD_IF(8)
// a grid of gx x gy blocks, one after another; each block's threads at once, as std::threads
template <class F> void tl_launch(unsigned gx, unsigned gy, unsigned threads, F body) {
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      blockIdx = {bx, by, 0};
      std::barrier<> bar(threads);
      tl_block_barrier = &bar;
      std::vector<std::thread> ts;
      for (unsigned t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
          threadIdx = {t, 0, 0};
          body();
        });
      for (auto& th : ts) th.join();
    }
}
"""
# the device definitions the shim replaces (inline PTX)
_PTX_HELPERS = re.compile(r"(template <class T> )?__device__ __forceinline__ \w+ "
                          r"(smem_addr|tl_cp_async\d+|tl_cp_async_wait_all|tl_load_if\d)\(.*?\n}\n", re.S)


def build_on_cpu(tmp_path, cuda, prelude, main):
    """`cuda` (a kernel's CUDA for sm_80) built with g++ between `prelude` (the shim and
    what else it needs) and `main`: its inline-PTX helpers dropped for the shim's, its
    shared memory the shim's array; float operations not contracted, as NVRTC runs with
    --fmad=false, and integers wrapping. Returns the executable and how many helpers went."""
    cuda, helpers = _PTX_HELPERS.subn("", cuda)
    cuda = cuda.replace("extern __shared__ __align__(1024) unsigned char tl_smem[];",
                        "unsigned char* const tl_smem = tl_cpu_smem;")
    (tmp_path / "k.cc").write_text(prelude + cuda + main)
    subprocess.run(["g++", "-O1", "-std=c++20", "-ffp-contract=off", "-fwrapv", "-fno-strict-aliasing", "-pthread",
                    "-w", "-o", str(tmp_path / "k"), str(tmp_path / "k.cc")], check=True)
    return tmp_path / "k", helpers

_CPU_MAIN = r"""
int main(int argc, char** argv) {  // M N offA sA0 sA1 offB sB0 sB1 lenA lenB; A's and B's buffers on stdin
  long long v[10];
  for (int i = 0; i < 10; ++i) v[i] = atoll(argv[i + 1]);
  std::vector<unsigned char> a(v[8] * sizeof(T) + 64), b(v[9] * sizeof(T) + 64);
  T* A = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(a.data()) + 63) / 64 * 64);
  T* B = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(b.data()) + 63) / 64 * 64);
  if (fread(A, sizeof(T), v[8], stdin) != size_t(v[8]) || fread(B, sizeof(T), v[9], stdin) != size_t(v[9])) return 2;
  tl_launch((v[1] + BN - 1) / BN, (v[0] + BM - 1) / BM, THREADS, [&] {
    copy2d(A + v[2], v[0], v[1], v[3], v[4], B + v[5], v[0], v[1], v[6], v[7]);
  });
  fwrite(B, sizeof(T), v[9], stdout);
}
"""

CPU_COPY = """
kernel copy2d(A: {dt}[M, N], B: {dt}[M, N]) {{
    const BM = {bm}, BN = {bn};
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads {threads};
    shared s: {dt}[BM, BN];
    copy(A[by * BM, bx * BN], s);
    copy(s, B[by * BM, bx * BN]);
}}
"""

# M, N, A's offset and strides, B's offset and strides (elements): 16-byte vectors, vectors with a
# partial last one, offsets that keep or break the alignment, strided columns, a single element
CPU_CASES = [(100, 300, 0, 300, 1, 0, 300, 1), (100, 301, 0, 304, 1, 0, 304, 1), (70, 301, 16, 304, 1, 32, 320, 1),
             (70, 301, 1, 304, 1, 3, 305, 1), (70, 130, 0, 260, 2, 0, 131, 1), (1, 1, 0, 1, 1, 0, 1, 1),
             (65, 129, 0, 144, 1, 0, 129, 1)]


# the same, each tile's columns reversed on the way: columns past N read as zeros land inside B
CPU_REVERSE = CPU_COPY.replace("copy(A[by * BM, bx * BN], s);", """shared r: {dt}[BM, BN];
    copy(A[by * BM, bx * BN], s);
    parallel (i, j) in (BM, BN) {{
        r[i, j] = s[i, BN - 1 - j];
    }}""").replace("copy(s, B[", "copy(r, B[")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the generated CUDA for the CPU")
@pytest.mark.parametrize("reverse", [False, True], ids=["copy", "reverse"])
@pytest.mark.parametrize("dt, ctype, bm, bn, threads", [("f32", "float", 64, 128, 128), ("i8", "signed char", 8, 48, 64),
                                                        ("f64", "double", 16, 64, 96)])
def test_thread_copies_run_on_the_cpu(tmp_path, dt, ctype, bm, bn, threads, reverse):
    """The CUDA sm_80 gets for copy2d (16-byte vector copies when the rows allow,
    element copies otherwise) built with g++, one std::thread per CUDA thread and
    a std::barrier for __syncthreads, cp.async as a copy of its byte count and
    zeros for the rest of the 16: every element lands, nothing else is written."""
    k = tilec.compile((CPU_REVERSE if reverse else CPU_COPY).format(dt=dt, bm=bm, bn=bn, threads=threads), arch="sm_80")
    assert "tl_v16" in k.cuda_source and "tl_cp_async16(" in k.cuda_source
    main = _CPU_MAIN.replace("THREADS", str(threads)).replace("BM", str(bm)).replace("BN", str(bn))
    exe, helpers = build_on_cpu(tmp_path, k.cuda_source, _CPU_SHIM + f"using T = {ctype};\n", main)
    assert helpers == 4     # element copies of 4 and 8 bytes go through cp.async too, of 1 byte tl_load_if1
    assert ("tl_load_if1(" in k.cuda_source) == (dt == "i8")
    npt = {"f32": np.float32, "i8": np.int8, "f64": np.float64}[dt]
    for m, n, off_a, a0, a1, off_b, b0, b1 in CPU_CASES:
        len_a, len_b = off_a + (m - 1) * a0 + (n - 1) * a1 + 1, off_b + (m - 1) * b0 + (n - 1) * b1 + 8
        a = (np.random.default_rng(m + n).standard_normal(len_a) * 50).astype(npt)
        b = np.full(len_b, 77, npt)
        out = subprocess.run([str(exe)] + [str(x) for x in (m, n, off_a, a0, a1, off_b, b0, b1, len_a, len_b)],
                             input=a.tobytes() + b.tobytes(), capture_output=True, check=True, timeout=120).stdout
        i, j = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
        want = b.copy()
        src = j // bn * bn + bn - 1 - j % bn if reverse else j        # the column of A that lands at j
        want[off_b + i * b0 + j * b1] = np.where(src < n, a[off_a + i * a0 + np.minimum(src, n - 1) * a1], 0)
        got = np.frombuffer(out, npt)
        assert np.array_equal(got, want), ((m, n, off_a, a0, a1, off_b, b0, b1), int((got != want).sum()))
