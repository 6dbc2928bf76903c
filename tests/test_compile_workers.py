"""Compile workers (tilec/runtime/workers.py): autotuning's candidates built in
parallel processes. Real workers on the CPU (NVRTC from the wheel): they build
what the calling process builds, say refusals, take the caller's TILEC_*
settings, never run the caller's __main__, and a tune whose workers die still
compiles every candidate in its own process."""
import re
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from tilec import kernel as kernel_mod
from tilec.compiler import load_source
from tilec.runtime import workers

from conftest import ROOT
from test_autotune import FASTEST, arrays, env, tuned, untuned  # noqa: F401  (env: the fixture)

GEMM = load_source(str(ROOT / "examples/gemm.tile"))


def job(**consts):
    return (GEMM.name, GEMM.text, consts, "sm_90a", True, False)


@pytest.fixture
def two_workers(monkeypatch):
    monkeypatch.setenv("TILEC_COMPILE_WORKERS", "2")


def test_workers_build_what_this_process_builds(two_workers):
    cfgs = [dict(BN=128, STAGES=3, PRODUCER=0, PERSISTENT=0), dict(BN=256, STAGES=4, PRODUCER=1, PERSISTENT=1)]
    results = workers.build_all([job(**c) for c in cfgs])
    for cfg, (status, meta, cubin) in zip(cfgs, results):
        assert status == "ok"
        here_meta, here_cubin = kernel_mod.build(GEMM, cfg, "sm_90a")
        assert meta["cuda_source"] == here_meta["cuda_source"] and meta["host_source"] == here_meta["host_source"]
        assert cubin == here_cubin and meta["consts"] == here_meta["consts"]


def test_a_refused_program_comes_back_refused_with_its_message(two_workers):
    results = workers.build_all([job(BM=192, BN=256, PRODUCER=1), job(BN=128)])
    assert results[0][0] == "refused" and "registers per thread" in results[0][1]
    assert results[1][0] == "ok"


def test_one_or_no_worker_builds_nothing_here(monkeypatch):
    for n in ("0", "1"):
        monkeypatch.setenv("TILEC_COMPILE_WORKERS", n)
        assert workers.build_all([job(BN=128), job(BN=256)]) == [None, None]


def test_workers_take_the_callers_tilec_settings(two_workers, monkeypatch):
    """TILEC_TEST_EXPECT_TX_SKEW (read when lowering) set after the workers started."""
    workers.build_all([job(BN=128), job(BN=256)])           # the workers are up
    monkeypatch.setenv("TILEC_TEST_EXPECT_TX_SKEW", "16")
    (_, meta, _), _ = workers.build_all([job(BN=128), job(BN=256)])
    assert re.search(r"mbarrier_arrive_expect_tx\([^;]*, 32784\);", meta["cuda_source"])    # 32768 + 16
    monkeypatch.delenv("TILEC_TEST_EXPECT_TX_SKEW")
    (_, meta, _), _ = workers.build_all([job(BN=128), job(BN=256)])
    assert "32784" not in meta["cuda_source"]


def test_workers_do_not_run_the_callers_main_module(tmp_path):
    script = tmp_path / "no_main_guard.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        print("top level ran", flush=True)
        os.environ["TILEC_COMPILE_WORKERS"] = "2"
        sys.path.insert(0, {str(ROOT)!r})
        from tilec.compiler import load_source
        from tilec.runtime import workers
        g = load_source({str(ROOT / "examples/gemm.tile")!r})
        print([r[0] for r in workers.build_all([(g.name, g.text, dict(BN=n), "sm_90a", True, False)
                                               for n in (128, 256)])], flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["top level ran", "['ok', 'ok']"]


def test_a_tune_builds_its_candidates_in_workers(env, monkeypatch):
    monkeypatch.setenv("TILEC_COMPILE_WORKERS", "2")
    k = tuned()
    x, y = arrays()
    want = untuned(x, y, 0.5)
    k(x, y, 0.5)
    assert env.nvrtc == 0                     # the four that compile were built by the workers
    assert len(env.compiled) == 6 and len(env.timed) == 4 and k.best_config == FASTEST
    assert np.array_equal(y, want)
    assert k.kernel.compile_seconds > 0 and not k.kernel.from_disk_cache
    report = k.tune_report()
    assert report.count("refused") == 2 and "TMA boxes are at most 256" in report     # the caller's own errors
    env.clear()                               # a fresh process: the choice and the kernels from the disk
    env.reset_counts()
    k = tuned()
    k(x, y, 0.5)
    assert env.nvrtc == 0 and env.timed == [] and k.kernel.from_disk_cache


def test_a_tune_whose_workers_die_compiles_here(env, monkeypatch):
    monkeypatch.setenv("TILEC_COMPILE_WORKERS", "2")

    def dies(self, job):
        self.close()
        raise EOFError
    monkeypatch.setattr(workers._Worker, "run", dies)
    k = tuned()
    x, y = arrays()
    k(x, y, 0.5)
    assert env.nvrtc == 4 and k.best_config == FASTEST


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")     # no pipe left to fail at GC
def test_a_worker_that_is_not_a_python_is_given_up(two_workers, monkeypatch):
    """sys.executable that is no python (an embedded interpreter's host program):
    one that exits at once, and one that stays up and says nothing. The builds
    come back unbuilt, for the caller: at once, and after READY_SECONDS, not never."""
    workers.close_all()
    monkeypatch.setattr(workers, "READY_SECONDS", 1)
    for exe, boot in (("/bin/false", "ignored"), ("/bin/sh", "sleep 30")):
        monkeypatch.setattr(sys, "executable", exe)
        monkeypatch.setattr(workers, "_BOOT", boot)
        t = time.perf_counter()
        assert workers.build_all([job(BN=128), job(BN=256)]) == [None, None]
        assert time.perf_counter() - t < 10
    assert workers._IDLE == [] and workers._LEASED == [0]


def test_concurrent_tunes_get_workers_of_their_own(monkeypatch):
    """Two threads build at once: each drives its own workers (a worker shared by
    two would interleave their pipes); the live workers stay within the cap."""
    monkeypatch.setenv("TILEC_COMPILE_WORKERS", "3")
    workers.close_all()
    sets = [[dict(BN=bn, STAGES=st) for bn in (128, 256) for st in (3, 4)],
            [dict(BN=bn, STAGES=st, PRODUCER=0) for bn in (128, 256) for st in (3, 4)]]
    out = [None, None]
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, workers.build_all([job(**c) for c in sets[i]])))
               for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for cfgs, results in zip(sets, out):
        for cfg, r in zip(cfgs, results):
            if r is not None:           # built by a worker (else left to the caller)
                assert r[0] == "ok" and all(r[1]["consts"][k] == v for k, v in cfg.items())
    assert sum(r is not None for rs in out for r in rs) >= 4      # one of them had workers at least
    assert workers._LEASED == [0] and len(workers._IDLE) <= 3


def test_default_worker_count_is_the_usable_cpus_up_to_32(monkeypatch):
    """One worker per CPU the process may use (its affinity, not the machine's count), at most
    32; TILEC_COMPILE_WORKERS overrides."""
    monkeypatch.delenv("TILEC_COMPILE_WORKERS", raising=False)
    for cpus, want in ((4, 4), (16, 16), (32, 32), (64, 32)):
        monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        monkeypatch.setattr(workers.os, "cpu_count", lambda: 128)
        assert workers.max_workers() == want
    monkeypatch.setenv("TILEC_COMPILE_WORKERS", "3")
    assert workers.max_workers() == 3
