"""Autotuning (tilec.compile(src, tune=..., key=...), a program's `tune`
statement, tilec/autotune.py).

CPU tests: the timing function is replaced by a fake with a fixed fastest
candidate, and the launches by the interpreter on numpy arrays; NVRTC runs for
real (sm_90a compiles without a GPU). The tune statement: its candidates,
default, key, pinned consts, errors, the regular-expression reader against the
parser, the disk key, `tilec check` and `tilec emit`. GPU tests (marked gpu):
gemm.tile tuned by its own statement at 4096^3 f16 (the 48 of its 3264
candidates that its where condition keeps) against torch.matmul, with the cold and warm times; every candidate of gemm.tile's and
conv2d.tile's statements against torch, outputs guarded (tests/guard.py)."""
import io
import os
import re
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import tilec
from tilec import autotune
from tilec import kernel as kernel_mod
from tilec.compiler import load_source
from tilec.errors import Source
from tilec.ir import nodes as ir
from tilec.runtime import cache, nvrtc
from conftest import ROOT, TILEC, python_c
from test_rotate import ksum

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
        monkeypatch.setenv("TILEC_COMPILE_WORKERS", "0")      # in this process, where compiles are counted
        self.clear()
        monkeypatch.setattr(autotune, "_can_time", lambda args: True)
        monkeypatch.setattr(autotune, "TIMING_ROUNDS", 1)     # one fake timing per candidate (and run-off)
        monkeypatch.setattr(autotune, "_device_name", lambda args: "Fake GPU")
        monkeypatch.setattr(autotune, "_run", interpret_run)

        def fake_time(kernel, args, stream, flush=None):
            cfg = {k: kernel.consts[k] for k in SPACE}
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

def test_candidates_are_timed_in_rounds(env, monkeypatch):
    """Each round launches every candidate once, every other round in reverse
    order, so drift over the tuning hits them alike; a candidate's time is the
    median of its rounds (no cuts here: the slower candidates take 1000 times as long)."""
    monkeypatch.setattr(autotune, "TIMING_ROUNDS", 3)
    monkeypatch.setattr(autotune, "RUNOFF_WITHIN", 0.0)
    monkeypatch.setattr(autotune, "PRUNE", ())
    monkeypatch.setattr(sys.modules[__name__], "fake_times",
                        lambda cfg: 1e-3 * (1 + len(env.timed)) if cfg == FASTEST else 1.0)
    k = tuned()
    x, y = arrays()
    k(x, y, 0.5)
    order = [(c["BM"], c["BN"]) for c in env.timed]
    first = order[:4]
    assert sorted(first) == [(16, 64), (16, 128), (32, 64), (32, 128)]
    assert order == first + first[::-1] + first
    assert k.best_config == FASTEST
    at = [n + 2 for n, c in enumerate(order) if c == (32, 128)]      # call n (from 0) took 1e-3 * (n + 2)
    assert f"BM=32 BN=128: {1e-3 * sorted(at)[1] * 1e3:.4f} ms  <- chosen" in k.tune_report()


def test_close_candidates_are_timed_again_in_turns(env, monkeypatch):
    """Candidates within 3% of the fastest first time are timed again in bursts
    (RUNOFF_ROUNDS rounds, in turns, of RUNOFF_BURST launches, the last
    RUNOFF_KEEP of each counting) and the fastest of them by those times wins:
    one lucky first timing (BM=16 BN=64 here) does not; the rest are timed
    once; the outputs are restored; the report marks the finalists."""
    first = {}

    def drifting(cfg):
        key = (cfg["BM"], cfg["BN"])
        if key not in first:
            first[key] = True
            return {(16, 64): 0.990e-3, (32, 128): 1.000e-3, (16, 128): 1.015e-3}.get(key, 2e-3)
        return {(16, 64): 1.050e-3, (32, 128): 1.001e-3, (16, 128): 1.010e-3}[key]
    monkeypatch.setattr(sys.modules[__name__], "fake_times", drifting)
    k = tuned()
    x, y = arrays()
    want = untuned(x, y, 0.5)
    k(x, y, 0.5)
    assert k.best_config == {"BM": 32, "BN": 128}
    counts = {c: sum(t == dict(zip(("BM", "BN"), c)) for t in env.timed) for c in ((16, 64), (32, 128), (16, 128),
                                                                                   (32, 64))}
    again = 1 + autotune.RUNOFF_ROUNDS * autotune.RUNOFF_BURST
    assert counts == {(16, 64): again, (32, 128): again, (16, 128): again, (32, 64): 1}
    assert np.array_equal(y, want)
    report = k.tune_report()
    assert "BM=32 BN=128: 1.0010 ms (run-off)  <- chosen" in report
    assert "BM=16 BN=64: 1.0500 ms (run-off)\n" in report and "BM=32 BN=64: 2.0000 ms\n" in report


def test_the_run_off_times_finalists_after_launches_of_their_own(env, monkeypatch):
    """A candidate whose launch right after another candidate's is fastest (BM=16 BN=64:
    1.000 ms then, 1.050 ms after its own) loses the run-off to one that is faster after
    its own launches (BM=32 BN=128: 1.010, then 1.000): only the last RUNOFF_KEEP launches
    of each burst count."""
    last = [None]

    def contextual(cfg):
        key = (cfg["BM"], cfg["BN"])
        after_own, last[0] = last[0] == key, key
        return {(16, 64): (1.000e-3, 1.050e-3), (32, 128): (1.010e-3, 1.000e-3)}.get(key, (2e-3, 2e-3))[after_own]
    monkeypatch.setattr(autotune, "TIMING_ROUNDS", 3)
    monkeypatch.setattr(sys.modules[__name__], "fake_times", contextual)
    k = tuned()
    x, y = arrays()
    k(x, y, 0.5)
    assert k.best_config == {"BM": 32, "BN": 128}
    assert "BM=32 BN=128: 1.0000 ms (run-off)  <- chosen" in k.tune_report()


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


SCALED = ACC.replace("s[i, j] * alpha;", "s[i, j] * alpha * W;").replace("const BM = 32, BN = 64;",
                                                                            "const BM = 32, BN = 64, W = 1;")


def test_a_candidate_with_other_outputs_is_not_chosen(env, monkeypatch):
    """A candidate whose outputs after its warm-up launch differ from the first
    candidate's (here a tuned W that changes what the kernel computes; in a real
    tune, a compiler bug) is not timed or chosen, however fast, and the tune says so:
    a TuneMismatchWarning, and `not chosen` in the report."""
    space = {"BM": (16, 32), "W": (1, 2)}
    monkeypatch.setattr(sys.modules[__name__], "SPACE", space)
    monkeypatch.setattr(sys.modules[__name__], "fake_times", lambda cfg: 1e-3 if cfg["W"] == 2 else 2e-3 - cfg["BM"] * 1e-5)
    k = tilec.compile(SCALED, tune=space, key=("M", "N"), arch="sm_90a")
    x, y = arrays()
    want = untuned(x, y, 0.5)
    with pytest.warns(tilec.TuneMismatchWarning) as caught:
        k(x, y, 0.5)
    assert len(caught) == 1
    assert str(caught[0].message).startswith(
        "autotune acc at M=40 N=100: 2 candidates computed other outputs than BM=16 W=1, the first that ran, and were "
        "not chosen (BM=16 W=2: output Y differs at ")
    assert k.best_config == {"BM": 32, "W": 1}
    assert np.array_equal(y, want)
    assert {(c["BM"], c["W"]) for c in env.timed} == {(16, 1), (32, 1)}
    report = k.tune_report()
    assert re.search(r"BM=32 W=2: not chosen: output Y differs at \d+ of 4000 elements \(the largest difference "
                     r"[0-9.e-]+, [0-9.e-]+ allowed\) from BM=16 W=1's", report), report


def test_a_candidate_the_driver_refuses_is_skipped_with_a_warning(env, monkeypatch):
    """A candidate the compiler accepted whose launch the driver refuses (a DeviceError,
    as 48 KiB of tiles beside an mbarrier once did) is a tilec bug: the tune skips it
    and says so, a TuneLaunchWarning naming it (an error in the test suite, pyproject);
    a launch refused for the call's shape (a LaunchError) is skipped quietly."""
    def run(kernel, args, stream=None):
        if kernel.consts["BM"] == 32 and kernel.consts["BN"] == 128:
            raise tilec.DeviceError("launching acc failed: CUDA_ERROR_INVALID_VALUE")
        if kernel.consts["BM"] == 16 and kernel.consts["BN"] == 128:
            raise tilec.LaunchError("a grid too big for this shape")
        interpret_run(kernel, args)
    monkeypatch.setattr(autotune, "_run", run)
    k = tilec.compile(ACC, tune=SPACE, key=("M", "N"), arch="sm_90a")
    x, y = arrays()
    want = untuned(x, y, 0.5)
    with pytest.warns(tilec.TuneLaunchWarning) as caught:
        k(x, y, 0.5)
    assert [str(w.message) for w in caught] == [
        "autotune acc at M=40 N=100: 1 candidate the compiler accepted failed to launch and was skipped (BM=32 BN=128: "
        "error: launching acc failed: CUDA_ERROR_INVALID_VALUE); this is a bug in tilec; k.tune_report() lists them"]
    assert k.best_config not in ({"BM": 32, "BN": 128}, {"BM": 16, "BN": 128})
    assert np.array_equal(y, want)
    assert "BM=32 BN=128: refused: error: launching acc failed" in k.tune_report()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_candidates_outputs_agree_within_the_order_of_sums(dtype):
    """_Reference.mismatch: a float output may differ from the reference by MISMATCH_ULPS ulps of
    its largest value (never below MISMATCH_FLOOR of it); one element further off, a
    NaN where the reference has none, an infinity of the other sign, is a mismatch."""
    dt = np.dtype(dtype) if dtype != "bfloat16" else pytest.importorskip("ml_dtypes").bfloat16
    ref = np.linspace(-8, 8, 4001).astype(dt)
    sig = (("C", ("N",)),)
    allowed = 8 * max(autotune.MISMATCH_ULPS * autotune._EPS[dtype], autotune.MISMATCH_FLOOR)

    def mismatch(out):
        return autotune._Reference(0, [ref], [0]).mismatch([out], sig)
    assert mismatch(ref.copy()) is None
    near = ref.astype(np.float64)
    near[::3] += allowed * 0.5                 # and rounded to dtype: less than half an ulp of 8 more
    assert mismatch(near.astype(dt)) is None
    for change, count in [((7, ref[7].astype(np.float64) + allowed * 3), 1), ((7, np.nan), 1),
                          ((slice(0, 10), 0.0), 10)]:                   # nothing written: zeros
        out = ref.copy()
        out[change[0]] = change[1]
        why = mismatch(out)
        assert why is not None and why.startswith(f"output C differs at {count} of 4001 elements"), why
    inf_ref = ref.copy()
    inf_ref[5] = np.inf
    out = inf_ref.copy()
    assert autotune._Reference(0, [inf_ref], [0]).mismatch([out], sig) is None
    out[5] = -np.inf
    assert autotune._Reference(0, [inf_ref], [0]).mismatch([out], sig).startswith("output C differs at 1 of 4001 elements")


def test_fp8_gemms_are_compared_more_loosely():
    """Tensor cores keep ~14 bits when they add 8-bit products (benchmarks/NOTES.md session
    35): the reference of a kernel with an fp8 wgmma allows MISMATCH_ULPS_F8 ulps, others
    MISMATCH_ULPS; a tile of zeros is off either way."""
    f8 = tilec.compile(ROOT / "examples" / "gemm_f8.tile", arch="sm_90a").cuda_source
    f16 = tilec.compile(ROOT / "examples" / "gemm.tile", arch="sm_90a").cuda_source
    assert autotune._F8_MMA.search(f8) and not autotune._F8_MMA.search(f16)
    ref = np.linspace(-300, 300, 4001).astype(np.float16)
    sig = (("C", ("N",)),)
    off = ref.astype(np.float64)
    off[100] += 2.0                            # 4 ulps of f16 at 300 allow 1.17, 16 allow 4.69
    for ulps, want in [(autotune.MISMATCH_ULPS, False), (autotune.MISMATCH_ULPS_F8, True)]:
        ok = autotune._Reference(0, [ref], [0], ulps).mismatch([off.astype(np.float16)], sig) is None
        assert ok == want, ulps
    zeros = ref.copy()
    zeros[:64] = 0
    assert autotune._Reference(0, [ref], [0], autotune.MISMATCH_ULPS_F8).mismatch([zeros], sig) is not None


def test_outputs_are_compared_in_slices_of_rows(monkeypatch):
    """Large outputs are compared a few rows at a time (MISMATCH_CHUNK elements): the
    same counts, the largest value and difference over all slices."""
    monkeypatch.setattr(autotune, "MISMATCH_CHUNK", 25)          # 2 rows of 12 a slice
    ref = np.arange(96, dtype=np.float32).reshape(8, 12) - 40.0   # largest magnitude 55, in the last slice
    out = ref.copy()
    out[0, 0] += 0.005                                           # within 55 * 2^-13 = 0.0067
    out[1, 3] += 1.0
    out[6, 11] -= 2.5
    assert list(autotune._chunks(out, ref))[3][0].shape == (2, 12)
    assert autotune._Reference(0, [ref], [0]).mismatch([out], (("C", ("M", "N")),)) == \
        "output C differs at 2 of 96 elements (the largest difference 2.5, 0.006714 allowed) from"


def test_integer_outputs_agree_exactly():
    ref = np.arange(100, dtype=np.int32)
    out = ref.copy()
    reference = autotune._Reference(0, [ref], [0])
    assert reference.mismatch([out], (("Y", ("N",)),)) is None
    out[3] += 1
    assert reference.mismatch([out], (("Y", ("N",)),)) == "output Y differs at 1 of 100 elements from"


# a rotating pipeline whose 64 KiB tile fits 3 copies in shared memory, not 4 (S = 4 runs plain)
ROTATING = ksum("S").replace("const BM = 8, BN = 32;", "const BM = 128, BN = 128, S = 3;")


@pytest.mark.parametrize("fastest", [3, 4])
def test_a_plain_pipelined_loop_is_said_of_the_chosen_candidate_only(env, monkeypatch, fastest):
    """tilec.PipelineWarning comes from the candidate the tune chooses (stages = 4 does
    not fit, so its loop runs plain), not from the others it compiled and timed."""
    monkeypatch.setattr(autotune, "_time", lambda kernel, args, stream, flush=None:
                        1e-3 if kernel.consts["S"] == fastest else 2e-3)
    monkeypatch.setattr(autotune, "_run", lambda kernel, args, stream=None: None)
    k = tilec.compile(ROTATING, tune={"S": (3, 4)}, key=("K",), arch="sm_90a")
    a, y = np.zeros((2, 128, 128), np.float32), np.zeros((128, 128), np.float32)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        k(a, y)
    plain = [str(w.message) for w in said if issubclass(w.category, tilec.PipelineWarning)]
    assert k.best_config == {"S": fastest}
    assert plain == ([] if fastest == 3 else [
        "<string>:9:5: this pipelined loop (stages = 4) runs as a plain loop: the stages' copies of the tiles it "
        "loads do not fit in shared memory (shared tiles need 262144 bytes, and 1024 more for 1 mbarrier (static "
        "shared memory counts in 1024-byte steps); a Hopper block has at most 232448 bytes of shared memory)"]), plain
    assert k.kernel.pipeline_notes == tuple(plain)


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


def test_the_key_reader_fast_and_slow_paths():
    """A tuned kernel reads its key on every call: `.shape[d]` of each tensor read
    once when the values are ints, else through _shape (a __cuda_array_interface__
    object, numpy ints); the same values either way, and clean errors."""
    sig = (("A", ("M", "K")), ("alpha", None), ("B", ("K", None)))
    read = autotune.key_reader(sig, ("M", "alpha", "K"))
    a, b = np.zeros((3, 5)), np.zeros((5, 7))
    assert read((a, 2, b)) == (3, 2, 5) and read((a, 1.5, b)) == (3, 1.5, 5)

    class Interface:                                  # no .shape: the slow path
        __cuda_array_interface__ = {"shape": (4, 6), "typestr": "<f4", "data": (0, False), "version": 3}

    class NumpyDims:                                  # .shape of numpy ints: converted to int
        shape = (np.int64(8), np.int64(9))
    assert read((Interface(), 2, b)) == (4, 2, 6)
    kv = read((NumpyDims(), 2, b))
    assert kv == (8, 2, 9) and all(type(v) is int for v in kv[::2])
    assert autotune.key_reader(sig, ())((a, 2, b)) == ()
    with pytest.raises(tilec.TilecError, match=r"^error: argument A: 1 dims, the kernel declares 2 \(A\[M, K\]\)$"):
        read((np.zeros(3), 2, b))
    with pytest.raises(tilec.TilecError, match=r"the kernel takes 3 arguments \(A, alpha, B\), got 2"):
        read((a, 2))
    with pytest.raises(tilec.TilecError, match="cannot read the shape of a object argument"):
        read((object(), 2, b))
    with pytest.raises(tilec.TilecError, match="autotune key 'N' is neither a shape symbol nor a scalar"):
        autotune.key_reader(sig, ("N",))


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


def test_tune_l2_cold_flushes_before_every_timed_launch_and_is_a_choice_of_its_own(env, monkeypatch):
    """tune_l2="cold": every timed launch (rounds and run-off) gets the flush buffer,
    the report says so, and its choice is kept apart from the default's, in memory
    and on disk: a cold tune after a warm one of the same key tunes again."""
    flushes = []
    fake_time = autotune._time

    def recording(kernel, args, stream, flush=None):
        flushes.append(flush)
        return fake_time(kernel, args, stream, flush)
    monkeypatch.setattr(autotune, "_time", recording)
    monkeypatch.setattr(autotune, "_l2_flush_buffer", lambda args: "the flush buffer")
    x, y = arrays()
    warm = tuned()
    warm(x, y, 1.0)
    assert set(flushes) == {None} and "tune_l2" not in warm.tune_report()
    flushes.clear()
    env.reset_counts()
    cold = tilec.compile(ACC, tune=SPACE, key=("M", "N"), arch="sm_90a", tune_l2="cold")
    assert cold is not warm and cold is tilec.compile(ACC, tune=SPACE, key=("M", "N"), arch="sm_90a",
                                                       tune_l2="cold")
    cold(x, y, 1.0)
    assert len(env.timed) == 4 and flushes == ["the flush buffer"] * 4
    assert cold.tune_report().startswith("autotune acc key {'M': 40, 'N': 100} (tune_l2=\"cold\": the L2 flushed "
                                         "before each timed launch):")
    assert "tune_l2=cold" in repr(cold) and "tune_l2" not in repr(warm)
    env.clear()
    env.reset_counts()
    tilec.compile(ACC, tune=SPACE, key=("M", "N"), arch="sm_90a", tune_l2="cold")(x, y, 1.0)
    assert env.timed == []          # read from the disk, as its own choice


def test_tune_l2_is_warm_or_cold_and_goes_with_tuning():
    with pytest.raises(tilec.TilecError, match=r"tune_l2= is \"warm\" .* or \"cold\" .*, got 'hot'"):
        tilec.compile(ACC, tune=SPACE, arch="sm_90a", tune_l2="hot")
    with pytest.raises(tilec.TilecError, match="tune_l2='cold' goes with tuning, and tune=False tunes nothing"):
        tilec.compile(ACC, tune=False, arch="sm_90a", tune_l2="cold")
    with pytest.raises(tilec.TilecError, match=r"tune_l2='cold' goes with tuning: give tune= \(or compile a "
                       r"program with a tune statement\)"):
        tilec.compile(ACC, arch="sm_90a", tune_l2="cold")
    assert isinstance(tilec.compile(ACC, arch="sm_90a", tune_l2="warm"), tilec.Kernel)


@pytest.mark.parametrize("backend", ["cuda", "interpret"])
def test_a_const_both_tuned_and_given_is_refused_by_compile(backend):
    with pytest.raises(tilec.TilecError, match="^error: BM both tuned and given as a const$"):
        tilec.compile(ACC, tune=SPACE, key=("M",), arch="sm_90a", backend=backend, BM=16)


@pytest.mark.parametrize("backend", ["cuda", "interpret"])
@pytest.mark.parametrize("kwargs, message", [
    ({"tune": {"BN": 64}}, r"tune\['BN'\]: a non-empty tuple of values, e.g. {'BN': \(64, 128\)}, got 64"),
    ({"tune": {"BN": "64"}}, r"tune\['BN'\]: a non-empty tuple of values, e.g. {'BN': \(64, 128\)}, got '64'"),
    ({"tune": {"BN": ("a",)}}, r"tune\['BN'\]: a const's values are integers, got 'a'"),
    ({"tune": {"BN": (64, 1.5)}}, r"tune\['BN'\]: a const's values are integers, got 1.5"),
    ({"tune": {"BN": (True,)}}, r"tune\['BN'\]: a const's values are integers, got True"),
    ({"tune": {"BN": (64, 64)}}, r"tune\['BN'\]: a value comes twice in \(64, 64\)"),
    ({"tune": {3: (64,)}}, r"tune=: a key is a const's name, got 3"),
    ({"tune": [("BN", (64,))]}, r"tune= takes a non-empty dict"),
    ({"tune": {"BX": (64, 128)}}, r"tune=: kernel 'acc' has no const 'BX' to tune \(its consts: BM, BN\)"),
    ({"tune": {"BN": (64, 128)}, "key": 5}, r"key= takes the name, or a tuple of names, of shape symbols and "
                                             r"scalar parameters .*, got 5"),
    ({"tune": {"BN": (64, 128)}, "key": ("M", 5)}, r"key= takes the name.*, got \('M', 5\)"),
    ({"tune": {"BN": (64, 128)}, "key": ("M", "M")}, r"key=: a name comes twice in \('M', 'M'\)"),
    ({"tune": {"BN": (64, 128)}, "key": "Q"}, r"autotune key 'Q' is neither a shape symbol nor a scalar"),
])
def test_tune_and_key_are_checked_by_compile(backend, kwargs, message):
    """Every mistake in tune= / key= is a TilecError of tilec.compile, before any
    call, on either backend (not a TypeError, not an error of the first call)."""
    with pytest.raises(tilec.TilecError, match=message):
        tilec.compile(ACC, arch="sm_90a", backend=backend, **kwargs)


def test_tune_values_may_be_numpy_integers(env):
    k = tilec.compile(ACC, tune={"BN": (np.int64(64), np.int32(128))}, key=("M",), arch="sm_90a")
    assert "BN=(64, 128)" in repr(k)


def test_signature_without_the_parser_matches_the_parser():
    from tilec.frontend import parse
    from tilec.ir import nodes as ir
    for path in sorted((ROOT / "examples").glob("*.tile")):
        src = load_source(str(path))
        want = tuple((p.name, tuple(d.name if isinstance(d, ir.Var) else None for d in p.shape)
                      if isinstance(p, ir.TensorParam) else None) for p in parse(src).params)
        assert autotune.signature(src) == want, path


def test_readme_snippet(env, monkeypatch):
    """The README's autotuning lines, on small numpy arrays through the fakes."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Autotuning"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(ROOT)
    times = {}

    def fake_time(kernel, args, stream, flush=None):
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


# ------------------------------------------------------------------ CPU: the tune statement

# ACC with its tune space in the program: SPACE, with BM = 32, BN = 64 declared (tried first)
ACC_TUNED = ACC.replace("    const BM = 32, BN = 64;\n",
                        "    const BM = 32, BN = 64;\n    tune BM in (16, 32), BN in (64, 4096, 128);\n")
DECLARED = {"BM": 32, "BN": 64}
GEMM_PATH = str(ROOT / "examples/gemm.tile")
CONV_PATH = str(ROOT / "examples/conv2d.tile")

# programs with tune statements for the reader-vs-parser test: spacing, comments, consts
# declared with calls (commas inside), a tune statement after other declarations
TUNED_PROGRAMS = {
    "acc": ACC_TUNED,
    "layout": ACC.replace("    const BM = 32, BN = 64;\n", """\
    const BM = 32, // rows
          BN = 64;
    tune   BN   in(64,128 , 256) , // a comment: tune XX in (1);
        BM in ( 32 );
"""),
    "calls": ACC.replace("    const BM = 32, BN = 64;\n", "    const BN = 64, W = max(BN, min(32, 16)), BM = 32;\n")
    .replace("    threads 128;\n", "    threads 128;\n    tune BN in (64, 128);\n"),
    "single": ACC.replace("    const BM = 32, BN = 64;\n", "    const BM = 32, BN = 64;\n    tune BN in (64);\n"),
    "where": ACC.replace("    const BM = 32, BN = 64;\n", """\
    const BM = 32, BN = 64, WIDE = 2 * BN;
    tune BM in (16, 32), BN in (64, 128)where(BM <= M // rows
        && WIDE * 2 <= max(N, 128));
"""),
}


def tuned_from_statement(src=ACC_TUNED, **kw):
    return tilec.compile(src, arch="sm_90a", **kw)


def test_statement_candidates_start_with_the_declared_values(env):
    k = tuned_from_statement()
    assert isinstance(k, autotune.TunedKernel)
    assert env.compiled == [DECLARED]                     # the default, compiled by tilec.compile
    assert k.default.consts == DECLARED and k.consts == DECLARED      # read through until the first call
    assert k._tune == dict(SPACE)
    assert k._candidates == [DECLARED, {"BM": 16, "BN": 64}, {"BM": 16, "BN": 4096}, {"BM": 16, "BN": 128},
                             {"BM": 32, "BN": 4096}, {"BM": 32, "BN": 128}]
    x, y = arrays()
    want = untuned(x, y, 0.5)
    k(x, y, 0.5)
    assert len(env.timed) == 4 and env.timed[0] == DECLARED
    assert k.best_config == FASTEST and k.consts["BN"] == 128 and np.array_equal(y, want)
    lines = k.tune_report().splitlines()
    assert lines[0] == "autotune acc key {'M': 40, 'N': 100}:"
    assert lines[1].startswith("  BM=32 BN=64: 2.") and "<- chosen" in lines[-1]


# ACC_TUNED with a `where` condition: 16-row tiles for at most 48 rows, 32-row ones for more, and no
# candidate whose TALL * BN (a const computed from a tuned one) passes 8192: BN = 4096 is never tried
ACC_WHERE = ACC.replace("    const BM = 32, BN = 64;\n",
                        "    const BM = 32, BN = 64, TALL = 2 * BM;\n    tune BM in (16, 32), BN in (64, 4096, 128)\n"
                        "        where (BM == 16) == (M <= 48) && TALL * BN <= 8192;\n")
WHERE_TEXT = "(BM == 16) == (M <= 48) && TALL * BN <= 8192"


def ring_bytes(cfg) -> int:
    """The shared memory of a gemm.tile candidate's ring of f16 stages (a and b tiles)."""
    return cfg["STAGES"] * (cfg["BM"] + cfg["BN"]) * cfg["BK"] * 2


def test_gemm_tile_tries_a_bounded_space_that_fits_at_every_shape():
    """gemm.tile's `where` condition, at row counts across its bands (1 to 8192, the
    edges of each band included): every shape tries at most 228 candidates (a cold
    tune's cost: 204 at 1-32 rows, 222-228 at 33-240, 162 at 1025-2047), and at least 100
    whose rings fit beside the epilogue (<= 200 KiB) and are not the 192x256 tile
    beside a producer (refused for registers), so no shape is left with only
    candidates the compiler refuses; from 2048 rows and columns, with rows of A and B
    that TMA can load (K and N multiples of 8), the 48 of 128-256 rows and columns and
    3-4 stages (39 of them fit), else the 162 again."""
    k = tilec.compile(GEMM_PATH, arch="sm_90a")
    rows = set(range(1, 257, 3)) | {8, 16, 32, 33, 64, 65, 112, 113, 128, 129, 240, 241, 256, 1024, 1025, 2047}
    for m in sorted(rows):
        kept = k._meeting((m, 4096, 4096))[0]
        fit = [c for c in kept if ring_bytes(c) <= 200 * 1024 and (c["BM"], c["BN"], c["PRODUCER"]) != (192, 256, 1)]
        assert len(kept) <= 228 and len(fit) >= 100, (m, len(kept), len(fit))
    assert len(k._meeting((1025, 4096, 4096))[0]) == len(k._meeting((2047, 4096, 4096))[0]) == 162
    for mkn in [(2048, 4096, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 2048)]:
        kept = k._meeting(mkn)[0]
        assert len(kept) == 48 and all(c["BM"] >= 128 and c["BN"] >= 128 and c["STAGES"] <= 4 for c in kept), mkn
        assert sum(ring_bytes(c) <= 200 * 1024 and (c["BM"], c["BN"], c["PRODUCER"]) != (192, 256, 1)
                   for c in kept) == 39
    for mkn in [(4096, 4096, 2047), (4096, 4097, 4096), (4096, 4096, 4100), (4095, 4096, 4097)]:
        assert len(k._meeting(mkn)[0]) == 162, mkn      # the thread-copy variant runs: narrow tiles win there


def test_a_where_condition_leaves_out_candidates_per_key(env):
    k = tuned_from_statement(ACC_WHERE)
    assert env.compiled == [{"BM": 32, "BN": 64}]          # the declared candidate, whatever the condition
    x, y = arrays(m=40)
    want = untuned(x, y, 0.5)
    k(x, y, 0.5)
    assert env.compiled[1:] == env.timed[:2] == [{"BM": 16, "BN": 64}, {"BM": 16, "BN": 128}]
    assert all(c["BM"] == 16 for c in env.timed)           # (and again in the run-off: 3% apart)
    assert k.best_config == {"BM": 16, "BN": 64} and np.array_equal(y, want)
    lines = k.tune_report().splitlines()
    assert lines[1:] == ["  BM=16 BN=64: 2.2240 ms (run-off)  <- chosen", "  BM=16 BN=128: 2.2880 ms (run-off)",
                         f"  4 other candidates: not tried, the tune condition `{WHERE_TEXT}` is false for them at "
                         "M=40 N=100"]
    env.reset_counts()
    x, y = arrays(m=100)
    k(x, y, 0.5)                                           # another key: the 32-row tiles
    assert env.timed == [{"BM": 32, "BN": 64}, {"BM": 32, "BN": 128}] and k.best_config == FASTEST
    env.clear()
    env.reset_counts()
    k = tuned_from_statement(ACC_WHERE.replace("M <= 48", "M <= 24"))     # another condition: tuned again
    k(*arrays(m=40), 0.5)
    assert [c["BM"] for c in env.timed] == [32, 32]      # 2.3 / 1.0 ms: no run-off


def test_a_where_condition_that_leaves_no_candidate_tries_them_all(env):
    k = tuned_from_statement(ACC_WHERE, BM=32)             # pinned: the condition is false at 40 rows
    k(*arrays(m=40), 0.5)
    assert env.timed == [{"BM": 32, "BN": 64}, {"BM": 32, "BN": 128}]       # BN = 4096: refused
    assert k.tune_report().splitlines()[-1] == \
        f"  the tune condition `{WHERE_TEXT}` is false for every candidate at M=40 N=100: all were tried"


def test_a_where_condition_reads_only_the_key_and_consts(env):
    with pytest.raises(tilec.TilecError, match=re.escape(
            f"the tune condition `{WHERE_TEXT}` reads M, not in the key (N): a choice made for one value would "
            "be reused for another. Add it to key=, or leave key= out (every shape symbol)")):
        tuned_from_statement(ACC_WHERE, key="N")
    assert tuned_from_statement(ACC_WHERE, key=("N", "M"))._key == ("N", "M")
    # the default key: every shape symbol, then the scalars the condition reads
    reads_rows = (ROOT / "tests/filecheck/tune_where.tile").read_text()
    assert "rows >= 0" in reads_rows and tuned_from_statement(reads_rows)._key == ("M", "N", "rows")
    assert tuned_from_statement(reads_rows.replace("rows >= 0", "rows >= 0 || M > 1"))._key == ("M", "N", "rows")


def test_a_where_argument_filters_tune_and_replaces_the_statement_s(env):
    k = tilec.compile(ACC, tune=SPACE, key=("M", "N"), where="BM == 16 || N > 4 * M", arch="sm_90a")
    x, y = arrays(m=40)
    want = untuned(x, y, 0.5)
    k(x, y, 0.5)
    assert {c["BM"] for c in env.timed} == {16} and np.array_equal(y, want)
    assert k.tune_report().splitlines()[-1] == \
        "  3 other candidates: not tried, the tune condition `BM == 16 || N > 4 * M` is false for them at M=40 N=100"
    env.reset_counts()
    k(*arrays(m=20), 0.5)                                   # N > 4 * M: every candidate
    assert k.best_config == FASTEST and len(env.compiled) == 6
    env.reset_counts()
    k = tuned_from_statement(ACC_WHERE, where="BM == 32")   # the statement's condition replaced
    k(*arrays(m=40), 0.5)
    assert {c["BM"] for c in env.timed} == {32} and k.best_config == FASTEST
    with pytest.raises(tilec.SemanticError) as e:
        tilec.compile(ACC, tune=SPACE, where="BM <= M && bx == 0", arch="sm_90a")
    assert str(e.value) == ("where=:1:12: error: the tune condition reads 'bx', a block index: it may read consts, "
                            "shape symbols and integer scalar parameters\nBM <= M && bx == 0\n           ^~")
    with pytest.raises(tilec.ParseError, match=r"where=:1:6: error: unexpected end of input; expected an expression"):
        tilec.compile(ACC, tune=SPACE, where="BM <=", arch="sm_90a")
    with pytest.raises(tilec.TilecError, match=r"reads M, not in the key \(N\)"):
        tilec.compile(ACC, tune=SPACE, key="N", where="BM <= M", arch="sm_90a")
    for bad in ("", 16, True):
        with pytest.raises(tilec.TilecError, match="where= takes a tune condition's text"):
            tilec.compile(ACC, tune=SPACE, where=bad, arch="sm_90a")
    with pytest.raises(tilec.TilecError, match="where= goes with tuning, and tune=False tunes nothing"):
        tuned_from_statement(tune=False, where="BM <= M")
    with pytest.raises(tilec.TilecError, match="where= goes with tuning: give tune="):
        tilec.compile(ACC, where="BM <= M", arch="sm_90a")


def test_a_key_without_tuning_is_an_error():
    """key= names what a tune is keyed by: without a tune it would be ignored silently."""
    with pytest.raises(tilec.TilecError, match="key= goes with tuning, and tune=False tunes nothing"):
        tuned_from_statement(tune=False, key="M")
    with pytest.raises(tilec.TilecError, match="key= goes with tuning: give tune="):
        tilec.compile(ACC, key="M", arch="sm_90a")
    with pytest.raises(tilec.TilecError, match=r"autotune key 'Q' is neither a shape symbol nor a scalar parameter "
                                               r"of the kernel \(it has M, N\)"):
        tilec.compile("examples/copy2d.tile", tune={"BN": (64, 128)}, key="Q", arch="sm_90a")


def _bool_exprs():
    from hypothesis import strategies as st
    leaf = st.one_of(st.integers(-3, 3).map(ir.Int), st.sampled_from("ABCD").map(ir.Var))
    cmp = st.builds(ir.BinOp, st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "+", "*"]), leaf, leaf)
    return st.recursive(cmp, lambda sub: st.one_of(
        st.builds(ir.BinOp, st.sampled_from(["&&", "||"]), sub, sub), st.builds(ir.UnaryOp, st.just("!"), sub)),
        max_leaves=8)


def test_a_condition_decided_from_some_names_holds_for_every_value_of_the_rest():
    """tilec check leaves out the candidates a condition rejects for every shape: `_decide` on the
    condition with only the consts folded in must be None (undecided) or the value it has for every
    value of the names left."""
    from hypothesis import given, settings, strategies as st
    from tilec.ir.exprs import fold, substitute

    @settings(max_examples=300, deadline=None)
    @given(_bool_exprs(), st.dictionaries(st.sampled_from("ABCD"), st.integers(-3, 3)),
           st.lists(st.fixed_dictionaries({n: st.integers(-3, 3) for n in "ABCD"}), min_size=1, max_size=4))
    def check(cond, known, rests):
        partial = autotune._decide(fold(substitute(cond, {n: ir.Int(v) for n, v in known.items()})))
        for rest in rests:
            whole = fold(substitute(cond, {n: ir.Int(v) for n, v in {**rest, **known}.items()}))
            assert isinstance(whole, ir.Int)
            assert autotune._decide(whole) is bool(whole.value)
            assert partial is None or partial is bool(whole.value)
    check()


def test_statement_default_key_is_every_shape_symbol_of_the_header(env):
    assert tuned_from_statement()._key == ("M", "N")
    assert tilec.compile(GEMM_PATH, arch="sm_90a")._key == ("M", "K", "N")
    conv = tilec.compile(CONV_PATH, arch="sm_90a")
    assert conv._key == ("N", "H", "W", "C", "F", "NP")       # not KH, KW (consts) nor Wt's KH * KW * C
    assert tuned_from_statement(key="M")._key == ("M",)
    assert tuned_from_statement(key=("N", "alpha"))._key == ("N", "alpha")
    assert tuned_from_statement(key=())._key == ()


def test_the_declared_values_are_what_an_untimed_call_runs(env, monkeypatch):
    x, y = arrays()
    want = untuned(x, y, 1.0)
    monkeypatch.setenv("TILEC_AUTOTUNE", "0")
    k = tuned_from_statement()
    k(x, y, 1.0)
    assert env.timed == [] and k.best_config == DECLARED and np.array_equal(y, want)
    assert "BM=32 BN=64: chosen untimed (TILEC_AUTOTUNE=0)" in k.tune_report()
    monkeypatch.delenv("TILEC_AUTOTUNE")
    monkeypatch.setattr(autotune, "_can_time", lambda args: False)
    env.clear()
    k = tuned_from_statement()
    k(x, y, 1.0)
    assert env.timed == [] and k.best_config == DECLARED
    interpreted = tilec.compile(ACC_TUNED, backend="interpret")
    assert interpreted.consts == DECLARED
    assert tilec.compile(ACC_TUNED, backend="interpret", BN=128).consts == {"BM": 32, "BN": 128}


def test_pinned_consts_leave_the_space(env):
    k = tuned_from_statement(BN=128)
    assert k._tune == {"BM": (16, 32)} and k._candidates == [{"BM": 32}, {"BM": 16}]
    assert k.default.consts == {"BM": 32, "BN": 128}
    plain = tuned_from_statement(BM=16, BN=4096 // 32)
    assert type(plain) is tilec.Kernel and plain.consts == {"BM": 16, "BN": 128}
    untuned_kernel = tuned_from_statement(tune=False)
    assert type(untuned_kernel) is tilec.Kernel and untuned_kernel.consts == DECLARED
    assert untuned_kernel.cuda_source == tuned_from_statement().cuda_source


def test_tune_argument_replaces_the_statement(env):
    k = tuned_from_statement(tune={"BN": (128, 64)}, key=("M",))
    assert k._tune == {"BN": (128, 64)} and k._candidates == [{"BN": 128}, {"BN": 64}]
    assert k.default is None and env.compiled == []       # tune=: no declared default, nothing compiled yet
    with pytest.raises(AttributeError, match="has not been called yet"):
        k.cuda_source
    x, y = arrays()
    k(x, y, 1.0)
    assert sorted(c["BN"] for c in env.compiled) == [64, 128] and all(set(c) == {"BN"} for c in env.compiled)
    assert k.best_config in ({"BN": 64}, {"BN": 128}) and k.consts["BM"] == 32
    # tune= keeps the statement's default key: every shape symbol of the header
    assert tuned_from_statement(tune={"BN": (128, 64)})._key == ("M", "N")
    assert tilec.compile(ACC, tune={"BN": (128, 64)}, arch="sm_90a")._key == ("M", "N")
    assert tilec.compile(ACC, tune={"BN": (128, 64)}, key=(), arch="sm_90a")._key == ()


def test_statement_and_tune_argument_over_one_space_are_kept_apart(env, monkeypatch):
    """The disk key holds the space and, for a statement, its first candidate."""
    keys = []
    real_key = cache.key
    monkeypatch.setattr(cache, "key", lambda *parts: keys.append(parts) or real_key(*parts))
    x, y = arrays()
    tuned_from_statement()(x, y, 1.0)
    explicit = tilec.compile(ACC_TUNED, tune=SPACE, key=("M", "N"), arch="sm_90a")
    env.reset_counts()
    explicit(x, y, 1.0)
    assert len(env.timed) == 4                            # not the statement's choice: tuned again
    tuned_keys = [k for k in keys if k[0] == "autotune"]
    assert len(tuned_keys) == 2
    space = (("BM", (16, 32)), ("BN", (64, 4096, 128)))
    assert tuned_keys[0][3] == (space, "first", (("BM", 32), ("BN", 64))) and tuned_keys[1][3] == space
    assert tuned_keys[0][4] == tuned_keys[1][4] == ("M", "N")


def test_statement_choice_is_read_from_disk(env):
    x, y = arrays()
    tuned_from_statement()(x, y, 1.0)
    env.clear()
    env.reset_counts()
    k = tuned_from_statement()
    k(x, y, 1.0)
    assert env.timed == [] and env.nvrtc == 0
    assert env.compiled == [DECLARED, FASTEST]            # the default (tilec.compile) and the winner
    assert k.best_config == FASTEST
    assert "_candidates" not in vars(k)                   # a warm start does not build the space's candidates


def test_a_default_the_compiler_refuses_is_the_program_s_error(env):
    src = ACC.replace("    const BM = 32, BN = 64;\n", "    const BM = 32, BN = 4096;\n    tune BN in (64, 4096);\n")
    with pytest.raises(tilec.SemanticError, match="is 4096; TMA boxes are at most 256"):
        tilec.compile(src, arch="sm_90a")
    assert type(tilec.compile(src, arch="sm_90a", BN=64)) is tilec.Kernel


def test_statement_errors_are_raised_by_compile():
    """Every tune error of test_parse_errors, through tilec.compile (the reader defers to the parser)."""
    from test_parse_errors import CASES
    cases = [c for c in CASES if c.id.startswith("tune-")]
    assert len(cases) >= 10
    for case in cases:
        cls, program, expected = case.values
        with pytest.raises(cls) as info:
            tilec.compile(Source("t.tile", program), arch="sm_90a")
        assert str(info.value) == expected, case.id


def test_a_tuned_kernel_is_not_a_torch_operator(env):
    with pytest.raises(tilec.TilecError, match="not a torch operator.*tune=False"):
        tuned_from_statement().as_torch_op()


# ---- the statement without the parser

def parser_built() -> bool:
    return sys.modules["tilec.frontend.parse"].parser.cache_info().currsize > 0


def test_statement_reader_agrees_with_the_parser():
    programs = {p.stem: load_source(str(p)) for p in sorted((ROOT / "examples").glob("*.tile"))}
    programs.update({name: Source("t.tile", text) for name, text in TUNED_PROGRAMS.items()})
    assert programs["gemm"].text.count("tune ") == 1 and programs["conv2d"].text.count("tune ") == 1
    from tilec.frontend import parse
    for name, src in programs.items():
        k = parse(src)
        want = (k.tune, {c[0]: c[1].value for c in k.consts if c[0] in dict(k.tune)},
                k.tune_where and k.tune_where.text) if k.tune else None
        assert autotune.statement(src) == want, name
        assert autotune._statement_by_parser(src) == want, name
        consts, params = {c[0] for c in k.consts}, {p.name for p in k.params}
        symbols = []
        for p in k.tensors:
            for d in p.shape:
                if isinstance(d, ir.Var) and d.name not in consts | params and d.name not in symbols:
                    symbols.append(d.name)
        assert autotune.shape_symbols(src) == tuple(symbols), name
    assert autotune.statement(programs["gemm"]) == (
        (("BM", (8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 192)), ("BN", (64, 128, 256)),
         ("STAGES", (3, 4, 6, 8)),
         ("PRODUCER", (0, 1)), ("PERSISTENT", (0, 1)), ("STREAM_K", (0, 1)), ("BK", (64, 128))),
        {"BM": 128, "BN": 128, "STAGES": 3, "PRODUCER": 1, "PERSISTENT": 0, "STREAM_K": 0, "BK": 64},
        "STREAM_K <= PERSISTENT && (BM != 64 || M > 32) && (BM <= 64 || M > 64) && (BM % 64 == 0 || BM <= 16 && "
        "M <= 4 * BM || M > 2 * BM - 16 && M <= 2 * BM && (BK == 128 || BM > 64 && BN <= 128) && PRODUCER == 1 && "
        "STAGES >= 4) && (BK == 64 && "
        "STAGES != 6 || BK == 128 && BM <= 64 && BN <= 128 && M <= 1024) && (M < 2048 || N < 2048 || N % 8 != 0 || "
        "K % 8 != 0 || BM >= 128 && BN >= 128 && STAGES <= 4)")
    assert autotune.statement(programs["conv2d"]) == (
        (("BM", (64, 128, 192)), ("BN", (64, 128, 256)), ("STAGES", (3, 4, 5, 6)), ("PRODUCER", (0, 1)),
         ("PERSISTENT", (0, 1)), ("BK", (64, 32))),
        {"BM": 128, "BN": 128, "STAGES": 3, "PRODUCER": 0, "PERSISTENT": 0, "BK": 64},
        "(BN <= 64 || F > BN / 2) && (BK == 64 || KH * KW * C <= 128 && STAGES <= 4)")
    assert autotune.statement(programs["layout"])[0] == (("BN", (64, 128, 256)), ("BM", (32,)))
    assert autotune.statement(programs["where"])[2] == "(BM <= M && WIDE * 2 <= max(N, 128))"


def test_statement_reader_reads_without_the_parser_and_defers_to_it(monkeypatch):
    used = []
    real = autotune._statement_by_parser
    monkeypatch.setattr(autotune, "_statement_by_parser", lambda src: used.append(src.name) or real(src))
    for name, text in TUNED_PROGRAMS.items():
        autotune.statement(Source("t.tile", text))
    autotune.statement(load_source(GEMM_PATH))
    assert used == []
    # text the expressions do not read exactly: the parser decides
    renamed = Source("t.tile", ACC_TUNED.replace("shared t:", "shared tune_t:").replace(", t)", ", tune_t)")
                                .replace("t[i, j]", "tune_t[i, j]").replace("copy(t,", "copy(tune_t,"))
    assert autotune.statement(renamed)[1] == DECLARED and used == []      # a longer name is not the word
    # `tune` elsewhere: the parser decides (a keyword only where a statement starts)
    tile = ACC.replace("shared t:", "shared tune:").replace(", t)", ", tune)").replace("copy(t,", "copy(tune,")
    assert autotune.statement(Source("t.tile", tile.replace("t[i, j] = t[i, j] + ", "s[i, j] = "))) is None
    assert len(used) == 1
    named = Source("t.tile", ACC_TUNED.replace("const BM = 32,", "const tune = 1, BM = 32,"))
    with pytest.raises(tilec.SemanticError, match=r"'tune' is a keyword argument of tilec.compile\(\)"):
        autotune.statement(named)      # (the parser's verdict: a const may not be named after compile()'s tune=)
    assert len(used) == 2
    with pytest.raises(tilec.ParseError, match="t.tile:11:13: error: unexpected '\\['; expected a name"):
        autotune.statement(Source("t.tile", tile.replace("t[i, j]", "tune[i, j]")))
    assert len(used) == 3
    expr = Source("t.tile", ACC_TUNED.replace("BN = 64;", "BN = 64 + 0;"))
    with pytest.raises(tilec.SemanticError, match="must be an integer literal, not '64 \\+ 0'"):
        autotune.statement(expr)
    assert len(used) == 4


def test_warm_compile_reads_the_statement_without_the_parser(tmp_path):
    """A second process: tilec.compile of gemm.tile from the disk cache builds no parser (the
    default's cubin comes from the disk too)."""
    code = f"""
import sys, tilec
k = tilec.compile({GEMM_PATH!r}, arch="sm_90a")
built = sys.modules["tilec.frontend.parse"].parser.cache_info().currsize
print(type(k).__name__, k._key, k.default.from_disk_cache, built)
"""
    env = {**os.environ, "TILEC_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TILEC_CACHE", None)
    first = subprocess.run(python_c(code), capture_output=True, text=True, timeout=120, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["TunedKernel", "('M',", "'K',", "'N')", "False", "1"]
    warm = subprocess.run(python_c(code), capture_output=True, text=True, timeout=120, env=env)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.split() == ["TunedKernel", "('M',", "'K',", "'N')", "True", "0"]


# ---- the command line

def tilec_cli(*args):
    # `check` of the shipped gemm.tile compiles 462 candidates through NVRTC: 2-5 minutes on two
    # CPUs, past 300 s where CI runs Python versions side by side (a guard against a hang, not a
    # measure of speed)
    return subprocess.run([*TILEC, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_check_compiles_every_candidate_and_lists_the_refused():
    p = tilec_cli("check", "examples/gemm.tile")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert re.fullmatch(r"examples/gemm\.tile: ok \(kernel gemm, \d+-byte cubin for sm_90a; "
                        r"tune: 462 of 588 candidates compile; 2676 more excluded by the tune condition for every "
                        r"shape\)", lines[0]), lines[0]
    # the 240 with STREAM_K=1 PERSISTENT=0 (`where STREAM_K <= PERSISTENT`) are not compiled: the compiler would
    # refuse them (stream_k = 1 needs persistent = 1); nor 128-deep K steps but for tiles of 8-64 rows and 64 or
    # 128 columns, nor 6-stage rings of 64-deep steps; tiles of 24-56 rows only 128 deep behind a producer, of
    # 72-120 rows only behind a producer
    assert not any("STREAM_K=1" in line and "PERSISTENT=0" in line for line in lines)
    assert all(re.search(r"BM=(8|16|24|32|40|48|56|64) BN=(64|128) .*BK=128", line) for line in lines if "BK=128" in line)
    assert all(re.search(r"PRODUCER=1 .*BK=128", line) for line in lines if re.search("BM=(24|32|40|48|56) ", line))
    assert all("PRODUCER=1" in line for line in lines if re.search("BM=(72|80|88|96|104|112|120) ", line))
    assert all("BK=128" in line for line in lines if "STAGES=6" in line)
    registers = ("examples/gemm.tile:17:9: error: gemm: the accumulator fragments take 128 registers per "
                 "thread (128 for 'acc') and a wgmma needs about 26 more, over the 128 a thread of a "
                 "384-thread block beside a producer warpgroup can have: use fewer columns per warpgroup "
                 "(a smaller N tile) or fewer threads")
    assert [line for line in lines if line.endswith(registers)] == [
        f"examples/gemm.tile: 9 candidates with BM=192 BN=256 PRODUCER=1 BK=64 refused: {registers}"]
    # the rest: 8-stage rings (and 6-stage rings of 64x128 tiles 128 deep) that do not fit (one line, or one per
    # group of candidates), each naming the bytes its tiles need; only 8x64, 8x128, 16x64, 16x128, 64x64, 64x128
    # and 128x64 tiles fit 8 stages 64 deep, and 8x64 to 48x64 128 deep; 80x128 to 96x128 too (beside a producer:
    # on a persistent grid the epilogue stores by thread copies where a staging tile of its own would not fit)
    smem = [line for line in lines[1:] if not line.endswith(registers)]
    named = re.compile(r"examples/gemm\.tile: (?:candidate|\d+ candidates with) BM=(\d+) BN=(\d+) STAGES=[68] .*refused: "
                       r"examples/gemm\.tile:1[01]:5: error: shared tiles need (\d+) bytes, 1024 more to align "
                       r"swizzled tiles(?:, and 1024 more for \d+ mbarriers \(static shared memory counts in "
                       r"1024-byte steps\))?; a Hopper block has at most 232448 bytes of shared memory")
    tiles = {(int(m.group(1)), int(m.group(2))) for m in map(named.fullmatch, smem) if m}
    assert all(named.fullmatch(line) for line in smem), smem
    assert tiles == {(8, 128), (8, 256), (16, 128), (16, 256), (24, 128), (32, 128), (40, 128), (48, 128),
                     (56, 64), (56, 128), (64, 64), (64, 128), (64, 256), (104, 128), (112, 128), (120, 128),
                     (128, 128), (128, 256), (192, 64), (192, 128), (192, 256)}
    p = tilec_cli("check", "examples/conv2d.tile", "-D", "STAGES=4")
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(r"examples/conv2d\.tile: ok \(kernel conv2d, \d+-byte cubin for sm_90a; "
                        r"tune: 68 of 72 candidates compile\)\n", p.stdout.splitlines(True)[0]), p.stdout
    assert "examples/conv2d.tile: 4 candidates with BM=192 BN=256 PRODUCER=1 refused: " in p.stdout


def test_check_of_a_space_of_one_candidate(tmp_path):
    one = tmp_path / "one.tile"
    one.write_text(ACC.replace("    const BM = 32, BN = 64;\n", "    const BM = 32, BN = 64;\n    tune BN in (64);\n"))
    p = tilec_cli("check", str(one))
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert re.fullmatch(rf"{re.escape(str(one))}: ok \(kernel \w+, \d+-byte cubin for sm_90a; "
                        r"tune: 1 of 1 candidates compile\)\n", p.stdout), p.stdout


def test_check_fails_when_the_declared_default_fails(tmp_path):
    bad = tmp_path / "bad.tile"
    bad.write_text(ACC.replace("    const BM = 32, BN = 64;\n", "    const BM = 32, BN = 4096;\n"
                               "    tune BN in (4096, 64);\n"))
    p = tilec_cli("check", str(bad))
    assert p.returncode == 1 and p.stdout == ""
    assert "is 4096; TMA boxes are at most 256" in p.stderr and "Traceback" not in p.stderr
    p = tilec_cli("check", "examples/gemm.tile", "--arch", "sm_80")
    assert p.returncode == 1 and "gemm needs Hopper's warpgroup MMA" in p.stderr


def test_emit_shows_the_space_and_runs_the_declared_values():
    ir_text = tilec_cli("emit", "examples/gemm.tile", "--emit", "ir").stdout
    assert "  const PERSISTENT = 0\n  const STREAM_K = 0\n  const GROUP = 8\n  tune BM in (8, 16, 24, 32, 40, 48, 56, 64, 72, " \
        "80, 88, 96, 104, 112, 120, 128, 192), BN in (64, 128, 256), STAGES in (3, 4, 6, 8), PRODUCER in (0, 1), PERSISTENT in (0, 1), STREAM_K in (0, 1), " \
        "BK in (64, 128) where STREAM_K <= PERSISTENT && (BM != 64 || M > 32) && (BM <= 64 || M > 64) && (BM % 64 == 0 " \
        "|| BM <= 16 && M <= 4 * BM || M > 2 * BM - 16 && M <= 2 * BM && (BK == 128 || BM > 64 && BN <= 128) && " \
        "PRODUCER == 1 && STAGES >= 4) && " \
        "(BK == 64 && STAGES != 6 || BK == 128 && BM <= 64 && BN <= 128 && M <= 1024) && (M < 2048 || N < 2048 || " \
        "N % 8 != 0 || K % 8 != 0 || BM >= 128 && BN >= 128 && STAGES <= 4)\n" \
        "  grid (tl_block) = (cdiv(N, 128) * cdiv(M, 128)), group = 8\n" \
        in ir_text
    cuda = tilec_cli("emit", "examples/gemm.tile", "--emit", "cuda").stdout
    want = tilec.compile(Source("examples/gemm.tile", (ROOT / "examples/gemm.tile").read_text()), arch="sm_90a",
                         tune=False).cuda_source
    assert cuda == (want if want.endswith("\n") else want + "\n")
    assert "// consts: BM = 128, BN = 128, BK = 64, STAGES = 3, PRODUCER = 1, PERSISTENT = 0, STREAM_K = 0, " \
        "GROUP = 8\n" in cuda
    pinned = tilec_cli("emit", "examples/gemm.tile", "--emit", "ir", "--after", "fold-consts", "-D", "BN=256").stdout
    assert "  const BN = 256\n  const BK = 64\n  const STAGES = 3\n  const PRODUCER = 1\n  const PERSISTENT = 0\n" \
        "  const STREAM_K = 0\n  const GROUP = 8\n  tune BM in (8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 192), BN in (64, 128, 256)," \
        in pinned


# ------------------------------------------------------------------ GPU

@pytest.fixture
def fresh_caches(monkeypatch, tmp_path):
    """A fresh process, as far as the caches go, over an empty disk cache."""
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
    kernel_mod._CACHE.clear()
    autotune._CHOICES.clear()


@pytest.mark.gpu
def test_gpu_gemm_tuned_by_its_tune_statement(monkeypatch, tmp_path, capsys):
    """examples/gemm.tile as shipped: 3264 candidates, 48 of which its `where` condition
    keeps at 4096^3 (128-192 rows and 128-256 columns a tile, 3-4 stages, stream-K only on a
    persistent grid; 6 refused for registers), keyed by M, K, N; then warm starts
    from the disk cache, compile and first call."""
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
    torch.cuda.synchronize()
    t = time.perf_counter()
    k = tilec.compile(GEMM_PATH)
    k(a, b, c.view)
    torch.cuda.synchronize()
    cold = time.perf_counter() - t
    assert isinstance(k, autotune.TunedKernel) and k._key == ("M", "K", "N")
    want = a.float() @ b.float()
    err = ((c.view.float() - want).norm() / want.norm()).item()
    assert err < 2e-3, f"relative error {err:.2e}"
    c.check()
    report = k.tune_report()
    assert report.count(" ms") == 42 and report.count("refused") == 6, report
    assert report.splitlines()[1].startswith("  BM=128 BN=128 STAGES=3 PRODUCER=1 PERSISTENT=0 STREAM_K=0 BK=64: ")
    assert "  BM=192 BN=256 STAGES=4 PRODUCER=1 PERSISTENT=1 STREAM_K=0 BK=64: refused: " in report
    assert "BK=128" not in report and "BN=64" not in report and not re.search("STAGES=[68]", report)
    assert "PERSISTENT=0 STREAM_K=1" not in report and not re.search("BM=(8|16|24|32|40|48|56|64|72|80|88|96|104|112|120) ", report)
    assert report.splitlines()[-1].startswith("  3216 other candidates: not tried, the tune condition `STREAM_K <= ")
    assert set(k.best_config) == {"BM", "BN", "STAGES", "PRODUCER", "PERSISTENT", "STREAM_K", "BK"}
    warm = []
    for _ in range(3):                         # a fresh process, as far as the caches go
        kernel_mod._CACHE.clear()
        autotune._CHOICES.clear()
        c2 = guarded((n, n), "f16", fill=float("nan"))
        torch.cuda.synchronize()
        t = time.perf_counter()
        k2 = tilec.compile(GEMM_PATH)
        k2(a, b, c2.view)
        torch.cuda.synchronize()
        warm.append(time.perf_counter() - t)
        assert k2.best_config == k.best_config and k2.kernel.from_disk_cache and k2.default.from_disk_cache
        assert torch.equal(c2.view, c.view)
        c2.check()
    with capsys.disabled():
        print(f"\nautotune gemm.tile's tune statement, 48 of 3264 candidates at 4096^3 f16: cold {cold:.2f} s (compile + "
              f"timing), warm from disk {min(warm) * 1e3:.2f} ms (compile + first call, best of 3); chosen "
              f"{k.best_config}\n{report}")
    assert cold < 30
    assert min(warm) < 5e-3, warm


def shipped_candidates(path):
    """The candidates of the file's tune statement that its `where` condition, if any, does not
    exclude for every shape (what `tilec check` compiles; any of them may be picked)."""
    source = load_source(path)
    return autotune.any_shape_candidates(source, {}, *autotune.statement_space(source, {}))


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", [(1000, 1000, 1000), (256, 384, 4096), (40, 1000, 8192)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_every_gemm_candidate_computes_the_product(mnk):
    """Tuning may pick any candidate of gemm.tile's statement (its `where` condition
    picks by M, and consts given to tilec.compile override it): each one the compiler
    accepts is right on ragged shapes and writes only its output view (the last two
    shapes have fewer tiles than SMs: stream-K splits every tile's K steps; tiles
    whose rows are no multiple of 64 run swapped, acc^T = b^T @ a^T)."""
    import torch
    from guard import guarded
    m, n, k = mnk
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    want = a.float() @ b.float()
    cands = shipped_candidates(GEMM_PATH)            # compiled as a tune compiles them: by the compile workers
    compiled, errors = autotune.compile_candidates(load_source(GEMM_PATH), cands, "sm_90a", False, False)
    assert all(isinstance(e, tilec.SemanticError) for e in errors.values())
    refused = {tuple(cands[i].items()): str(e) for i, e in sorted(errors.items())}
    for i, kern in sorted(compiled.items()):
        cfg = cands[i]
        c = guarded((m, n), "f16", fill=float("nan"))
        kern(a, b, c.view)
        torch.cuda.synchronize()
        err = ((c.view.float() - want).norm() / want.norm()).item()
        assert torch.isfinite(c.view.float()).all() and err < 2e-3, (cfg, err)
        c.check()
    registers = [dict(c) for c, e in refused.items() if "registers per thread" in e]
    assert registers == [
        {"BM": 192, "BN": 256, "STAGES": s, "PRODUCER": 1, "PERSISTENT": p, "STREAM_K": sk, "BK": 64}
        for s in (3, 4, 8) for p, sk in ((0, 0), (1, 0), (1, 1))]
    # the rest: rings of 6 or 8 stages that do not fit (tilec check lists them; beside a producer on a persistent
    # grid the epilogue stores by thread copies where its staging tile would not fit: 8 more compile, session 55)
    smem = [dict(c) for c, e in refused.items() if "a Hopper block has at most 232448 bytes of shared memory" in e]
    assert len(registers) + len(smem) == len(refused) and len(smem) == 117
    assert all(c["STAGES"] in (6, 8) and ring_bytes(c) > 200 * 1024 for c in smem)


@pytest.mark.gpu
@pytest.mark.parametrize("bm", [24, 40, 56, 72, 96, 120])
def test_gpu_half_tiles_in_bf16_at_the_shapes_that_try_them(bm):
    """gemm.tile's tiles of rows no multiple of 64 (acc^T), in bf16, at a ragged M that
    tries them (two tiles of rows, the second short) and ragged N and K: each 64-column
    candidate of that height the where condition keeps there (4 stages; plain,
    persistent and stream-K) is right and writes only its output view."""
    import torch
    from guard import guarded
    m, n, k = 2 * bm - 5, 1000, 2056
    source = Source("gemm_bf16.tile", (ROOT / "examples/gemm.tile").read_text().replace("f16", "bf16"))
    kernel = tilec.compile(source, arch="sm_90a")
    cands = [c for c in kernel._meeting((m, k, n))[0] if c["BM"] == bm and c["BN"] == 64 and c["STAGES"] == 4]
    assert len(cands) == 3, cands
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    want = a.float() @ b.float()
    for cfg in cands:
        c = guarded((m, n), "bf16", fill=float("nan"))
        tilec.compile(source, tune=False, fallback=False, **cfg)(a, b, c.view)
        torch.cuda.synchronize()
        err = ((c.view.float() - want).norm() / want.norm()).item()
        assert torch.isfinite(c.view.float()).all() and err < 1e-2, (cfg, err)
        c.check()


def test_conv2d_tries_k_tiles_32_deep_for_few_channels_and_each_computes_the_convolution():
    """conv2d.tile tunes BK in (64, 32) where a filter's K = KH * KW * C is at most 128
    (C = 8: three K tiles of 32 instead of two of 64, the second mostly past the last
    tap, and half the shared memory a stage: 1.52 x cuDNN against 1.34 for the tuned
    BK = 64 at 112x112 C8 on the H200, benchmarks/NOTES.md session 49). Every such
    candidate the compiler accepts computes the convolution in the interpreter (the
    launch fixes C = 8, on TMA), exactly, its output a view with a guarded margin; at C = 64
    none is tried."""
    from test_fixed_symbols import conv_problem, run as run_conv
    source = load_source(CONV_PATH)
    space, first, where = autotune.statement_space(source, {})
    condition = autotune.Condition(source, {}, where)
    at = lambda c: [cfg for cfg in autotune.candidates(space, first)
                    if condition.meets(cfg, {"N": 2, "H": 9, "W": 7, "C": c, "F": 200, "NP": 2 * 9 * 7})]
    assert {cfg["BK"] for cfg in at(64)} == {64}
    deep32 = [cfg for cfg in at(8) if cfg["BK"] == 32]
    assert len(deep32) == 72 and all(c["STAGES"] <= 4 for c in deep32)
    ran = 0
    for cfg in deep32:
        try:
            k = tilec.compile(CONV_PATH, tune=False, backend="interpret", **cfg)
        except tilec.SemanticError as e:
            assert "registers per thread" in str(e) and cfg["BM"] == 192 and cfg["BN"] == 256, (cfg, str(e))
            continue
        args, y, want = conv_problem(2, 9, 7, 8, 200, "numpy")
        with warnings.catch_warnings():
            warnings.simplefilter("error", tilec.TmaFallbackWarning)
            run_conv(k, args, y, want, "numpy")
        ran += 1
    assert ran == 68


@pytest.mark.gpu
def test_gpu_every_conv2d_candidate_and_the_tuned_conv2d_compute_the_convolution(fresh_caches):
    import torch
    import torch.nn.functional as F
    from guard import guarded
    n, h, w, ch, f = 2, 14, 14, 64, 200
    x = torch.randn(n, h, w, ch, device="cuda").half()
    weight = torch.randn(f, ch, 3, 3, device="cuda").half() / (ch * 9) ** 0.5
    wt = weight.permute(2, 3, 1, 0).reshape(9 * ch, f).contiguous()
    want = F.conv2d(x.permute(0, 3, 1, 2).float(), weight.float(), padding=1).permute(0, 2, 3, 1).reshape(-1, f)

    def check(kern, what):
        y = guarded((n * h * w, f), "f16", fill=float("nan"))
        kern(x, wt, y.view)
        torch.cuda.synchronize()
        err = ((y.view.float() - want).norm() / want.norm()).item()
        assert torch.isfinite(y.view.float()).all() and err < 2e-3, (what, err)
        y.check()
    cands = shipped_candidates(CONV_PATH)
    assert len(cands) == 216 and cands[0] == {"BM": 128, "BN": 128, "STAGES": 3, "PRODUCER": 0, "PERSISTENT": 0,
                                              "BK": 64}
    refused = {"registers": [], "shared memory": []}
    for cfg in cands:
        try:
            kern = tilec.compile(CONV_PATH, tune=False, fallback=False, **cfg)
        except tilec.SemanticError as e:
            refused["registers" if "registers per thread" in str(e) else "shared memory"].append(cfg)
            assert "registers per thread" in str(e) or "a Hopper block has at most" in str(e), (cfg, str(e))
            continue
        check(kern, cfg)
    assert refused["registers"] == [
        {"BM": 192, "BN": 256, "STAGES": s, "PRODUCER": 1, "PERSISTENT": p, "BK": bk}
        for s in (3, 4, 5, 6) for p in (0, 1) for bk in ((64, 32) if s <= 4 else (64,))]
    assert len(refused["shared memory"]) == 20 and all(c["STAGES"] >= 5 for c in refused["shared memory"])
    tuned_conv = tilec.compile(CONV_PATH)
    check(tuned_conv, "tuned")
    assert tuned_conv.tune_report().count(" ms") == 116 and tuned_conv.best_config in cands


@pytest.mark.gpu
def test_gpu_tuning_restores_an_in_place_output(fresh_caches):
    """Y += alpha * X: after tuning (many timing runs), Y, a view inside a guarded
    buffer, equals one untuned call's, its margin intact."""
    import torch
    from guard import guarded
    x = torch.randn(1000, 1000, device="cuda")
    g = guarded((1000, 1000), "f32")
    y = g.view
    y.copy_(torch.randn(1000, 1000, device="cuda"))
    want = y + 0.5 * x
    k = tilec.compile(ACC, tune={"BM": (16, 32), "BN": (64, 128, 4096)}, key=("M", "N"))
    k(x, y, 0.5)
    torch.cuda.synchronize()
    assert torch.allclose(y, want, atol=1e-5, rtol=1e-5)
    g.check()
    assert k.tune_report().count("refused") == 2


@pytest.mark.gpu
def test_gpu_a_candidate_with_other_outputs_is_not_chosen(fresh_caches):
    """On the GPU as on the CPU: the candidates with W=2 compute other outputs than the
    first (W=1) and are not chosen; the call leaves one untuned call's result in Y, a
    view inside a guarded buffer, its margin intact."""
    import torch
    from guard import guarded
    x = torch.randn(1000, 1000, device="cuda")
    g = guarded((1000, 1000), "f32")
    y = g.view
    y.copy_(torch.randn(1000, 1000, device="cuda"))
    want = y + 0.5 * x
    k = tilec.compile(SCALED, tune={"BM": (16, 32), "W": (1, 2)}, key=("M", "N"))
    with pytest.warns(tilec.TuneMismatchWarning, match="2 candidates computed other outputs than BM=16 W=1"):
        k(x, y, 0.5)
    torch.cuda.synchronize()
    assert k.best_config["W"] == 1
    assert torch.allclose(y, want, atol=1e-5, rtol=1e-5)
    g.check()
    assert k.tune_report().count("not chosen: output Y differs at ") == 2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_gpu_gemm_candidates_summing_in_other_orders_all_agree(fresh_caches, dtype):
    """The cross-check's tolerance against real sums in other orders: 64/128-row tiles,
    64/128-deep K steps, stream-K's partial sums or not, at K = 8192 into an f16 or f32 C
    (a TuneMismatchWarning fails the test: pyproject's filterwarnings)."""
    import torch
    from guard import guarded
    src = open(GEMM_PATH).read().replace("C: f16[M, N]", f"C: {dtype}[M, N]")
    k = tilec.compile(src, tune={"BM": (64, 128), "BN": (128, 256), "STREAM_K": (0, 1), "BK": (64, 128)},
                      PERSISTENT=1, STAGES=4, key=("M", "N", "K"))
    m, n, kk = 1000, 1000, 8192
    a = torch.randn(m, kk, device="cuda", dtype=torch.float16)
    b = torch.randn(kk, n, device="cuda", dtype=torch.float16)
    c = guarded((m, n), dtype, fill=float("nan"))
    k(a, b, c.view)
    torch.cuda.synchronize()
    c.check()
    report = k.tune_report()
    assert "not chosen" not in report and report.count(" ms") >= 8, report
    want = a.float() @ b.float()
    assert ((c.view.float() - want).norm() / want.norm()).item() < 2e-3


@pytest.mark.gpu
def test_gpu_a_cold_l2_tune_restores_the_output_and_writes_nothing_outside_it(fresh_caches):
    """Y += alpha * X tuned with tune_l2="cold" (a 256 MB buffer written before each timed
    launch): Y, a view inside a guarded buffer, equals one untuned call's, its margin intact."""
    import torch
    from guard import guarded
    x = torch.randn(1000, 1000, device="cuda")
    g = guarded((1000, 1000), "f32")
    y = g.view
    y.copy_(torch.randn(1000, 1000, device="cuda"))
    want = y + 0.5 * x
    k = tilec.compile(ACC, tune={"BM": (16, 32), "BN": (64, 128)}, key=("M", "N"), tune_l2="cold")
    k(x, y, 0.5)
    torch.cuda.synchronize()
    assert torch.allclose(y, want, atol=1e-5, rtol=1e-5)
    g.check()
    assert "tune_l2=\"cold\"" in k.tune_report() and k.tune_report().count(" ms") == 4


@pytest.mark.gpu
def test_gpu_a_cold_l2_tune_without_room_for_its_buffer_says_so(monkeypatch, fresh_caches):
    """No GPU memory for the flush buffer: a TilecError naming tune_l2 and what to do, not
    torch's out-of-memory error from inside the tuner."""
    import torch
    real_empty = torch.empty

    def no_room(*size, dtype=None, device=None, **kw):
        if dtype is torch.uint8 and size and size[0] >= 64 << 20:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
        return real_empty(*size, dtype=dtype, device=device, **kw)
    monkeypatch.setattr(torch, "empty", no_room)
    x = torch.randn(256, 256, device="cuda")
    y = torch.zeros(256, 256, device="cuda")
    k = tilec.compile(ACC, tune={"BM": (16, 32)}, key=("M", "N"), tune_l2="cold")
    with pytest.raises(tilec.TilecError, match=r"tune_l2=\"cold\" writes a \d+ MB buffer .* no room for it"):
        k(x, y, 0.5)


@pytest.mark.parametrize("scale, dropped", [(1.0, True), (0.01, False)], ids=["1ms", "10us"])
def test_slow_candidates_are_timed_no_more_after_the_first_rounds(env, monkeypatch, scale, dropped):
    """PRUNE's cuts: after 1 round the candidates over 2 times the fastest's median are
    timed no more, after 3 rounds those over 1.25 times (their time: that median, marked
    in the report); the others run every round. Not where the fastest takes under
    PRUNE_FROM (10 us here): all run."""
    assert autotune.PRUNE == ((1, 2.0), (3, 1.25))
    monkeypatch.setattr(autotune, "TIMING_ROUNDS", 10)
    monkeypatch.setattr(autotune, "RUNOFF_WITHIN", 0.0)
    speed = {(32, 128): 1.0e-3, (16, 64): 1.2e-3, (16, 128): 1.3e-3, (32, 64): 2.5e-3}
    monkeypatch.setattr(sys.modules[__name__], "fake_times", lambda cfg: scale * speed[(cfg["BM"], cfg["BN"])])
    k = tuned()
    x, y = arrays()
    want = untuned(x, y, 0.5)
    k(x, y, 0.5)
    counts = {c: sum(t == dict(zip(("BM", "BN"), c)) for t in env.timed) for c in speed}
    assert counts == {(32, 128): 10, (16, 64): 10, (16, 128): 3 if dropped else 10, (32, 64): 1 if dropped else 10}
    assert k.best_config == FASTEST and np.array_equal(y, want)
    report = k.tune_report()
    assert f"BM=16 BN=128: {1.3 * scale:.4f} ms{' (3 rounds)' if dropped else ''}\n" in report
    assert f"BM=32 BN=64: {2.5 * scale:.4f} ms{' (1 round)' if dropped else ''}\n" in report
    assert f"BM=16 BN=64: {1.2 * scale:.4f} ms\n" in report
