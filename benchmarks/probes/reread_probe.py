"""A block that reads what it stored: A[k + 1] = A[k] + 1 down a loop (`range` or
`pipelined`), y shared (TMA stores) or local (thread stores), 20 runs each; prints
how many runs came out wrong (NOTES.md session 29: before Kernel.rereads, the
pipelined loop rotated and was wrong in 20 of 20 runs on the H100).

    python benchmarks/probes/reread_probe.py            (from the repository root, on a GPU)"""
import sys

sys.path.insert(0, "tests")
import torch  # noqa: E402

import tilec  # noqa: E402
from test_rotate import chain  # noqa: E402     the kernel of tests/test_rotate.py and test_gpu_rereads.py

want = torch.arange(64, device="cuda", dtype=torch.float32)[:, None, None].expand(64, 64, 256)
for ydecl in ("shared", "local"):
    for loop in ("range(K - 1)", "pipelined(K - 1, stages = 2)"):
        k = tilec.compile(chain(ydecl).replace("pipelined(K - 1, stages = 2)", loop))
        wrong = 0
        for _ in range(20):
            a = torch.zeros(64, 64, 256, device="cuda")
            k(a)
            torch.cuda.synchronize()
            wrong += int(not torch.equal(a, want))
        print(f"y {ydecl}, {loop}: {wrong} of 20 runs wrong", flush=True)
