"""NVRTC: generated CUDA -> cubin (never PTX for the driver to JIT) and PTX for
inspection. Works with no GPU and no CUDA toolkit: NVRTC comes from a wheel."""
from __future__ import annotations

import functools
import os
import re
import threading
from pathlib import Path
import time
from dataclasses import dataclass

from ..errors import CompileError

_LOCK = threading.Lock()


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    ptx: str
    arch: str
    seconds: float
    log: str = ""       # NVRTC's and ptxas's warnings and advisories (e.g. C7515) on success


def _check(result, what):
    err = result[0]
    if int(err) != 0:
        raise CompileError(f"NVRTC {what} failed: {err}")
    return result[1] if len(result) == 2 else result[1:]


def version() -> tuple:
    from cuda.bindings import nvrtc
    return tuple(_check(nvrtc.nvrtcVersion(), "version"))


@functools.lru_cache(maxsize=None)
def identity() -> str:
    """Which NVRTC compiles here, cheaply (no library load): the libnvrtc this process
    has mapped already (LD_PRELOAD, an earlier load), else the wheel's, which the
    loader takes first; its path, size and mtime; else the version NVRTC reports. Found
    once per process (a key of every disk-cache lookup; the process keeps the library it
    loaded first anyway). Without the mapped one, a process that preloads another NVRTC
    was served the cubins of the wheel's (session 23: 13.0's, for 13.5)."""
    try:
        lib = mapped_library("libnvrtc.so")
        if lib is None:
            import nvidia
            lib = next((str(p) for root in nvidia.__path__ for p in sorted(Path(root).glob("cu*/lib/libnvrtc.so*"))),
                       None)
        if lib is not None:
            st = os.stat(lib)
            return f"{lib}:{st.st_size}:{st.st_mtime_ns}"
    except (ImportError, OSError):
        pass
    return "nvrtc-%d.%d" % version()


def mapped_library(prefix: str, maps: str = "/proc/self/maps") -> str | None:
    """The path of a shared library whose file name starts with `prefix` that this
    process has mapped (Linux), or None."""
    try:
        with open(maps) as f:
            for line in f:      # address perms offset dev inode [path]
                fields = line.split(None, 5)
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith(prefix):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def compile_cuda(source: str, name: str, arch: str) -> Compiled:
    from cuda.bindings import nvrtc
    t0 = time.perf_counter()
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []), "create")
    try:
        # --fmad=false: the kernel's one fused multiply-add per `a * b ± c` is spelled
        # out (__fmaf_rn, ir.exprs.fused_product); NVRTC contracts nothing else
        opts = [f"--gpu-architecture={arch}".encode(), b"-std=c++17", b"--fmad=false"]
        with _LOCK:   # NVRTC-based runtimes race when several threads compile at once
            result = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(result[0]) != 0:
            raise CompileError(_explain(source, _log(prog, nvrtc)))
        # output buffers are bytearrays: NVRTC writes into them, and `b" " * 1` would be
        # CPython's shared one-byte bytes object (an empty log has size 1)
        cubin = bytearray(_check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size"))
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "cubin")
        ptx = bytearray(_check(nvrtc.nvrtcGetPTXSize(prog), "ptx size"))
        _check(nvrtc.nvrtcGetPTX(prog, ptx), "ptx")
        log = _log(prog, nvrtc).strip()
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return Compiled(bytes(cubin), ptx.rstrip(b"\0 ").decode(), arch, time.perf_counter() - t0, log)


_NEG = re.compile(r"^\s*neg\.s32\s+(%r\d+),\s*(%r\d+);", re.M)
_MIN_MAX = re.compile(r"^\s*(?:min|max)\.s32\s+%r\d+,\s*(%r\d+),\s*(%r\d+);", re.M)
NEG_MIN_MAX_FIXED = (13, 4)


def known_miscompiles(ptx: str, arch: str, v: tuple) -> list:
    """What NVRTC version `v` (its ptxas), which compiled this PTX to the cubin, is known to
    get wrong in it, as messages. One, found by tilec's random-program tests and checked on the H100
    (benchmarks/probes/min3_probe.py, NOTES.md session 23): NVRTC 13.0 to 13.3 fold a
    32-bit min or max of x and -x with a third operand into one sm_90 VIMNMX3 that
    drops the negation, so min(min(a, -a), b) computes min(a, b); 13.4 keeps it."""
    if not arch.startswith("sm_90") or tuple(v) >= NEG_MIN_MAX_FIXED:
        return []
    negated = {m.group(1): m.group(2) for m in _NEG.finditer(ptx)}
    if not any(negated.get(b) == a or negated.get(a) == b for a, b in (m.groups() for m in _MIN_MAX.finditer(ptx))):
        return []
    return [f"NVRTC {v[0]}.{v[1]} (its ptxas) miscompiles this kernel's integer min or max of x and -x "
            f"on {arch}: combined with a third min or max, the negation is dropped (min(min(a, -a), b) computes "
            f"min(a, b)); results may be wrong. NVRTC {NEG_MIN_MAX_FIXED[0]}.{NEG_MIN_MAX_FIXED[1]} compiles it "
            f"right: pip install -U 'nvidia-cuda-nvrtc>={NEG_MIN_MAX_FIXED[0]}.{NEG_MIN_MAX_FIXED[1]}'"]


def _log(prog, nvrtc) -> str:
    n = _check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
    log = bytearray(n)
    nvrtc.nvrtcGetProgramLog(prog, log)
    return log.rstrip(b"\0 ").decode(errors="replace")


_LOG_LINE = re.compile(r"\((\d+)\): (error|warning)")
_ORIGIN = re.compile(r"^\s*// (.+?:\d+): (.*)$")


def _explain(source: str, log: str) -> str:
    """NVRTC's log with, for the first error, the generated line and the .tile
    line it came from (the nearest `// file:line:` comment above it)."""
    lines = source.splitlines()
    m = _LOG_LINE.search(log)
    where = ""
    if m:
        n = int(m.group(1))
        gen = lines[n - 1].strip() if 0 < n <= len(lines) else ""
        origin = next((o for o in (_ORIGIN.match(lines[i]) for i in range(n - 1, -1, -1)) if o), None)
        where = f"\n  generated line {n}: {gen}"
        if origin:
            where += f"\n  from {origin.group(1)}: {origin.group(2)}"
    return f"NVRTC rejected the generated CUDA (a tilec bug; please report it):{where}\n{log.strip()}"
