"""Same process: conv2d.tile 128x128, producer, persistent, 3-6 stages, as emitted vs with the
producer's K loop free of per-step divisions (hoist.py), on the s2 layer and 28x28 C128; vs
cuDNN. `--sass` (no GPU): the producer loop's SASS instruction count for each variant."""
import os, sys
os.environ["TILEC_CACHE"] = "0"
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilec
from common import rewrite_cuda
from hoist import hoist

SRC = open("examples/conv2d.tile").read()
PATCH = rewrite_cuda()


def kernels(s):
    ks = {}
    for st in (3, 4, 5, 6):
        for h in (False, True):
            PATCH["fn"] = hoist if h else None
            ks[f"S{st}{' hoisted' if h else ''}"] = tilec.compile(
                f"// hoist probe {s} {st} {h}\n" + SRC, tune=False,
                S=s, BM=128, BN=128, STAGES=st, PRODUCER=1, PERSISTENT=1)
    return ks


def layer(name, hw, s):
    import torch
    from common import Conv, versus_cudnn
    torch.backends.cudnn.benchmark = True
    versus_cudnn(Conv(hw, 128, 128, 3, s), kernels(s), name)


if __name__ == "__main__":
    if "--sass" in sys.argv:
        import subprocess, tempfile
        nvd = sys.argv[sys.argv.index("--sass") + 1]
        for v, k in kernels(2).items():
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(k.cubin); f.flush()
                sass = subprocess.run([nvd, "-c", f.name], capture_output=True, text=True).stdout
            lines = [l for l in sass.splitlines() if "/*" in l and ";" in l]
            i = next(j for j, l in enumerate(lines) if "USETMAXREG.DEALLOC" in l)
            prod = lines[i:]
            j = next(j for j, l in enumerate(prod) if "EXIT" in l and j > 5 and "@!P0" in l)
            print(v, "producer instructions (setmaxnreg to exit)", j)
        sys.exit(0)
    layer("s2", 56, 2)
    layer("28x28", 28, 1)
