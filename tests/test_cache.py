"""The disk cache and compile concurrency (CPU: NVRTC needs no GPU)."""
import os
import subprocess
import threading
from pathlib import Path

import pytest

import tilec
from tilec.kernel import _CACHE
from tilec.runtime import cache
from conftest import python_c

ROOT = Path(__file__).resolve().parent.parent
COPY2D = (ROOT / "examples/copy2d.tile").read_text()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILEC_CACHE", raising=False)
    _CACHE.clear()
    yield tmp_path / "cache"
    _CACHE.clear()


def entries(d):
    return sorted(p for p in Path(d).rglob("*.tilec") if not p.name.startswith(".tmp"))


def test_miss_then_hit(cache_dir):
    k1 = tilec.compile(COPY2D, BM=32)
    assert not k1.from_disk_cache and len(entries(cache_dir)) == 1
    _CACHE.clear()
    k2 = tilec.compile(COPY2D, BM=32)
    assert k2.from_disk_cache
    assert (k2.cubin, k2.cuda_source, k2.host_source, k2.ptx) == (k1.cubin, k1.cuda_source, k1.host_source, k1.ptx)
    assert "box [32, 128]" in k2.ir("plan-tma")        # the IR is rebuilt on demand


def test_key_covers_consts_arch_and_source(cache_dir):
    tilec.compile(COPY2D, BM=32)
    tilec.compile(COPY2D, BM=16)
    tilec.compile(COPY2D, BM=32, arch="sm_100a")
    tilec.compile(COPY2D.replace("threads 128", "threads 64"), BM=32)
    assert len(entries(cache_dir)) == 4


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_entry_is_rebuilt_not_loaded(cache_dir, damage):
    good = tilec.compile(COPY2D, BM=8).cubin
    (path,) = entries(cache_dir)
    blob = path.read_bytes()
    bad = {"truncate": blob[: len(blob) // 2], "flip": blob[:-10] + bytes([blob[-10] ^ 1]) + blob[-9:],
           "garbage": os.urandom(len(blob)), "empty": b""}[damage]
    path.write_bytes(bad)
    _CACHE.clear()
    k = tilec.compile(COPY2D, BM=8)
    assert not k.from_disk_cache and k.cubin == good
    meta, cubin = cache.load(path.stem)                # rewritten whole
    assert cubin == good and meta["name"] == "copy2d"


def test_cache_off(cache_dir, monkeypatch):
    monkeypatch.setenv("TILEC_CACHE", "0")
    tilec.compile(COPY2D, BM=4)
    assert not cache_dir.exists() or not entries(cache_dir)


def test_concurrent_writer_processes(cache_dir):
    code = ("import tilec, sys; k = tilec.compile(sys.argv[1], BM=2); "
            "print(len(k.cubin))")
    src = ROOT / "examples/copy2d.tile"
    procs = [subprocess.Popen([*python_c(code), str(src)], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and len(set(outs)) == 1
    (entry,) = entries(cache_dir)
    assert cache.load(entry.stem) is not None
    assert not list(Path(cache_dir).rglob(".tmp-*"))


def test_sixteen_threads_compile_once(cache_dir, monkeypatch):
    from tilec.runtime import nvrtc
    calls = []
    real = nvrtc.compile_cuda

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(nvrtc, "compile_cuda", counting)
    results, errors = [], []
    barrier = threading.Barrier(16)

    def work():
        try:
            barrier.wait()
            results.append(tilec.compile(COPY2D, BM=1))
        except Exception as e:       # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(calls) == 1 and len({id(k) for k in results}) == 1
