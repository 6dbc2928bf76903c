"""s2_space.py's layers over BK 32 / 64 / 128 and 2-6 stages (two consumer warpgroups)."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s2_space import layer

T = dict(BK=(32, 64, 128), STAGES=(2, 3, 4, 6), PRODUCER=(0, 1), PERSISTENT=(1,), WG=(2,), BN=(128,))
layer(56, 128, 128, 2, T)
layer(28, 128, 128, 1, T)
