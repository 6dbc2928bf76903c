"""User names and the code tilec generates (docs/language.md §4, Names;
tilec/frontend/names.py): a name the front end accepts compiles through NVRTC
and runs through its host wrapper, whatever it is; the ones that could not are
refused at their declaration (tests/test_parse_errors.py has the messages).
CPU only: NVRTC and the interpreter; tests/test_export.py compiles an export's
C++ of the names its launcher once declared."""
import inspect
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tilec
from tilec import ParseError, SemanticError
from tilec.codegen import cuda as cuda_codegen
from tilec.compiler import lower, read_source
from tilec.errors import Source
from tilec.frontend import names
from conftest import ROOT, TILEC

# One program with a slot for each kind of name: every name is used where the
# generated CUDA and the host wrapper print it (a symbol in a shape, the grid and a
# shape check; a scalar in the body, ...). B and j are fixed names.
PROGRAM = """\
kernel {kernel}({tensor}: f32[{symbol}, N], B: f32[{symbol}, N], {scalar}: f32) {{
    const {const} = 32;
    let {let} = {const} * 2;
    grid ({block}) = (cdiv({symbol}, {const}));
    threads 128;
    shared {tile}: f32[{const}, 64];
    copy({tensor}[{block} * {const}, 0], {tile});
    for {loop} in range(2) {{
        parallel ({index}, j) in ({const}, 64) {{
            {tile}[{index}, j] = {tile}[{index}, j] * {scalar} + f32({loop} + {let});
        }}
    }}
    copy({tile}, B[{block} * {const}, 0]);
}}
"""
DEFAULTS = dict(kernel="k", tensor="A", symbol="M", scalar="alpha", const="BM", let="L", block="bx", tile="s",
                loop="t", index="i")
WHAT = dict(kernel="kernel", tensor="parameter", symbol="shape symbol", scalar="parameter", const="const", let="let",
            block="block index", tile="tile", loop="loop variable", index="parallel index")
TAKEN = set(DEFAULTS.values()) | {"N", "B", "j"}


def program(slot, name):
    return PROGRAM.format(**dict(DEFAULTS, **{slot: name}))


def expected(a):
    """What PROGRAM computes: two passes of s * alpha + t + 64."""
    out = a
    for t in range(2):
        out = out * np.float32(2.0) + np.float32(t + 64)
    return out


def runs_everywhere(slot, name):
    """`name` in `slot` compiles through NVRTC (and the host wrapper's Python), and
    the interpreter runs the kernel through its host wrapper, correctly."""
    src = program(slot, name)
    k = tilec.compile(src, arch="sm_90a")
    assert k.cubin and "def launch(tl_call" in k.host_source
    interp = tilec.compile(src, backend="interpret")
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    b = np.zeros_like(a)
    interp(a, b, 2.0)
    np.testing.assert_array_equal(b, expected(a))


REFUSALS = re.compile(r"is a reserved name|a boolean literal|is a literal|is a Python keyword|"
                      r"is a keyword argument of tilec\.compile\(\)")


def refused_or_runs(slot, name):
    """The property: the front end refuses `name` in `slot` at its declaration with
    a reserved-name error, or does not parse the program (a statement keyword such
    as grid where an assignment starts), or the program runs."""
    try:
        lower(Source("names.tile", program(slot, name)))
    except ParseError:
        return "parse"
    except SemanticError as e:
        assert REFUSALS.search(str(e)), str(e)
        assert e.span is not None and e.span.line in (1, 2, 3, 4, 6, 8, 9), str(e)   # at a declaration
        return "refused"
    runs_everywhere(slot, name)
    return "runs"


# ---------------------------------------------------------------- names tilec's own code uses

# the host wrapper's and the launcher's own names before they took the prefix tl_, the
# runtime's, and names a kernel's or NVRTC's code uses that a name may still be
HOST_NAMES = ["rt", "call", "arg_A", "grid", "err", "tmap_A", "THREADS", "DYNAMIC_SMEM_BYTES", "IN_PLACE", "WRITES",
              "launch", "stream", "device", "why", "rc", "fail", "A_shape", "t_A", "std", "match", "type", "_",
              "smem", "bar0", "slot", "param", "where", "key", "clock", "A7"]


@pytest.mark.parametrize("slot", ["scalar", "symbol"])
@pytest.mark.parametrize("name", HOST_NAMES)
def test_names_the_generated_code_used_are_refused_or_run(slot, name):
    """`rt`, `call` and `arg_A` as a shape symbol or parameter passed `tilec check`
    and failed at launch (AttributeError in the host wrapper); a parameter `call`
    was "duplicate argument 'call'"."""
    refused_or_runs(slot, name)


@pytest.mark.parametrize("name", ["main", "round", "printf", "dim3", "A7", "_", "WARP_SZ", "launch", "grid", "rt",
                                  "std", "mov", "ret", "entry"])
def test_kernel_names_are_refused_or_run(name):
    """A kernel is the extern "C" function of its name: main, the C math library's
    and NVRTC's global names are refused (NVRTC 13.5 crashed on A7); and it is the
    PTX entry of its name, where ptxas could not parse `_` (its sink operand; CI's
    hypothesis property found it) or `WARP_SZ` (its constant). PTX opcodes and
    directive names run."""
    runs = ("launch", "grid", "rt", "mov", "ret", "entry")
    assert refused_or_runs("kernel", name) == ("runs" if name in runs else "refused")


def test_a_kernel_named_as_ptx_reads_a_name_is_refused_at_its_line():
    src = "kernel _(A: f32[N]) {\n    grid (bx) = (1);\n    threads 32;\n}\n"
    with pytest.raises(tilec.SemanticError) as e:
        tilec.compile(src)
    assert str(e.value).startswith("<string>:1:8: error: '_' is a reserved name for a kernel: a kernel is the PTX "
                                   "entry of its name, and PTX reads '_' as its sink operand"), str(e.value)


def test_host_wrapper_names_the_kernel_may_use_run():
    """All at once, in the host wrapper's own scope: a launch reads them as the kernel's."""
    src = """\
kernel launch(rt: f32[call, grid], tmap_rt: f32[call, grid], arg_rt: f32, THREADS: f32, IN_PLACE: i32, err: i32,
              DYNAMIC_SMEM_BYTES: i32, WRITES: i32) {
    require IN_PLACE + err + DYNAMIC_SMEM_BYTES + WRITES >= 0;
    grid (bx, by) = (cdiv(grid, 32), cdiv(call, 16));
    threads 128;
    shared s: f32[16, 32];
    copy(rt[by * 16, bx * 32], s);
    parallel (i, j) in (16, 32) {
        s[i, j] = s[i, j] * arg_rt + THREADS;
    }
    copy(s, tmap_rt[by * 16, bx * 32]);
}
"""
    k = tilec.compile(src, arch="sm_90a")
    assert "tl_call.require(IN_PLACE + err + DYNAMIC_SMEM_BYTES + WRITES >= 0" in k.host_source
    interp = tilec.compile(src, backend="interpret")
    a = np.arange(40 * 70, dtype=np.float32).reshape(40, 70)
    b = np.zeros_like(a)
    interp(a, b, 3.0, 0.5, 1, 2, 3, 4)
    np.testing.assert_array_equal(b, a * np.float32(3.0) + np.float32(0.5))


@pytest.mark.parametrize("slot", sorted(DEFAULTS))
@pytest.mark.parametrize("name", ["true", "false"])
def test_the_boolean_literals_are_no_names(slot, name):
    """true and false are the literals 1 and 0: a shape symbol named false was a dim of 0
    (the launch then said "dim 0 is 64 but the declaration says 0"; found by the
    property below). Wherever a name is declared they do not parse or are refused."""
    assert refused_or_runs(slot, name) in ("parse", "refused")


# ---------------------------------------------------------------- any identifier

INTERESTING = sorted(names.CXX_KEYWORDS | names.C_NAMES | names.CUDA_NAMES | set(names.COMPILE_OPTIONS) |
                     set(names.KERNEL_NAMES) | set(HOST_NAMES) | {
                         "True", "False", "None", "lambda", "def", "import", "pass", "in", "is", "as", "with",
                         "global", "async", "await", "assert", "nonlocal", "yield", "kernel", "const", "let",
                         "require", "tune", "threads", "shared", "local", "for", "parallel", "if", "else", "main",
                         "NULL", "char16_t", "char8_t", "float4", "make_float4", "int2", "CUstream", "cudaMalloc",
                         "CUDA_R_16F", "NV_IF_TARGET", "_Pragma", "_X", "__x", "tl_x", "tilec_k", "TILEC_OK",
                         "wgmma_fence", "tma_load_2d", "int64_t", "uint8_t", "INT32_MAX", "size_t", "f32", "i64",
                         "true", "false", "x", "X", "_", "a1", "Z9"})
IDENTIFIERS = st.one_of(st.sampled_from(INTERESTING), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(slot=st.sampled_from(sorted(DEFAULTS)), name=IDENTIFIERS)
def test_any_identifier_is_refused_or_runs(slot, name):
    """Any identifier the grammar accepts, in any kind of declaration: refused at the
    declaration with a reserved-name error, or compiled by NVRTC and run (the
    interpreter, through the host wrapper); about 0.2 s an example."""
    if name in TAKEN:
        return
    refused_or_runs(slot, name)


# ---------------------------------------------------------------- the reserved lists

def test_compile_options_are_compiles_keyword_arguments():
    """A const is overridden as tilec.compile(src, **consts): consts may not take
    the names of its other arguments (its signature is docs/language.md §14's)."""
    params = inspect.signature(tilec.compile).parameters
    assert tuple(n for n, p in params.items() if p.kind != p.VAR_KEYWORD) == names.COMPILE_OPTIONS


def _template_globals() -> set:
    """The global names primitives.cu.j2 declares, with sample ranks and shapes for
    its placeholders (tma_load_{{ rank }}d is tma_load_2d, struct {{ name }} an fp8 type's)."""
    from tilec._resources import resource
    text = (resource("templates") / "primitives.cu.j2").read_text()
    text = re.sub(r"\{\{\s*name\s*\}\}", "f8e4m3_t", re.sub(r"\{%[^%]*%\}", "", text))   # the fp8 structs'
    text = re.sub(r"\{\{[^}]*\}\}", "2", text)
    found = set()
    for line in text.splitlines():
        m = re.match(r"(?:template <[^>]*> )?(?:__device__ )+(?:__forceinline__ |__noinline__ )?"
                     r"(?:__align__\(\d+\) )?[\w:<>*& ]*?\b(\w+)\s*[(\[]", line)
        if m and not line.startswith("  "):
            found.add(m.group(1))
        m = re.match(r"(?:template <[^>]*> )?struct (?:__align__\(\d+\) )?(\w+)", line)
        if m:
            found.add(m.group(1))
    return found


def test_every_device_helper_is_reserved():
    """A tile or scalar named like a helper the kernel calls shadowed it (a kernel's
    `mbarrier_arrive(&tl_bar0)` after a tile named mbarrier_arrive)."""
    declared = _template_globals()
    assert {"smem_addr", "mbarrier_arrive", "tma_load_2d", "consumers_sync", "f16_t", "tl_min"} <= declared
    assert sorted(n for n in declared if not names.reserved(n)) == []


def _kernel_identifiers(cuda: str) -> set:
    """The identifiers of the generated kernel function (not member names, strings, comments)."""
    body = cuda[cuda.index('extern "C" __global__'):]
    body = re.sub(r'"(\\.|[^"\\])*"', '""', re.sub(r"//[^\n]*", "", body))
    return {m.group(2) for m in re.finditer(r"(\.|->|::|#\s*pragma\s+)?\b([A-Za-z_]\w*)", body) if not m.group(1)}


@pytest.mark.parametrize("path, consts", [(p, {}) for p in sorted((ROOT / "examples").glob("*.tile"))] + [
    (ROOT / "examples/gemm.tile", dict(PERSISTENT=1, STREAM_K=1)), (ROOT / "examples/gemm.tile", dict(BM=24)),
    (ROOT / "tests/attention.tile", {}), (ROOT / "tests/filecheck/float_calls.tile", {})], ids=str)
def test_generated_kernels_name_only_reserved_names_and_the_programs(path, consts):
    """Every name a generated kernel uses that its program did not declare is
    reserved, so no name of a program can shadow it (C++ keywords, CUDA's
    built-ins, tilec's helpers and the float4 of a stream-K slot)."""
    src = read_source(path)
    own = set(re.findall(r"[A-Za-z_]\w*", re.sub(r"//[^\n]*", "", src.text)))
    for debug in (False, True):
        lw = lower(src, consts, arch="sm_90a")
        used = _kernel_identifiers(cuda_codegen.generate(lw.kernel, src.name, debug, "sm_90a"))
        assert sorted(n for n in used - own if not names.reserved(n)) == []


def test_tensor_maps_of_tensors_named_like_each_others_maps_are_two():
    """Tensor A's second map was tmap_A_1, and so was tensor A_1's first: one
    kernel parameter declared twice."""
    src = """\
kernel k(A: f32[M, N], A_1: f32[M, N], B: f32[M, N]) {
    grid (bx, by) = (cdiv(N, 128), cdiv(M, 64));
    threads 128;
    shared s: f32[64, 128];
    shared t: f32[32, 128];
    shared u: f32[64, 128];
    copy(A[by * 64, bx * 128], s);
    copy(A[by * 64, bx * 128], t);
    copy(A_1[by * 64, bx * 128], u);
    copy(s, B[by * 64, bx * 128]);
}
"""
    k = tilec.compile(src, arch="sm_90a")
    maps = [t.name for t in k.kernel_ir.tensor_maps]
    assert maps == ["tmap_A", "tmap_A_1", "tmap_A_1_1", "tmap_B"]


# ---------------------------------------------------------------- compile options

CONST_ARCH = """\
kernel k(A: f32[M, N], B: f32[M, N]) {
    const arch = 1;
    tune arch in (1, 2);
    grid (bx) = (1);
    threads 128;
}
"""


def test_a_const_named_like_a_compile_option_is_refused_at_the_const(tmp_path):
    """`tilec check`, tilec.compile and its tune raised "compile() got multiple
    values for keyword argument 'arch'"."""
    path = tmp_path / "arch.tile"
    path.write_text(CONST_ARCH)
    with pytest.raises(SemanticError, match=r"arch\.tile:2:11: error: 'arch' is a keyword argument of tilec\.compile"):
        tilec.compile(str(path))
    p = subprocess.run([*TILEC, "check", str(path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith(f"{path}:2:11: error: 'arch' is a keyword argument of tilec.compile()")


def test_define_of_a_compile_option_is_a_clean_error():
    p = subprocess.run([*TILEC, "check", "examples/copy2d.tile", "-D", "arch=2"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr == ("error: -D arch=2: 'arch' is a keyword argument of tilec.compile(), which no const may be "
                        "named (a shape symbol so named cannot be fixed)\n")


def test_tilec_export_takes_a_const_named_like_exports_arguments(tmp_path):
    """export() takes name=, fixes=, out_dir: `-D name=1` reached it as a second name."""
    src = tmp_path / "n.tile"
    src.write_text(read_source(ROOT / "examples/copy2d.tile").text.replace("BM", "name"))
    p = subprocess.run([*TILEC, "export", str(src), "-o", str(tmp_path / "out"), "-D", "name=32"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert "// consts: name = 32, BN = 128" in (tmp_path / "out" / "copy2d.cc").read_text()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
