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


def test_long_texts_and_bytes_round_trip_as_raw_sections(cache_dir):
    """Long strings and bytes leave the JSON for raw sections after the cubin; the meta
    comes back equal, and the JSON holds only the short values and the sections' list."""
    meta = {"name": "k", "n": 3, "short": "x" * cache.RAW_OVER, "long": "é\n\"" * 4000, "code": bytes(range(256)) * 9,
            "empty": b""}
    cache.store("ab" + "0" * 62, meta, b"\x7fELF cubin")
    assert cache.load("ab" + "0" * 62) == (meta, b"\x7fELF cubin")
    blob = entries(cache_dir)[0].read_bytes()
    meta_len = int.from_bytes(blob[40:48], "little")
    small = __import__("json").loads(blob[56:56 + meta_len])
    assert sorted(small) == ["n", "name", "short", cache.SECTIONS]
    assert small[cache.SECTIONS] == [["long", "str", 16000], ["code", "bytes", 2304], ["empty", "bytes", 0]]


def test_host_wrapper_code_comes_from_the_disk_cache(cache_dir, monkeypatch):
    """A kernel loaded from the disk cache runs the host wrapper's code object stored there
    (marshal, for the Python that wrote it: no compile of its source); a tag of another
    Python, or bytes that do not unmarshal, fall back to compiling the source."""
    from tilec import kernel as kernel_mod
    tilec.compile(COPY2D, BM=8)
    _CACHE.clear()
    compiled = []
    real = kernel_mod._compile_host
    monkeypatch.setattr(kernel_mod, "_compile_host", lambda *a: compiled.append(a) or real(*a))
    k = tilec.compile(COPY2D, BM=8)
    assert k.from_disk_cache and callable(k._launch) and not compiled
    (path,) = entries(cache_dir)
    for tag, code in ((kernel_mod._CODE_TAG + "-other", None), (kernel_mod._CODE_TAG, b"not marshal")):
        meta, cubin = cache.load(path.stem)
        meta["host_code_tag"] = tag
        if code is not None:
            meta["host_code"] = code
        cache.store(path.stem, meta, cubin)
        _CACHE.clear()
        k = tilec.compile(COPY2D, BM=8)
        assert k.from_disk_cache and callable(k._launch)
    assert len(compiled) == 2


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
