"""The divisor codegen prepares before a pipelined loop (tl_make_divisor,
tl_fastdiv, tl_fastmod in templates/primitives.cu.j2): the CUDA text itself,
built for the host with g++, against C's / and % for every 0 <= n < 2^31 it
is used for (exhaustive for small values, random and edge values beyond)."""
import shutil
import subprocess

import pytest

from tilec.codegen.cuda import _env

CXX = shutil.which("g++") or shutil.which("c++")

MAIN = r"""
#include <cstdio>
#include <random>
int main() {
  std::mt19937_64 rng(7);
  long wrong = 0, tests = 0;
  auto check = [&](int n, int d, const tl_divisor& v) {
    ++tests;
    if (tl_fastdiv(n, v) != n / d || tl_fastmod(n, v) != n % d) {
      if (wrong++ < 5) std::printf("n=%d d=%d: %d %d\n", n, d, tl_fastdiv(n, v), tl_fastmod(n, v));
    }
  };
  for (int d = 1; d <= 3000; ++d) {
    const tl_divisor v = tl_make_divisor(d);
    for (int n = 0; n < 9000; ++n) check(n, d, v);
    for (int k = 0; k < 8; ++k) check(0x7fffffff - k, d, v);
  }
  for (int i = 0; i < 400000; ++i) {
    const int d = i % 2 ? int(rng() % 200000) + 1 : int(rng() & 0x7fffffff) | 1;
    const tl_divisor v = tl_make_divisor(d);
    const int n = int(rng() & 0x7fffffff);
    check(n, d, v);
    check(n / d * d, d, v);
    if (n / d * d > 0) check(n / d * d - 1, d, v);
  }
  for (int s = 0; s < 31; ++s) {
    const tl_divisor v = tl_make_divisor(1 << s);
    for (int k = 0; k < 8; ++k) check(0x7fffffff - k, 1 << s, v);
  }
  std::printf("%ld tests, %ld wrong\n", tests, wrong);
  return wrong != 0;
}
"""


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_fastdiv_equals_c_division(tmp_path):
    macros = _env().get_template("primitives.cu.j2").module
    text = str(macros.fastdiv())
    text = text.replace("__device__ __forceinline__", "static inline").replace(
        "__clz(d - 1)", "__builtin_clz(unsigned(d - 1))")
    src = tmp_path / "fastdiv.cc"
    src.write_text(text + MAIN)
    exe = tmp_path / "fastdiv"
    subprocess.run([CXX, "-O2", "-std=c++17", str(src), "-o", str(exe)], check=True, timeout=120)
    p = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith(" 0 wrong"), p.stdout
