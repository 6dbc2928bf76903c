"""Where a cold tune of examples/gemm.tile goes: the compile phase alone (every
candidate lowered and NVRTC-compiled by the compile workers, a fresh disk cache,
the workers started cold), then the whole cold tune on a 4096^3 (or --n) f16 gemm
(compile + timing), for each worker count of --workers.

    python benchmarks/probes/tune_split.py --workers 8,16 --reps 3"""
import argparse
import os
import statistics
import tempfile
import time

from common import bench, tune_cold  # (common puts benchmarks/ on sys.path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", type=int, default=4096)
    args = ap.parse_args()
    import torch
    import tilec
    from tilec import autotune
    from tilec.runtime import workers
    n = args.n
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    ref = a @ b
    for w in [int(x) for x in args.workers.split(",")]:
        os.environ["TILEC_COMPILE_WORKERS"] = str(w)
        compile_s, tune_s = [], []
        for _ in range(args.reps):
            os.environ["TILEC_CACHE_DIR"] = tempfile.mkdtemp()
            workers.close_all()
            k = tilec.compile(str(bench.ROOT / "examples/gemm.tile"))
            configs = [{**k._consts, **cfg} for cfg in k._candidates]
            t = time.perf_counter()
            compiled, refused = autotune.compile_candidates(k.source, configs, k.arch, k._fallback_allowed, k.debug)
            compile_s.append(time.perf_counter() - t)
            workers.close_all()
            k = tilec.compile(str(bench.ROOT / "examples/gemm.tile"))
            s, cfg = tune_cold(k, a, b, ref)
            tune_s.append(s)
        print(f"workers {w}: {len(configs)} candidates, {len(compiled)} compile; compile phase "
              f"{statistics.median(compile_s):.2f} s {[round(x, 2) for x in compile_s]}; whole cold tune {n}^3 "
              f"{statistics.median(tune_s):.2f} s {[round(x, 2) for x in tune_s]}", flush=True)


if __name__ == "__main__":
    main()
