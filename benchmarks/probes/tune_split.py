"""Where a cold tune of examples/gemm.tile goes, phase by phase: a fresh disk cache,
cleared process caches and compile workers started cold (as bench.py's autotune
rows), on an f16 gemm of each --n (N for N^3, or MxNxK), with each worker count of --workers. Phases:
compile (compile_candidates: workers, then the Kernels in this process; workers: the compile workers' part), warm-up
(each candidate's first launch: module load, tensor maps), cross-check (each candidate's outputs compared
with the first's: autotune._Reference; --no-check: not compared), rounds (the timed
rounds, the run-off's included), run-off, and the rest (tilec.compile, saving the outputs, the winner's run).

    python benchmarks/probes/tune_split.py --workers 8 --n 4096,8192,16x4096x4096 --reps 3"""
import argparse
import os
import re
import statistics
import time

from common import bench, checked_gemm, gemm_config_name, timed_into  # (common puts benchmarks/ on sys.path)

PHASES = ("compile", "workers", "warm-up", "cross-check", "rounds", "run-off")   # workers: inside compile; run-off: in rounds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", default="4096,8192")
    ap.add_argument("--no-prune", action="store_true", help="every candidate timed in every round (as before "
                    "2026-11-26)")
    ap.add_argument("--one-cut", action="store_true", help="only the cut after 3 rounds (as before "
                    "session 17's cut after the first round)")
    ap.add_argument("--no-check", action="store_true", help="the candidates' outputs not compared (as before "
                    "session 22)")
    ap.add_argument("--report", action="store_true", help="the last tune's report of each size")
    ap.add_argument("--each", action="store_true", help="every run's phases, not only their medians")
    ap.add_argument("--cpu", action="store_true", help="with --each: each run's CPU seconds in the compile "
                    "workers, the cgroup's CPU throttling, CPU pressure and the load average (is a slow run "
                    "short of CPU, or doing more work?)")
    args = ap.parse_args()
    import torch
    import tilec
    from tilec import autotune
    from tilec.runtime import workers
    if args.no_prune:
        autotune.PRUNE = ()
    if args.one_cut:
        autotune.PRUNE = ((3, 1.25),)
    spent = {}
    autotune.compile_candidates = timed_into(spent, "compile", autotune.compile_candidates)
    autotune.build_in_workers = timed_into(spent, "workers", autotune.build_in_workers)
    autotune._rounds = timed_into(spent, "rounds", autotune._rounds)
    autotune._run = timed_into(spent, "warm-up", autotune._run)         # the warm-up launches (and the winner's run)
    if args.no_check:
        autotune._Reference.mismatch = lambda self, args, sig: None
        autotune._tolerance = lambda ref: None
    autotune._Reference.__init__ = timed_into(spent, "cross-check", autotune._Reference.__init__)
    autotune._Reference.mismatch = timed_into(spent, "cross-check", autotune._Reference.mismatch)
    autotune.TunedKernel._runoff = staticmethod(timed_into(spent, "run-off", autotune.TunedKernel._runoff))
    jobs = []
    if args.cpu:
        run_job = workers._Worker.run

        def timed_job(worker, job):
            t0 = time.perf_counter()
            try:
                return run_job(worker, job)
            finally:
                jobs.append((worker.proc.pid, time.perf_counter() - t0))
        workers._Worker.run = timed_job
    for shape in args.n.split(","):
        m, n, kk = (int(x) for x in shape.split("x")) if "x" in shape else (int(shape),) * 3
        a = torch.randn(m, kk, device="cuda", dtype=torch.float16)
        b = torch.randn(kk, n, device="cuda", dtype=torch.float16)
        ref = a @ b
        for w in [int(x) for x in args.workers.split(",")]:
            os.environ["TILEC_COMPILE_WORKERS"] = str(w)
            runs = []
            for _ in range(args.reps):
                with bench.fresh_disk_cache():
                    workers.close_all()
                    spent.clear()
                    jobs.clear()
                    cpu0 = _cpu_now() if args.cpu else None
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    k = tilec.compile(str(bench.ROOT / "examples/gemm.tile"))
                    checked_gemm(k, a, b, ref, "tune")
                    torch.cuda.synchronize()
                    whole = time.perf_counter() - t
                    rest = whole - sum(v for p, v in spent.items() if p not in ("run-off", "workers"))
                    if args.cpu:
                        spent.update(_cpu_after(cpu0))
                        spent.update(_job_times(jobs))
                    runs.append({"whole": whole, **spent, "rest": rest, "pick": gemm_config_name(k.best_config)})
            cols = ("whole",) + PHASES + ("rest",) + (CPU_COLS if args.cpu else ())
            tried = sum(line.startswith("  BM=") for line in k.tune_report().splitlines())
            print(f"{m}x{n}x{kk}, {w} workers, {tried} of {len(k._candidates)} candidates: " + ", ".join(
                f"{c} {statistics.median(r.get(c, 0.0) for r in runs):.2f} s" for c in cols) +
                f"  (whole per run: {[round(r['whole'], 2) for r in runs]}; picks: {[r['pick'] for r in runs]})",
                flush=True)
            if args.each:
                for r in runs:
                    print("  " + ", ".join(f"{c} {r.get(c, 0.0):.2f} s" for c in cols), flush=True)
            if args.report:
                print(k.tune_report(), flush=True)


CPU_COLS = ("workers cpu", "throttled", "cpu pressure", "load", "job median", "job p90", "first jobs median")


def _job_times(jobs):
    """The compile jobs' wall seconds (median, 90th percentile) and the median of each
    worker's first job (a worker's imports and parser: is a slow run slow in every job?)."""
    if not jobs:
        return {}
    walls = sorted(w for _, w in jobs)
    first = {}
    for pid, w in jobs:
        first.setdefault(pid, w)
    return {"job median": statistics.median(walls), "job p90": walls[int(0.9 * (len(walls) - 1))],
            "first jobs median": statistics.median(first.values())}


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cpu_now():
    """The cgroup's throttled seconds so far and the CPU-pressure stall seconds so far."""
    stat = dict(line.split() for line in _read("/sys/fs/cgroup/cpu.stat").splitlines() if line.count(" ") == 1)
    pressure = re.search(r"some .*total=(\d+)", _read("/proc/pressure/cpu"))
    return {"throttled": int(stat.get("throttled_usec", 0)) / 1e6,
            "cpu pressure": int(pressure.group(1)) / 1e6 if pressure else 0.0}


def _cpu_after(before):
    """This run's CPU seconds in the (still idle) compile workers, the throttled and stalled
    seconds since `before`, and the 1-minute load average."""
    from tilec.runtime import workers
    tick = os.sysconf("SC_CLK_TCK")
    used = 0
    for w in workers._IDLE:
        fields = _read(f"/proc/{w.proc.pid}/stat").rsplit(")", 1)[-1].split()
        if len(fields) > 12:
            used += int(fields[11]) + int(fields[12])       # utime + stime
    now = _cpu_now()
    return {"workers cpu": used / tick, "throttled": now["throttled"] - before["throttled"],
            "cpu pressure": now["cpu pressure"] - before["cpu pressure"],
            "load": float(_read("/proc/loadavg").split()[0] or 0)}


if __name__ == "__main__":
    main()
