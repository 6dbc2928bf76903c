"""A longer hunt than test_random_programs' GPU test: random programs on the GPU against
the interpreter, seed and count from argv, each program logged before it runs to
$OUT/hunt_SEED.log (or /tmp), with the launches; a CUDA fault ends the process naming
the program (CUDA_LAUNCH_BLOCKING=1), other failures are logged and the hunt goes on.

    python tests/hunt_random_programs.py 11 500      (on the GPU machine, from the repo root)
    python tests/hunt_random_programs.py 11 500 gemm (gemm programs only; `conv`: convolutions)
    python tests/hunt_random_programs.py 11 500 gemm halves (of 500 drawn, only those whose
        template sets `halves`: a rare form, hunted on its own)

Session 22's findings with it: tests/random_programs_findings.md."""
import os
import sys
os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
sys.path.insert(0, "tests")
import test_random_programs as t  # noqa: E402
from hypothesis import given, seed as hseed, settings  # noqa: E402
from random_programs import conv_program, gemm_program, program  # noqa: E402

LOG = os.path.join(os.environ.get("OUT", "/tmp"), f"hunt_{sys.argv[1]}.log")
from tilec.runtime import host  # noqa: E402
_launch = host.Call.launch


def logged_launch(self, grid, *a, **kw):
    with open(LOG, "a") as f:
        f.write(f"  launch {self.kernel_name} grid {grid} fallback-variant={self.fallback is None}\n")
    return _launch(self, grid, *a, **kw)


host.Call.launch = logged_launch
count = [0, 0]


ONLY = (sys.argv[4:] or [""])[0]   # a template flag: run only the programs that set it
skipped = [0]


def body(p):
    if ONLY and not getattr(p.template, ONLY):
        skipped[0] += 1
        return
    count[0] += 1
    with open(LOG, "a") as f:
        f.write(f"=== #{count[0]}{t.describe(p)}\n")
    try:
        t.run_gpu(p)
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"
        if "CUDA error" in msg or "illegal" in msg.lower() or "CUDA_ERROR" in msg:
            with open(LOG, "a") as f:
                f.write(f"FAULT in #{count[0]}: {msg}\n")
            print(f"seed {sys.argv[1]}: FAULT in #{count[0]}", flush=True)
            os._exit(3)
        count[1] += 1
        with open(LOG, "a") as f:
            f.write(f"FAIL #{count[0]}: {msg[:3000]}\n")


strategy = {"gemm": gemm_program, "conv": conv_program}.get((sys.argv[3:] or [""])[0], program)()
hseed(int(sys.argv[1]))(settings(max_examples=int(sys.argv[2]), **t.SETTINGS)(given(strategy)(body)))()
print(f"seed {sys.argv[1]}: ran {count[0]}, failed {count[1]}"
      + (f" (skipped {skipped[0]} without {ONLY})" if ONLY else ""), flush=True)
