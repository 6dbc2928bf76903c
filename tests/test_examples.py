"""Every example, and a spread of generated variants, through NVRTC to an sm_90a
cubin (no GPU needed), with their thread-copy fallback variants."""
from pathlib import Path

import pytest

import tilec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
ELF = b"\x7fELF"


def assert_compiles(k):
    assert k.arch == "sm_90a"
    assert k.cubin[:4] == ELF
    assert ".target sm_90a" in k.ptx
    assert f".entry {k.name}(" in k.ptx
    fb = k.fallback
    assert fb.cubin[:4] == ELF
    assert "cp.async.bulk.tensor" not in fb.cuda_source
    # no NVRTC warning (e.g. an unused variable) and no ptxas advisory: C7515,
    # "wgmma.mma_async instructions are serialized", costs a third of a gemm's speed
    assert k.compile_log == "", k.compile_log
    assert fb.compile_log == "", fb.compile_log


SUPPORTED = sorted(p.stem for p in EXAMPLES.glob("*.tile"))


def test_the_examples_are_there():
    assert {"copy2d", "scale", "gemm", "conv2d", "im2col", "gemm_128x256", "gemm_f8", "gemm_f8_blockscaled"} <= \
        set(SUPPORTED)


@pytest.mark.parametrize("name", SUPPORTED)
def test_example_compiles(name):
    k = tilec.compile(str(EXAMPLES / f"{name}.tile"), arch="sm_90a")
    assert k.name == name
    assert_compiles(k)
    assert "cp.async.bulk.tensor" in k.cuda_source


def test_the_blockscaled_gemm_rotates_with_its_gemm_inside():
    """gemm_f8_blockscaled's K loop scales each block's product: no ring, a rotating
    pipeline (copies of every loaded tile) whose gemm starts each block from zero."""
    k = tilec.compile(str(EXAMPLES / "gemm_f8_blockscaled.tile"), arch="sm_90a")
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in k.ptx
    assert "tl_a_stage2" in k.cuda_source and "tl_empty" not in k.cuda_source
    assert "wgmma_m64n128k32_f8e4m3_bk_zero(part" in k.cuda_source
    assert k.pipeline_notes == ()


@pytest.mark.parametrize("name", ["gemm", "conv2d", "gemm_128x256", "gemm_f8"])
def test_gemm_examples_use_wgmma(name):
    k = tilec.compile(str(EXAMPLES / f"{name}.tile"), arch="sm_90a")
    assert "wgmma.mma_async.sync.aligned.m64n" in k.ptx
    assert "mbarrier_arrive(&tl_empty1" in k.cuda_source


def test_the_design_doc_s_interface_lines(monkeypatch):
    """docs/design.md §4, as written (all but the call, which needs a GPU)."""
    monkeypatch.chdir(ROOT)
    k = tilec.compile("examples/gemm.tile", BM=64)     # path or source text
    assert "__global__" in k.cuda_source and "def launch(" in k.host_source and ".entry gemm(" in k.ptx
    ir = k.ir("after-barriers")    # the IR after a named pass (str); k.ir() lists passes
    assert ir == k.ir("insert-barriers") == k.ir("barriers") and "mbarrier" in ir
    assert "insert-barriers\n" in k.ir() and k.ir("after-plan-smem") == k.ir("plan-smem")
    with pytest.raises(tilec.TilecError, match="no pass named 'after-nope'"):
        k.ir("after-nope")


@pytest.mark.parametrize("src", [None, b"kernel k() {}", 3, ["examples/copy2d.tile"]])
def test_compile_takes_a_path_or_text_and_nothing_else(src):
    with pytest.raises(TypeError, match=r"a tilec program is a path \(a str ending in '.tile', or an os.PathLike "
                                        r"such as pathlib.Path\) or the program text \(a str\), got "
                                        + type(src).__name__):
        tilec.compile(src)


def test_a_str_is_a_path_when_it_ends_in_tile_and_a_pathlike_whatever_its_name(tmp_path):
    (tmp_path / "k.tl").write_text((EXAMPLES / "copy2d.tile").read_text())
    assert tilec.compile(tmp_path / "k.tl", arch="sm_90a").name == "copy2d"      # os.PathLike: a path
    with pytest.raises(tilec.TilecError, match="unexpected"):
        tilec.compile(str(tmp_path / "k.tl"), arch="sm_90a")                     # a str not ending in .tile: text
    with pytest.raises(tilec.TilecError, match="cannot read .*: is a directory"):
        tilec.compile(tmp_path)


def test_the_packaged_examples_compile_from_any_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    k = tilec.compile("examples/scale.tile", arch="sm_90a")
    assert k.name == "scale" and k.source.name == "examples/scale.tile"
    assert k.source.text == (EXAMPLES / "scale.tile").read_text()


# ---------------------------------------------------------------- generated variants

SIZES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i8": 1, "u8": 1, "i32": 4}


@pytest.mark.parametrize("dt", SIZES)
def test_dtype_variant(dt):
    bn = 128 if SIZES[dt] < 8 else 64       # a 16-byte multiple inner box, tile at most 32 KB
    k = tilec.compile(f"""
kernel copy_{dt}(A: {dt}[M, N], B: {dt}[M, N]) {{
    const BM = 32, BN = {bn};
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared s: {dt}[BM, BN];
    copy(A[by * BM, bx * BN], s);
    parallel (i, j) in (BM, BN) {{
        s[i, j] = s[i, j] + s[i, j];
    }}
    copy(s, B[by * BM, bx * BN]);
}}
""", arch="sm_90a")
    assert_compiles(k)
    assert f"mbarrier_arrive_expect_tx(&tl_bar0, {32 * bn * SIZES[dt]});" in k.cuda_source


RANK_PROGRAMS = {
    1: """
kernel copy_r1(A: f32[N], B: f32[N]) {
    grid (bx) = (cdiv(N, 256));
    threads 128;
    shared s: f32[256];
    copy(A[bx * 256], s);
    copy(s, B[bx * 256]);
}
""",
    2: """
kernel copy_r2(A: f32[M, N], B: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared s: f32[8, 32];
    copy(A[by * 8, bx * 32], s);
    copy(s, B[by * 8, bx * 32]);
}
""",
    3: """
kernel copy_r3(A: f32[L, M, N], B: f32[L, M, N]) {
    grid (bx, by, bz) = (cdiv(N, 32), cdiv(M, 8), cdiv(L, 2));
    threads 128;
    shared s: f32[2, 8, 32];
    copy(A[bz * 2, by * 8, bx * 32], s);
    copy(s, B[bz * 2, by * 8, bx * 32]);
}
""",
    4: """
kernel copy_r4(A: f32[K, L, M, N], B: f32[K, L, M, N]) {
    grid (bx, by, bz) = (cdiv(N, 32), cdiv(M, 8), L);
    threads 128;
    shared s: f32[2, 1, 8, 32];
    copy(A[0, bz, by * 8, bx * 32], s);
    copy(s, B[0, bz, by * 8, bx * 32]);
}
""",
    5: """
kernel copy_r5(A: f32[J, K, L, M, N], B: f32[J, K, L, M, N]) {
    grid (bx, by) = (cdiv(N, 32), cdiv(M, 8));
    threads 128;
    shared s: f32[4, 2, 2, 8, 32];
    copy(A[0, 0, 0, by * 8, bx * 32], s);
    parallel (p, q, r, u, v) in (4, 2, 2, 8, 32) {
        s[p, q, r, u, v] = s[p, q, r, u, v] + 1.0;
    }
    copy(s, B[0, 0, 0, by * 8, bx * 32]);
}
""",
}


@pytest.mark.parametrize("rank", sorted(RANK_PROGRAMS))
def test_rank_variant(rank):
    k = tilec.compile(RANK_PROGRAMS[rank], arch="sm_90a")
    assert_compiles(k)
    assert f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile" in k.cuda_source
    assert f"cp.async.bulk.tensor.{rank}d.global.shared::cta.tile.bulk_group" in k.cuda_source


def test_local_tile_variant():
    k = tilec.compile("""
kernel loc(X: f32[M, N], Y: f16[M, N], alpha: f32) {
    const BM = 16, BN = 64;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared s: f32[BM, BN];
    local r: f32[BM, BN];
    copy(X[by * BM, bx * BN], s);      // shared
    copy(s, r);                        // -> local
    parallel (i, j) in (BM, BN) {      // -> parallel
        r[i, j] = max(r[i, j] * alpha, 0.0);
    }
    copy(r, Y[by * BM, bx * BN]);      // -> global, converting to f16
}
""", arch="sm_90a")
    assert_compiles(k)
    assert "float r[8];" in k.cuda_source


def test_loop_and_if_variant():
    k = tilec.compile("""
kernel clamp(X: f32[M, N], Y: f32[M, N], n: i32, lo: f32) {
    const BM = 16, BN = 64;
    grid (bx) = (cdiv(N, BN));
    threads 128;
    shared s: f32[BM, BN];
    for t in range(cdiv(M, BM)) {
        copy(X[t * BM, bx * BN], s);
        if t < n {
            parallel (i, j) in (BM, BN) {
                if s[i, j] < lo {
                    s[i, j] = lo;
                } else {
                    s[i, j] = sqrt(s[i, j]);
                }
            }
        } else {
            fill(s, 0);
        }
        copy(s, Y[t * BM, bx * BN]);
    }
}
""", arch="sm_90a")
    assert_compiles(k)
    assert "phase_bar0 ^= 1;" in k.cuda_source


# ---------------------------------------------------------------- user names vs. the names codegen uses

NAMED = """
kernel k(A: f32[M, N], B: f32[M, N], {scalar}: f32) {{
    grid (bx, by) = (cdiv(N, 64), cdiv(M, 16));
    threads 128;
    shared {tile}: f32[16, 64];
    copy(A[by * 16, bx * 64], {tile});
    parallel ({i}, {j}) in (16, 64) {{
        {tile}[{i}, {j}] = {tile}[{i}, {j}] * {scalar};
    }}
    copy({tile}, B[by * 16, bx * 64]);
}}
"""


def test_ordinary_names_compile():
    assert_compiles(tilec.compile(NAMED.format(scalar="alpha", tile="s", i="i", j="j"), arch="sm_90a"))


@pytest.mark.parametrize("names", [
    dict(scalar="alpha", tile="s", i="i", j="e"),
    dict(scalar="alpha", tile="s", i="slot", j="j"),
    dict(scalar="alpha", tile="smem", i="i", j="j"),
    dict(scalar="alpha", tile="bar0", i="i", j="j"),
    dict(scalar="tmap_A", tile="A_dim0", i="i0", j="src_in"),
], ids=["parallel-var-e", "parallel-var-slot", "tile-smem", "tile-bar0", "derived-looking-names"])
def test_names_that_codegen_also_uses_compile(names):
    assert_compiles(tilec.compile(NAMED.format(**names), arch="sm_90a"))


@pytest.mark.parametrize("name", ["int", "threadIdx", "tl_x", "mbarrier_wait", "float"])
def test_reserved_names_are_rejected_with_a_location(name):
    with pytest.raises(tilec.SemanticError, match=f"'{name}' is a reserved name"):
        tilec.compile(NAMED.format(scalar=name, tile="s", i="i", j="j"), arch="sm_90a")


def test_loop_variable_may_not_shadow_a_const():
    src = """kernel k(A: f32[M, N], B: f32[M, N]) {
        const BM = 64;
        grid (bx) = (1);
        threads 128;
        shared s: f32[64, 128];
        for BM in range(4) { copy(A[BM * 64, 0], s); copy(s, B[BM * 64, 0]); }
    }"""
    with pytest.raises(tilec.SemanticError, match="'BM' is already declared \\(as a const\\)"):
        tilec.compile(src, arch="sm_90a")


def test_scalar_named_e_is_not_shadowed_in_a_parallel_body():
    k = tilec.compile(NAMED.format(scalar="e", tile="s", i="i", j="j"), arch="sm_90a")
    body = next(line.strip() for line in k.cuda_source.splitlines() if line.strip().startswith("s[i * 64 + j] ="))
    assert body.startswith("s[i * 64 + j] = s[i * 64 + j] * ")
    name = body.rsplit(" ", 1)[1].rstrip(";")       # the C name the scalar argument got
    assert f"const float {name})" in k.cuda_source
    assert f" {name} =" not in k.cuda_source        # and nothing else declares that name


def test_compiling_leaves_python_s_shared_objects_alone(monkeypatch, tmp_path):
    """NVRTC writes its log into a buffer we pass; an empty log has size 1, and
    `b" " * 1` is CPython's shared one-byte object: writing there once turned every
    b" " (and on Python 3.12 every " ") of the process into a NUL."""
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path))
    k = tilec.compile(str(EXAMPLES / "copy2d.tile"), arch="sm_90a", BM=32)
    assert k.compile_log == "" and not k.from_disk_cache
    assert bytes([0x20])[0] == 0x20 and ord(chr(0x20)) == 0x20    # the shared one-character objects


def test_an_index_that_folding_removes_is_not_declared():
    """`(i + 1) % 1` folds to 0, so the body reads no `i`; the source line quoted
    in a comment above the code still names it, and declaring it anyway made
    NVRTC warn 'variable "i" was declared but never referenced' (found by
    tests/test_random_programs.py)."""
    k = tilec.compile("""
kernel fold(A: i32[M, N], Y: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 16), M);
    threads 128;
    shared a: i32[1, 16];
    local r: f32[1, 16];
    copy(A[by, bx * 16], a);
    parallel (i, j) in (1, 16) {
        r[i, j] = f32(j);
        if (a[(i + 1) % 1, j] > 1) {
            r[i, j] = 2.0;
        }
    }
    copy(r, Y[by, bx * 16]);
}
""", arch="sm_90a")
    assert_compiles(k)
    assert "const int i =" not in k.cuda_source


def test_a_16_bit_float_cast_beside_a_float_in_select_min_max_abs():
    """`max(acc, f16(x))` instantiated tl_max<float, f16_t>, whose `a < b ? b : a`
    NVRTC rejected as ambiguous (found by tests/test_random_programs.py): a cast
    to a 16- or 8-bit float is rounded and then used as a float, like an element
    of such a tile."""
    k = tilec.compile("""
kernel mixed(A: f32[N], Y: f32[N]) {
    grid (bx) = (cdiv(N, 32));
    threads 32;
    shared a: f32[32];
    copy(A[bx * 32], a);
    parallel (i) in (32) {
        a[i] = max(a[i], f16(a[i])) + min(bf16(a[i]), 0.5) + abs(f8e4m3(a[i])) + select(i < 3, f16(a[i]), 1.0);
    }
    copy(a, Y[bx * 32]);
}
""", arch="sm_90a")
    assert_compiles(k)


def test_nested_unary_minus_is_no_decrement():
    """`---b[i]` printed as `---float(...)`, which C++ reads as `--` of an rvalue
    (found by tests/test_random_programs.py); `- -1` likewise."""
    k = tilec.compile("""
kernel neg(A: bf16[N], Y: bf16[N], n: i32) {
    grid (bx) = (cdiv(N, 32));
    threads 32;
    shared a: bf16[32];
    copy(A[bx * 32], a);
    parallel (i) in (32) {
        a[i] = ---a[i] + f32(- -n) + f32(-(-i));
    }
    copy(a, Y[bx * 32]);
}
""", arch="sm_90a")
    assert_compiles(k)
    import numpy as np
    ki = tilec.compile(k.source.text, backend="interpret")
    a = np.arange(40, dtype=np.float32).astype(np.float16).astype(np.float32)
    import ml_dtypes
    x, y = a.astype(ml_dtypes.bfloat16), np.zeros(40, ml_dtypes.bfloat16)
    ki(x, y, 3)
    assert np.array_equal(y.astype(np.float32), -a + 3 + np.arange(40) % 32)
