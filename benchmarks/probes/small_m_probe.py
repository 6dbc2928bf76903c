"""gemm.tile as shipped on the shapes of LLM decode and small batches (M of 16-512
rows against N x K weights of 4096-14336): each shape tuned cold (fresh disk cache),
then the pick and cuBLAS timed in alternating rounds (bench.py's timing). With
`--without-bm64` the space without `BM = 64` (session 14's) is tuned beside it, as
session 15 first ran it (`--bm64` then, the other way round); with `--stages 3,4,8` the
space with those STAGES; with `--bn 64,128,256` the space with those BN. Outputs are views
with a sentinel margin, checked after the tune.

    python benchmarks/probes/small_m_probe.py [f16|bf16] [--without-bm64] [--shapes MxNxK,...] [--report] [--stages 3,4,8] [--bn 64,128,256]
"""
import os, re, sys
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import tuned_picks_vs_cublas

DT = "bf16" if "bf16" in sys.argv else "f16"
SHIPPED = open("examples/gemm.tile").read().replace("f16", DT)
SPACES = {"shipped": SHIPPED}
if "--without-bm64" in sys.argv:         # the space of session 14, beside the shipped one
    assert "tune BM in (64, 128, 192)" in SHIPPED
    SPACES = {"without BM 64": SHIPPED.replace("tune BM in (64, 128, 192)", "tune BM in (128, 192)"),
              "shipped": SHIPPED}
for i, arg in enumerate(sys.argv):
    for flag, name in (("--bn", "BN"), ("--stages", "STAGES")):    # the shipped space beside one with these values
        if arg == flag:
            new, n = re.subn(rf"\b{name} in \([^)]*\)", f"{name} in ({sys.argv[i + 1]})", SHIPPED)
            assert n == 1, name
            SPACES[f"{name} in ({sys.argv[i + 1]})"] = new
SHAPES = [(m, n, k) for m in (16, 64, 256, 512) for n, k in ((4096, 4096), (14336, 4096), (4096, 14336))]
for i, arg in enumerate(sys.argv):
    if arg == "--shapes":
        SHAPES = [tuple(int(x) for x in s.split("x")) for s in sys.argv[i + 1].split(",")]


tuned_picks_vs_cublas(SPACES, SHAPES, DT, n=7, report="--report" in sys.argv)
