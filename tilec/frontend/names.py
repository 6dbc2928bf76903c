"""The names a program may not declare, and why (docs/language.md §4, Names).

A user name is printed as it is in the generated CUDA (every declared name), in
the Python host wrapper (parameters and shape symbols) and in an export's C
header and C++ launcher (parameters; shape symbols in the launcher). tilec's
own names in all three start with tl_ (and tilec_ / TILEC_ in an export), which
no user name may; the names below are the rest that C++, NVRTC's built-in
headers, the host toolchain's headers, Python or tilec.compile() give a meaning:

- C++: every C++20 keyword and alternative token, `main`, the macros of the C
  standard headers an export includes and of NVRTC's built-in headers, the
  <stdint.h> / <stddef.h> types an export's header declares with;
- CUDA: the built-in variables, the vector types, tilec's device helpers (the
  names primitives.cu.j2 declares; tests/test_names.py checks the list against
  it) and the math functions a kernel calls;
- a kernel's name is its extern "C" function, at global scope in NVRTC's
  built-in headers: the C functions and types they declare there are reserved
  for kernels (`round`, `printf`, `dim3`, ...);
- Python keywords, for the names the host wrapper declares (parameters, shape symbols);
- tilec.compile()'s keyword arguments, for consts (overridden as its **consts).
"""
from __future__ import annotations

import keyword
import re

from ..ir.exprs import FLOAT_CALLS

# C++20's keywords and alternative tokens (char8_t, concept, requires, co_await ... are
# keywords only from C++20, but an export's header may be compiled as C++20).
CXX_KEYWORDS = frozenset("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
char16_t char32_t class compl concept const consteval constexpr constinit const_cast continue co_await co_return
co_yield decltype default delete do double dynamic_cast else enum explicit export extern false float for friend goto
if inline int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
register reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch
template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
while xor xor_eq""".split())

# Macros and types C++ code sees (and main): the C standard headers' object-like macros (an
# export's launcher includes <cstdio>, <cstdlib>, <cmath>, <stdint.h> ...: `float EOF`
# would be `float (-1)`), NVRTC's NULL, assert and va_* (its other macros start with
# CU / cuda / NV_ / _: the prefixes below), and the fixed-width types an export's
# header declares its parameters with (`float int64_t, const int64_t A_shape[2]`
# would not parse). g++'s GNU modes (its default) predefine linux and unix as 1.
C_NAMES = frozenset("""NULL assert offsetof errno EOF BUFSIZ FILENAME_MAX FOPEN_MAX L_tmpnam TMP_MAX SEEK_SET
SEEK_CUR SEEK_END stdin stdout stderr EDOM ERANGE EILSEQ EXIT_SUCCESS EXIT_FAILURE RAND_MAX MB_CUR_MAX MB_LEN_MAX
INFINITY NAN HUGE_VAL HUGE_VALF HUGE_VALL MATH_ERRNO MATH_ERREXCEPT math_errhandling FP_INFINITE FP_NAN FP_NORMAL
FP_SUBNORMAL FP_ZERO FP_ILOGB0 FP_ILOGBNAN CHAR_BIT SCHAR_MIN SCHAR_MAX UCHAR_MAX CHAR_MIN CHAR_MAX SHRT_MIN SHRT_MAX
USHRT_MAX INT_MIN INT_MAX UINT_MAX LONG_MIN LONG_MAX ULONG_MAX LLONG_MIN LLONG_MAX ULLONG_MAX SIZE_MAX PTRDIFF_MIN
PTRDIFF_MAX SIG_ATOMIC_MIN SIG_ATOMIC_MAX WCHAR_MIN WCHAR_MAX WINT_MIN WINT_MAX WEOF va_list va_start va_arg va_end
va_copy linux unix size_t ptrdiff_t nullptr_t max_align_t intptr_t uintptr_t intmax_t uintmax_t""".split())
# <stdint.h>: int8_t .. uint64_t, int_least16_t, uint_fast32_t, and their INT32_MAX, UINT64_C ... macros
_STDINT = re.compile(r"u?int(_least|_fast)?(8|16|32|64)_t|U?INT(_LEAST|_FAST)?(8|16|32|64|MAX|PTR)_(MIN|MAX|C|WIDTH)")

# CUDA's built-in variables and the device-side names a generated kernel calls or
# declares: tilec's helpers (primitives.cu.j2: tests/test_names.py checks this list
# against it), the float4 of a stream-K slot, the math functions an expression calls.
CUDA_NAMES = frozenset("""threadIdx blockIdx blockDim gridDim warpSize CUtensorMap smem_addr mbarrier_init
mbarrier_arrive mbarrier_arrive_expect_tx mbarrier_wait mbarrier_wait_bounded fence_mbarrier_init globaltimer_ns
bulk_copy_zeros bulk_commit_group bulk_wait_group bulk_wait_group_read setmaxnreg_dec setmaxnreg_inc consumers_sync
fence_proxy_async_shared fence_proxy_async_global f16_t bf16_t f8e4m3_t f8e5m2_t min max abs cdiv""".split()) | \
    FLOAT_CALLS | {f + "f" for f in FLOAT_CALLS}      # exp and CUDA's expf, ...
# tl_: tilec's own names (generated CUDA, host wrapper, launcher); __ and _X: C++'s;
# helpers named by a rank or a shape (tma_load_2d, wgmma_m64n128k16_f16_bn); tilec_ /
# TILEC_: an export's functions, status codes and macros; the driver API's and NVRTC's
# names (CUstream, CU_TENSOR_MAP_..., CUDA_R_16F, cuLaunchKernel, cudaStreamDefault,
# NV_IF_TARGET); CUDA's vector types and their make_ functions (float4, make_float4).
_PREFIXES = re.compile(r"tl_|__|_[A-Z]|tma_load_|tma_store_|wgmma_|tilec_|TILEC_|CU[a-z_]|CUDA|cu[A-Z]|cuda[A-Z_]|NV_|"
                       r"(make_)?(u?char|u?short|u?int|u?long|u?longlong|float|double)[1-4]$")

# A kernel is the extern "C" function of its name, declared at global scope after
# NVRTC's built-in headers (crt/math_functions.h, ...): these names are theirs there.
# Found by compiling `extern "C" __global__ void NAME(int)` with NVRTC 13.5 for every
# identifier of CUDA 13's headers (the C math library in double and float, printf,
# malloc, dim3, ...). NVRTC 13.5's ptxas crashes (a segfault, for sm_80 and sm_90a) on
# a kernel named A7, the only one among the identifiers tried.
KERNEL_NAMES = frozenset("""abs acos acosf acosh acoshf asin asinf asinh asinhf atan atan2 atan2f atanf atanh atanhf
cbrt cbrtf ceil ceilf clock64 clock_t copysign copysignf cos cosf cosh coshf cospi cospif cyl_bessel_i0 cyl_bessel_i0f
cyl_bessel_i1 cyl_bessel_i1f dim3 erf erfc erfcf erfcinv erfcinvf erfcx erfcxf erff erfinv erfinvf exp exp10 exp10f
exp2 exp2f expf expm1 expm1f fabs fabsf fdim fdimf fdivide fdividef floor floorf fma fmaf fmax fmaxf fmin fminf fmod
fmodf free frexp frexpf hypot hypotf ilogb ilogbf j0 j0f j1 j1f jn jnf labs ldexp ldexpf lgamma lgammaf
libraryPropertyType llabs llmax llmin llrint llrintf llround llroundf log log10 log10f log1p log1pf log2 log2f logb
logbf logf lrint lrintf lround lroundf malloc modf modff nan nanf nearbyint nearbyintf nextafter nextafterf norm norm3d
norm3df norm4d norm4df normcdf normcdff normcdfinv normcdfinvf normf pow powf printf rcbrt rcbrtf remainder remainderf
remquo remquof rhypot rhypotf rint rintf rnorm rnorm3d rnorm3df rnorm4d rnorm4df rnormf round roundf rsqrt rsqrtf
scalbln scalblnf scalbn scalbnf sin sincos sincosf sincospi sincospif sinf sinh sinhf sinpi sinpif sqrt sqrtf std tan
tanf tanh tanhf tgamma tgammaf trunc truncf ullmax ullmin umax umin y0 y0f y1 y1f yn ynf MAJOR_VERSION MINOR_VERSION
PATCH_LEVEL""".split())
NVRTC_CRASHES = frozenset({"A7"})
# ... and the PTX entry of its name, where ptxas reads a lone `_` as its sink operand and
# `WARP_SZ` as its predefined constant: NVRTC 13.5 compiles either name, ptxas cannot parse
# the result (found by tests/test_names.py's hypothesis property; the PTX opcodes and
# directive names compile as kernel names).
PTX_NAMES = frozenset({"_", "WARP_SZ"})

# tilec.compile()'s keyword arguments: its **consts override consts by name, so a
# const with one of these names could not be overridden (tests/test_names.py checks
# the list against the signature; docs/language.md §14 fixes it).
COMPILE_OPTIONS = ("src", "arch", "fallback", "debug", "backend", "tune", "key", "where", "tune_l2")

# what each declaration's name is, in the messages ("the host wrapper could not name the parameter so")
_IN_PYTHON = {"parameter", "shape symbol"}


def reserved(name: str) -> bool:
    """Whether C++, NVRTC, CUDA or tilec's generated code gives `name` a meaning
    wherever a program declares it (the kernel's name has more: kernel_reason)."""
    return name in CXX_KEYWORDS or name == "main" or name in C_NAMES or name in CUDA_NAMES or \
        bool(_STDINT.fullmatch(name)) or bool(_PREFIXES.match(name))


RESERVED = "is a reserved name (C++ or the generated CUDA uses it); choose another"


def why_reserved(name: str, what: str) -> str | None:
    """The error for declaring `name` as a `what` ("parameter", "shape symbol",
    "const", "let", "block index", "tile", "loop variable", "parallel index",
    "kernel"), or None where it may be."""
    if name in CXX_KEYWORDS:
        return f"'{name}' is a reserved name (a C++ keyword); choose another"
    if name == "main":
        return "'main' is a reserved name (C++'s program entry point); choose another"
    if name in C_NAMES or _STDINT.fullmatch(name):
        return f"'{name}' is a reserved name (C's or CUDA's headers define it); choose another"
    if reserved(name):
        return f"'{name}' {RESERVED}"
    if what == "kernel" and name in KERNEL_NAMES:
        return (f"'{name}' is a reserved name for a kernel: a kernel is the extern \"C\" function of its name, and "
                f"the CUDA headers NVRTC compiles with declare '{name}' at global scope; choose another")
    if what == "kernel" and name in PTX_NAMES:
        return (f"'{name}' is a reserved name for a kernel: a kernel is the PTX entry of its name, and PTX reads "
                f"'{name}' as {'its sink operand' if name == '_' else 'its predefined constant'}; choose another")
    if what == "kernel" and name in NVRTC_CRASHES:
        return (f"'{name}' is a reserved name for a kernel: NVRTC 13.5 crashes compiling a kernel so named; "
                "choose another")
    if what in _IN_PYTHON and keyword.iskeyword(name):
        return f"'{name}' is a Python keyword: the host wrapper could not name the {what} so; choose another"
    if what == "const" and name in COMPILE_OPTIONS:
        return (f"'{name}' is a keyword argument of tilec.compile(): a const so named could not be overridden "
                f"(tilec.compile(src, {name}=...) sets the option, not the const); choose another")
    return None
