"""Does the tuner pick differently when each timed launch finds the L2 flushed (as
Triton's do_bench times), and does that pick run faster where the weights come from
DRAM, as in a model's decode step? For each shape: gemm.tile as shipped tuned as the
tuner times by default (the last launch's tensors left in L2) and tuned with
tune_l2="cold" (the L2 flushed before each timed launch; before that option, session 16,
this probe patched autotune._time to the same effect); then both picks and cuBLAS in
alternating rounds with the L2 warm (`rounds`) and flushed (`rounds_cold_l2`). Outputs
guarded and checked after each tune.

    python benchmarks/probes/cold_tune_probe.py [--shapes MxNxK,...]"""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import checked_gemm, gemm_case, gemm_config_name, rounds, rounds_cold_l2, tune_cold  # noqa: E402

SHAPES = [(1, 4096, 4096), (8, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (144, 4096, 4096),
          (224, 4096, 4096), (16, 4096, 14336), (64, 14336, 4096), (256, 4096, 4096), (4096, 4096, 4096)]
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]


def main():
    import tilec
    src = open("examples/gemm.tile").read()
    tuned = {"warm-tuned": tilec.compile(src), "cold-tuned": tilec.compile(src, tune_l2="cold")}
    for M, N, K in SHAPES:
        a, b, ref, fns = gemm_case(M, N, K)
        picks = []
        for name, k in tuned.items():
            s, best = tune_cold(k, a, b, ref)
            print(f"{M}x{N}x{K} {name}: tuned in {s:.2f} s, pick {gemm_config_name(best)}", flush=True)
            label = f"{name} {gemm_config_name(best)}"
            if best in picks:
                print(f"  {M}x{N}x{K} {label}: the same pick", flush=True)
                continue
            picks.append(best)
            pick = tilec.compile(src, tune=False, **best)
            fns[label] = checked_gemm(pick, a, b, ref, name)[0]
        for label, timing in (("L2 warm", rounds), ("L2 flushed", rounds_cold_l2)):
            med = timing(fns, n=7)
            for m in fns:
                print(f"  {M}x{N}x{K} {label:10s} {m:36s} {med[m] * 1e3:8.1f} us  vs cuBLAS "
                      f"{med['cublas'] / med[m]:.3f}", flush=True)


if __name__ == "__main__":
    main()
