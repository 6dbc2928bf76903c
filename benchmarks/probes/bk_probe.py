import os, sys
sys.argv = [sys.argv[0]]
src = open(os.path.join(os.path.dirname(__file__), "s2_space.py")).read()
src = src.split("T = dict(")[0]
exec(compile(src, "s2_space", "exec"))
T = dict(BK=(32, 64, 128), STAGES=(2, 3, 4, 6), PRODUCER=(0, 1), PERSISTENT=(1,), WG=(2,), BN=(128,))
layer(56, 128, 128, 2, T)
layer(28, 128, 128, 1, T)
