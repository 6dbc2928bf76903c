"""s2_space.py's layers at 4, 5 and 6 stages (producer, persistent, two consumer warpgroups)."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s2_space import layer

T = dict(STAGES=(4, 5, 6), PRODUCER=(1,), PERSISTENT=(1,), WG=(2,), BN=(128,))
layer(56, 128, 128, 2, T)
layer(28, 128, 128, 1, T)
