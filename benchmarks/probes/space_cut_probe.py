"""What a cut of gemm.tile's tune space for large outputs would lose: at each shape, the
tuner's full tune (its `where` condition as shipped), then from its report the fastest
candidate overall against the fastest of those a cut keeps (BM >= 128, BN >= 128,
STAGES <= 4: the big tiles), and how many candidates each has. The candidates compile
once (they do not depend on the shape); each later shape is timing alone.

    python benchmarks/probes/space_cut_probe.py [--dtype f16]"""
import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.getcwd())

SHAPES = [(2048, 2048, 4096), (2048, 4096, 4096), (4096, 2048, 4096), (3072, 3072, 4096), (4095, 4097, 4096),
          (4096, 4096, 1024), (4096, 4096, 4096), (4096, 4096, 16384), (6144, 6144, 4096), (4096, 8192, 4096),
          (8192, 8192, 8192), (16384, 2048, 4096), (1536, 8192, 4096)]
LINE = re.compile(r"^  (BM=\d+ BN=\d+ STAGES=\d+ PRODUCER=\d PERSISTENT=\d STREAM_K=\d BK=\d+): ([0-9.]+) ms")


def kept(cfg: dict) -> bool:
    return cfg["BM"] >= 128 and cfg["BN"] >= 128 and cfg["STAGES"] <= 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="f16")
    args = ap.parse_args()
    import torch
    import tilec
    from tilec import autotune
    os.environ["TILEC_CACHE_DIR"] = tempfile.mkdtemp()
    dtype = getattr(torch, {"f16": "float16", "bf16": "bfloat16"}[args.dtype])
    src = open("examples/gemm.tile").read().replace("f16", args.dtype)
    k = tilec.compile(src)
    print("M x N x K, M*N / 2^20: candidates timed (kept by the cut), the fastest (pick), the fastest kept, "
          "kept / fastest", flush=True)
    for m, n, kk in SHAPES:
        autotune._CHOICES.clear()
        a = torch.randn(m, kk, device="cuda", dtype=dtype)
        b = torch.randn(kk, n, device="cuda", dtype=dtype)
        c = torch.empty(m, n, device="cuda", dtype=dtype)
        k(a, b, c)
        torch.cuda.synchronize()
        times = {}
        for line in k.tune_report().splitlines():
            hit = LINE.match(line)
            if hit:
                times[hit.group(1)] = float(hit.group(2))
        cfgs = {name: {kv.split("=")[0]: int(kv.split("=")[1]) for kv in name.split()} for name in times}
        best = min(times, key=times.get)
        inside = [name for name in times if kept(cfgs[name])]
        best_in = min(inside, key=times.get) if inside else None
        ratio = times[best_in] / times[best] if best_in else float("nan")
        print(f"{m}x{n}x{kk}, {m * n / 2 ** 20:.1f}: {len(times)} ({len(inside)}), {times[best]:.4f} ms ({best}), "
              f"{times[best_in] if best_in else float('nan'):.4f} ms ({best_in}), {ratio:.3f}", flush=True)
        del a, b, c


if __name__ == "__main__":
    main()
