"""Does the tuner pick differently when each timed launch finds the L2 flushed (as
Triton's do_bench times), and does that pick run faster where the weights come from
DRAM, as in a model's decode step? For each shape: gemm.tile as shipped tuned as the
tuner times (the last launch's tensors left in L2) and tuned with 256 MB written before
each timed launch; then both picks and cuBLAS in alternating rounds with the L2 warm
(`rounds`) and flushed (`rounds_cold_l2`). Outputs guarded and checked after each tune.

    python benchmarks/probes/cold_tune_probe.py [--shapes MxNxK,...]"""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import checked_gemm, gemm_case, gemm_config_name, rounds, rounds_cold_l2, tune_cold  # noqa: E402

SHAPES = [(16, 4096, 4096), (64, 4096, 4096), (16, 4096, 14336), (64, 14336, 4096), (256, 4096, 4096),
          (4096, 4096, 4096)]
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]


def main():
    import torch
    import tilec
    from tilec import autotune
    src = open("examples/gemm.tile").read()
    k = tilec.compile(src)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    warm_time = autotune._time

    def cold_time(kernel, args, stream):
        flush.zero_()
        return warm_time(kernel, args, stream)
    for M, N, K in SHAPES:
        a, b, ref, fns = gemm_case(M, N, K)
        picks = {}
        for name, timer in (("warm-tuned", warm_time), ("cold-tuned", cold_time)):
            autotune._time = timer
            try:
                s, best = tune_cold(k, a, b, ref)
            finally:
                autotune._time = warm_time
            picks[name] = best
            print(f"{M}x{N}x{K} {name}: tuned in {s:.2f} s, pick {gemm_config_name(best)}", flush=True)
            pick = tilec.compile(src, tune=False, **best)
            fns[f"{name} {gemm_config_name(best)}"] = checked_gemm(pick, a, b, ref, name)[0]
        for label, timing in (("L2 warm", rounds), ("L2 flushed", rounds_cold_l2)):
            med = timing(fns, n=7)
            for m in fns:
                print(f"  {M}x{N}x{K} {label:10s} {m:36s} {med[m] * 1e3:8.1f} us  vs cuBLAS "
                      f"{med['cublas'] / med[m]:.3f}", flush=True)


if __name__ == "__main__":
    main()
