"""Debug builds: bounded mbarrier waits that report instead of hanging."""
import os
import subprocess
import time

import pytest

import tilec
from tilec.compiler import lower
from conftest import ROOT, python_c
from guard import guarded


def test_debug_build_bounds_every_wait():
    k = tilec.compile(ROOT / "examples/scale.tile", debug=True)
    assert "mbarrier_wait_bounded(&tl_bar0, 0, tl_debug, 0, 32768, 8);" in k.cuda_source
    assert "mbarrier_wait(&tl_bar0" not in k.cuda_source.split("extern \"C\"")[1]
    assert "call.debug_record()" in k.host_source
    plain = tilec.compile(ROOT / "examples/scale.tile")
    assert "bounded" not in plain.cuda_source and "debug" not in plain.host_source


def test_expect_tx_skew_hook_changes_only_the_byte_count(monkeypatch):
    monkeypatch.setenv("TILEC_TEST_EXPECT_TX_SKEW", "16")
    text = lower(ROOT / "examples/copy2d.tile").ir_text("insert-barriers")
    assert "mbarrier.arrive.expect_tx bar0, 32784 bytes" in text
    assert "bytes 32768" in text


HANG = """
import os, sys, time, torch, tilec
k = tilec.compile("examples/copy2d.tile", debug=True)
a = torch.randn(256, 512, device="cuda"); b = torch.empty_like(a)
t = time.time()
try:
    k(a, b)
except tilec.DeviceError as e:
    print("RAISED", round(time.time() - t, 1), e)
    sys.exit(0)
print("NO ERROR")
sys.exit(1)
"""


@pytest.mark.gpu
def test_wrong_expect_tx_raises_naming_barrier_and_line_instead_of_hanging():
    env = dict(os.environ, TILEC_TEST_EXPECT_TX_SKEW="16", TILEC_CACHE="0")
    t = time.time()
    p = subprocess.run(python_c(HANG), cwd=ROOT, env=env, capture_output=True, text=True, timeout=90)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "RAISED" in out and "mbarrier bar0" in out and "expect-tx 32784 bytes" in out, out
    assert "examples/copy2d.tile:9" in out, out
    assert time.time() - t < 60


@pytest.mark.gpu
def test_debug_build_runs_correct_kernels_unchanged():
    import torch
    k = tilec.compile(ROOT / "examples/scale.tile", debug=True)
    x = torch.randn(300, 1000, device="cuda")
    y = guarded(x.shape, x.dtype)
    k(x, y.view, 3.0)
    torch.testing.assert_close(y.view, x * 3 + 1)
    y.check()
