"""TMA's limits, defined once: the compiler checks the static ones at the copy's
line (passes/plan_tma.py), the launch the rest (runtime/tensormap.py), and the
interpreter models the same (tma-reference.md §2, §3)."""

MAX_BOX = 256                           # elements per box dim (tiled)
MAX_ELEMENT_STRIDE = 8
SWIZZLE_SPAN = {"none": None, "32B": 32, "64B": 64, "128B": 128}     # bytes of a swizzle pattern's row
# Not in NVIDIA's tables; the H100's driver refuses tiled boxes over 228 KiB
# (found by tests/test_gpu_validator.py: 233472 bytes encode, 233536 do not),
# counting box / element stride elements per dim, rounded down (seen on the H100:
# box 229 with element stride 2 counts 114).
MAX_TILED_BOX_BYTES = 228 * 1024
# im2col: pixel-box corner ranges per tensor rank, channels and pixels per load
CORNER_RANGE = {3: (-2**15, 2**15 - 1), 4: (-2**7, 2**7 - 1), 5: (-2**4, 2**4 - 1)}
MAX_CHANNELS_PER_PIXEL = 256
MAX_PIXELS_PER_COLUMN = 1024
MAX_IM2COL_LOAD_BYTES = 128 * 1024      # seen on the H100: larger im2col maps are refused by the driver
