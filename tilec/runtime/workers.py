"""Compile workers: autotuning's candidates lowered and compiled in parallel.

In one process they cannot overlap: lowering (check-barriers above all) holds
the GIL, and NVRTC calls are serialised (runtime/nvrtc.py). So a tune with
several candidates to build hands them to worker processes, each a fresh
`python` that reads jobs from its stdin and writes results to its stdout
(pickled), and that stays up for the next tune. A worker is a subprocess of its
own, not a multiprocessing child, and serves one build_all at a time: it never imports the user's `__main__` (no
`if __name__ == "__main__"` guard needed), and it is exec'd, not a fork of a
process that holds CUDA and threads. It gets the parent's sys.path, so it imports the same tilec.

A job is (source name, source text, consts, arch, tma, debug), sent with the
caller's TILEC_* environment variables of the moment; a result is
("ok", meta, cubin) as kernel.build() makes them, or ("refused", message) for
a program the compiler refuses (("error", repr) for anything else); the caller
compiles that candidate again in its own process for the error itself
(refusals come early, in lowering).
TILEC_COMPILE_WORKERS sets how many workers at most (default: the CPUs this
process may use, at most MAX_DEFAULT = 32; a value that is not a count warns and is
not used); 0 or 1 builds in the calling process, as does a worker that fails
to start or dies (the job it had goes back to the caller)."""
from __future__ import annotations

import atexit
import os
import pickle
import queue
import subprocess
import sys
import threading
import time

_BOOT = ("import pickle, sys; sys.path[:] = pickle.load(sys.stdin.buffer); "
         "from tilec.runtime.workers import serve; serve()")
READY_SECONDS = 60              # a worker not ready by then (not a python, cannot import tilec) is given up
_IDLE: list = []                # live workers no build is using, kept for later tunes
_LEASED = [0]                   # workers a build_all is using now (each drives its own)
_POOL_LOCK = threading.Lock()


def max_workers() -> int:
    """TILEC_COMPILE_WORKERS, else the default; a value that is not a count (0 or
    more) warns once (RuntimeWarning) and the default is used."""
    env = os.environ.get("TILEC_COMPILE_WORKERS", "").strip()
    default = min(usable_cpus(), MAX_DEFAULT)
    if env:
        try:
            n = int(env)
        except ValueError:
            n = -1
        if n >= 0:
            return n
        if env not in _WARNED:
            _WARNED.add(env)
            import warnings
            warnings.warn(f"TILEC_COMPILE_WORKERS={env!r} is not a number of workers (0 or more): using the "
                          f"default, {default}", RuntimeWarning, stacklevel=2)
    return default


_WARNED: set = set()        # the TILEC_COMPILE_WORKERS values warned about


MAX_DEFAULT = 32        # a cold tune's compile is NVRTC's ptxas, one core per worker: session 20's gemm.tile, 162 candidates
                        # at 4096^3 took 12.9 s with 8 workers and 8.7 s with 16 on a 16-core machine, 9.0 s
                        # with 16 and 7.3 s with 32 on a 32-core one (session 20, the CUDA compute cache off)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's CPU set), else the count."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Worker:
    def __init__(self):
        """Starts the process (raises OSError if it cannot); ready() says whether it came up."""
        self.proc = subprocess.Popen([sys.executable or "python3", "-c", _BOOT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.hello = []
        self.reader = threading.Thread(target=lambda: self.hello.append(self._load()), daemon=True)
        try:
            pickle.dump(list(sys.path), self.proc.stdin)
            self.proc.stdin.flush()
        except OSError:
            pass
        self.reader.start()

    def ready(self, deadline: float) -> bool:
        """Whether it said it is ready by `deadline` (time.monotonic()); if not, it is killed."""
        self.reader.join(max(0.0, deadline - time.monotonic()))
        if self.hello == ["ready"]:
            return True
        self.proc.kill()
        self.proc.wait()
        try:
            self.proc.stdin.close()     # now, not at garbage collection (the sys.path sent may be unflushed)
        except OSError:
            pass
        return False

    def _load(self):
        try:
            return pickle.load(self.proc.stdout)
        except (OSError, EOFError, pickle.PickleError):
            return None

    def run(self, job):
        tilec_env = {k: v for k, v in os.environ.items() if k.startswith("TILEC_")}
        pickle.dump((tilec_env, job), self.proc.stdin)
        self.proc.stdin.flush()
        return pickle.load(self.proc.stdout)

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def _lease(n: int) -> list:
    """Up to n workers for one build_all alone (idle ones first, then new ones,
    while the live workers stay within max_workers()): concurrent tunes in
    other threads get workers of their own, or build in their own process.
    New ones start together and get READY_SECONDS to come up."""
    with _POOL_LOCK:
        _IDLE[:] = [w for w in _IDLE if w.proc.poll() is None]
        got = [_IDLE.pop() for _ in range(min(n, len(_IDLE)))]
        room = max_workers() - _LEASED[0] - len(got) - len(_IDLE)
        new = []
        for _ in range(max(0, min(n - len(got), room))):
            try:
                new.append(_Worker())
            except OSError:
                break
        _LEASED[0] += len(got) + len(new)
    deadline = time.monotonic() + READY_SECONDS
    ready = [w for w in new if w.ready(deadline)]
    with _POOL_LOCK:
        _LEASED[0] -= len(new) - len(ready)
    return got + ready


def _release(ws: list):
    with _POOL_LOCK:
        _LEASED[0] -= len(ws)
        _IDLE.extend(w for w in ws if w.proc.poll() is None)


def close_all():
    """Stop the idle workers (at exit, or to measure a cold start); the next build starts new ones."""
    with _POOL_LOCK:
        for w in _IDLE:
            w.close()
        _IDLE.clear()


atexit.register(close_all)


def build_all(jobs: list, on_done=None) -> list:
    """Each job's result, in order: ("ok", meta, cubin), ("refused", message), or
    None where it was not built (no workers, or the worker died): the caller
    builds those itself. `on_done(i)`: called (from a worker thread) as job i
    finishes."""
    results = [None] * len(jobs)
    n = min(len(jobs), max_workers())
    if n < 2:
        return results
    todo = queue.SimpleQueue()
    for i in range(len(jobs)):
        todo.put(i)

    def drive(worker):
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = worker.run(jobs[i])
            except (OSError, EOFError, pickle.PickleError):
                worker.close()      # dead or garbled: job i goes back to the caller, the others take the rest
                return
            if on_done is not None:
                on_done(i)

    leased = _lease(n)
    try:
        threads = [threading.Thread(target=drive, args=(w,), daemon=True) for w in leased]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        _release(leased)
    return results


def serve():
    """A worker's loop: jobs from stdin until it closes, results to stdout. What
    the compiler prints goes to stderr (discarded), so stdout carries only
    results; warnings are not said here (the caller says a kernel's check notes
    from its meta)."""
    import warnings
    warnings.simplefilter("ignore")
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    inp = sys.stdin.buffer
    from ..errors import Source, TilecError
    from ..kernel import build
    pickle.dump("ready", out)
    out.flush()
    while True:
        try:
            tilec_env, (name, text, consts, arch, tma, debug) = pickle.load(inp)
        except EOFError:
            return
        for k in [k for k in os.environ if k.startswith("TILEC_") and k not in tilec_env]:
            del os.environ[k]
        os.environ.update(tilec_env)        # the caller's TILEC_* settings at this job
        try:
            meta, cubin = build(Source(name, text), consts, arch, tma, debug)
            result = ("ok", meta, cubin)
        except TilecError as e:
            result = ("refused", str(e))
        except Exception as e:      # a compiler bug: the caller's own compile raises it in full
            result = ("error", repr(e))
        pickle.dump(result, out)
        out.flush()
