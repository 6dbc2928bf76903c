import os, sys
src = open(os.path.join(os.path.dirname(__file__), "s2_space.py")).read().split("T = dict(")[0]
exec(compile(src, "s2_space", "exec"))
T = dict(STAGES=(4, 5, 6), PRODUCER=(1,), PERSISTENT=(1,), WG=(2,), BN=(128,))
layer(56, 128, 128, 2, T)
layer(28, 128, 128, 1, T)
