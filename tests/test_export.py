"""`tilec export`: a kernel as a cubin, a C header and a C++ launcher that needs
cuda.h and libcuda only.

On the CPU: the files, FileCheck over the generated C++, a syntax check of the
C++ (and of the header as C) with the system compiler, and the launcher run
against a stand-in libcuda (STUB below) that prints every driver call it gets:
for good arguments its cuTensorMapEncode* calls must be, argument for argument,
what the Python wrapper passes to the driver for the same tensors (the real
runtime.host code, with a stand-in cuda.bindings that records its calls), and
its launch the kernel's parameters in abi.kernel_params' order; for bad ones
its error code and message must be the Python wrapper's (the interpreter's
launch checks, which are the wrapper's) word for word. The same comparison runs
on tests/random_programs.py's programs with random views of their shapes
(TILEC_RANDOM_EXPORTS examples, seed TILEC_RANDOM_EXPORTS_SEED).

On the GPU (marked gpu): the launcher built with -lcuda and a C++ main, run on
data the test writes, against the Python launch of the same kernel, bit for bit,
with every output a view inside a sentinel-filled buffer whose padding must
stay intact."""
import ctypes
import os
import re
import shlex
import struct
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, seed as hyp_seed, settings as hyp_settings, strategies as st

import tilec
from tilec.autotune import shape_symbols
from tilec.codegen import export as tilec_export
from tilec.compiler import load_source
from tilec.codegen.abi import WORKSPACE_FLAG_BYTES, kernel_params, workspace_bytes_per_block
from tilec.errors import LaunchError
from tilec.ir import nodes as ir
from tilec.runtime import host as rt
from tilec.runtime import tensormap
from conftest import ROOT, TILEC
from host_toolchain import CC, CUDA_INCLUDE, CXX, libcuda_link_args
from test_filecheck import FILECHECK
from test_interpret import im2col_reference
from random_programs import program as random_program

EXAMPLES = ["copy2d", "scale", "im2col", "gemm", "conv2d", "rowsum"]
# Host expressions the examples do not have: requires over scalars, a division that
# floors below zero and one by a scalar, max() in the grid, an f32 scalar, min() and
# max() of floats (in float, not truncated to integers).
WEIRD = """
kernel weird(X: f16[M, N], Y: f16[M, N], n: i32, beta: f32) {
    const BM = 16, BN = 64;
    require M % 2 == 0 && n > -3;
    require (N - 70) / 4 >= -1;
    require N / n >= 1;
    require (M < 64) == (N < 64) || M % 4 == 0 && N > 0;
    require min(beta, 2.0) > 0.25 && max(abs(beta), -1.0) < 0.5;
    grid (bx, by) = (cdiv(N, BN), max(cdiv(M, BM), 1));
    threads 128;
    shared s: f16[BM, BN];
    copy(X[by * BM, bx * BN], s);
    parallel (i, j) in (BM, BN) {
        s[i, j] = f16(s[i, j] * beta);
    }
    copy(s, Y[by * BM, bx * BN]);
}
"""
# No tensor map at all: one cubin, no TMA rules.
PLAIN = """
kernel plain(X: f32[N], Y: f32[N]) {
    grid (bx) = (cdiv(N, 256));
    threads 256;
    local r: f32[256];
    copy(X[bx * 256], r);
    copy(r, Y[bx * 256]);
}
"""
# Ranks 1 and 3: the driver's dummy stride of a rank-1 map, strides of extent-1 dims.
COPY1 = """
kernel copy1(A: f32[N], B: f32[N]) {
    grid (bx) = (cdiv(N, 256));
    threads 128;
    shared s: f32[256];
    copy(A[bx * 256], s);
    copy(s, B[bx * 256]);
}
"""
COPY3 = """
kernel copy3(A: f32[D, M, N], B: f32[D, M, N]) {
    grid (bx, by, bz) = (cdiv(N, 64), cdiv(M, 8), cdiv(D, 4));
    threads 128;
    shared s: f32[4, 8, 64];
    copy(A[bz * 4, by * 8, bx * 64], s);
    copy(s, B[bz * 4, by * 8, bx * 64]);
}
"""
# grid ..., persistent = 1: 11 tiles; the stub's GPU holds 4 blocks (STUB_RESIDENT)
PERSIST = """
kernel persist(A: f32[N], B: f32[N]) {
    grid (bx) = (cdiv(N, 256)), persistent = 1;
    threads 128;
    shared s: f32[256];
    copy(A[bx * 256], s);
    copy(s, B[bx * 256]);
}
"""
# Writes no tensor: nothing for the launcher's write checks, under either pointer-check flag
READONLY = """
kernel readonly(A: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 128), cdiv(M, 64));
    threads 128;
    shared s: f32[64, 128];
    copy(A[by * 64, bx * 128], s);
}
"""
# 16-bit float scalars: the launcher takes their bits (uint16_t), as the Python wrapper packs them
HALVES = """
kernel halves(X: f32[N], Y: f32[N], a: f16, b: bf16) {
    grid (bx) = (cdiv(N, 256));
    threads 128;
    shared s: f32[256];
    copy(X[bx * 256], s);
    parallel (i) in (256) {
        s[i] = s[i] * a + b;
    }
    copy(s, Y[bx * 256]);
}
"""
STUB_RESIDENT = 4       # the stub's SMs (4) times the blocks per SM its occupancy query answers (1)
# gemm.tile's declared tiles, persistent, stream-K: every const given, so nothing is tuned
STREAM_K_GEMM = dict(BM=128, BN=128, STAGES=3, PRODUCER=1, PERSISTENT=1, STREAM_K=1)
PROGRAMS = {"weird": WEIRD, "plain": PLAIN, "copy1": COPY1, "copy3": COPY3, "persist": PERSIST,
            "readonly": READONLY, "halves": HALVES}
needs_cxx = pytest.mark.skipif(CXX is None or CUDA_INCLUDE is None,
                               reason="needs a C++ compiler (g++) and the CUDA driver API's cuda.h (a CUDA toolkit, "
                                      "CUDA_HOME, or an NVIDIA wheel's include dir); none found")


def compile_kernel(name, **consts):
    src = PROGRAMS.get(name) or str(ROOT / "examples" / f"{name}.tile")
    return tilec.compile(src, arch="sm_90a", debug=False, **consts)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (directory, tilec.Kernel) of each example's export (with its
    thread-copy variant), plus copy2d exported with --no-fallback as copy2d_strict
    and gemm.tile persistent with a stream-K schedule (STREAM_K_GEMM) as gemm_sk,
    without one as gemm_pe, and conv2d.tile with C fixed to 24 as conv2d_c24."""
    out = {}
    for name in EXAMPLES + list(PROGRAMS):
        d = tmp_path_factory.mktemp(name)
        k = compile_kernel(name)
        tilec_export.generate(k).write(d)
        out[name] = (d, k)
    d = tmp_path_factory.mktemp("copy2d_strict")
    k = tilec.compile(str(ROOT / "examples" / "copy2d.tile"), arch="sm_90a", debug=False, fallback=False)
    tilec_export.generate(k, fallback=False).write(d)
    out["copy2d_strict"] = (d, k)
    for name, consts in (("gemm_sk", STREAM_K_GEMM), ("gemm_pe", dict(STREAM_K_GEMM, STREAM_K=0)),
                         ("conv2d_c24", {"C": 24})):
        d = tmp_path_factory.mktemp(name)
        k = compile_kernel(name.partition("_")[0], **consts)
        tilec_export.generate(k).write(d)
        out[name] = (d, k)
    return out


# ---------------------------------------------------------------- the files

@pytest.mark.parametrize("name", EXAMPLES)
def test_export_writes_the_files(exported, name):
    d, k = exported[name]
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [f"{name}.h", f"{name}.cc", f"{name}.cubin", f"{name}.thread_copy.cubin"])
    assert (d / f"{name}.cubin").read_bytes() == k.cubin
    assert (d / f"{name}.thread_copy.cubin").read_bytes() == k.fallback.cubin
    assert (d / f"{name}.cubin").read_bytes()[:4] == b"\x7fELF"
    source = (d / f"{name}.cc").read_text()
    assert f'extern "C" int tilec_{name}(' in source
    # the cubins are embedded byte for byte
    first = ", ".join(f"0x{b:02x}" for b in k.cubin[:16])
    assert f"tl_tma_variant_cubin[{len(k.cubin)}] = {{\n    {first}," in source


def test_no_fallback_export_has_one_cubin(exported):
    d, k = exported["copy2d_strict"]
    assert sorted(p.name for p in d.iterdir()) == ["copy2d.cc", "copy2d.cubin", "copy2d.h"]
    source = (d / "copy2d.cc").read_text()
    assert "thread_copy" not in source
    assert "TILEC_ETMA    an argument breaks a TMA rule" in (d / "copy2d.h").read_text()


def test_cli_export(tmp_path):
    p = subprocess.run([*TILEC, "export", "examples/scale.tile", "-o", str(tmp_path), "-D", "BN=128"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert sorted(Path(line).name for line in p.stdout.split()) == [
        "scale.cc", "scale.cubin", "scale.h", "scale.thread_copy.cubin"]
    assert "// consts: BM = 32, BN = 128" in (tmp_path / "scale.cc").read_text()


def test_cli_export_of_a_tuned_program_says_what_it_holds(tmp_path):
    """A program with a tune statement exports its declared values; the note says so
    (and goes once every tuned const is given)."""
    argv = [*TILEC, "export", "examples/gemm.tile", "-o", str(tmp_path)]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(tmp_path / f"gemm.{e}") for e in ("h", "cc", "cubin", "thread_copy.cubin")]
    assert p.stderr == (
        "examples/gemm.tile: note: the export holds the tune statement's declared values (BM=128 BN=128 STAGES=3 "
        "PRODUCER=1 PERSISTENT=0 STREAM_K=0 BK=64), not a tuned choice: give the values tuned for your shapes "
        "with -D, or tune in Python and write the choice with k.export(DIR) after a call\n")
    given = [a for kv in ("BM=64", "BN=128", "STAGES=4", "PRODUCER=1", "PERSISTENT=0", "STREAM_K=0", "BK=64")
             for a in ("-D", kv)]
    p = subprocess.run(argv + given, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "// consts: BM = 64, BN = 128, BK = 64, STAGES = 4," in (tmp_path / "gemm.h").read_text()


def test_cli_export_errors_cleanly(tmp_path):
    p = subprocess.run([*TILEC, "export", "examples/gemm.tile", "-o", str(tmp_path), "-D", "BN=100"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert re.search(r"examples/gemm.tile:\d+:9: error: gemm: the tile width N = 100 must be a multiple of 8",
                     p.stderr), p.stderr


def test_a_debug_build_is_not_exported():
    k = tilec.compile(str(ROOT / "examples" / "copy2d.tile"), arch="sm_90a", debug=True)
    with pytest.raises(tilec.TilecError, match="a debug build cannot be exported"):
        tilec_export.generate(k)


# ---------------------------------------------------------------- FileCheck over the C++

CHECKS = {
    "copy2d": """
CHECK:      extern "C" int tilec_copy2d(
CHECK-NEXT:     CUstream stream,
CHECK-NEXT:     CUdeviceptr A, const int64_t A_shape[2], const int64_t A_strides[2],
CHECK-NEXT:     CUdeviceptr B, const int64_t B_shape[2], const int64_t B_strides[2],
CHECK-NEXT:     char* err,
CHECK-NEXT:     size_t err_len) {
CHECK:        const long long M = A_shape[0];  // A dim 0
CHECK-NEXT:   const long long N = A_shape[1];  // A dim 1
CHECK:        if (B_shape[0] != M)
CHECK-NEXT:     return tl_fail(err, err_len, TILEC_EARG, "argument B: dim 0 is ", B_shape[0], " but M = ", M,
CHECK-NEXT:                    " (from A dim 0)");
CHECK:        // {{.*}}examples/copy2d.tile:4: grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
CHECK-NEXT:   const long long tl_grid[3] = {tl_cdiv(N, 128), tl_cdiv(M, 64), 1};
CHECK:        CUtensorMap tl_tmap_A, tl_tmap_B;
CHECK-NEXT:   int tl_rc = tl_encode_tiled(tl_tmap_A, tl_rule_tmap_A, A, A_shape, A_strides, tl_why);
CHECK-NEXT:   if (tl_rc == TILEC_OK) tl_rc = tl_encode_tiled(tl_tmap_B, tl_rule_tmap_B, B, B_shape, B_strides, tl_why);
CHECK-NEXT:   if (tl_rc == TILEC_ETMA) {
CHECK-NEXT:     void* tl_thread_copy_params[] = {tl_param(&A), tl_param(&A_shape[0]), tl_param(&A_shape[1]),
CHECK:          return tl_launch(tl_thread_copy_variant, tl_grid, tl_thread_copy_params, stream, err, err_len,
CHECK:        if (tl_rc != TILEC_OK)
CHECK-NEXT:     return tl_fail(err, err_len, tl_rc, tl_why);
CHECK-NEXT:   void* tl_params[] = {&tl_tmap_A, &tl_tmap_B, tl_param(&B), tl_param(&B_shape[0]), tl_param(&B_shape[1]),
CHECK-NEXT:                        tl_param(&B_strides[0]), tl_param(&B_strides[1])};
CHECK-NEXT:   return tl_launch(tl_tma_variant, tl_grid, tl_params, stream, err, err_len, "");
""",
    "copy2d.rules": """
CHECK:      void tiled_problems(
CHECK:        if (address % 16) {
CHECK:          p.add("base address ", hex, " is not 16-byte aligned (TMA requires 16-byte aligned tensors)");
CHECK:        p.add("dim ", d, " is ", shape[d], "; TMA dims are 1 .. 2^32");
CHECK:        p.add("innermost dim ", rank - 1, " has stride ", strides[rank - 1],
CHECK:              " bytes is not a multiple of 16 (TMA requires 16-byte aligned strides)");
CHECK:          p.add("dim ", d, " stride ", b, " bytes is outside TMA's 0 .. 2^40");
CHECK:      int tl_encode_tiled(
CHECK:        if (m.inner_rounded) {
CHECK:                          " bytes, less than the 16-byte granule a TMA store writes");
CHECK:          dims[m.rank - 1] = shape[m.rank - 1] / per * per;
CHECK:        if (int rc = empty(m.tensor, m.rank, shape, why)) return rc;
CHECK:        tma_strides(m.rank, m.elsize, shape, strides, tma);
CHECK:        tiled_problems(p, m.elsize, address, m.rank, dims, tma);
CHECK:        const CUresult r = cuTensorMapEncodeTiled(&map, m.dtype, m.rank, reinterpret_cast<void*>(address), global_dim,
CHECK-NOT:  cuTensorMapEncodeIm2col
CHECK:      // {{.*}}examples/copy2d.tile:8: copy(A[by * BM, bx * BN], s);
CHECK-NEXT: const TiledMap tl_rule_tmap_A = {
CHECK-NEXT:     "A",  // the tensor argument it describes
CHECK-NEXT:     CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4,  // f32: data type, bytes
CHECK-NEXT:     2,  // rank
CHECK-NEXT:     {64, 128},  // box
CHECK-NEXT:     {1, 1},  // element strides
CHECK-NEXT:     CU_TENSOR_MAP_SWIZZLE_NONE,  // swizzle
CHECK-NEXT:     CU_TENSOR_MAP_L2_PROMOTION_L2_256B,  // L2 promotion
CHECK-NEXT:     false  // inner_rounded
CHECK:      const TiledMap tl_rule_tmap_B = {
CHECK:          true  // inner_rounded
CHECK:      Variant tl_tma_variant(tl_tma_variant_cubin, 32768, 128);  // the TMA variant
CHECK-NEXT: Variant tl_thread_copy_variant(tl_thread_copy_variant_cubin, 32768, 128);
""",
    "copy2d.launch": """
CHECK:      int tl_launch(Variant& v, const long long grid[3], void** params, CUstream stream, char* err, size_t err_len,
CHECK-NEXT:               const std::string& warning) {
CHECK-NEXT:   if (grid[0] > 2147483647 || grid[1] > 65535 || grid[2] > 65535)
CHECK-NEXT:     return tl_fail(err, err_len, TILEC_EARG, "grid [", grid[0], ", ", grid[1], ", ", grid[2],
CHECK-NEXT:                    "] is over CUDA's limits (2^31-1, 65535, 65535)");
CHECK:        if (!function_in_current_context(v, &f, why)) return tl_fail(err, err_len, TILEC_EDEVICE, why);
CHECK-NEXT:   const CUresult r = cuLaunchKernel(f, static_cast<unsigned>(grid[0]), static_cast<unsigned>(grid[1]),
""",
    "im2col": """
CHECK:      int tl_encode_im2col(
CHECK:        if (channels % m.channels_per_pixel) {
CHECK:          p.add(channels, " channels is not a multiple of the ", m.channels_per_pixel,
CHECK:        tiled_problems(p, m.elsize, address, m.rank, shape, tma);
CHECK:            p.add("spatial dim ", d + 1, ": the pixel box ", shape[d + 1], " - (", m.lower_corner[d], ") + (",
CHECK:        const CUresult r = cuTensorMapEncodeIm2col(&map, m.dtype, m.rank, reinterpret_cast<void*>(address), global_dim,
CHECK:      const Im2colMap tl_rule_tmap_Xc = {
CHECK-NEXT:     "X",  // the tensor argument it describes
CHECK-NEXT:     CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,  // f16: data type, bytes
CHECK-NEXT:     4,  // rank
CHECK-NEXT:     128,  // pixels per column (rows of the tile)
CHECK-NEXT:     64,  // channels per pixel (columns of the tile)
CHECK-NEXT:     {-1, -1},  // pixel box lower corner, per spatial dim
CHECK-NEXT:     {-1, -1},  // pixel box upper corner, per spatial dim
CHECK-NEXT:     {1, 1, 1, 1},  // element strides (the convolution strides)
CHECK:      extern "C" int tilec_im2col(
CHECK:        if (Y_shape[1] != 9 * C)
CHECK-NEXT:     return tl_fail(err, err_len, TILEC_EARG, "argument Y: dim 1 is ", Y_shape[1],
CHECK-NEXT:                    " but the declaration says 9 * C = ", 9 * C);
CHECK-NEXT:   // {{.*}}examples/im2col.tile:8: require NP == N * OH * OW;
CHECK-NEXT:   if (!(NP == N * H * W))
CHECK-NEXT:     return tl_fail(err, err_len, TILEC_EARG, "require NP == N * OH * OW failed (H = ", H, ", N = ", N,
CHECK-NEXT:                    ", NP = ", NP, ", W = ", W, ")");
CHECK:        int tl_rc = tl_encode_im2col(tl_tmap_Xc, tl_rule_tmap_Xc, X, X_shape, X_strides, tl_why);
CHECK-NEXT:   if (tl_rc == TILEC_OK) tl_rc = tl_encode_tiled(tl_tmap_Y, tl_rule_tmap_Y, Y, Y_shape, Y_strides, tl_why);
CHECK:        void* tl_params[] = {&tl_tmap_Xc, &tl_tmap_Y, tl_param(&Y), tl_param(&Y_shape[0]), tl_param(&Y_shape[1]),
CHECK-NEXT:                        tl_param(&Y_strides[0]), tl_param(&Y_strides[1]), tl_param(&tl_i32_H),
CHECK-NEXT:                        tl_param(&tl_i32_W), tl_param(&tl_i32_C)};
""",
    "gemm": """
CHECK:      const TiledMap tl_rule_tmap_A = {
CHECK:          {128, 64},  // box
CHECK:          CU_TENSOR_MAP_SWIZZLE_128B,  // swizzle
CHECK:      Variant tl_tma_variant(tl_tma_variant_cubin, 99328, 384);  // the TMA variant
CHECK:        (v.smem_bytes > 0 &&  // beyond 48 KiB with the mbarriers' static bytes, shared memory must be asked for
CHECK-NEXT:    driver_failed(cuFuncSetAttribute(*f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
CHECK:        // the shape symbols as the kernel takes them: 32-bit ints
CHECK-NEXT:   if (M > 2147483647)
CHECK-NEXT:     return tl_fail(err, err_len, TILEC_EARG, "shape symbol M = ", M,
CHECK-NEXT:                    " is over 2^31-1: kernels index each dimension with 32-bit ints");
CHECK-NEXT:   const int tl_i32_M = static_cast<int>(M);
CHECK-NEXT:   if (K > 2147483647)
CHECK:        const int tl_i32_N = static_cast<int>(N);
CHECK:        void* tl_params[] = {&tl_tmap_A, &tl_tmap_B, &tl_tmap_C, tl_param(&C), tl_param(&C_shape[0]),
CHECK-NEXT:                        tl_param(&C_shape[1]), tl_param(&C_strides[0]), tl_param(&C_strides[1]),
CHECK-NEXT:                        tl_param(&tl_i32_M), tl_param(&tl_i32_K), tl_param(&tl_i32_N)};
""",
    "conv2d": """
CHECK:      const Im2colMap tl_rule_tmap_Xc = {
CHECK:      const TiledMap tl_rule_tmap_Wt = {
CHECK:      const TiledMap tl_rule_tmap_Y = {
CHECK:        if (Wt_shape[0] != 9 * C)
CHECK:        if (Y_shape[1] != F)
CHECK:        // {{.*}}examples/conv2d.tile:12: grid (bx, by) = (cdiv(F, BN), cdiv(N * OH * OW, BM)), persistent = PERSISTENT;
CHECK-NEXT:   const long long tl_grid[3] = {tl_cdiv(F, 128), tl_cdiv(N * H * W, 128), 1};
CHECK:        int tl_rc = tl_encode_im2col(tl_tmap_Xc, tl_rule_tmap_Xc, X, X_shape, X_strides, tl_why);
CHECK-NEXT:   if (tl_rc == TILEC_OK) tl_rc = tl_encode_tiled(tl_tmap_Wt, tl_rule_tmap_Wt, Wt, Wt_shape, Wt_strides, tl_why);
CHECK-NEXT:   if (tl_rc == TILEC_OK) tl_rc = tl_encode_tiled(tl_tmap_Y, tl_rule_tmap_Y, Y, Y_shape, Y_strides, tl_why);
""",
    "scale": """
CHECK:          CUdeviceptr Y, const int64_t Y_shape[2], const int64_t Y_strides[2],
CHECK-NEXT:     float alpha,
CHECK-NEXT:     char* err,
CHECK:        void* tl_params[] = {&tl_tmap_X, &tl_tmap_Y, tl_param(&Y), tl_param(&Y_shape[0]), tl_param(&Y_shape[1]),
CHECK-NEXT:                        tl_param(&Y_strides[0]), tl_param(&Y_strides[1]), tl_param(&alpha)};
CHECK-NOT:  floordiv
""",
}


@pytest.mark.skipif(FILECHECK is None, reason="the `filecheck` command (pip install filecheck) is not installed")
@pytest.mark.parametrize("check", sorted(CHECKS))
def test_filecheck_generated_cpp(exported, tmp_path, check):
    name = check.split(".")[0]
    d, _ = exported[name]
    checks = tmp_path / "checks.txt"
    checks.write_text(CHECKS[check])
    p = subprocess.run([FILECHECK, str(checks), "--input-file", str(d / f"{name}.cc")], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


def test_templates_print_no_unused_helper(exported):
    """No dead code: the im2col encoder only where a kernel has an im2col map,
    the granule rounding only where a map is rounded, floordiv nowhere here."""
    for name in EXAMPLES:
        source = (exported[name][0] / f"{name}.cc").read_text()
        assert ("int tl_encode_im2col(" in source) == (name in ("im2col", "conv2d")), name
        assert "floordiv" not in source and "floormod" not in source


# ---------------------------------------------------------------- the C++ compiles

@needs_cxx
@pytest.mark.parametrize("name", EXAMPLES + list(PROGRAMS) + ["copy2d_strict"])
def test_generated_cpp_compiles(exported, name):
    d, k = exported[name]
    cc = d / f"{k.name}.cc"
    for flags in ([], ["-DTILEC_UNCHECKED_POINTERS"]):
        p = subprocess.run([CXX, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", *flags,
                            f"-I{CUDA_INCLUDE}", str(cc)], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
    if CC is not None:      # the header is C
        p = subprocess.run([CC, "-x", "c", "-std=c99", "-Wall", "-Werror", "-fsyntax-only", f"-I{CUDA_INCLUDE}",
                            str(d / f"{k.name}.h")], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr


@needs_cxx
@pytest.mark.parametrize("name, consts, fix", [("conv2d", {}, {"C": 24}), ("gemm", STREAM_K_GEMM, {"K": 264})])
def test_an_export_with_fixes_compiles_without_warnings(tmp_path, name, consts, fix):
    tilec_export.generate(compile_kernel(name, **consts), fixes=[fix]).write(tmp_path)
    for cc in sorted(tmp_path.glob("*.cc")):
        p = subprocess.run([CXX, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{tmp_path}",
                            f"-I{CUDA_INCLUDE}", str(cc)], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr


@needs_cxx
@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.tile")), ids=lambda p: p.stem)
def test_every_example_exports_and_compiles(tmp_path, path):
    k = tilec.compile(str(path), arch="sm_90a", debug=False)
    tilec_export.generate(k).write(tmp_path)
    p = subprocess.run([CXX, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{CUDA_INCLUDE}",
                        str(tmp_path / f"{k.name}.cc")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


# Names the launcher once declared or called itself where the kernel's names are in
# scope: parameters stream, err, err_len ("conflicting declaration"), fail, launch, param
# (called), std (std::string); shape symbols device, grid, why, rc, A_shape, t_A.
OWN_NAMES = """
kernel names(A: f32[device, grid], B: f32[device, grid], C: f32[why, rc, A_shape, t_A], stream: f32, err: i32,
             err_len: i32, fail: i32, launch: i32, param: i32, std: f32) {
    require err + err_len + fail + launch + param >= 0 && why * rc * A_shape * t_A >= 0 && std > 0.0;
    grid (bx, by) = (cdiv(grid, 128), cdiv(device, 64));
    threads 128;
    shared s: f32[64, 128];
    copy(A[by * 64, bx * 128], s);
    parallel (i, j) in (64, 128) {
        s[i, j] = s[i, j] * stream;
    }
    copy(s, B[by * 64, bx * 128]);
}
"""


@needs_cxx
def test_names_the_launcher_used_itself_compile_and_launch_as_python(tmp_path, monkeypatch):
    """The launcher's own names start with tl_ (its parameters' where the kernel has
    the name: tl_stream, tl_A_shape): g++ compiles it (C++17 and C++20, the header as
    C), and it launches as the Python wrapper does."""
    k = tilec.compile(OWN_NAMES, arch="sm_90a", debug=False)
    tilec_export.generate(k).write(tmp_path)
    header = (tmp_path / "names.h").read_text()
    assert "    CUstream tl_stream,\n    CUdeviceptr A, const int64_t tl_A_shape[2], const int64_t A_strides[2]," in header
    assert "    float stream,\n    int32_t err,\n    int32_t err_len," in header
    for std in ("c++17", "c++20"):
        p = subprocess.run([CXX, f"-std={std}", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{CUDA_INCLUDE}",
                            str(tmp_path / "names.cc")], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
    if CC is not None:
        p = subprocess.run([CC, "-x", "c", "-std=c99", "-Wall", "-Werror", "-fsyntax-only", f"-I{CUDA_INCLUDE}",
                            str(tmp_path / "names.h")], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    exe = build_stub(tmp_path, k, tmp_path, "names", main=main_source(k.kernel_ir, gpu=False, prefix="v_"))
    args = [t(0x7f0000000000, (100, 1000)), t(0x7f0000100000, (100, 1000)), t(0x7f0000200000, (2, 3, 4, 5)),
            1.5, 1, 2, 3, 4, 5, 0.5]
    python_driver = fake_driver(monkeypatch)        # after compiling: NVRTC is cuda.bindings' too
    kind, cubin, lines = python_launch(k, args, python_driver, monkeypatch)
    assert kind == "launch"
    rc, err, calls = run_stub_exe(exe, k, args)
    assert (rc, err) == (0, "")
    assert calls == stub_expectation(k, cubin, lines)
    bad = args[:3] + [1.5, -100] + args[5:]       # require err + ... >= 0 fails: the Python wrapper's words
    assert python_launch(k, bad, python_driver, monkeypatch)[0] == "error"
    rc, err, _ = run_stub_exe(exe, k, bad)
    assert (rc, err) == (1, python_launch(k, bad, python_driver, monkeypatch)[1])


# ---------------------------------------------------------------- a stand-in libcuda

STUB = r"""
// A stand-in for libcuda: prints each call the exported launcher makes; device
// memory is host memory. STUB_* environment variables choose failures.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {
size_t image_size(const void* image) {  // the ELF's extent, from its header
  const unsigned char* e = static_cast<const unsigned char*>(image);
  unsigned long long phoff, shoff;
  unsigned short phentsize, phnum, shentsize, shnum;
  memcpy(&phoff, e + 0x20, 8); memcpy(&shoff, e + 0x28, 8);
  memcpy(&phentsize, e + 0x36, 2); memcpy(&phnum, e + 0x38, 2);
  memcpy(&shentsize, e + 0x3a, 2); memcpy(&shnum, e + 0x3c, 2);
  const size_t a = shoff + size_t(shnum) * shentsize, b = phoff + size_t(phnum) * phentsize;
  return a > b ? a : b;
}
CUresult env_result(const char* name) {
  const char* v = getenv(name);
  return v ? CUresult(atoi(v)) : CUDA_SUCCESS;
}
template <class T> std::string list(const T* v, unsigned n) {
  std::string s;
  for (unsigned i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}
const char* dtype_name(CUtensorMapDataType t) {
  switch (t) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8: return "UINT8";
    case CU_TENSOR_MAP_DATA_TYPE_UINT16: return "UINT16";
    case CU_TENSOR_MAP_DATA_TYPE_UINT32: return "UINT32";
    case CU_TENSOR_MAP_DATA_TYPE_INT32: return "INT32";
    case CU_TENSOR_MAP_DATA_TYPE_UINT64: return "UINT64";
    case CU_TENSOR_MAP_DATA_TYPE_INT64: return "INT64";
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16: return "FLOAT16";
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32: return "FLOAT32";
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT64: return "FLOAT64";
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16: return "BFLOAT16";
    default: return "?";
  }
}
const char* swizzle_name(CUtensorMapSwizzle s) {
  switch (s) {
    case CU_TENSOR_MAP_SWIZZLE_NONE: return "NONE";
    case CU_TENSOR_MAP_SWIZZLE_32B: return "32B";
    case CU_TENSOR_MAP_SWIZZLE_64B: return "64B";
    case CU_TENSOR_MAP_SWIZZLE_128B: return "128B";
    default: return "?";
  }
}
const char* l2_name(CUtensorMapL2promotion p) {
  switch (p) {
    case CU_TENSOR_MAP_L2_PROMOTION_NONE: return "NONE";
    case CU_TENSOR_MAP_L2_PROMOTION_L2_64B: return "L2_64B";
    case CU_TENSOR_MAP_L2_PROMOTION_L2_128B: return "L2_128B";
    case CU_TENSOR_MAP_L2_PROMOTION_L2_256B: return "L2_256B";
    default: return "?";
  }
}
const char* tail_names(CUtensorMapInterleave i, CUtensorMapFloatOOBfill o) {
  return i == CU_TENSOR_MAP_INTERLEAVE_NONE && o == CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE ? "NONE NONE" : "?";
}
const void* maps[8];
int map_count = 0;
int map_index(const void* m) {
  for (int i = 0; i < map_count; ++i) if (maps[i] == m) return i;
  maps[map_count] = m;
  return map_count++;
}
}  // namespace

extern "C" {
CUresult cuGetErrorName(CUresult error, const char** name) {
  switch (error) {
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_NO_BINARY_FOR_GPU: *name = "CUDA_ERROR_NO_BINARY_FOR_GPU"; return CUDA_SUCCESS;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *name = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}
CUresult cuInit(unsigned) { return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice* d, int ordinal) { *d = ordinal; return CUDA_SUCCESS; }
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) { *c = reinterpret_cast<CUcontext>(0x1000); return CUDA_SUCCESS; }
CUresult cuCtxSetCurrent(CUcontext) { return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = getenv("STUB_NO_CONTEXT") ? nullptr : reinterpret_cast<CUcontext>(0x1000);
  return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* d) {
  *d = 0;
  return getenv("STUB_NO_CONTEXT") ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}
// STUB_MEMORY (host, none, device1, managed; else device 0's memory) and STUB_RANGE
// ("start,size" of its allocation; else all of memory) say what the pointer is; or
// STUB_RANGES ("start,size;start,size;..."): the allocations, the one holding the
// pointer answering, and a pointer in none is memory CUDA does not know (type 0).
CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute* which, void** values, CUdeviceptr ptr) {
  std::string memory = getenv("STUB_MEMORY") ? getenv("STUB_MEMORY") : "";
  unsigned long long start = 0, size = 1ULL << 62;
  if (const char* range = getenv("STUB_RANGE")) {
    start = strtoull(range, nullptr, 0);
    size = strtoull(strchr(range, ',') + 1, nullptr, 0);
  }
  if (const char* ranges = getenv("STUB_RANGES")) {
    memory = "none";
    start = size = 0;
    for (const char* r = ranges; r != nullptr && *r; r = strchr(r, ';') ? strchr(r, ';') + 1 : nullptr) {
      char* comma;
      const unsigned long long s = strtoull(r, &comma, 0), z = strtoull(comma + 1, nullptr, 0);
      if (s <= ptr && ptr - s < z) {
        memory = "";
        start = s;
        size = z;
        break;
      }
    }
  }
  for (unsigned i = 0; i < n; ++i) {
    switch (which[i]) {
      case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *static_cast<unsigned*>(values[i]) = memory == "host" ? CU_MEMORYTYPE_HOST : memory == "none" ? 0
                                                                                   : CU_MEMORYTYPE_DEVICE;
        break;
      case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned*>(values[i]) = memory == "managed"; break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(values[i]) = memory == "device1"; break;
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(values[i]) = start; break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(values[i]) = size; break;
      default: return CUDA_ERROR_INVALID_VALUE;
    }
  }
  return env_result("STUB_POINTER_RESULT");
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, CUfunction, int, size_t) {
  *blocks = 1;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice) {
  if (attribute == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) {
    *value = 4;
    return CUDA_SUCCESS;
  }
  const bool major = attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
  const char* v = getenv(major ? "STUB_MAJOR" : "STUB_MINOR");
  *value = v ? atoi(v) : major ? 9 : 0;
  return CUDA_SUCCESS;
}
CUresult cuStreamCreate(CUstream* s, unsigned) { *s = reinterpret_cast<CUstream>(0x2000); return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream) { return CUDA_SUCCESS; }
CUresult cuMemAlloc(CUdeviceptr* p, size_t n) { *p = reinterpret_cast<CUdeviceptr>(malloc(n)); return CUDA_SUCCESS; }
CUresult cuMemFree(CUdeviceptr p) { free(reinterpret_cast<void*>(p)); return CUDA_SUCCESS; }
CUresult cuMemAllocHost(void** p, size_t n) { *p = malloc(n); return CUDA_SUCCESS; }
CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n) {
  memcpy(reinterpret_cast<void*>(d), reinterpret_cast<const void*>(s), n);
  return CUDA_SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream) {
  memset(reinterpret_cast<void*>(d), v, n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoD(CUdeviceptr d, const void* s, size_t n) { memcpy(reinterpret_cast<void*>(d), s, n); return CUDA_SUCCESS; }
CUresult cuMemcpyDtoH(void* d, CUdeviceptr s, size_t n) { memcpy(d, reinterpret_cast<void*>(s), n); return CUDA_SUCCESS; }
CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  printf("load %zu\n", image_size(image));
  *module = reinterpret_cast<CUmodule>(const_cast<void*>(image));
  return env_result("STUB_LOAD_RESULT");
}
CUresult cuModuleUnload(CUmodule) { return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction* f, CUmodule module, const char* name) {
  printf("function %s\n", name);
  *f = reinterpret_cast<CUfunction>(module);
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction, CUfunction_attribute attribute, int value) {
  if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) printf("max dynamic smem %d\n", value);
  return CUDA_SUCCESS;
}
CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank, void* address,
                                const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  printf("encode tiled map#%d dtype=%s rank=%u address=%#llx dims=%s strides=%s box=%s es=%s swizzle=%s l2=%s "
         "tail=%s\n", map_index(map), dtype_name(dtype), rank, (unsigned long long)address, list(dims, rank).c_str(),
         list(strides, rank - 1 ? rank - 1 : 1).c_str(), list(box, rank).c_str(),
         list(element_strides, rank).c_str(), swizzle_name(swizzle), l2_name(l2), tail_names(interleave, oob));
  return env_result("STUB_ENCODE_RESULT");
}
CUresult cuTensorMapEncodeIm2col(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank, void* address,
                                 const cuuint64_t* dims, const cuuint64_t* strides, const int* lower,
                                 const int* upper, cuuint32_t channels, cuuint32_t pixels,
                                 const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                 CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  printf("encode im2col map#%d dtype=%s rank=%u address=%#llx dims=%s strides=%s lower=%s upper=%s channels=%u "
         "pixels=%u es=%s swizzle=%s l2=%s tail=%s\n", map_index(map), dtype_name(dtype), rank,
         (unsigned long long)address, list(dims, rank).c_str(), list(strides, rank - 1).c_str(),
         list(lower, rank - 2).c_str(), list(upper, rank - 2).c_str(), channels, pixels,
         list(element_strides, rank).c_str(), swizzle_name(swizzle), l2_name(l2), tail_names(interleave, oob));
  return env_result("STUB_ENCODE_RESULT");
}
// STUB_PARAMS: "<image size>=<param sizes, comma-separated>;..." says how to print each variant's parameters.
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream stream, void** params, void** extra) {
  const size_t image = image_size(f);
  printf("launch %zu grid=%u,%u,%u block=%u,%u,%u smem=%u stream=%#llx extra=%s\n", image, gx, gy, gz, bx, by, bz,
         smem, (unsigned long long)stream, extra ? "yes" : "none");
  std::string spec = getenv("STUB_PARAMS") ? getenv("STUB_PARAMS") : "";
  const std::string key = std::to_string(image) + "=";
  size_t at = spec.find(key);
  if (at != std::string::npos) {
    std::string sizes = spec.substr(at + key.size(), spec.find(';', at) - at - key.size());
    int i = 0;
    for (size_t p = 0; p < sizes.size(); ++i) {
      size_t q = sizes.find(',', p);
      if (q == std::string::npos) q = sizes.size();
      const int n = atoi(sizes.substr(p, q - p).c_str());
      p = q + 1;
      if (n == 128) { printf("param map#%d\n", map_index(params[i])); continue; }
      unsigned long long v = 0;
      memcpy(&v, params[i], n);
      if (n == 8) printf("param %lld\n", (long long)v); else printf("param %#llx\n", v);
    }
  }
  return env_result("STUB_LAUNCH_RESULT");
}
}  // extern "C"
"""


def _scalar_arg(dt: ir.DType) -> str:
    """How the test main reads a scalar argument from argv."""
    if dt.name == "f32":
        return "strtof({}, nullptr)"
    if dt.name == "f64":
        return "strtod({}, nullptr)"
    return f"static_cast<{tilec_export.SCALAR_CTYPES[dt.name]}>(strtoull({{}}, nullptr, 0))"


def scalar_argv(dt: ir.DType, value) -> str:
    """A scalar argument on the test main's command line: a 16-bit float as its bits,
    which the launcher takes (tilec_export.BITS_NOTE), as the Python wrapper packs it."""
    if dt.name in tilec_export.BITS_NOTE:
        return hex(rt.scalar_value(value, dt.name).value)
    return str(value)


def main_source(k: ir.Kernel, gpu: bool, name: str | None = None, prefix: str = "") -> str:
    """A C++ main that calls tilec_<kernel> (tilec_<name>: an export named so) with the
    arguments of its command line: per tensor `pointer d0.. s0..` (gpu: `[where:]file
    offset_bytes d0.. s0..`: the whole buffer is read from the file into memory of the
    kind `where` names (place() in the source: device memory unless it says otherwise),
    the tensor starts offset bytes into it, and after the kernel the buffer is written
    to file.out), per scalar its value, then err_len. Prints rc= and err= lines. prefix: of
    the locals named after the kernel's parameters (a kernel may have one named stream)."""
    name = name or k.name
    lines = ['#include "%s.h"' % name, "#include <cstdio>", "#include <cstdlib>", "#include <cstring>",
             "#include <fstream>",
             "#include <iterator>", "#include <string>", "#include <vector>", "",
             "static void check(CUresult r, const char* what) {",
             "  if (r == CUDA_SUCCESS) return;",
             "  const char* name = \"?\";",
             "  cuGetErrorName(r, &name);",
             "  fprintf(stderr, \"%s failed: %s\\n\", what, name);",
             "  exit(2);",
             "}", ""]
    if gpu:
        lines += ["// A buffer of `data`'s bytes where `where` says: \"pinned\" (cuMemAllocHost), \"malloc\",",
                  "// \"cuda1\" (device 1's memory), else device memory of the current context's device.",
                  "static CUdeviceptr place(const std::string& where, const std::vector<char>& data, CUcontext ctx) {",
                  "  const size_t n = data.size();",
                  "  void* host = nullptr;",
                  "  if (where == \"pinned\") check(cuMemAllocHost(&host, n), \"cuMemAllocHost\");",
                  "  if (where == \"malloc\") host = malloc(n);",
                  "  if (host != nullptr) {",
                  "    memcpy(host, data.data(), n);",
                  "    return reinterpret_cast<CUdeviceptr>(host);",
                  "  }",
                  "  CUcontext other = ctx;",
                  "  if (where == \"cuda1\") {",
                  "    CUdevice one;",
                  "    check(cuDeviceGet(&one, 1), \"cuDeviceGet(1)\");",
                  "    check(cuDevicePrimaryCtxRetain(&other, one), \"cuDevicePrimaryCtxRetain(1)\");",
                  "  }",
                  "  check(cuCtxSetCurrent(other), \"cuCtxSetCurrent\");",
                  "  CUdeviceptr buffer;",
                  "  check(cuMemAlloc(&buffer, n), \"cuMemAlloc\");",
                  "  check(cuMemcpyHtoD(buffer, data.data(), n), \"cuMemcpyHtoD\");",
                  "  check(cuCtxSetCurrent(ctx), \"cuCtxSetCurrent\");",
                  "  return buffer;",
                  "}", "",
                  "// The buffer's bytes back into `data` (cuMemcpy: any device's memory, under unified addressing).",
                  "static void fetch(const std::string& where, CUdeviceptr buffer, std::vector<char>& data) {",
                  "  if (where == \"pinned\" || where == \"malloc\")",
                  "    memcpy(data.data(), reinterpret_cast<const void*>(buffer), data.size());",
                  "  else",
                  "    check(cuMemcpy(reinterpret_cast<CUdeviceptr>(data.data()), buffer, data.size()), \"cuMemcpy\");",
                  "}", ""]
    lines += ["int main(int argc, char** argv) {",
             "  int i = 1;",
             "  (void)argc;"]
    if gpu:
        lines += ["  check(cuInit(0), \"cuInit\");",
                  "  CUdevice device;",
                  "  check(cuDeviceGet(&device, 0), \"cuDeviceGet\");",
                  "  CUcontext ctx;",
                  "  check(cuDevicePrimaryCtxRetain(&ctx, device), \"cuDevicePrimaryCtxRetain\");",
                  "  check(cuCtxSetCurrent(ctx), \"cuCtxSetCurrent\");",
                  "  CUstream stream;",
                  "  check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), \"cuStreamCreate\");"]
    else:
        lines += ["  CUstream stream = reinterpret_cast<CUstream>(0x2000);"]
    call = []
    if k.stream_k:      # gpu: a zeroed workspace of the size the export asks for; else its pointer and size
        if gpu:
            lines += ["  size_t workspace_bytes = 0;",
                      "  char need_err[512];",
                      f"  if (tilec_{name}_workspace_bytes(&workspace_bytes, need_err, sizeof need_err) != TILEC_OK) {{",
                      "    fprintf(stderr, \"%s\\n\", need_err);",
                      "    return 2;",
                      "  }",
                      "  CUdeviceptr workspace;",
                      "  check(cuMemAlloc(&workspace, workspace_bytes), \"cuMemAlloc\");",
                      "  check(cuMemsetD8Async(workspace, 0, workspace_bytes, stream), \"cuMemsetD8Async\");"]
        else:
            lines += ["  const CUdeviceptr workspace = strtoull(argv[i++], nullptr, 0);",
                      "  const size_t workspace_bytes = strtoull(argv[i++], nullptr, 0);",
                      "  size_t need = 0;",
                      f"  const int need_rc = tilec_{name}_workspace_bytes(&need, nullptr, 0);",
                      "  printf(\"need_rc=%d need=%zu\\n\", need_rc, need);"]
        call += ["workspace", "workspace_bytes"]
    for p in k.params:
        if isinstance(p, ir.TensorParam):
            r = len(p.shape)
            n = prefix + p.name
            if gpu:
                lines += [f"  std::string {n}_file = argv[i++], {n}_where;  // [where:]file",
                          f"  if ({n}_file.find(':') != std::string::npos) {{",
                          f"    {n}_where = {n}_file.substr(0, {n}_file.find(':'));",
                          f"    {n}_file.erase(0, {n}_where.size() + 1);",
                          "  }",
                          f"  const long long {n}_offset = strtoll(argv[i++], nullptr, 0);",
                          f"  std::ifstream {n}_in({n}_file, std::ios::binary);",
                          f"  std::vector<char> {n}_host((std::istreambuf_iterator<char>({n}_in)), "
                          "std::istreambuf_iterator<char>());",
                          f"  const CUdeviceptr {n}_buffer = place({n}_where, {n}_host, ctx);",
                          f"  const CUdeviceptr {n} = {n}_buffer + {n}_offset;"]
            else:
                lines += [f"  const CUdeviceptr {n} = strtoull(argv[i++], nullptr, 0);"]
            lines += [f"  int64_t {n}_shape[{r}], {n}_strides[{r}];",
                      f"  for (int d = 0; d < {r}; ++d) {n}_shape[d] = strtoll(argv[i++], nullptr, 0);",
                      f"  for (int d = 0; d < {r}; ++d) {n}_strides[d] = strtoll(argv[i++], nullptr, 0);"]
            call += [n, f"{n}_shape", f"{n}_strides"]
        else:
            lines += [f"  const auto {prefix}{p.name} = {_scalar_arg(p.dtype).format('argv[i++]')};"]
            call.append(prefix + p.name)
    lines += ["  const size_t err_len = strtoull(argv[i++], nullptr, 0);",
              "  std::vector<char> err(err_len + 1, 'X');",
              f"  int rc = tilec_{name}(stream, {', '.join(call)}, err_len ? err.data() : nullptr, err_len);"]
    if k.stream_k and gpu:      # a second launch, on the workspace the first left
        lines += ["  if (rc == TILEC_OK)",
                  f"    rc = tilec_{name}(stream, {', '.join(call)}, err_len ? err.data() : nullptr, err_len);"]
    lines += ["  printf(\"rc=%d\\nerr=%s\\n\", rc, err_len ? err.data() : \"(null)\");"]
    if gpu:
        lines += ["  check(cuStreamSynchronize(stream), \"running the kernel\");"]
        for p in k.tensors:
            n = prefix + p.name
            lines += [f"  fetch({n}_where, {n}_buffer, {n}_host);",
                      f"  std::ofstream({n}_file + \".out\", std::ios::binary).write({n}_host.data(), "
                      f"{n}_host.size());"]
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def stub_programs(exported, tmp_path_factory):
    """name -> the test main + export + STUB, built (on demand, once)."""
    built = {}
    work = tmp_path_factory.mktemp("stub")
    (work / "stub.cc").write_text(STUB)

    def program(name):
        if name not in built:
            d, k = exported[name]
            built[name] = build_stub(d, k, work, name)
        return built[name]
    return program


def build_stub(d, k, work, name, flags=(), main=None):
    """The test main (`main`'s text, by default main_source's) + every .cc in `d` (an
    export, its fixes, any other export written there) + STUB (written to `work`
    first), built with `flags`: the executable."""
    stub = work / "stub.cc"
    if not stub.exists():
        stub.write_text(STUB)
    main_cc = work / f"{name}_main.cc"
    main_cc.write_text(main_source(k.kernel_ir, gpu=False) if main is None else main)
    exe = work / f"{name}_stub"
    sources = sorted(set(d.glob("*.cc")) - {main_cc, stub})
    p = subprocess.run([CXX, "-std=c++17", "-O0", *flags, f"-I{d}", f"-I{CUDA_INCLUDE}", str(main_cc),
                        *map(str, sources), str(stub), "-o", str(exe)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return exe


def param_sizes(k: ir.Kernel) -> str:
    return ",".join(str(p.nbytes) for p in kernel_params(k))


def run_stub(exported, stub_programs, name, args, err_len=4096, workspace=None, **env):
    """workspace: (pointer, bytes), a stream-K export's first arguments."""
    d, k = exported[name]
    return run_stub_exe(stub_programs(name), k, args, name != "copy2d_strict", err_len, workspace, **env)


def run_stub_exe(exe, k, args, with_fallback=True, err_len=4096, workspace=None, also=(), **env):
    """Run a built stub program of kernel `k`'s export on `args`: (rc, err, the stub's lines).
    also: the Kernels of programs linked beside it (an export's fixes), whose cubins it may load."""
    variants = [(v.cubin, v.kernel_ir) for kk in (k, *also)
                for v in [kk] + ([kk.fallback] if with_fallback and kk.kernel_ir.tensor_maps else [])]
    spec = ";".join(f"{len(c)}={param_sizes(ir_)}" for c, ir_ in variants)
    argv = [hex(workspace[0]), str(workspace[1])] if workspace is not None else []
    for p, a in zip(k.kernel_ir.params, args):
        if isinstance(p, ir.TensorParam):
            ptr, shape, strides = a
            argv += [hex(ptr), *map(str, shape), *map(str, strides)]
        else:
            argv.append(scalar_argv(p.dtype, a))
    argv.append(str(err_len))
    full_env = dict(os.environ, STUB_PARAMS=spec, **env)
    p = subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=60, env=full_env)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    rc = int(next(line for line in out if line.startswith("rc="))[3:])
    err = next(line for line in out if line.startswith("err="))[4:]
    return rc, err, [line for line in out if not line.startswith(("rc=", "err="))]


# ---- what Python does with the same arguments

class _Enum:
    def __init__(self, prefix):
        self.prefix = prefix

    def __getattr__(self, name):
        return name[len(self.prefix):]


@pytest.fixture
def python_driver(monkeypatch):
    """A stand-in cuda.bindings.driver that records the runtime's encode calls, in
    the stub's words; the list of those lines."""
    return fake_driver(monkeypatch)


def fake_driver(monkeypatch):
    """python_driver's stand-in, installed with `monkeypatch`."""
    calls = []
    cu = types.ModuleType("cuda.bindings.driver")
    cu.CUtensorMapDataType = _Enum("CU_TENSOR_MAP_DATA_TYPE_")
    cu.CUtensorMapInterleave = _Enum("CU_TENSOR_MAP_INTERLEAVE_")
    cu.CUtensorMapSwizzle = _Enum("CU_TENSOR_MAP_SWIZZLE_")
    cu.CUtensorMapL2promotion = _Enum("CU_TENSOR_MAP_L2_PROMOTION_")
    cu.CUtensorMapFloatOOBfill = _Enum("CU_TENSOR_MAP_FLOAT_OOB_FILL_")
    cu.cuuint64_t = cu.cuuint32_t = int
    j = ",".join

    def tiled(dtype, rank, address, dims, strides, box, es, interleave, swizzle, l2, oob):
        calls.append(f"encode tiled map#{len(calls)} dtype={dtype} rank={rank} address={address:#x} "
                     f"dims={j(map(str, dims))} strides={j(map(str, strides))} box={j(map(str, box))} "
                     f"es={j(map(str, es))} swizzle={swizzle} l2={l2} tail={interleave} {oob}")
        return 0, _Map(len(calls) - 1)

    def im2col(dtype, rank, address, dims, strides, lower, upper, channels, pixels, es, interleave, swizzle, l2,
               oob):
        calls.append(f"encode im2col map#{len(calls)} dtype={dtype} rank={rank} address={address:#x} "
                     f"dims={j(map(str, dims))} strides={j(map(str, strides))} lower={j(map(str, lower))} "
                     f"upper={j(map(str, upper))} channels={channels} pixels={pixels} es={j(map(str, es))} "
                     f"swizzle={swizzle} l2={l2} tail={interleave} {oob}")
        return 0, _Map(len(calls) - 1)

    cu.cuTensorMapEncodeTiled, cu.cuTensorMapEncodeIm2col = tiled, im2col
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver = cu
    package = types.ModuleType("cuda")
    package.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", package)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", cu)
    return calls


class _Launched(Exception):
    pass


_REAL_LAUNCH = rt.Call.launch


class _Map:
    """A tensor map the stand-in cuda.bindings encoded: the index the stub gives it."""

    def __init__(self, index):
        self.index = index


def python_launch(kernel, args, calls, monkeypatch, fallback=False):
    """Run `kernel`'s generated Python host wrapper (kernel.host_source) on `args`
    ((pointer, shape, strides) per tensor, numbers for scalars), everything real
    but reading the arguments (stood in: TensorArgs as given) and the driver (the
    python_driver fixture's, recording encodes in the stub's words; the launch
    stops at loading the module). Returns ("error", message) or
    ("launch", cubin, lines: the encodes, then the stub's launch and param lines).
    fallback: pass the thread-copy variant's wrapper, as tilec.compile does."""
    def tensor(self, obj, name, dtype, rank):
        arg = rt.TensorArg(name, obj[0], tuple(obj[1]), tuple(obj[2]), dtype, 0)
        size = ir.DTYPES[dtype].size     # what Call.tensor remembers of a device tensor
        self.remember(name, "cuda:0", arg.ptr, arg.shape, tuple(s * size for s in arg.strides), size)
        self.args.append(arg)
        return arg

    def launch(self, grid, threads, smem_bytes, params, persistent=False, balanced=False, stream_k=False):
        def loaded(device):
            if persistent:      # the real launch takes loaded.resident_blocks: the stub's GPU's
                raise _Launched((rt.persistent_blocks(grid[0], STUB_RESIDENT, balanced, stream_k), 1, 1), threads,
                                smem_bytes, params)
            raise _Launched(grid, threads, smem_bytes, params)
        self.loaded = loaded
        try:
            _REAL_LAUNCH(self, grid, threads, smem_bytes, params, persistent, balanced, stream_k)
        except _Launched as stop:
            return stop.args
        raise AssertionError("the wrapper's launch did not load the kernel")

    monkeypatch.setattr(rt.Call, "tensor", tensor)
    monkeypatch.setattr(rt.Call, "launch", launch)

    def run(k, a, fallback):
        """k's wrapper on arguments `a`: launch(call, *args), the Call made here as
        tilec.kernel makes it."""
        namespace = {}
        exec(compile(k.host_source, f"<{k.name} host wrapper>", "exec"), namespace)
        return namespace["launch"](rt.Call(k.name, None, None, namespace["WRITES"], None, fallback), *a)

    variants = {}

    def run_fallback(*a, stream=None):
        variants["ran"] = kernel.fallback
        return run(kernel.fallback, a, None)

    del calls[:]
    monkeypatch.setattr(tensormap, "CACHE", tensormap.TensorMapCache())     # every map encoded afresh
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tilec.TmaFallbackWarning)
            launched = run(kernel, args, run_fallback if fallback else None)
    except LaunchError as err:
        return "error", err.message
    ran = variants.get("ran", kernel)
    lines = list(calls)
    if launched is None:
        return "launch", None, lines
    grid, threads, smem_bytes, params = launched
    lines.append(f"launch {len(ran.cubin)} grid={','.join(map(str, grid))} block={threads},1,1 smem={smem_bytes} "
                 "stream=0x2000 extra=none")
    for value in params:
        if isinstance(value, _Map):
            lines.append(f"param map#{value.index}")
        elif ctypes.sizeof(value) == 8:     # the stub prints every 8-byte parameter as a long long, f64 too
            lines.append(f"param {ctypes.c_longlong.from_buffer_copy(value).value}")
        else:
            raw = bytes(value) + bytes(8 - ctypes.sizeof(value))
            word = struct.unpack('<Q', raw)[0]
            lines.append(f"param {word:#x}" if word else "param 0")     # C's %#llx prints 0 bare
    return "launch", ran.cubin, lines


def contiguous(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def t(ptr, shape, strides=None):
    return (ptr, tuple(shape), tuple(strides) if strides is not None else contiguous(shape))


# Good arguments per example (strided views included).
GOOD = {
    "copy2d": [t(0x7f0000000000, (100, 1000)), t(0x7f0000100000, (100, 1000), (1004, 1))],
    "scale": [t(0x7f0000000000, (33, 300)), t(0x7f0000100000, (33, 300), (304, 1)), 2.5],
    "im2col": [t(0x7f0000000000, (2, 9, 10, 64)), t(0x7f0000100000, (180, 576))],
    "gemm": [t(0x7f0000000000, (300, 264)), t(0x7f0000100000, (264, 196), (200, 1)),
             t(0x7f0000200000, (300, 196), (200, 1))],
    "conv2d": [t(0x7f0000000000, (2, 9, 10, 64)), t(0x7f0000100000, (576, 128)), t(0x7f0000200000, (180, 128))],
    "rowsum": [t(0x7f0000000000, (300, 1000), (1004, 1)), t(0x7f0000200000, (300,)), t(0x7f0000300000, (300,), (2,))],
    "weird": [t(0x7f0000000000, (32, 128)), t(0x7f0000100000, (32, 128)), 2, 0.375],
    "plain": [t(0x7f0000000000, (1000,)), t(0x7f0000100000, (1000,))],
    "copy1": [t(0x7f0000000000, (1001,)), t(0x7f0000100000, (1001,))],
    "persist": [t(0x7f0000000000, (2563,)), t(0x7f0000100000, (2563,))],
    "readonly": [t(0x7f0000000000, (100, 1000))],
    "halves": [t(0x7f0000000000, (1000,)), t(0x7f0000100000, (1000,)), 1 / 3, -0.1],
    # dim 1 of extent 1: its stride is free (TensorArg.tma_strides makes it legal)
    "copy3": [t(0x7f0000000000, (5, 1, 64), (128, 999, 1)), t(0x7f0000100000, (5, 1, 64), (64, 3, 1))],
}
GOOD["copy2d expanded"] = [t(0x7f0000000000, (100, 1000), (0, 1)), t(0x7f0000100000, (100, 1000))]  # A read as it is
GOOD["copy2d in place"] = [t(0x7f0000000000, (100, 1000)), t(0x7f0000000000, (100, 1000))]  # one tensor: mark-in-place
GOOD["copy2d halves"] = [t(0x7f0000000000, (100, 1000), (2000, 1)), t(0x7f0000000000 + 4000, (100, 1000), (2000, 1))]


def stub_expectation(k, cubin, launch_lines):
    """The stub's lines for a launch the Python wrapper made: the encodes, then
    the module loaded (on the first launch), then the launch."""
    encodes = [line for line in launch_lines if line.startswith("encode")]
    rest = launch_lines[len(encodes):]
    loads = [f"load {len(cubin)}", f"function {k.name}"]
    smem = int(re.search(r"smem=(\d+)", rest[0]).group(1))
    if smem:
        loads.append(f"max dynamic smem {smem}")
    return encodes + loads + rest


@needs_cxx
@pytest.mark.parametrize("name", EXAMPLES + list(PROGRAMS) + ["copy2d expanded"])
def test_stub_good_arguments_encode_and_launch_as_python(exported, stub_programs, python_driver, monkeypatch,
                                                        name):
    d, k = exported[name.split()[0]]
    args = GOOD[name]
    kind, cubin, lines = python_launch(k, args, python_driver, monkeypatch)
    assert kind == "launch" and cubin == k.cubin
    assert len([x for x in lines if x.startswith("encode")]) == len(k.kernel_ir.tensor_maps)
    rc, err, calls = run_stub(exported, stub_programs, name.split()[0], args)
    assert (rc, err) == (0, "")
    assert calls == stub_expectation(k, cubin, lines)


@needs_cxx
def test_named_exports_of_one_kernel_link_into_one_program(exported, stub_programs, tmp_path):
    """`tilec export --name`: conv2d.tile with C fixed to 24, exported as conv2d_c24 beside
    conv2d.tile's own export, links into one program with it (no symbol, file or header
    guard of one export is the other's), and launches as the export of the kernel's own
    name does, argument for argument."""
    d, src = tmp_path / "build", str(ROOT / "examples" / "conv2d.tile")
    for extra in (["-D", "C=24", "--name", "conv2d_c24"], []):
        p = subprocess.run([*TILEC, "export", src, "-o", str(d), *extra], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr
    assert sorted(p.name for p in d.iterdir()) == sorted(f"{n}.{e}" for n in ("conv2d", "conv2d_c24")
                                                         for e in ("h", "cc", "cubin", "thread_copy.cubin"))
    header = (d / "conv2d_c24.h").read_text()
    assert header.startswith(f"// Generated by tilec {tilec.__version__} from {src}: ahead-of-time export of kernel "
                             "conv2d as conv2d_c24\n")
    assert "#ifndef TILEC_EXPORT_CONV2D_C24_H" in header and "int tilec_conv2d_c24(" in header
    assert '#include "conv2d_c24.h"' in (d / "conv2d_c24.cc").read_text()
    k = exported["conv2d_c24"][1]
    assert (d / "conv2d_c24.cubin").read_bytes() == k.cubin
    main = main_source(k.kernel_ir, gpu=False, name="conv2d_c24")
    main = main.replace('#include "conv2d_c24.h"', '#include "conv2d_c24.h"\n#include "conv2d.h"', 1)
    main += "int (*const the_other_export)(CUstream, CUdeviceptr, const int64_t*, const int64_t*, CUdeviceptr, " \
            "const int64_t*, const int64_t*, CUdeviceptr, const int64_t*, const int64_t*, char*, size_t) = " \
            "tilec_conv2d;\n"
    exe = build_stub(d, k, tmp_path, "both", main=main)       # conv2d.cc and conv2d_c24.cc
    good = [t(0x7f0000000000, (2, 9, 10, 24)), t(0x7f0000100000, (216, 128)), t(0x7f0000200000, (180, 128))]
    rc, err, calls = run_stub_exe(exe, k, good)
    assert (rc, err) == (0, "") and any(c.startswith("launch") for c in calls), calls
    assert (rc, err, calls) == run_stub(exported, stub_programs, "conv2d_c24", good)
    rc, err, _ = run_stub_exe(exe, k, BAD["fixed symbol"][1])
    assert rc == 1 and BAD["fixed symbol"][3] in err, err


@needs_cxx
def test_an_export_with_fixes_runs_the_fixed_program_for_those_arguments(exported, stub_programs, tmp_path):
    """`tilec export --fix C=24`: conv2d.tile's launcher runs the program compiled with
    C = 24 (conv2d_C24.cc, linked beside it) for 24 channels, exactly as that
    program's own export does, and its own program for the others (64 channels on
    TMA, 72 on the thread copies, as before)."""
    d = tmp_path / "build"
    p = subprocess.run([*TILEC, "export", str(ROOT / "examples" / "conv2d.tile"), "-o", str(d), "--fix", "C=24"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str(d / f"{n}.{e}") for n in ("conv2d", "conv2d_C24")
                                for e in ("h", "cc", "cubin", "thread_copy.cubin")]
    assert "// A launch whose arguments have C = 24 runs conv2d_C24.cc's program instead" in \
        (d / "conv2d.h").read_text()
    k, k24 = exported["conv2d"][1], exported["conv2d_c24"][1]
    assert (d / "conv2d_C24.cubin").read_bytes() == k24.cubin
    exe = build_stub(d, k, tmp_path, "fixes")                 # conv2d.cc and conv2d_C24.cc
    c24 = [t(0x7f0000000000, (2, 9, 10, 24)), t(0x7f0000100000, (216, 128)), t(0x7f0000200000, (180, 128))]
    ran = run_stub_exe(exe, k, c24, also=[k24])
    assert ran[:2] == (0, "") and ran == run_stub(exported, stub_programs, "conv2d_c24", c24)
    assert [c for c in ran[2] if c.startswith("load")] == [f"load {len(k24.cubin)}"]
    for args in (GOOD["conv2d"], BAD["conv2d channels"][1]):
        assert run_stub_exe(exe, k, args, also=[k24]) == run_stub(exported, stub_programs, "conv2d", args)


def test_export_fixes_are_shape_symbols_of_the_program(tmp_path):
    src = str(ROOT / "examples" / "conv2d.tile")
    for fixes, message in (([{"BN": 64}], "fix {'BN': 64}: 'BN' is not a shape symbol of kernel conv2d; its shape "
                                          "symbols: N, H, W, C, F, NP"),
                           ([{}], "a fix is a dict of shape symbols to values, e.g. {'C': 24}, got {}"),
                           ([{"C": 0}], "shape symbol 'C' must be fixed to a positive integer, got 0")):
        with pytest.raises(tilec.TilecError) as e:
            tilec_export.export(src, tmp_path, fixes=fixes)
        assert e.value.message == message
    with pytest.raises(tilec.TilecError, match=r"'C' is not a shape symbol of kernel conv2d \(fixed in this program "
                                               r"already\); its shape symbols: N, H, W, F, NP"):
        tilec_export.export(src, tmp_path, fixes=[{"C": 24}], C=24)
    assert not any(tmp_path.iterdir())


def test_export_name_must_be_a_c_identifier(tmp_path):
    for name in ("1x", "conv-2d", "", "a b", 7):
        with pytest.raises(tilec.TilecError, match="an export's name is a C identifier"):
            tilec_export.export(str(ROOT / "examples" / "copy2d.tile"), tmp_path, name=name)
    p = subprocess.run([*TILEC, "export", "examples/copy2d.tile", "-o", str(tmp_path), "--name", "copy-2d"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr == "error: an export's name is a C identifier (letters, digits and _, not starting with a " \
                       "digit): it names the files NAME.h, NAME.cc and the function tilec_NAME; got 'copy-2d'\n"
    assert not any(tmp_path.iterdir())


def test_kernel_export_writes_what_tilec_export_writes(tmp_path):
    """k.export(dir, name, **symbols) from Python: the files `tilec export` writes for
    the same program, byte for byte; the interpreter's kernel and a tuned kernel
    (before its first call: its declared candidate) export the same."""
    src = str(ROOT / "examples" / "conv2d.tile")
    cli = tmp_path / "cli"
    p = subprocess.run([*TILEC, "export", src, "-o", str(cli), "-D", "C=24", "--name", "c24"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    want = {f.name: f.read_bytes() for f in cli.iterdir()}
    kernels = {"kernel": tilec.compile(src, arch="sm_90a", debug=False, tune=False),
               "interpreted": tilec.compile(src, backend="interpret"),
               "tuned": tilec.compile(src, arch="sm_90a", debug=False)}
    assert type(kernels["tuned"]).__name__ == "TunedKernel"
    for what, k in kernels.items():
        out = tmp_path / what
        written = k.export(out, name="c24", C=24)
        assert sorted(written) == sorted(out / n for n in want)
        assert {f.name: f.read_bytes() for f in out.iterdir()} == want, what
    k = kernels["kernel"]
    assert [f.name for f in k.export(tmp_path / "own", fallback=False)] == ["conv2d.h", "conv2d.cc", "conv2d.cubin"]


# Bad arguments: (example, arguments, the error code, a piece of the message).
# The whole message must be the Python wrapper's.
BAD = {
    "bind": ("copy2d", [t(0x7f0000000000, (100, 1000)), t(0x7f0000100000, (100, 999))], 1,
             "argument B: dim 1 is 999 but N = 1000 (from A dim 1)"),
    "declared expression": ("im2col", [t(0x7f0000000000, (2, 9, 10, 64)), t(0x7f0000100000, (180, 575))], 1,
                            "argument Y: dim 1 is 575 but the declaration says 9 * C = 576"),
    "require": ("im2col", [t(0x7f0000000000, (2, 9, 10, 64)), t(0x7f0000100000, (179, 576))], 1,
                "require NP == N * OH * OW failed (H = 9, N = 2, NP = 179, W = 10)"),
    "require conv2d": ("conv2d", [t(0x7f0000000000, (2, 9, 10, 64)), t(0x7f0000100000, (576, 128)),
                                  t(0x7f0000200000, (181, 128))], 1, "require NP == N * OH * OW failed"),
    "grid": ("copy2d", [t(0x7f0000000000, (65535 * 64 + 1, 4)), t(0x7f1000000000, (65535 * 64 + 1, 4))], 1,
             "grid [1, 65536, 1] is over CUDA's limits (2^31-1, 65535, 65535)"),
    "empty tensor": ("gemm", [t(0, (300, 0)), t(0, (0, 196)), t(0x7f0000200000, (300, 196), (200, 1))], 2,
                     "argument A: it is empty (shape [300, 0]); a TMA tensor map cannot describe an empty tensor"),
    "row stride": ("copy2d", [t(0x7f0000000000, (100, 1000), (1001, 1)), t(0x7f0000100000, (100, 1000))], 2,
                   "argument A: row stride 4004 bytes is not a multiple of 16 (TMA requires 16-byte aligned "
                   "strides)"),
    "base address": ("gemm", [t(0x7f0000000000, (300, 264)), t(0x7f0000100008, (264, 200)),
                              t(0x7f0000200000, (300, 200))], 2,
                     "argument B: base address 0x7f0000100008 is not 16-byte aligned"),
    "inner stride": ("copy2d", [t(0x7f0000000000, (100, 1000), (2000, 2)), t(0x7f0000100000, (100, 1000))], 2,
                     "argument A: innermost dim 1 has stride 2 elements; TMA needs it contiguous (stride 1)"),
    "several rules": ("copy2d", [t(0x7f0000000004, (100, 1000), (1001, 1)), t(0x7f0000100000, (100, 1000))], 2,
                      "is not 16-byte aligned (TMA requires 16-byte aligned tensors); row stride 4004 bytes"),
    "huge dim": ("copy2d", [t(0x7f0000000000, (3, 2**32 + 4), (2**32 + 8, 1)), t(0x7f1000000000, (3, 2**32 + 4),
                                                                                (2**32 + 8, 1))], 2,
                 "argument A: dim 1 is 4294967300; TMA dims are 1 .. 2^32"),
    "huge stride": ("copy2d", [t(0x7f0000000000, (3, 64), (2**38, 1)), t(0x7f0000100000, (3, 64))], 2,
                    "argument A: dim 0 stride 1099511627776 bytes is outside TMA's 0 .. 2^40"),
    "granule": ("copy2d", [t(0x7f0000000000, (100, 2), (4, 1)), t(0x7f0000100000, (100, 2), (4, 1))], 2,
                "argument B: its rows are 2 x 4 bytes, less than the 16-byte granule a TMA store writes"),
    "im2col channels": ("im2col", [t(0x7f0000000000, (2, 9, 10, 32)), t(0x7f0000100000, (180, 288))], 2,
                        "argument X: 32 channels is not a multiple of the 64 channels of one im2col load (a TMA "
                        "im2col load must not straddle two filter taps; pad the channels to a multiple of 64, choose "
                        "a K tile that divides 32, or compile the kernel with C = 32 fixed (-D C=32), where its "
                        "loads fit the taps)"),
    "im2col channels of 8 bytes": ("im2col", [t(0x7f0000000000, (2, 9, 10, 4)), t(0x7f0000100000, (180, 36))], 2,
                                   "argument X: 4 channels is not a multiple of the 64 channels of one im2col load "
                                   "(a TMA im2col load must not straddle two filter taps, and a tap of 4 channels "
                                   "is 8 bytes, no multiple of the 16 bytes TMA moves: pad the channels to a "
                                   "multiple of 8)"),
    "floor below zero": ("weird", [t(0x7f0000000000, (32, 65)), t(0x7f0000100000, (32, 65)), 2, 1.0], 1,
                         "require (N - 70) / 4 >= -1 failed (N = 65)"),
    "comparisons of comparisons": ("weird", [t(0x7f0000000000, (34, 128)), t(0x7f0000100000, (34, 128)), 2, 1.0],
                                   1, "require (M < 64) == (N < 64) || M % 4 == 0 && N > 0 failed (M = 34, N = 128)"),
    "require scalar": ("weird", [t(0x7f0000000000, (32, 128)), t(0x7f0000100000, (32, 128)), -3, 1.0], 1,
                       "require M % 2 == 0 && n > -3 failed (M = 32, n = -3)"),
    "require float min": ("weird", [t(0x7f0000000000, (32, 128)), t(0x7f0000100000, (32, 128)), 2, 0.125], 1,
                          "require min(beta, 2.0) > 0.25 && max(abs(beta), -1.0) < 0.5 failed (beta = 0.125)"),
    "require float max": ("weird", [t(0x7f0000000000, (32, 128)), t(0x7f0000100000, (32, 128)), 2, 0.75], 1,
                          "require min(beta, 2.0) > 0.25 && max(abs(beta), -1.0) < 0.5 failed (beta = 0.75)"),
    "innermost extent 1": ("copy3", [t(0x7f0000000000, (3, 5, 1), (5, 1, 7)), t(0x7f0000100000, (3, 5, 1))], 2,
                           "argument A: dim 0 stride 20 bytes is not a multiple of 16 (TMA requires 16-byte "
                           "aligned strides); row stride 4 bytes"),
    "plain bind": ("plain", [t(0x7f0000000000, (1000,)), t(0x7f0000100000, (999,))], 1,
                   "argument Y: dim 0 is 999 but N = 1000 (from X dim 0)"),
    "expanded output": ("copy2d", [t(0x7f0000000000, (100, 1000)), t(0x7f0000100000, (100, 1000), (0, 1))], 1,
                        "argument B: dim 0 has stride 0, so its 100 elements share one address (an expanded or "
                        "broadcast view); the kernel writes B, and its writes there would race"),
    "overlapping output": ("copy2d", [t(0x7f0000000000, (100, 1000)), t(0x7f0000100000, (100, 1000), (500, 1))], 1,
                           "argument B: some of its elements share memory (shape (100, 1000), strides (2000, 4) bytes, "
                           "elements of 4 bytes); the kernel writes B, and its writes there would race"),
    "partial overlap": ("copy2d", [t(0x7f0000000000, (100, 1000)), t(0x7f0000000000 + 4000 * 50, (100, 1000))], 1,
                        "arguments A and B share memory but are not the same view; the kernel writes B, so its "
                        "writes would race with the reads of A: pass tensors that do not overlap"),
    "gemm in place": ("gemm", [t(0x7f0000000000, (264, 264)), t(0x7f0000100000, (264, 264)),
                               t(0x7f0000000000, (264, 264))], 1,
                      "arguments A and C are one tensor (the same memory, shape and strides), but kernel gemm cannot "
                      "run in place: it reads A (line"),
    "two outputs in one": ("rowsum", [t(0x7f0000000000, (300, 1000)), t(0x7f0000200000, (300,)),
                                      t(0x7f0000200000, (300,))], 1,
                           "arguments RowSum and RowMax are one tensor (the same memory, shape and strides), and the "
                           "kernel writes both: their writes would race: pass separate tensors"),
    "fixed symbol": ("conv2d_c24", [t(0x7f0000000000, (2, 9, 10, 32)), t(0x7f0000100000, (288, 128)),
                                    t(0x7f0000200000, (180, 128))], 1,
                     "argument X: dim 3 is 32 but the declaration says 24 (compiled with C = 24)"),
    "conv2d channels": ("conv2d", [t(0x7f0000000000, (2, 9, 10, 72)), t(0x7f0000100000, (648, 128)),
                                   t(0x7f0000200000, (180, 128))], 2,
                        "72 channels is not a multiple of the 64 channels of one im2col load"),
}


@needs_cxx
@pytest.mark.parametrize("case", sorted(BAD))
def test_stub_bad_arguments_get_pythons_message(exported, stub_programs, python_driver, monkeypatch, case):
    name, args, code, piece = BAD[case]
    d, k = exported[name]
    kind, want = python_launch(k, args, python_driver, monkeypatch)[:2]
    assert kind == "error" and piece in want, want
    if code == 2:           # a TMA rule: the export without a thread-copy variant returns it
        if name == "copy2d":
            rc, err, calls = run_stub(exported, stub_programs, "copy2d_strict", args)
            assert (rc, err) == (2, want)
            assert not any(c.startswith(("launch", "load")) for c in calls), calls
            # never an illegal map: nothing from the breaking map on was encoded
            broken = next(i for i, m in enumerate(k.kernel_ir.tensor_maps) if want.startswith(f"argument {m.tensor}:"))
            assert len([c for c in calls if c.startswith("encode")]) == broken
        # with it, the thread-copy variant runs, as the Python wrapper runs it
        kind, cubin, lines = python_launch(k, args, python_driver, monkeypatch, fallback=True)
        assert kind == "launch" and cubin == k.fallback.cubin
        rc, err, calls = run_stub(exported, stub_programs, name, args)
        assert (rc, err) == (0, f"{want}: TMA cannot copy it, so kernel {k.name} ran its thread-copy variant "
                                "(correct, slower)")
        assert calls == stub_expectation(k, cubin, lines)
        return
    rc, err, calls = run_stub(exported, stub_programs, name, args)
    assert (rc, err) == (code, want)
    if case == "grid":      # checked at the launch, after the maps, as Call.launch does
        assert [c for c in calls if not c.startswith("encode")] == []
    else:
        assert calls == []


@needs_cxx
def test_stub_grid_is_checked_after_the_maps(exported, stub_programs, python_driver, monkeypatch):
    """A grid over CUDA's limits and a TMA rule broken: without the thread-copy
    variant the rule is the error, with it the grid (as Call.launch checks the
    grid after the maps, the variant's launch too)."""
    args = [t(0x7f0000000000, (65535 * 64 + 1, 4), (5, 1)), t(0x7f1000000000, (65535 * 64 + 1, 4))]
    d, k = exported["copy2d"]
    strict = python_launch(k, args, python_driver, monkeypatch)
    assert strict == ("error", "argument A: row stride 20 bytes is not a multiple of 16 (TMA requires 16-byte "
                               "aligned strides)")
    rc, err, calls = run_stub(exported, stub_programs, "copy2d_strict", args)
    assert (rc, err) == (2, strict[1])
    with_fallback = python_launch(k, args, python_driver, monkeypatch, fallback=True)
    assert with_fallback == ("error", "grid [1, 65536, 1] is over CUDA's limits (2^31-1, 65535, 65535)")
    rc, err, calls = run_stub(exported, stub_programs, "copy2d", args)
    assert (rc, err) == (1, with_fallback[1])
    assert not any(c.startswith(("load", "launch")) for c in calls)


@needs_cxx
def test_stub_division_by_zero_is_an_error(exported, stub_programs):
    """Where Python's wrapper would raise ZeroDivisionError, the export returns a
    launch error naming the division."""
    args = [t(0x7f0000000000, (32, 128)), t(0x7f0000100000, (32, 128)), 0, 1.0]
    assert run_stub(exported, stub_programs, "weird", args)[:2] == (1, "require N / n >= 1: division by n = 0")


@needs_cxx
def test_stub_empty_grid_launches_nothing(exported, stub_programs):
    rc, err, calls = run_stub(exported, stub_programs, "copy2d", [t(0x7f0000000000, (0, 1000)), t(0, (0, 1000))])
    assert (rc, err, calls) == (0, "", [])


@needs_cxx
@pytest.mark.parametrize("case, args, message", [
    ("negative dim", [t(0x7f0000000000, (100, -4)), t(0x7f0000100000, (100, -4))], "argument A: dim 1 is -4"),
    ("null pointer", [t(0x7f0000000000, (100, 1000)), t(0, (100, 1000))], "argument B: a null pointer"),
])
def test_stub_c_only_rules(exported, stub_programs, case, args, message):
    assert run_stub(exported, stub_programs, "copy2d", args)[:2] == (1, message)


@needs_cxx
@pytest.mark.parametrize("env, message", [
    ({"STUB_MEMORY": "host"}, "argument A: pointer 0x7f0000000000 is pinned host memory, where device memory is "
                              "required"),
    ({"STUB_MEMORY": "none"}, "argument A: pointer 0x7f0000000000 is not memory CUDA allocated or registered (host "
                              "memory from malloc or new?), where device memory is required"),
    ({"STUB_MEMORY": "device1"}, "argument A: its memory is on device 1, but the current context is device 0's: "
                                 "make device 1's context current, or pass memory of device 0"),
    # A's 100 rows of 1000 f32 end at 0x7f0000000000 + 400000 (0x61a80): one byte short, one element past
    ({"STUB_RANGE": "0x7f0000000000,399999"}, "argument A: its elements (pointer 0x7f0000000000, shape (100, 1000), "
                                              "strides (1000, 1) elements) reach past its memory allocation "
                                              "[0x7f0000000000, 0x7f0000061a7f): the kernel would read or write "
                                              "memory that is not the tensor's"),
    ({"STUB_RANGE": "0x7f0000000004,0x100000"}, "argument A: its elements (pointer 0x7f0000000000, shape (100, "
                                                "1000), strides (1000, 1) elements) reach past its memory "
                                                "allocation [0x7f0000000004, 0x7f0000100004)"),
])
def test_stub_memory_rules(exported, stub_programs, env, message):
    """What the pointer's attributes tell (a Python tensor's framework knows it): memory
    of the current device, inside its allocation. Nothing is encoded or launched."""
    rc, err, calls = run_stub(exported, stub_programs, "copy2d", GOOD["copy2d"], **env)
    assert rc == 1 and err.startswith(message), err
    assert calls == []


@needs_cxx
@pytest.mark.parametrize("env", [{"STUB_MEMORY": "managed"}, {"STUB_RANGE": "0x7f0000000000,400000"}],
                         ids=["managed", "exactly its allocation"])
def test_stub_memory_that_is_the_tensors_launches(exported, stub_programs, env):
    rc, err, calls = run_stub(exported, stub_programs, "copy2d", GOOD["copy2d"][:1] + [
        t(0x7f0000000000 + (100 * 1000 - 1) * 4, (100, 1000), (-1000, -1))], **env)      # B: A's bytes, reversed
    assert rc == 1 and "share memory" in err, err          # past the memory rules, to the overlap check
    if "STUB_MEMORY" in env:        # (the stub gives every pointer one range: not B's own)
        rc, err, calls = run_stub(exported, stub_programs, "copy2d", GOOD["copy2d"], **env)
        assert (rc, err) == (0, "") and any(c.startswith("launch") for c in calls)


@needs_cxx
def test_stub_unchecked_pointers_leave_the_memory_rules_out(exported, tmp_path):
    """-DTILEC_UNCHECKED_POINTERS: no pointer query, so memory the rules refuse is
    launched on (the caller's part); every other rule still holds."""
    d, k = exported["copy2d"]
    exe = build_stub(d, k, tmp_path, "copy2d_unchecked", flags=["-DTILEC_UNCHECKED_POINTERS"])
    rc, err, calls = run_stub_exe(exe, k, GOOD["copy2d"], STUB_MEMORY="host", STUB_POINTER_RESULT="1")
    assert (rc, err) == (0, "") and any(c.startswith("launch") for c in calls)
    assert run_stub_exe(exe, k, BAD["bind"][1])[:2] == (1, BAD["bind"][3])


HUGE_STRIDES = [2**40, 2**60 // 4, 2**60 // 4 + 1, 2**61, -(2**61), 2**62, 2**63 - 1, -(2**63)]


@needs_cxx
@hyp_settings(max_examples=int(os.environ.get("TILEC_EXTENT_EXAMPLES", 150)), deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
@given(st.data())
def test_stub_allocation_check_against_python_integers(exported, stub_programs, data):
    """The launcher's extent arithmetic against Python's integers: copy2d's A (any strides:
    negative, zero, huge, INT64_MIN) in an allocation of exactly its bytes runs; one byte
    short at either end is refused, naming the allocation (or, where the pointer itself
    falls outside it, as memory CUDA does not know); a view spanning more than 2^62 bytes
    is refused whatever its allocation."""
    m, n = data.draw(st.integers(1, 40)), data.draw(st.integers(1, 40))
    stride = st.one_of(st.integers(-300, 300), st.integers(-300, 300), st.sampled_from(HUGE_STRIDES))
    strides = (data.draw(stride), data.draw(stride))
    below = sum((d - 1) * -s * 4 for d, s in zip((m, n), strides) if s < 0)
    above = sum((d - 1) * s * 4 for d, s in zip((m, n), strides) if s > 0)
    base, limit = 0x100000000000, 2**62
    fits = below <= limit and above <= limit
    ptr = base + (below if fits else 4096)
    span = below + above + 4 if fits else 2**40
    kind = data.draw(st.sampled_from(["exact", "one short at the start", "one short at the end"]))
    start, size = {"exact": (base, span), "one short at the start": (base + 1, span - 1),
                   "one short at the end": (base, span - 1)}[kind]
    b_ptr = 0x7f0000000000
    ranges = f"{start},{size};{b_ptr},{m * n * 4}"
    rc, err, calls = run_stub(exported, stub_programs, "copy2d", [(ptr, (m, n), strides), t(b_ptr, (m, n))],
                              STUB_RANGES=ranges)
    if fits and kind == "exact":
        assert rc == 0 and any(c.startswith("launch") for c in calls), err
    elif not start <= ptr < start + size:
        assert (rc, calls) == (1, []) and err.startswith(f"argument A: pointer {hex(ptr)} is not memory CUDA"), err
    else:
        assert (rc, calls) == (1, []) and err.startswith(
            f"argument A: its elements (pointer {hex(ptr)}, shape ({m}, {n}), strides ({strides[0]}, {strides[1]}) "
            f"elements) reach past its memory allocation [{hex(start)}, {hex(start + size)}): "), err


@needs_cxx
def test_stub_pointer_query_failure_is_named(exported, stub_programs):
    rc, err, calls = run_stub(exported, stub_programs, "copy2d", GOOD["copy2d"], STUB_POINTER_RESULT="1")
    assert (rc, err, calls) == (3, "argument A: cuPointerGetAttributes failed: CUDA_ERROR_INVALID_VALUE", [])


@needs_cxx
@pytest.mark.parametrize("env, message", [
    ({"STUB_NO_CONTEXT": "1"}, "no CUDA context is current in this thread"),
    ({"STUB_MAJOR": "8", "STUB_MINOR": "6"}, "kernel copy2d was compiled for sm_90a, which does not run on device "
                                             "0 (compute capability 8.6): export it for that device's architecture"),
    ({"STUB_MAJOR": "10"}, "kernel copy2d was compiled for sm_90a, which does not run on device 0 (compute "
                           "capability 10.0)"),
    ({"STUB_LOAD_RESULT": "209"}, "cuModuleLoadData failed: CUDA_ERROR_NO_BINARY_FOR_GPU"),
    ({"STUB_ENCODE_RESULT": "1"}, "argument A: cuTensorMapEncodeTiled failed: CUDA_ERROR_INVALID_VALUE"),
    ({"STUB_LAUNCH_RESULT": "701"}, "launching copy2d failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
])
def test_stub_driver_failures_are_named(exported, stub_programs, env, message):
    rc, err, _ = run_stub(exported, stub_programs, "copy2d", GOOD["copy2d"], **env)
    assert rc == 3 and err.startswith(message), err


@needs_cxx
def test_stub_message_is_cut_to_err_len(exported, stub_programs):
    args = BAD["bind"][1]
    full = BAD["bind"][3]
    assert run_stub(exported, stub_programs, "copy2d", args, err_len=11)[:2] == (1, full[:10])
    assert run_stub(exported, stub_programs, "copy2d", args, err_len=0)[:2] == (1, "(null)")


@needs_cxx
def test_gpu_main_plumbing_on_the_stub(exported, tmp_path):
    """The GPU tests' main against the stand-in driver (host memory): buffers go
    in and out unchanged, the tensor is passed at its offset."""
    d, k = exported["copy2d"]
    (tmp_path / "stub.cc").write_text(STUB)
    exe = build_gpu_main(d, k.kernel_ir, tmp_path, link=[str(tmp_path / "stub.cc")])
    a = np.arange(12 * 20, dtype=np.float32).reshape(12, 20)
    b = np.full((14, 28), -7.0, np.float32)
    (tmp_path / "A.bin").write_bytes(a.tobytes())
    (tmp_path / "B.bin").write_bytes(b.tobytes())
    p = run_gpu_main(exe, k.kernel_ir, [(tmp_path / "A.bin", 0, (12, 20), (20, 1)),
                                        (tmp_path / "B.bin", (28 + 4) * 4, (12, 20), (28, 1))], tmp_path)
    assert "rc=0\nerr=\n" in p.stdout
    assert (tmp_path / "B.bin.out").read_bytes() == b.tobytes()
    base = re.search(r"encode tiled map#1 .* address=(0x[0-9a-f]+)", p.stdout)
    assert base is not None


# ---------------------------------------------------------------- random programs

RANDOM_BASE = 0x7f0000000000


def random_arguments(p, draw):
    """Arguments for random program `p` (tests/random_programs.py) as the stub takes them:
    per tensor (pointer, shape, strides), each 256 MiB apart or now and then in an earlier
    one's memory (the same start or a little past it), at the program's shape;
    rows padded or not, now and then dim 0 expanded (stride 0), and an unaligned view
    where the program has one (its start a few elements past a 16-byte boundary); then
    the scalars."""
    from random_programs import ELSIZE
    out = []
    for i, t in enumerate(p.tensors):
        shape = p.tensor_shape(t)
        es = ELSIZE[t.dtype]
        ptr = RANDOM_BASE + i * (1 << 28) + (0 if t.align else es * draw(st.integers(1, max(1, 16 // es - 1))))
        strides = list(contiguous(shape))
        if i and draw(st.integers(0, 7)) == 0:    # in an earlier tensor's memory: in place, or overlapping it
            ptr = out[draw(st.integers(0, i - 1))][0] + es * draw(st.sampled_from([0, 0, 1, 64]))
        if draw(st.integers(0, 15)) == 0:   # an expanded view: read as it is, refused where written
            strides[0] = 0
        elif len(shape) >= 2 and draw(st.booleans()):
            pad = draw(st.sampled_from([1, 3, 16 // es, 64]))
            row = shape[-1] + pad
            for d in range(len(shape) - 2, -1, -1):
                strides[d] = row
                row *= shape[d]
        out.append((ptr, tuple(shape), tuple(strides)))
    return out + p.scalar_values()


@needs_cxx
@hyp_seed(int(os.environ.get("TILEC_RANDOM_EXPORTS_SEED", 20270104)))
@hyp_settings(max_examples=int(os.environ.get("TILEC_RANDOM_EXPORTS", 6)), deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])  # seconds a try: no shrinking
@given(random_program(), st.data())
def test_random_programs_launch_as_python(tmp_path_factory, p, data):
    """tests/random_programs.py's programs (copies, element math, reductions, im2col, gemms
    and convolutions on any schedule) exported, on random views of their shapes: the
    launcher does what the Python wrapper does, encode for encode, launch for launch (a
    stream-K workspace where Python has its own), or fails with its message word for word;
    where a view breaks a TMA rule both run the thread-copy variant, the launcher saying so.
    A third of them have a shape symbol fixed at compile time (-D), now and then to a
    value the arguments do not have; a quarter of the others are exported with a fix
    (--fix), whose program the launcher runs where the arguments have its value, as
    that program's Python wrapper does."""
    fixed, fixes = {}, []
    symbols = [s for s in shape_symbols(load_source(p.text())) if s in p.sizes]
    if symbols and data.draw(st.integers(0, 2)) == 0:
        symbol = data.draw(st.sampled_from(symbols))
        fixed[symbol] = max(1, p.sizes[symbol] + (data.draw(st.integers(0, 3)) == 0))   # positive, as -D takes
    elif symbols and data.draw(st.integers(0, 3)) == 0:
        symbol = data.draw(st.sampled_from(symbols))
        fixes = [{symbol: max(1, p.sizes[symbol] + (data.draw(st.integers(0, 3)) == 0))}]
    try:
        k = tilec.compile(p.text(), arch="sm_90a", debug=False, **fixed)
        also = [k.fixed(**fix) for fix in fixes]
    except tilec.SemanticError as e:        # refused for that value (a require it decides false): nothing to launch
        assert (fixed or fixes) and "for every launch" in str(e), str(e)
        return
    work = tmp_path_factory.mktemp("random_export")
    tilec_export.generate(k, fixes=fixes).write(work)
    exe = build_stub(work, k, work, "random")
    args = random_arguments(p, data.draw)
    workspace = (SK_WORKSPACE, max(stream_k_need(x) for x in [k, *also])) if k.kernel_ir.stream_k else None
    rc, err, calls = run_stub_exe(exe, k, args, workspace=workspace, also=also)
    launcher = k
    if fixes and all(p.sizes[s] == v for s, v in fixes[0].items()):
        k = also[0]         # the launcher ran the fixed program: what its own wrapper does is what to expect
    with pytest.MonkeyPatch.context() as mp:        # the real cuda.bindings again after each example
        driver = fake_driver(mp)
        strict = python_launch(k, args, driver, mp)
        with_fallback = python_launch(k, args, driver, mp, fallback=True)
    context = f"{p.text()}fixed {fixed} fixes {fixes}\narguments {args}\nstub: rc={rc} err={err}\n" + \
        "\n".join(calls)
    if strict[0] == "error":
        if with_fallback[0] == "error":     # not a TMA rule: the launcher's error, word for word
            assert (rc, err) == (1, with_fallback[1]), context
            return
        kind, cubin, lines = with_fallback
        assert (rc, err) == (0, f"{strict[1]}: TMA cannot copy it, so kernel {k.name} ran its thread-copy "
                                "variant (correct, slower)"), context
        ran = k.fallback
    else:
        kind, cubin, lines = strict
        assert (rc, err) == (0, ""), context
        ran = k
    if k.kernel_ir.stream_k:                # the size query loaded every variant, before the launch
        q = next(i for i, c in enumerate(calls) if c.startswith("need_rc="))
        query, calls = calls[:q], calls[q + 1:]
        variants = [v for x in [launcher, *also] for v in [x] + ([x.fallback] if x.kernel_ir.tensor_maps else [])]
        assert [c for c in query if c.startswith("load")] == [f"load {len(v.cubin)}" for v in variants], context
    if cubin is None:                       # an empty grid: encodes at most, no launch
        assert not any(c.startswith(("launch", "load")) for c in calls), context
        assert calls == [line for line in lines if line.startswith("encode")], context
        return
    want = with_caller_workspace(lines, ran) if k.kernel_ir.stream_k else stub_expectation(ran, cubin, lines)
    assert calls == want, context


# ---------------------------------------------------------------- README

def readme_block() -> list:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Deploying without Python"):]
    block = section[section.index("```\n") + 4:]
    return [line.split("  #")[0].strip() for line in block[:block.index("```")].strip().splitlines()]


def test_readme_deploy_example_lines():
    lines = readme_block()
    assert len(lines) == 3
    assert lines[0].startswith("tilec export examples/copy2d.tile -o build")


def run_readme_line(line, cwd):
    """One line of the README's block, run in `cwd` (where examples/ is linked):
    `tilec` is the tilec under test, cuda.h's directory is where this machine has
    it, and -lcuda links the driver this machine has (libcuda_link_args)."""
    if line.startswith("tilec "):
        return subprocess.run([*TILEC, *shlex.split(line)[1:]], cwd=cwd, capture_output=True, text=True,
                              timeout=300)
    line = line.replace("/usr/local/cuda/include", str(CUDA_INCLUDE))
    if "-lcuda" in line:
        line = line.replace("-lcuda", " ".join(shlex.quote(a) for a in libcuda_link_args()))
    return subprocess.run(line, shell=True, cwd=cwd, capture_output=True, text=True, timeout=600)


@needs_cxx
def test_readme_deploy_example_exports_and_compiles(tmp_path):
    """The README's first two lines; the third links with libcuda: the GPU test runs it."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    for line in readme_block()[:2]:
        p = run_readme_line(line, tmp_path)
        assert p.returncode == 0, line + "\n" + p.stderr
    assert (tmp_path / "build" / "copy2d.o").is_file()


# ---------------------------------------------------------------- on the GPU

def build_gpu_main(d, k: ir.Kernel, work, link=None) -> Path:
    main = work / f"{k.name}_gpu_main.cc"
    main.write_text(main_source(k, gpu=True))
    exe = work / f"{k.name}_gpu"
    cmd = [CXX, "-std=c++17", "-O2", f"-I{d}", f"-I{CUDA_INCLUDE}", str(main), str(d / f"{k.name}.cc"),
           *map(str, sorted(d.glob(f"{k.name}_*.cc"))),     # an export's fixes
           *(link if link is not None else libcuda_link_args()), "-o", str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, " ".join(cmd) + "\n" + p.stderr
    return exe


def run_gpu_main(exe, k: ir.Kernel, tensors, work, scalars=()):
    """tensors: per tensor parameter (file, offset bytes, shape, strides)."""
    argv = []
    for p, tensor in zip(k.tensors, tensors):
        path, offset, shape, strides = tensor
        argv += [str(path), str(offset), *map(str, shape), *map(str, strides)]
    argv += [scalar_argv(p.dtype, v) for p, v in zip([p for p in k.params if p not in k.tensors], scalars)]
    argv.append("4096")
    p = subprocess.run([str(exe), *argv], capture_output=True, text=True, timeout=120, cwd=work)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


class _Placed:
    """A tensor for the C++ main: its whole buffer as a file, and where the tensor
    lies in it."""

    def __init__(self, path, buffer: np.ndarray, view: np.ndarray):
        self.path, self.buffer, self.view = path, buffer, view
        path.write_bytes(buffer.tobytes())
        self.offset = view.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]
        self.strides = tuple(s // view.itemsize for s in view.strides)

    def arg(self):
        return self.path, self.offset, self.view.shape, self.strides

    def read_back(self):
        data = np.frombuffer(Path(str(self.path) + ".out").read_bytes(), self.buffer.dtype)
        self.buffer[...] = data.reshape(self.buffer.shape)


def _gpu_case(tmp_path, name, inputs, out_shape, out_dtype, scalars=(), expect_warning=False, consts=None,
              fixes=()):
    """Export `name` (with `fixes`), run it from the C++ main on `inputs` (numpy arrays
    or views inside larger buffers, placed as they lie) with the output a guarded view,
    run the Python launch on the same data into a guarded torch view, and compare."""
    import torch
    from guard import guarded
    d = tmp_path / "export"
    k = compile_kernel(name, **(consts or {}))
    tilec_export.generate(k, fixes=fixes).write(d)
    exe = build_gpu_main(d, k.kernel_ir, tmp_path)
    placed = []
    for i, (buffer, view) in enumerate(inputs):
        placed.append(_Placed(tmp_path / f"in{i}.bin", buffer, view))
    g_cpp = guarded(out_shape, out_dtype, like="numpy")
    out = _Placed(tmp_path / "out.bin", g_cpp.buffer, g_cpp.view)
    p = run_gpu_main(exe, k.kernel_ir, [x.arg() for x in placed] + [out.arg()], tmp_path, scalars)
    assert "rc=0\n" in p.stdout, p.stdout
    if expect_warning:
        assert "TMA cannot copy it" in p.stdout
    else:
        assert "rc=0\nerr=\n" in p.stdout, p.stdout
    out.read_back()
    g_cpp.check()                                   # nothing written around the output

    g_py = guarded(out_shape, out_dtype)            # the Python launch, on the GPU
    torch_inputs = []
    for buffer, view in inputs:
        whole = torch.from_numpy(np.ascontiguousarray(buffer)).cuda()
        start = (view.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]) // view.itemsize
        torch_inputs.append(whole.as_strided(view.shape, [s // view.itemsize for s in view.strides],
                                             whole.storage_offset() + start))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tilec.TmaFallbackWarning)
        tilec.compile(PROGRAMS.get(name) or str(ROOT / "examples" / f"{name}.tile"), **(consts or {}))(
            *torch_inputs, g_py.view, *scalars)
    torch.cuda.synchronize()
    g_py.check()
    py = g_py.view.cpu().numpy()
    bits = {2: np.uint16, 4: np.uint32}[py.dtype.itemsize]
    assert np.array_equal(np.ascontiguousarray(g_cpp.view).view(bits), np.ascontiguousarray(py).view(bits))
    return g_cpp


@pytest.mark.gpu
@needs_cxx
def test_gpu_copy2d_from_cpp_equals_python(tmp_path):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((777, 1003)).astype(np.float32)
    pitch = np.zeros((777, 1004), np.float32)       # rows of 1003 in a 16-byte pitch: TMA, with a store tail
    pitch[:, :1003] = a
    g = _gpu_case(tmp_path, "copy2d", [(pitch, pitch[:, :1003])], (777, 1003), "f32")
    assert np.array_equal(g.view, a)


@pytest.mark.gpu
@needs_cxx
def test_gpu_copy2d_fallback_from_cpp_equals_python(tmp_path):
    """Rows of 1001 f32 (4004 bytes, not a multiple of 16): the thread-copy variant."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((300, 1001)).astype(np.float32)
    g = _gpu_case(tmp_path, "copy2d", [(a, a)], (300, 1001), "f32", expect_warning=True)
    assert np.array_equal(g.view, a)


@pytest.mark.gpu
@needs_cxx
def test_gpu_im2col_from_cpp_equals_python(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 9, 10, 64)).astype(np.float16)
    g = _gpu_case(tmp_path, "im2col", [(x, x)], (180, 576), "f16")
    assert np.array_equal(g.view, im2col_reference(x, 3, 1, 1, 1))


@pytest.mark.gpu
@needs_cxx
def test_gpu_gemm_from_cpp_equals_python(tmp_path):
    """B and C with rows of 196 f16 in a 200-element pitch: TMA loads and a TMA
    store whose last granule of each row is written by threads."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((300, 264)).astype(np.float16)
    b_buffer = rng.standard_normal((264, 200)).astype(np.float16)
    g = _gpu_case(tmp_path, "gemm", [(a, a), (b_buffer, b_buffer[:, :196])], (300, 196), "f16")
    ref = a.astype(np.float32) @ b_buffer[:, :196].astype(np.float32)
    assert np.allclose(g.view.astype(np.float32), ref, rtol=2e-2, atol=2e-1)


@pytest.mark.gpu
@needs_cxx
def test_gpu_conv2d_from_cpp_equals_python(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 9, 10, 64)).astype(np.float16)
    wt = (rng.standard_normal((576, 128)) / 24).astype(np.float16)
    g = _gpu_case(tmp_path, "conv2d", [(x, x), (wt, wt)], (180, 128), "f16")
    ref = im2col_reference(x, 3, 1, 1, 1).astype(np.float32) @ wt.astype(np.float32)
    assert np.allclose(g.view.astype(np.float32), ref, rtol=2e-2, atol=5e-2)


@pytest.mark.gpu
@needs_cxx
def test_gpu_conv2d_of_24_channels_from_cpp_with_a_fix_equals_python(tmp_path):
    """conv2d.tile exported with --fix C=24 on 24 channels: the launcher runs the program
    compiled for them (on TMA: no thread-copy message), as the Python call does."""
    rng = np.random.default_rng(24)
    x = rng.integers(-1, 2, (2, 9, 10, 24)).astype(np.float16)
    wt = rng.integers(-1, 2, (216, 64)).astype(np.float16)
    g = _gpu_case(tmp_path, "conv2d", [(x, x), (wt, wt)], (180, 64), "f16", fixes=[{"C": 24}])
    ref = im2col_reference(x, 3, 1, 1, 1).astype(np.float64) @ wt.astype(np.float64)
    assert np.array_equal(g.view.astype(np.float64), ref)


@pytest.mark.gpu
@needs_cxx
def test_gpu_half_scalars_from_cpp_equal_python(tmp_path):
    """An f16 and a bf16 scalar through the C signature, as their bits."""
    x = np.linspace(-3, 3, 1000, dtype=np.float32)
    g = _gpu_case(tmp_path, "halves", [(x, x)], (1000,), "f32", scalars=(1 / 3, -0.1))
    a, b = np.float32(np.float16(1 / 3)), np.float32(-0.10009765625)     # -0.1 as bf16
    assert np.array_equal(g.view, (x.astype(np.float64) * a + b).astype(np.float32))     # one fused multiply-add


@pytest.mark.gpu
@needs_cxx
def test_gpu_scale_from_cpp_equals_python(tmp_path):
    """A scalar through the C signature; X a view in a wider pitch."""
    rng = np.random.default_rng(6)
    x_buffer = rng.standard_normal((33, 304)).astype(np.float32)
    g = _gpu_case(tmp_path, "scale", [(x_buffer, x_buffer[:, :300])], (33, 300), "f32", scalars=(0.5,))
    assert np.array_equal(g.view, x_buffer[:, :300] * np.float32(0.5) + np.float32(1.0))


@pytest.mark.gpu
@needs_cxx
def test_gpu_bad_argument_from_cpp(tmp_path):
    """On the real driver: a bad argument gets its code and the Python wrapper's
    message, and nothing runs (the output's padding and inside keep the sentinel)."""
    from guard import guarded
    d = tmp_path / "export"
    k = compile_kernel("copy2d")
    tilec_export.generate(k).write(d)
    exe = build_gpu_main(d, k.kernel_ir, tmp_path)
    a = np.ones((100, 1000), np.float32)
    g = guarded((100, 999), "f32", like="numpy")
    before = g.buffer.copy()
    inputs = [_Placed(tmp_path / "A.bin", a, a), _Placed(tmp_path / "B.bin", g.buffer, g.view)]
    p = run_gpu_main(exe, k.kernel_ir, [x.arg() for x in inputs], tmp_path)
    assert "rc=1\nerr=argument B: dim 1 is 999 but N = 1000 (from A dim 1)\n" in p.stdout, p.stdout
    inputs[1].read_back()
    assert np.array_equal(g.buffer.view(np.uint32), before.view(np.uint32))


def _gpu_count():
    try:
        import torch
        return torch.cuda.device_count()
    except ImportError:
        return 0


@pytest.mark.gpu
@needs_cxx
@pytest.mark.parametrize("where", ["pinned", "malloc", "past its allocation", "cuda1"])
def test_gpu_memory_that_is_not_the_tensors_from_cpp(tmp_path, where):
    """On the real driver: a tensor in host memory (pinned, which the GPU could write
    through; or from malloc), one on another device, one whose shape runs past its
    allocation: refused with its code and the rule, nothing written."""
    from guard import guarded
    if where == "cuda1" and _gpu_count() < 2:
        pytest.skip("needs two GPUs; this machine has fewer")
    d = tmp_path / "export"
    k = compile_kernel("copy2d")
    tilec_export.generate(k).write(d)
    exe = build_gpu_main(d, k.kernel_ir, tmp_path)
    rows = 1000 if where == "past its allocation" else 100         # A's file holds 100 rows, 400 KB
    a = np.ones((100, 1000), np.float32)
    g = guarded((rows, 1000), "f32", like="numpy")
    before = g.buffer.copy()
    A, B = _Placed(tmp_path / "A.bin", a, a), _Placed(tmp_path / "B.bin", g.buffer, g.view)
    a_arg = (A.path, A.offset, (rows, 1000), A.strides)
    b_arg = B.arg()
    if where in ("pinned", "malloc", "cuda1"):
        b_arg = (f"{where}:{B.path}",) + b_arg[1:]
    p = run_gpu_main(exe, k.kernel_ir, [a_arg, b_arg], tmp_path)
    message = {"pinned": r"argument B: pointer 0x[0-9a-f]+ is pinned host memory, where device memory is required",
               "malloc": r"argument B: pointer 0x[0-9a-f]+ is not memory CUDA allocated or registered \(host memory "
                         r"from malloc or new\?\), where device memory is required",
               "past its allocation": r"argument A: its elements \(pointer (0x[0-9a-f]+), shape \(1000, 1000\), "
                                      r"strides \(1000, 1\) elements\) reach past its memory allocation \[\1, "
                                      r"0x[0-9a-f]+\): the kernel would read or write memory that is not the tensor's",
               "cuda1": r"argument B: its memory is on device 1, but the current context is device 0's: make device "
                        r"1's context current, or pass memory of device 0"}[where]
    assert re.search(r"rc=1\nerr=" + message + r"\n", p.stdout), p.stdout
    B.read_back()
    assert np.array_equal(g.buffer.view(np.uint32), before.view(np.uint32))


@pytest.mark.gpu
@needs_cxx
def test_gpu_readme_deploy_example(tmp_path):
    """The README's three lines as they are, with an app.cc that copies a tensor
    into a view inside a sentinel-filled buffer."""
    (tmp_path / "app.cc").write_text(APP)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    for line in readme_block():
        p = run_readme_line(line, tmp_path)
        assert p.returncode == 0, line + "\n" + p.stderr
    p = subprocess.run([str(tmp_path / "a.out")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


@pytest.mark.gpu
def test_gpu_tuned_kernel_exports_the_candidate_its_call_chose(tmp_path):
    """k.export of an autotuned kernel after a call: the candidate that call chose."""
    torch = pytest.importorskip("torch")
    k = tilec.compile(str(ROOT / "examples" / "gemm.tile"), tune={"BN": (64, 128), "STAGES": (2, 3)},
                      key=("M", "N", "K"))
    from guard import guarded
    a, b = (torch.randn(512, 512, device="cuda", dtype=torch.float16) for _ in range(2))
    c = guarded((512, 512), "f16")
    k(a, b, c.view)
    torch.cuda.synchronize()
    c.check()                                       # nothing written around the output
    assert torch.allclose(c.view.float(), (a.float() @ b.float()), rtol=2e-2, atol=1e-1)
    chosen = k.best_config
    k.export(tmp_path, name="gemm_512")
    assert (tmp_path / "gemm_512.cubin").read_bytes() == k.kernel.cubin
    consts = (tmp_path / "gemm_512.h").read_text().splitlines()[1]
    assert f"BN = {chosen['BN']}," in consts and f"STAGES = {chosen['STAGES']}," in consts, (chosen, consts)


APP = r"""
#include "copy2d.h"
#include <cstdio>
#include <vector>

// B is a [100, 1000] view at row 1, column 4 of a [102, 1008] buffer of -7777:
// the kernel must write the view and nothing around it.
int main() {
  cuInit(0);
  CUdevice dev;
  CUcontext ctx;
  cuDeviceGet(&dev, 0);
  cuDevicePrimaryCtxRetain(&ctx, dev);
  cuCtxSetCurrent(ctx);
  const int64_t shape[2] = {100, 1000}, a_strides[2] = {1000, 1}, b_strides[2] = {1008, 1};
  std::vector<float> a_host(100 * 1000), b_host(102 * 1008, -7777.0f), back(102 * 1008);
  for (size_t i = 0; i < a_host.size(); ++i) a_host[i] = float(i % 977) - 3.5f;
  CUdeviceptr a, b;
  cuMemAlloc(&a, a_host.size() * 4);
  cuMemAlloc(&b, b_host.size() * 4);
  cuMemcpyHtoD(a, a_host.data(), a_host.size() * 4);
  cuMemcpyHtoD(b, b_host.data(), b_host.size() * 4);
  char err[256];
  int rc = tilec_copy2d(0, a, shape, a_strides, b + (1008 + 4) * 4, shape, b_strides, err, sizeof err);
  if (rc != TILEC_OK) { printf("error %d: %s\n", rc, err); return 1; }
  cuMemcpyDtoH(back.data(), b, back.size() * 4);
  int wrong = 0;
  for (int r = 0; r < 102; ++r)
    for (int c = 0; c < 1008; ++c) {
      const bool inside = r >= 1 && r <= 100 && c >= 4 && c < 1004;
      const float want = inside ? a_host[(r - 1) * 1000 + (c - 4)] : -7777.0f;
      wrong += back[r * 1008 + c] != want;
    }
  printf(wrong ? "%d wrong\n" : "ok\n", wrong);
  return 0;
}
"""


@needs_cxx
def test_stub_persistent_launch_keeps_the_resident_blocks(exported, stub_programs, python_driver, monkeypatch):
    """grid ..., persistent = 1: 11 tiles, 4 blocks resident on the stub's GPU: both
    launchers launch 4 blocks (each loops over tiles), not 11."""
    d, k = exported["persist"]
    kind, cubin, lines = python_launch(k, GOOD["persist"], python_driver, monkeypatch)
    rc, err, calls = run_stub(exported, stub_programs, "persist", GOOD["persist"])
    assert (rc, err) == (0, "")
    launches = [c for c in calls if c.startswith("launch")]
    assert len(launches) == 1 and " grid=4,1,1 " in launches[0]
    assert calls == stub_expectation(k, cubin, lines)


@needs_cxx
def test_stub_persistent_gemm_launches_the_fewest_blocks_of_as_many_waves(exported, stub_programs, python_driver,
                                                                          monkeypatch):
    """A persistent gemm (no stream-K) of 6 tiles where 4 blocks fit: 2 waves either way, so both
    launchers run 3 blocks of 2 tiles (rt.persistent_blocks), not 4 (two of them with 1)."""
    d, k = exported["gemm_pe"]
    kind, cubin, lines = python_launch(k, GOOD["gemm"], python_driver, monkeypatch)
    rc, err, calls = run_stub(exported, stub_programs, "gemm_pe", GOOD["gemm"])
    assert (rc, err) == (0, "")
    assert calls == stub_expectation(k, cubin, lines)
    assert [c for c in calls if c.startswith("launch")][0].count(" grid=3,1,1 ") == 1


def test_persistent_blocks():
    assert [rt.persistent_blocks(t, 132, True) for t in (1, 131, 132, 133, 264, 265, 512, 784, 2752)] == \
        [1, 131, 132, 67, 132, 89, 128, 131, 132]
    assert [rt.persistent_blocks(t, 132, False) for t in (1, 133, 512)] == [1, 132, 132]
    # stream-K: every resident block, however few the tiles (the kernel splits their K steps)
    assert [rt.persistent_blocks(t, 132, False, stream_k=True) for t in (1, 133, 512)] == [132, 132, 132]


# ---------------------------------------------------------------- stream-K: the caller's workspace

SK_WORKSPACE = 0x7f0000300000


def stream_k_need(k) -> int:
    """The workspace any launch on the stub's GPU needs: the flags, a slot per resident block."""
    return WORKSPACE_FLAG_BYTES + STUB_RESIDENT * workspace_bytes_per_block(k.kernel_ir)


def with_caller_workspace(lines, k):
    """Python's launch lines of stream-K kernel `k` with the caller's workspace (SK_WORKSPACE)
    as the launcher passes it, where Python's rt.Workspace reads 0 before a launch points it
    at its own."""
    lines = list(lines)
    at = next(i for i, c in enumerate(lines) if c.startswith("launch"))
    slot = at + 1 + [p.kind for p in kernel_params(k.kernel_ir)].index("workspace")
    assert lines[slot] == "param 0"
    lines[slot] = f"param {SK_WORKSPACE}"
    return lines


@needs_cxx
def test_stub_stream_k_launch_passes_the_workspace(exported, stub_programs, python_driver, monkeypatch):
    """gemm with stream_k = 1: the size query answers the flags plus a slot per resident
    block; the launch encodes what Python encodes and launches what Python launches, with
    the caller's workspace where Python puts its own."""
    d, k = exported["gemm_sk"]
    need = stream_k_need(k)
    kind, cubin, lines = python_launch(k, GOOD["gemm"], python_driver, monkeypatch)
    rc, err, calls = run_stub(exported, stub_programs, "gemm_sk", GOOD["gemm"], workspace=(SK_WORKSPACE, need))
    assert (rc, err) == (0, "")
    assert f"need_rc=0 need={need}" in calls
    encodes = [c for c in calls if c.startswith("encode")]
    assert encodes == [line for line in lines if line.startswith("encode")]
    lines = with_caller_workspace(lines, k)
    want = lines[next(i for i, c in enumerate(lines) if c.startswith("launch")):]
    assert calls[next(i for i, c in enumerate(calls) if c.startswith("launch")):] == want
    assert f" grid={STUB_RESIDENT},1,1 " in want[0]


@needs_cxx
def test_stub_stream_k_export_with_fixes_sizes_the_workspace_for_every_program(exported, stub_programs, tmp_path):
    """A stream-K export with --fix K=264: the workspace query loads every program the
    launcher may run (its own and the fixed one's, each with its thread-copy variant)
    and answers the most any needs; a K = 264 launch runs the fixed program."""
    d = tmp_path / "build"
    k = exported["gemm_sk"][1]
    k264 = k.fixed(K=264)
    tilec_export.generate(k, fixes=[{"K": 264}]).write(d)
    exe = build_stub(d, k, tmp_path, "sk")                    # gemm.cc and gemm_K264.cc
    need = max(stream_k_need(k), stream_k_need(k264))
    rc, err, calls = run_stub_exe(exe, k, GOOD["gemm"], workspace=(SK_WORKSPACE, need), also=[k264])
    assert (rc, err) == (0, "") and f"need_rc=0 need={need}" in calls
    q = next(i for i, c in enumerate(calls) if c.startswith("need_rc="))
    assert [c for c in calls[:q] if c.startswith("load")] == [f"load {len(v.cubin)}" for v in
                                                              (k, k.fallback, k264, k264.fallback)]
    launched = [c for c in calls[q:] if c.startswith("launch")]
    assert len(launched) == 1 and launched[0].startswith(f"launch {len(k264.cubin)} "), calls


@needs_cxx
def test_stub_stream_k_launch_of_one_tile_runs_every_resident_block(exported, stub_programs, python_driver,
                                                                      monkeypatch):
    """A 100 x 100 output is one tile: the exported launcher still launches every resident
    block, as Python does (the kernel cuts the tile's K steps over them), where the plain
    persistent launcher runs one."""
    one_tile = [t(0x7f0000000000, (100, 4096)), t(0x7f0000100000, (4096, 100), (104, 1)),
                t(0x7f0000200000, (100, 100), (104, 1))]
    d, k = exported["gemm_sk"]
    need = stream_k_need(k)
    kind, cubin, lines = python_launch(k, one_tile, python_driver, monkeypatch)
    rc, err, calls = run_stub(exported, stub_programs, "gemm_sk", one_tile, workspace=(SK_WORKSPACE, need))
    assert (rc, err) == (0, "")
    launch = next(c for c in calls if c.startswith("launch"))
    assert f" grid={STUB_RESIDENT},1,1 " in launch and launch == next(c for c in lines if c.startswith("launch"))
    rc, err, calls = run_stub(exported, stub_programs, "gemm_pe", one_tile)
    assert (rc, err) == (0, "") and " grid=1,1,1 " in next(c for c in calls if c.startswith("launch"))


@needs_cxx
@pytest.mark.parametrize("case", ["one byte short", "null", "no context"])
def test_stub_stream_k_workspace_errors(exported, stub_programs, case):
    d, k = exported["gemm_sk"]
    need = stream_k_need(k)
    ws = {"one byte short": (SK_WORKSPACE, need - 1), "null": (0, need), "no context": (SK_WORKSPACE, need)}[case]
    env = {"STUB_NO_CONTEXT": "1"} if case == "no context" else {}
    rc, err, calls = run_stub(exported, stub_programs, "gemm_sk", GOOD["gemm"], workspace=ws, **env)
    assert not any(c.startswith("launch") for c in calls)
    if case == "one byte short":
        assert (rc, err) == (1, f"workspace: {need - 1} bytes, but this launch of {STUB_RESIDENT} blocks needs {need} "
                                "(tilec_gemm_workspace_bytes() gives enough for any launch on this device)")
    elif case == "null":
        assert (rc, err) == (1, "workspace: a null pointer; a stream_k = 1 kernel needs a zeroed workspace of "
                                "tilec_gemm_workspace_bytes() bytes")
    else:       # the query and the launch both need the current context
        assert "need_rc=3 need=0" in calls
        assert rc == 3 and "context" in err


@needs_cxx
def test_gpu_main_stream_k_plumbing_on_the_stub(exported, tmp_path):
    """The GPU main of a stream-K export against the stand-in driver: it asks for the
    workspace's size, allocates and zeroes that much, and launches twice on it."""
    d, k = exported["gemm_sk"]
    (tmp_path / "stub.cc").write_text(STUB)
    exe = build_gpu_main(d, k.kernel_ir, tmp_path, link=[str(tmp_path / "stub.cc")])
    tensors = []
    for name, shape, pitch in (("A", (300, 264), 264), ("B", (264, 196), 200), ("C", (300, 196), 200)):
        (tmp_path / f"{name}.bin").write_bytes(np.zeros((shape[0], pitch), np.float16).tobytes())
        tensors.append((tmp_path / f"{name}.bin", 0, shape, (pitch, 1)))
    p = run_gpu_main(exe, k.kernel_ir, tensors, tmp_path)
    assert "rc=0\nerr=\n" in p.stdout
    assert p.stdout.count("\nlaunch ") + p.stdout.startswith("launch ") == 2


@pytest.mark.gpu
@needs_cxx
def test_gpu_stream_k_gemm_from_cpp_equals_python(tmp_path):
    """2560x512 @ 512x2048 in 128x128 tiles: 320 tiles, more than two waves of 132,
    so whole tiles and split ones (stream-K) both run; launched twice from C++ on
    one zeroed workspace, equal bit for bit to the Python launch."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((2560, 512)).astype(np.float16)
    b_buffer = rng.standard_normal((512, 2056)).astype(np.float16)
    g = _gpu_case(tmp_path, "gemm", [(a, a), (b_buffer, b_buffer[:, :2048])], (2560, 2048), "f16",
                  consts=STREAM_K_GEMM)
    ref = a.astype(np.float32) @ b_buffer[:, :2048].astype(np.float32)
    assert np.allclose(g.view.astype(np.float32), ref, rtol=2e-2, atol=2e-1)
