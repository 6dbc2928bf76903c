"""The host toolchain that builds an exported launcher (tilec export's .cc) into a
program: a C / C++ compiler, the driver API's cuda.h, and how to link libcuda.
Shared by tests/test_export.py and `benchmarks/bench.py host`; needs no pytest."""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

CXX = shutil.which("g++") or shutil.which("c++")
CC = shutil.which("gcc") or shutil.which("cc")


def cuda_include_dirs() -> list:
    """Directories holding the driver API's cuda.h: CUDA_HOME / CUDA_PATH, nvcc's
    toolkit, /usr/local/cuda, and NVIDIA's wheels."""
    candidates = [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for site in sys.path:
        candidates += sorted(Path(site).glob("nvidia/*/include")) if site and Path(site).is_dir() else []
    found = []
    for d in candidates:
        h = d / "cuda.h"
        if h.is_file() and "cuTensorMapEncodeTiled" in h.read_text(errors="replace") and d not in found:
            found.append(d)
    return found


CUDA_INCLUDE = next(iter(cuda_include_dirs()), None)


def libcuda_link_args() -> list:
    """How to link against the driver: the libcuda this process has loaded (torch
    loads it), else -lcuda from the toolkit's stubs or the system."""
    try:
        import torch
        torch.cuda.init()
    except Exception:
        pass
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if re.search(r"/libcuda\.so(\.\d+)*$", path):
                return [path]
    stubs = [inc.parent / "lib64" / "stubs" for inc in cuda_include_dirs()]
    return [f"-L{s}" for s in stubs if (s / "libcuda.so").exists()] + ["-lcuda"]
