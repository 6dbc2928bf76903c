"""The float arithmetic of the CUDA tilec writes equals the interpreter's, bit
for bit, without a GPU: random element expressions (half of them with no f64
operand) over f32, f64, f16 and bf16 tiles, f32 / f64 / u32 / i32 scalars and
the loop index (sums, differences, products, negation, select, min, max, abs,
sqrt, casts to f32, f64, f16, bf16 and to integers) go into one kernel; sm_80's CUDA
for it is built with g++ and run on the CPU (tests/test_arch.py's shim: a
std::thread per CUDA thread, cp.async as a plain copy), with `-ffp-contract=off`,
as NVRTC runs with `--fmad=false`, and `__fmaf_rn` / `__fma_rn` as `fmaf` /
`fma`, f16_t and bf16_t as g++'s _Float16 and a round-to-nearest-even of
the bits (what cvt.rn does); the interpreter runs the same kernel on the same inputs. The results are
stored to f64 tiles, so a double's last bit shows as well as a float's. So the
fused multiply-adds codegen spells out, the operands it negates and converts,
its literals, casts and parentheses are the ones the interpreter models
(ir.exprs.fused_product decides for both; the GPU side of the same claim is
test_gpu_interpret's test_fused_only_where_the_source_says and the random
programs' GPU test)."""
import re
import shutil
import subprocess

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
from hypothesis import HealthCheck, given, settings, strategies as st

import tilec
from tilec.errors import TilecError
from test_arch import _CPU_SHIM, build_on_cpu

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the generated CUDA for the CPU")

OUTPUTS = 6         # expressions per kernel: one g++ build serves them all
BLOCK = 64

FLOAT_LEAVES = ["x[i]", "x[63 - i]", "h[i]", "b[i]", "a", "u", "n", "i", "0.5", "3.0", "1e-3", "0.1", "2", "3"]
LEAVES = FLOAT_LEAVES + ["z[i]", "z[63 - i]", "d"]
INTS = ["u", "n", "i", "2"]


def expressions(leaves):
    leaf = st.sampled_from(leaves)

    def grow(inner):
        two = st.tuples(inner, inner)
        return st.one_of(
            st.tuples(st.sampled_from(["+", "-", "*"]), inner, inner).map(lambda t: f"({t[1]} {t[0]} {t[2]})"),
            st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} * {t[1]} + {t[2]})"),
            st.tuples(inner, inner, inner).map(lambda t: f"({t[2]} - {t[0]} * {t[1]})"),
            # an integer operand the fused multiply-add negates: -u of an unsigned u would wrap
            st.tuples(st.sampled_from(INTS), inner, inner).map(lambda t: f"({t[2]} - {t[0]} * {t[1]})"),
            st.tuples(inner, inner, st.sampled_from(INTS)).map(lambda t: f"({t[0]} * {t[1]} - {t[2]})"),
            inner.map(lambda e: f"-{e}"),
            st.tuples(inner, inner, inner, inner).map(lambda t: f"select({t[0]} < {t[1]}, {t[2]}, {t[3]})"),
            st.tuples(st.sampled_from(["min", "max"]), two).map(lambda t: f"{t[0]}({t[1][0]}, {t[1][1]})"),
            inner.map(lambda e: f"abs({e})"),
            inner.map(lambda e: f"sqrt(abs({e}))"),
            st.tuples(st.sampled_from(["f32", "f64", "f16", "bf16"]), inner).map(lambda t: f"{t[0]}({t[1]})"),
            # to an integer: floats truncate and saturate (NaN -> 0), integers wrap
            st.tuples(st.sampled_from(["i32", "u8", "i64", "u32"]), inner).map(lambda t: f"{t[0]}({t[1]})"),
        )
    return st.recursive(leaf, grow, max_leaves=7)


def source(exprs):
    outs = ", ".join(f"Y{k}: f64[N]" for k in range(len(exprs)))       # f64: a double result's last bit shows
    tiles = "\n".join(f"    shared y{k}: f64[{BLOCK}];" for k in range(len(exprs)))
    body = "\n".join(f"        y{k}[i] = {e};" for k, e in enumerate(exprs))
    stores = "\n".join(f"    copy(y{k}, Y{k}[bx * {BLOCK}]);" for k in range(len(exprs)))
    return f"""
kernel exprs(X: f32[N], Z: f64[N], H: f16[N], B: bf16[N], {outs}, a: f32, d: f64, u: u32, n: i32) {{
    grid (bx) = (cdiv(N, {BLOCK}));
    threads {BLOCK};
    shared x: f32[{BLOCK}];
    shared z: f64[{BLOCK}];
    shared h: f16[{BLOCK}];
    shared b: bf16[{BLOCK}];
{tiles}
    copy(X[bx * {BLOCK}], x);
    copy(Z[bx * {BLOCK}], z);
    copy(H[bx * {BLOCK}], h);
    copy(B[bx * {BLOCK}], b);
    parallel (i) in ({BLOCK}) {{
{body}
    }}
{stores}
}}
"""


_MAIN = r"""
int main(int argc, char** argv) {  // N a d u n (hex floats); X, Z, H and B on stdin, the Ys on stdout
  const long long N = atoll(argv[1]);
  const float a = strtof(argv[2], nullptr);
  const double d = strtod(argv[3], nullptr);
  const unsigned u = strtoul(argv[4], nullptr, 10);
  const int n = atoi(argv[5]);
  (void)a; (void)d; (void)u; (void)n;
  std::vector<float> X(N);
  std::vector<double> Z(N);
  std::vector<f16_t> H(N);
  std::vector<bf16_t> B(N);
  std::vector<std::vector<double>> Y(OUTPUTS, std::vector<double>(N));
  if (fread(X.data(), sizeof(float), N, stdin) != size_t(N) || fread(Z.data(), sizeof(double), N, stdin) != size_t(N) ||
      fread(H.data(), 2, N, stdin) != size_t(N) || fread(B.data(), 2, N, stdin) != size_t(N))
    return 2;
  tl_launch((N + BLOCK - 1) / BLOCK, 1, BLOCK, [&] { exprs(CALL); });
  for (auto& y : Y) fwrite(y.data(), sizeof(double), N, stdout);
}
"""

_SHIM = _CPU_SHIM + r"""
#include <math.h>
#include <string.h>
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
struct f16_t {                          // cvt.rn.f16.f32 and back
  _Float16 v;
  f16_t() = default;
  f16_t(float f) : v(static_cast<_Float16>(f)) {}
  operator float() const { return static_cast<float>(v); }
};
struct bf16_t {                         // cvt.rn.bf16.f32: to nearest even; NaN stays NaN
  unsigned short bits;
  bf16_t() = default;
  bf16_t(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    bits = (u & 0x7fffffffu) > 0x7f800000u ? 0x7fff : (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
  }
  operator float() const {
    unsigned u = static_cast<unsigned>(bits) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
  }
};
"""
# the device definitions of the 16-bit float types (inline PTX), replaced by the shim's
_HALF_TYPES = re.compile(r"struct __align__\(2\) b?f16_t \{.*?\n\};\n", re.S)


def call_args(cuda: str) -> str:
    """The kernel's parameters, as the CPU main names its values."""
    params = re.search(r"exprs\((.*?)\) \{", cuda, re.S).group(1)
    args = []
    for p in params.split(","):
        name = p.split()[-1]
        if m := re.fullmatch(r"tl_(\w+?)_(dim|stride)0", name):
            args.append("N" if m.group(2) == "dim" else "1")
        elif re.fullmatch(r"Y\d+", name):
            args.append(f"Y[{name[1:]}].data()")
        else:
            args.append({"X": "X.data()", "Z": "Z.data()", "H": "H.data()", "B": "B.data()"}.get(name, name))
    return ", ".join(args)


def run_on_cpu(tmp_path, k, n, inputs, scalars):
    cuda, halves = _HALF_TYPES.subn("", k.cuda_source)
    assert halves == 2
    main = _MAIN.replace("OUTPUTS", str(OUTPUTS)).replace("BLOCK", str(BLOCK)).replace("CALL", call_args(cuda))
    exe, helpers = build_on_cpu(tmp_path, cuda, _SHIM, main)
    assert helpers >= 3
    a, d, u, m = scalars
    out = subprocess.run([str(exe), str(n), float(a).hex(), float(d).hex(), str(u), str(m)],
                         input=b"".join(x.tobytes() for x in inputs), capture_output=True, check=True,
                         timeout=120).stdout
    return np.frombuffer(out, np.float64).reshape(OUTPUTS, n)


def same(got, want):
    """Equal bits, every NaN alike (NaN payloads are not modelled)."""
    nan = np.isnan(got) & np.isnan(want)
    return (got.view(np.uint64) == want.view(np.uint64)) | nan


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(exprs=st.tuples(*[expressions(FLOAT_LEAVES if k % 2 else LEAVES) for k in range(OUTPUTS)]),
       a=st.sampled_from([0.75, -1.25, 1 / 3, 3e38]), d=st.sampled_from([0.1, -2.5, 1e-300]),
       u=st.sampled_from([0, 3, 4294967295]), m=st.sampled_from([-7, 2, 2147483647]), seed=st.integers(0, 99))
def test_cuda_float_arithmetic_is_the_interpreters(tmp_path, exprs, a, d, u, m, seed):
    src = source(exprs)
    try:
        k = tilec.compile(src, arch="sm_80")
    except TilecError:          # an expression check-types refuses (e.g. abs of an unsigned)
        return
    n = 150                     # three blocks, the last partial
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1, 1e3], n)).astype(np.float32)
    z = rng.standard_normal(n) * rng.choice([1e-3, 1, 1e3], n)
    h = (rng.standard_normal(n) * rng.choice([1e-3, 1, 1e3], n)).astype(np.float16)
    b = (rng.standard_normal(n) * rng.choice([1e-3, 1, 1e3], n)).astype(ml_dtypes.bfloat16)
    scalars = (np.float32(a), np.float64(d), np.uint32(u), np.int32(m))
    got = run_on_cpu(tmp_path, k, n, (x, z, h, b), scalars)
    ys = [np.zeros(n, np.float64) for _ in exprs]
    tilec.compile(src, backend="interpret", arch="sm_80")(x.copy(), z.copy(), h.copy(), b.copy(), *ys, *scalars)
    for e, g, want in zip(exprs, got, ys):
        ok = same(g, want)
        assert ok.all(), (f"y = {e}: {int((~ok).sum())} of {n} differ; first at {int(np.argmin(ok))}: "
                          f"CUDA {g[~ok][0]!r}, interpreter {want[~ok][0]!r}\n{k.cuda_source[-3000:]}")
