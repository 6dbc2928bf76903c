"""tests/softmax.tile, tuned on the first call of each shape, against torch.softmax
(f16 in, f32 math, f16 out): ratio = torch time / tilec time (bench.compare's rounds),
and the config the tune chose (NOTES.md sessions 31-33). Each result is checked first.

    python benchmarks/probes/softmax_probe.py            (from the repository root, on a GPU)"""
import sys

sys.path.insert(0, "benchmarks")
import torch  # noqa: E402

import tilec  # noqa: E402
from bench import compare  # noqa: E402

SHAPES = ((8192, 1024), (4096, 4096), (32768, 512), (2048, 32768), (4096, 1000))

k = tilec.compile("tests/softmax.tile")
for m, n in SHAPES:
    x = torch.randn(m, n, device="cuda", dtype=torch.float16) * 4
    y = torch.empty_like(x)
    k(x, y)
    want = torch.softmax(x.float(), -1).half()
    torch.testing.assert_close(y.float(), want.float(), rtol=2e-3, atol=1e-5)
    _, _, r = compare(lambda: k(x, y), lambda: torch.softmax(x, -1))
    chosen = " ".join(f"{c}={v}" for c, v in k.best_config.items())
    print(f"{m}x{n}: {r:.3f} [{r.lo:.3f}-{r.hi:.3f}]  ({chosen})", flush=True)
