"""Compile workers: autotuning's candidates lowered and compiled in parallel.

In one process they cannot overlap: lowering (check-barriers above all) holds
the GIL, and NVRTC calls are serialised (runtime/nvrtc.py). So a tune with
several candidates to build hands them to worker processes, each a fresh
`python` that reads jobs from its stdin and writes results to its stdout
(pickled), and that stays up for the next tune. A worker is a subprocess of its
own, not a multiprocessing child: it never imports the user's `__main__` (no
`if __name__ == "__main__"` guard needed), and it is exec'd, not a fork of a
process that holds CUDA and threads. It gets the parent's sys.path, so it imports the same tilec.

A job is (source name, source text, consts, arch, tma, debug), sent with the
caller's TILEC_* environment variables of the moment; a result is
("ok", meta, cubin) as kernel.build() makes them, or ("refused", message) for
a program the compiler refuses (("error", repr) for anything else); the caller
compiles that candidate again in its own process for the error itself
(refusals come early, in lowering).
TILEC_COMPILE_WORKERS sets how many workers at most (default: the CPU count,
at most 8); 0 or 1 builds in the calling process, as does a worker that fails
to start or dies (the rest of its jobs go back to the caller)."""
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
_POOL: list = []                # live workers, reused across tunes
_POOL_LOCK = threading.Lock()


def max_workers() -> int:
    env = os.environ.get("TILEC_COMPILE_WORKERS", "").strip()
    if env:
        try:
            return max(0, int(env))
        except ValueError:
            pass
    return min(os.cpu_count() or 1, 8)


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


def _workers(n: int) -> list:
    """n live workers, or fewer: new ones start together and get READY_SECONDS to come up."""
    with _POOL_LOCK:
        _POOL[:] = [w for w in _POOL if w.proc.poll() is None]
        new = []
        for _ in range(n - len(_POOL)):
            try:
                new.append(_Worker())
            except OSError:
                break
        deadline = time.monotonic() + READY_SECONDS
        _POOL.extend([w for w in new if w.ready(deadline)])
        return list(_POOL[:n])


def close_all():
    """Stop the workers (at exit, or to measure a cold start); the next build starts new ones."""
    with _POOL_LOCK:
        for w in _POOL:
            w.close()
        _POOL.clear()


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
                worker.close()      # dead or garbled: the caller builds what is left of its share
                return
            if on_done is not None:
                on_done(i)

    threads = [threading.Thread(target=drive, args=(w,), daemon=True) for w in _workers(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
