import os
import sys
from pathlib import Path

import pytest

import tilec

ROOT = Path(__file__).resolve().parent.parent
# The directory the tilec under test was imported from: the checkout (editable or
# bare), or site-packages for an installed tilec (.ci/run, TILEC_TEST_INSTALLED=1).
TILEC_HOME = Path(tilec.__file__).resolve().parent.parent


def python_c(code: str) -> list:
    """The argv of a Python subprocess running `code` with the same tilec as these
    tests, whatever its cwd: its sys.path[0] (the cwd, for -c) becomes TILEC_HOME,
    so a checkout's tilec/ in the cwd cannot shadow an installed tilec."""
    return [sys.executable, "-c", f"import sys; sys.path[0] = {str(TILEC_HOME)!r}\n{code}"]


def compile_error(src: str, edits=(), **consts) -> str:
    """The SemanticError message of compiling `src` for sm_90a after replacing each
    (old, new) of `edits` (each old must be there: an edit that no longer applies
    fails the test, not the rule it was written to break)."""
    for old, new in edits:
        assert old in src, old
        src = src.replace(old, new)
    with pytest.raises(tilec.SemanticError) as e:
        tilec.compile(src, arch="sm_90a", **consts)
    return str(e.value)


# `python -m tilec`, run by python_c's rule.
TILEC = python_c("import runpy; runpy.run_module('tilec', run_name='__main__', alter_sys=True)")


def pytest_configure(config):
    if os.environ.get("TILEC_TEST_INSTALLED") == "1" and (
            TILEC_HOME.is_relative_to(ROOT) or TILEC_HOME.name != "site-packages"):
        raise pytest.UsageError(f"TILEC_TEST_INSTALLED=1, but tilec was imported from {tilec.__file__}, "
                                "not from an installed package's site-packages")


def _gpu_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
    except Exception:
        return False


HAVE_GPU = _gpu_available()


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="needs a Hopper GPU and torch")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
