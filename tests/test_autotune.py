"""Autotuning (tilec.compile(src, tune=..., key=...), tilec/autotune.py).

CPU tests: the timing function is replaced by a fake with a fixed fastest
candidate, and the launches by the interpreter on numpy arrays; NVRTC runs for
real (sm_90a compiles without a GPU). GPU tests (marked gpu): gemm.tile over 16
candidates at 4096^3 f16 against torch.matmul, with the cold and warm times."""
import io
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import tilec
from tilec import autotune
from tilec import kernel as kernel_mod
from tilec.compiler import load_source
from tilec.runtime import cache, nvrtc
from conftest import ROOT, python_c

ACC = """
kernel acc(X: f32[M, N], Y: f32[M, N], alpha: f32) {
    const BM = 32, BN = 64;
    grid (bx, by) = (cdiv(N, BN), cdiv(M, BM));
    threads 128;
    shared s: f32[BM, BN];
    shared t: f32[BM, BN];
    copy(X[by * BM, bx * BN], s);
    copy(Y[by * BM, bx * BN], t);
    parallel (i, j) in (BM, BN) {
        t[i, j] = t[i, j] + s[i, j] * alpha;
    }
    copy(t, Y[by * BM, bx * BN]);
}
"""
# BN=4096 breaks the TMA box limit (256): refused by the compiler
SPACE = {"BM": (16, 32), "BN": (64, 4096, 128)}
FASTEST = {"BM": 32, "BN": 128}


def fake_times(cfg):
    return 1e-3 if cfg == FASTEST else 2e-3 + 1e-5 * cfg["BM"] + 1e-6 * cfg["BN"]


def interpret_run(kernel, args, stream=None):
    """A candidate's launch, by the CPU interpreter with the same consts."""
    tilec.compile(kernel.source, backend="interpret", arch=kernel.arch, **kernel._overrides)(*args)


class Env:
    def __init__(self, monkeypatch, tmp_path):
        self.timed, self.compiled, self.nvrtc = [], [], 0
        monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("TILEC_AUTOTUNE", raising=False)
        monkeypatch.delenv("TILEC_CACHE", raising=False)
        self.clear()
        monkeypatch.setattr(autotune, "_can_time", lambda args: True)
        monkeypatch.setattr(autotune, "_device_name", lambda args: "Fake GPU")
        monkeypatch.setattr(autotune, "_run", interpret_run)

        def fake_time(kernel, args, stream):
            cfg = {k: kernel._overrides[k] for k in SPACE}
            self.timed.append(cfg)
            interpret_run(kernel, args)          # writes the outputs, as a real timing run does
            return fake_times(cfg)
        monkeypatch.setattr(autotune, "_time", fake_time)
        real_compile_one, real_nvrtc = autotune._compile_one, nvrtc.compile_cuda

        def compile_one(source, consts, *a):
            self.compiled.append(dict(consts))
            return real_compile_one(source, consts, *a)

        def counting_nvrtc(*a, **kw):
            self.nvrtc += 1
            return real_nvrtc(*a, **kw)
        monkeypatch.setattr(autotune, "_compile_one", compile_one)
        monkeypatch.setattr(nvrtc, "compile_cuda", counting_nvrtc)

    def clear(self):
        """A fresh process, as far as the caches go (the disk stays)."""
        kernel_mod._CACHE.clear()
        autotune._CHOICES.clear()

    def reset_counts(self):
        self.timed, self.compiled, self.nvrtc = [], [], 0


@pytest.fixture
def env(monkeypatch, tmp_path):
    e = Env(monkeypatch, tmp_path)
    yield e
    e.clear()


def arrays(m=40, n=100, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, n)).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)


def untuned(x, y, alpha):
    """What one call of the untuned kernel leaves in Y."""
    y = y.copy()
    tilec.compile(ACC, backend="interpret")(x, y, alpha)
    return y


def tuned():
    return tilec.compile(ACC, tune=SPACE, key=("M", "N"), arch="sm_90a")


# ------------------------------------------------------------------ CPU

def test_tunes_every_candidate_and_keeps_the_fastest(env):
    k = tuned()
    x, y = arrays()
    want = untuned(x, y, 0.5)
    assert k(x, y, 0.5) is None
    assert len(env.compiled) == 6                               # the whole space
    assert env.nvrtc == 4                                       # two refused before NVRTC
    assert len(env.timed) == 4 and {"BM": 16, "BN": 4096} not in env.timed
    assert k.best_config == FASTEST
    assert k.kernel.consts["BM"] == 32 and k.consts["BN"] == 128     # attributes of the chosen kernel
    assert np.array_equal(y, want)            # the timing runs' writes were undone; the winner ran once
    report = k.tune_report()
    assert report.count("refused") == 2 and "TMA boxes are at most 256" in report
    assert re.search(r"BM=32 BN=128: 1\.0000 ms  <- chosen", report)


def test_the_same_key_does_not_tune_again_a_new_one_does(env):
    k = tuned()
    x, y = arrays()
    k(x, y, 1.0)
    env.reset_counts()
    x2, y2 = arrays(seed=1)
    want = untuned(x2, y2, 2.0)
    k(x2, y2, 2.0)                            # same M, N (alpha is not in the key)
    assert env.timed == [] and env.compiled == [] and np.array_equal(y2, want)
    x3, y3 = arrays(m=24, n=100)
    k(x3, y3, 1.0)                            # a new M: tuned again
    assert len(env.timed) == 4 and len(env.compiled) == 6
    assert k.best_config == FASTEST


def test_a_scalar_key(env):
    k = tilec.compile(ACC, tune=SPACE, key="alpha", arch="sm_90a")
    x, y = arrays()
    k(x, y, 1.0)
    k(x, y, 1.0)
    assert len(env.timed) == 4
    k(x, y, 3.0)
    assert len(env.timed) == 8


def test_the_choice_is_read_from_disk_compiling_only_the_winner(env):
    x, y = arrays()
    tuned()(x, y, 1.0)
    env.clear()
    env.reset_counts()
    k = tuned()
    want = untuned(x, y, 1.0)
    t = time.perf_counter()
    k(x, y, 1.0)
    assert env.timed == [] and env.compiled == [FASTEST] and env.nvrtc == 0     # the winner's cubin is on disk too
    assert k.best_config == FASTEST and np.array_equal(y, want)
    assert "<- chosen" in k.tune_report()
    assert time.perf_counter() - t < 5     # (mostly the interpreter's run)


def test_the_choice_is_read_from_disk_by_another_process(env, tmp_path):
    x, y = arrays()
    tuned()(x, y, 1.0)
    code = f"""
import numpy as np, tilec
from tilec import autotune
from tilec.runtime import nvrtc
calls = []
autotune._can_time = lambda args: True
autotune._device_name = lambda args: "Fake GPU"
autotune._time = lambda *a: calls.append("time")
autotune._run = lambda *a: None
real = nvrtc.compile_cuda
nvrtc.compile_cuda = lambda *a, **kw: calls.append("nvrtc") or real(*a, **kw)
k = tilec.compile({ACC!r}, tune={SPACE!r}, key=("M", "N"), arch="sm_90a")
k(np.zeros((40, 100), np.float32), np.zeros((40, 100), np.float32), 1.0)
print(k.best_config, calls)
"""
    out = subprocess.run(python_c(code), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'BM': 32, 'BN': 128} []"


def test_another_device_name_tunes_again(env, monkeypatch):
    x, y = arrays()
    tuned()(x, y, 1.0)
    env.clear()
    env.reset_counts()
    monkeypatch.setattr(autotune, "_device_name", lambda args: "Another GPU")
    tuned()(x, y, 1.0)
    assert len(env.timed) == 4


def test_autotune_off_takes_the_first_candidate_that_compiles(env, monkeypatch, tmp_path):
    monkeypatch.setenv("TILEC_AUTOTUNE", "0")
    k = tilec.compile(ACC, tune={"BN": (4096, 64, 128)}, key=("M", "N"), arch="sm_90a")
    x, y = arrays()
    want = untuned(x, y, 1.0)
    k(x, y, 1.0)
    assert env.timed == [] and k.best_config == {"BN": 64} and env.nvrtc == 1
    assert np.array_equal(y, want)
    assert "TILEC_AUTOTUNE=0" in k.tune_report() and "refused" in k.tune_report()
    assert not list((tmp_path / "cache").rglob("*.tilec")) or all(
        cache.load(p.stem)[0].get("best") is None for p in (tmp_path / "cache").rglob("*.tilec"))


def test_arguments_that_cannot_be_timed_take_the_first_candidate(env, monkeypatch):
    monkeypatch.setattr(autotune, "_can_time", lambda args: False)     # e.g. numpy arrays
    k = tuned()
    x, y = arrays()
    k(x, y, 1.0)
    assert env.timed == [] and k.best_config == {"BM": 16, "BN": 64}


def test_no_candidate_compiles_raises_the_first_error(env):
    k = tilec.compile(ACC, tune={"BN": (4096, 8192)}, key=("M", "N"), arch="sm_90a")
    with pytest.raises(tilec.SemanticError, match="is 4096; TMA boxes are at most 256"):
        k(*arrays(), 1.0)


def test_tuning_inside_a_capture_is_refused(env, monkeypatch):
    k = tuned()
    x, y = arrays()
    monkeypatch.setattr(kernel_mod, "_capturing", lambda: True)
    with pytest.raises(tilec.CaptureError, match="Tune before capturing"):
        k(x, y, 1.0)
    assert env.compiled == []
    monkeypatch.setattr(kernel_mod, "_capturing", lambda: False)
    k(x, y, 1.0)
    monkeypatch.setattr(kernel_mod, "_capturing", lambda: True)
    env.reset_counts()
    k(x, y, 1.0)                              # a tuned key: the chosen kernel's own call (its replay)
    assert env.compiled == []


class Tty(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_progress_only_on_a_terminal(env, monkeypatch, tty):
    err = Tty(tty)
    monkeypatch.setattr(sys, "stderr", err)
    tuned()(*arrays(), 1.0)
    if tty:
        text = err.getvalue()
        assert "\rtilec autotune acc [" in text and "6/12 compiling" in text and "10/10 timing" in text
        assert text.endswith("tilec autotune acc: BM=32 BN=128 (1.0000 ms; 4 timed, 2 refused)\x1b[K\n")
    else:
        assert err.getvalue() == ""


def test_interpreter_backend_takes_the_first_candidate_that_compiles():
    k = tilec.compile(ACC, backend="interpret", tune={"BN": (4096, 128, 64)}, key=("M",))
    assert k.consts["BN"] == 128
    x, y = arrays()
    want = untuned(x, y, 1.0)
    k(x, y, 1.0)
    assert np.array_equal(y, want)


def test_bad_tune_and_key_arguments():
    with pytest.raises(tilec.TilecError, match="neither a shape symbol nor a scalar"):
        tilec.compile(ACC, tune=SPACE, key=("K",), arch="sm_90a")
    with pytest.raises(tilec.TilecError, match="non-empty tuple"):
        tilec.compile(ACC, tune={"BM": ()}, arch="sm_90a")
    with pytest.raises(tilec.TilecError, match="non-empty dict"):
        tilec.compile(ACC, tune={}, arch="sm_90a")


def test_a_const_both_tuned_and_given_is_refused(env):
    k = tilec.compile(ACC, tune=SPACE, key=("M",), arch="sm_90a", BM=16)
    with pytest.raises(tilec.TilecError, match="BM both tuned and given"):
        k(*arrays(), 1.0)


def test_signature_without_the_parser_matches_the_parser():
    from tilec.frontend import parse
    from tilec.ir import nodes as ir
    for path in sorted((ROOT / "examples").glob("*.tile")):
        src = load_source(str(path))
        want = [(p.name, [d.name if isinstance(d, ir.Var) else None for d in p.shape]
                 if isinstance(p, ir.TensorParam) else None) for p in parse(src).params]
        assert autotune.signature(src) == want, path


def test_readme_snippet(env, monkeypatch):
    """The README's autotuning lines, on small numpy arrays through the fakes."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Autotuning"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(ROOT)
    times = {}

    def fake_time(kernel, args, stream):
        cfg = (kernel.consts["BN"], kernel.consts["STAGES"])
        times[cfg] = 1e-3 / (cfg[0] + cfg[1])
        return times[cfg]
    monkeypatch.setattr(autotune, "_time", fake_time)
    monkeypatch.setattr(autotune, "_run", lambda *a: None)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 64)).astype(np.float16)
    b = rng.standard_normal((64, 256)).astype(np.float16)
    c = np.zeros((128, 256), np.float16)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    exec(snippet, {"tilec": tilec, "a": a, "b": b, "c": c})
    assert len(times) == 4
    assert out.getvalue().strip() == "{'BN': 256, 'STAGES': 4}"


# ------------------------------------------------------------------ GPU

GEMM_SPACE = {"BN": (64, 128, 192, 256), "STAGES": (2, 3, 4, 5)}      # 16 candidates; BN=256 with 5 stages is refused


@pytest.mark.gpu
def test_gpu_gemm_tuned_over_16_candidates(monkeypatch, tmp_path, capsys):
    import torch
    from guard import guarded
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEC_AUTOTUNE", raising=False)
    kernel_mod._CACHE.clear()
    autotune._CHOICES.clear()
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    c = guarded((n, n), "f16", fill=float("nan"))
    path = str(ROOT / "examples/gemm.tile")
    torch.cuda.synchronize()
    t = time.perf_counter()
    k = tilec.compile(path, tune=GEMM_SPACE, key=("M", "N", "K"))
    k(a, b, c.view)
    torch.cuda.synchronize()
    cold = time.perf_counter() - t
    want = a.float() @ b.float()
    err = ((c.view.float() - want).norm() / want.norm()).item()
    assert err < 2e-3, f"relative error {err:.2e}"
    c.check()
    report = k.tune_report()
    assert report.count(" ms") == 15 and report.count("refused") == 1, report
    assert set(k.best_config) == {"BN", "STAGES"}
    kernel_mod._CACHE.clear()
    autotune._CHOICES.clear()
    t = time.perf_counter()
    k2 = tilec.compile(path, tune=GEMM_SPACE, key=("M", "N", "K"))
    choose = k2._choose(k2._read_key((a, b, c.view)), (a, b, c.view), None)
    warm = time.perf_counter() - t
    assert choose[2] is False and choose[1] == k.best_config and choose[0].from_disk_cache
    c2 = guarded((n, n), "f16", fill=float("nan"))
    k2(a, b, c2.view)
    torch.cuda.synchronize()
    assert torch.equal(c2.view, c.view)
    c2.check()
    with capsys.disabled():
        print(f"\nautotune gemm 16 candidates at 4096^3 f16: cold {cold:.2f} s (compile + timing), "
              f"warm from disk {warm * 1e3:.2f} ms (choice + winner's cubin); chosen {k.best_config}\n{report}")
    assert cold < 30


@pytest.mark.gpu
def test_gpu_tuning_restores_an_in_place_output(monkeypatch, tmp_path):
    """Y += alpha * X: after tuning (many timing runs), Y equals one untuned call's."""
    import torch
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
    kernel_mod._CACHE.clear()
    autotune._CHOICES.clear()
    x = torch.randn(1000, 1000, device="cuda")
    y = torch.randn(1000, 1000, device="cuda")
    want = y + 0.5 * x
    k = tilec.compile(ACC, tune={"BM": (16, 32), "BN": (64, 128, 4096)}, key=("M", "N"))
    k(x, y, 0.5)
    torch.cuda.synchronize()
    assert torch.allclose(y, want, atol=1e-5, rtol=1e-5)
    assert k.tune_report().count("refused") == 2
