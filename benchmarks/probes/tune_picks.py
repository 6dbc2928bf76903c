"""How often gemm.tile's tuner picks each config at 8192^3 f16 (and bf16) under run-off settings
(rounds x burst): 6 tunes each, kernels compiled once (only the choice is cleared and the disk
cache fresh), so each tune is the timing alone."""
import collections
import os
import sys
import tempfile

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
import tilec  # noqa: E402
from tilec import autotune  # noqa: E402

N = 8192
for dt in ("f16", "bf16"):
    dtype = torch.float16 if dt == "f16" else torch.bfloat16
    a = torch.randn(N, N, device="cuda", dtype=dtype)
    b = torch.randn(N, N, device="cuda", dtype=dtype)
    c = torch.empty(N, N, device="cuda", dtype=dtype)
    src = open("examples/gemm.tile").read().replace("f16", dt)
    for rounds_, burst in ((5, 4), (10, 4), (5, 8), (10, 8)):
        autotune.RUNOFF_ROUNDS, autotune.RUNOFF_BURST = rounds_, burst
        picks = collections.Counter()
        for i in range(6):
            os.environ["TILEC_CACHE_DIR"] = tempfile.mkdtemp()
            autotune._CHOICES.clear()
            k = tilec.compile(src)          # the same TunedKernel each time: its candidates compiled once
            k._chosen.clear()
            k(a, b, c)
            torch.cuda.synchronize()
            cfg = k.best_config
            picks[f"{cfg['BM']}x{cfg['BN']}/{cfg['STAGES']} pr{cfg['PRODUCER']} pe{cfg['PERSISTENT']}"] += 1
        print(f"{N}^3 {dt} run-off {rounds_} rounds x {burst}: {dict(picks)}", flush=True)
