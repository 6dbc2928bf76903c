"""The packaged tilec: a wheel built from this checkout holds the grammar, the
templates and the examples, and tilec installed from it (not editable) compiles
(marked slow: a wheel build and an install, about 7 s)."""
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow

DATA = {"grammar": "*.lark", "templates": "*.j2", "examples": "*.tile"}


def run(*argv, **kw):
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, **kw)
    assert p.returncode == 0, f"$ {' '.join(map(str, argv))}\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    # built from a copy, so that no build/ or egg-info lands in the checkout
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    for name in ("tilec", *DATA):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, src)
    (whl,) = out.glob("tilec-*.whl")
    return whl


def test_wheel_holds_grammar_templates_and_examples(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for d, pattern in DATA.items():
        files = {f"tilec/{d}/{p.name}" for p in (ROOT / d).glob(pattern)}
        assert files and files <= names, (d, sorted(files - names))


def test_wheel_holds_every_module(wheel):
    """A subpackage missing from pyproject.toml's `packages` is left out of the
    wheel, though an editable install still finds it."""
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tilec").rglob("*.py")}
    assert modules <= names, sorted(modules - names)


def test_installed_wheel_emits_cuda(wheel, tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    py = env / "bin" / "python"
    site = run(py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip()
    # tilec's dependencies: those of the environment running these tests
    deps = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    Path(site, "deps.pth").write_text("".join(f"{d}\n" for d in deps))
    # --ignore-installed: a tilec among those deps is neither kept nor uninstalled
    run(sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-deps", "--ignore-installed", wheel)

    where = run(py, "-c", "import tilec; print(tilec.__file__)", cwd=tmp_path)
    assert where.startswith(site), where
    # cuda.pathfinder looks for NVRTC's wheel in the running venv's own site-packages
    # only, not in deps.pth's: name this environment's as the CUDA root
    environ = dict(os.environ)
    for lib in Path(sysconfig.get_path("platlib"), "nvidia").glob("cu*/lib/libnvrtc.so*"):
        environ["CUDA_PATH"] = str(lib.parent.parent)
    cuda = run(env / "bin" / "tilec", "emit", "examples/copy2d.tile", "--emit", "cuda", cwd=ROOT, env=environ)
    assert 'extern "C" __global__ void __launch_bounds__(128) copy2d(' in cuda
    # outside the checkout, the documented example paths are the packaged examples (README, Installing)
    checked = run(env / "bin" / "tilec", "check", "examples/copy2d.tile", cwd=tmp_path, env=environ)
    assert checked == "examples/copy2d.tile: ok (kernel copy2d, 9408-byte cubin for sm_90a)\n"
    # the deploy path: the export templates are in the wheel, and a named export of a fixed program
    written = run(env / "bin" / "tilec", "export", "examples/conv2d.tile", "-o", "build", "-D", "C=24", "--name",
                  "conv2d_c24", cwd=tmp_path, env=environ)
    assert written.split() == [f"build/conv2d_c24.{e}" for e in ("h", "cc", "cubin", "thread_copy.cubin")]
    assert "int tilec_conv2d_c24(" in (tmp_path / "build" / "conv2d_c24.h").read_text()
