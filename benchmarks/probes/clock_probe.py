"""How close to the tensor cores' peak the tuned gemm runs, and at what SM clock: for the
tuned gemm.tile, cuBLAS and Triton's autotuned matmul (f16, 4096^3 and 8192^3),
(1) bench-style single calls behind a GPU spin (TFLOPS; the clock from a timed spin of known
cycles right after), (2) one second back to back with nvidia-smi sampling the SM clock and power.
FLOP/clk/SM = TFLOPS / (SMs x clock); dense f16 wgmma peaks at 4096 per SM per clock.
With --ncu-target NAME, only runs NAME's call a few times (for ncu); --shape MxNxK (repeatable)
measures those shapes instead of 4096^3 and 8192^3."""
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench  # noqa: E402
from triton_matmul import matmul as triton_matmul  # noqa: E402

SMS = torch.cuda.get_device_properties(0).multi_processor_count
SPIN = 2_000_000


def spin_clock_ghz():
    """The SM clock now: a spin of SPIN cycles timed with events."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    torch.cuda._sleep(SPIN)
    e.record()
    e.synchronize()
    return SPIN / (s.elapsed_time(e) * 1e6)


def single(fn, flops, gap, reps=30):
    """TFLOPS of bench-style calls, each after a further spin of `gap` cycles (0: as bench.py),
    and the clock measured by a spin right after the call (only with a gap)."""
    ts, clocks = [], []
    for _ in range(reps):
        if gap:
            torch.cuda._sleep(gap)
        ts.append(bench.time_one(fn))
        if gap:
            clocks.append(spin_clock_ghz())
    t = statistics.median(ts)
    return flops / t / 1e12, statistics.median(clocks) if clocks else float("nan")


def sustained(fn, flops, seconds=1.0):
    proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                             "-lms", "20"], stdout=subprocess.PIPE, text=True)
    samples = []
    reader = threading.Thread(target=lambda: samples.extend(proc.stdout), daemon=True)
    reader.start()
    time.sleep(0.3)
    n0 = len(samples)
    torch.cuda.synchronize()
    t = time.perf_counter()
    calls = 0
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    while time.perf_counter() - t < seconds:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()
    e.record()
    e.synchronize()
    n1 = len(samples)
    proc.terminate()
    got = [line.split(",") for line in samples[n0 + 5:n1]]
    clk = statistics.median(float(c) for c, _ in got) / 1e3 if got else float("nan")
    pw = statistics.median(float(p) for _, p in got) if got else float("nan")
    return flops * calls / (s.elapsed_time(e) * 1e-3) / 1e12, clk, pw


def main():
    target = sys.argv[sys.argv.index("--ncu-target") + 1] if "--ncu-target" in sys.argv else None
    shapes = [tuple(int(x) for x in sys.argv[i + 1].split("x")) for i, v in enumerate(sys.argv) if v == "--shape"]
    for m, n, kk in shapes or [(4096,) * 3, (8192,) * 3]:
        a = torch.randn(m, kk, device="cuda").half()
        b = torch.randn(kk, n, device="cuda").half()
        c = torch.empty(m, n, device="cuda", dtype=torch.float16)
        k = bench.tuned_gemm("f16")
        k(a, b, c)
        fns = {"tilec": lambda: k(a, b, c), "cublas": lambda: torch.matmul(a, b, out=c),
               "triton": lambda: triton_matmul(a, b, c)}
        if target != "tilec" and target != "cublas":
            triton_matmul(a, b, c)                   # Triton's tuning, outside ncu's target runs
        if target:
            torch.cuda.synchronize()
            for _ in range(4):
                fns[target]()
            torch.cuda.synchronize()
            continue
        flops = 2 * m * n * kk
        print(f"{m}x{n}x{kk} tilec config: {bench.chosen(k)}", flush=True)
        for gap in (0, SPIN):
            for rep in range(2):
                for name, fn in fns.items():
                    tf, clk = single(fn, flops, gap)
                    print(f"  {name:7s} single, gap {gap:8d}: {tf:6.1f} TFLOPS, clock after {clk:.3f} GHz", flush=True)
        for name, fn in fns.items():
            tf, clk, pw = sustained(fn, flops)
            print(f"  {name:7s} sustained: {tf:6.1f} TFLOPS at {clk:.3f} GHz, {pw:.0f} W -> "
                  f"{tf * 1e12 / (SMS * clk * 1e9):6.0f} FLOP/clk/SM", flush=True)


if __name__ == "__main__":
    main()
