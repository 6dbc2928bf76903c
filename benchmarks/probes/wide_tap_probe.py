"""Can a 24-channel conv load a filter tap in one TMA im2col load instead of three?

conv2d.tile on C = 24 f16 channels (48 bytes a tap) loads each tap as three 16-byte
chunks (channelsPerPixel = 8), 27 loads per K of 128 pixels, and runs at ~0.6 of
cuDNN (benchmarks/NOTES.md, sessions 44-49: load-issue bound). One load of
channelsPerPixel = 32 at channel 0 would bring channels 24-31 as zeros (TMA fills
what lies past C), 9 loads a K, if the encode takes a box wider than C and such
loads are not slow (session 47 found loads wholly out of bounds slow).

1. Correctness: channelsPerPixel 32 over a 24-channel X. Does cuTensorMapEncodeIm2col
   take it, and does a load give X's 24 channels then 8 zeros (every tap, rows that
   cross images, taps in the padding)?
2. Speed: blocks walk the 128-pixel tiles of 128 x 56 x 56 x 24 (two tiles in
   flight each) loading all 9 taps of each: (a) 27 loads of 8 channels, (b) 9 loads
   of 32 channels over the 24, (c) 9 loads of 32 channels of a real 32-channel X
   (the same bytes, all in bounds); alternating rounds (common.rounds).

tilec's own NVRTC call, tensor-map encode and kernel launch do the driver work.

    python benchmarks/probes/wide_tap_probe.py"""
import ctypes
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import rounds  # noqa: E402
from tilec import TilecError  # noqa: E402
from tilec.runtime import driver, nvrtc, tensormap  # noqa: E402

SRC = r'''
struct __align__(64) CUtensorMap { unsigned long long opaque[16]; };

__device__ void load(unsigned dst, const CUtensorMap* tm, int c, int w, int h, int n, unsigned bar, int kw, int kh) {
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
               " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};"
               :: "r"(dst), "l"(tm), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar),
                  "h"((unsigned short)kw), "h"((unsigned short)kh) : "memory");
}

__device__ void wait(unsigned bar, unsigned parity) {
  asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W; }"
               :: "r"(bar), "r"(parity) : "memory");
}

// One tile's 9 taps into buffer `b`: `chunks` loads of `ch` channels a tap, each 128 pixels.
__device__ void issue(const CUtensorMap* tm, int t, int OW, int OHW, int chunks, int ch, unsigned base, unsigned bar) {
  int m0 = t * 128, n = m0 / OHW, r = m0 % OHW, oh = r / OW, ow = r % OW;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(9 * chunks * 128 * ch * 2));
  for (int tap = 0; tap < 9; ++tap)
    for (int c = 0; c < chunks; ++c)
      load(base + (tap * chunks + c) * 128 * ch * 2, tm, c * ch, ow - 1, oh - 1, n, bar, tap % 3, tap / 3);
}

// Correctness: one load, copied out.
extern "C" __global__ void one(const __grid_constant__ CUtensorMap tm, unsigned short* out, int c0, int w0, int h0,
                               int n0, int kw, int kh, int bytes) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar;
  unsigned sb = (unsigned)__cvta_generic_to_shared(&bar), ss = (unsigned)__cvta_generic_to_shared(smem);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(sb));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(sb), "r"(bytes));
    load(ss, &tm, c0, w0, h0, n0, sb, kw, kh);
  }
  wait(sb, 0);
  for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) out[i] = ((unsigned short*)smem)[i];
}

// Speed: every tile's taps, two tiles in flight a block.
extern "C" __global__ void walk(const __grid_constant__ CUtensorMap tm, int tiles, int OW, int OHW, int chunks,
                                int ch) {
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bars[2];
  unsigned base = (unsigned)__cvta_generic_to_shared(smem), size = 9 * 128 * 64;   // a buffer: 9 taps of 64 bytes
  unsigned b0 = (unsigned)__cvta_generic_to_shared(&bars[0]), b1 = (unsigned)__cvta_generic_to_shared(&bars[1]);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b0));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(b1));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  int it = 0;
  if (threadIdx.x == 0 && blockIdx.x < tiles) issue(&tm, blockIdx.x, OW, OHW, chunks, ch, base, b0);
  for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++it) {
    int next = t + gridDim.x, b = it & 1;
    if (threadIdx.x == 0 && next < tiles) issue(&tm, next, OW, OHW, chunks, ch, base + (b ^ 1) * size, b ? b0 : b1);
    wait(b ? b1 : b0, (it >> 1) & 1);
    __syncthreads();
  }
}
'''


WALK_SMEM = 2 * 9 * 128 * 64 + 1024      # two tiles' buffers of 9 taps x 128 pixels x 64 bytes


def kernels():
    """The probe's two kernels, loaded on device 0 (torch's primary context)."""
    torch.zeros(1, device="cuda")
    cubin = nvrtc.compile_cuda(SRC, "wide_tap", "sm_90a").cubin
    return {"one": driver.LoadedKernel(cubin, "one", 0, 128 * 64 + 1024),
            "walk": driver.LoadedKernel(cubin, "walk", 0, WALK_SMEM)}


def im2col_map(X, channels):
    """A 3x3, stride-1, pad-1 im2col map of NHWC X: boxes of 128 pixels x `channels`."""
    N, H, W, C = X.shape
    return tensormap.encode_im2col("X", "FLOAT16", 4, X.data_ptr(), (C, W, H, N), (C * 2, W * C * 2, H * W * C * 2),
                                   (-1, -1), (-1, -1), channels, 128, (1, 1, 1, 1), "NONE", "NONE", "NONE", "NONE")


def launcher(loaded, grid, smem, tm, *ints, ptr=None):
    """A function launching `loaded` on torch's stream with the map `tm`, then `ptr`, then `ints`."""
    vals = ([ctypes.c_void_p(ptr)] if ptr is not None else []) + [ctypes.c_int(v) for v in ints]
    params = (ctypes.c_void_p * (1 + len(vals)))(int(tm.getPtr()), *[ctypes.addressof(v) for v in vals])
    launch = driver.launcher(loaded, (grid, 1, 1), 128, smem, params, "probe")

    def run():
        launch(torch.cuda.current_stream().cuda_stream)
    run.keep = (vals, params)       # the launch reads them by address
    return run


def correctness(ks):
    torch.manual_seed(0)
    N, H, W, C = 2, 5, 7, 24
    X = torch.randn(N, H, W, C, device="cuda").half()
    try:
        tm = im2col_map(X, 32)
    except TilecError as e:
        print(f"cuTensorMapEncodeIm2col refuses channelsPerPixel 32 over 24 channels: {e}")
        return False
    Xn, good, cases = X.cpu().numpy(), 0, 0
    for m0 in (0, W - 1, H * W - 3, N * H * W - 5):
        for kh in range(3):
            for kw in range(3):
                out = torch.full((128 * 32,), -12345, dtype=torch.int16, device="cuda")
                n, r = divmod(m0, H * W)
                oh, ow = divmod(r, W)
                launcher(ks["one"], 1, 128 * 64 + 1024, tm, 0, ow - 1, oh - 1, n, kw, kh, 128 * 64,
                         ptr=out.data_ptr())()
                torch.cuda.synchronize()
                got = out.view(torch.float16).view(128, 32).cpu().numpy()
                want = np.zeros((128, 32), np.float16)
                rows = min(128, N * H * W - m0)        # rows past the last image: not compared
                for i in range(rows):
                    nn, rr = divmod(m0 + i, H * W)
                    y, x = divmod(rr, W)
                    hh, ww = y - 1 + kh, x - 1 + kw
                    if 0 <= hh < H and 0 <= ww < W:
                        want[i, :C] = Xn[nn, hh, ww]
                cases += 1
                good += np.array_equal(got[:rows], want[:rows])
    print(f"channelsPerPixel 32 over 24 channels: {good} of {cases} loads are X's channels, then zeros")
    return good == cases


def speed(ks):
    N, H, W = 128, 56, 56
    tiles = N * H * W // 128
    x24 = torch.randn(N, H, W, 24, device="cuda").half()
    x32 = torch.randn(N, H, W, 32, device="cuda").half()
    today = "27 loads of 8 channels (C = 24, today)"
    modes = {today: (im2col_map(x24, 8), 3, 8), "9 loads of 32 channels over C = 24": (im2col_map(x24, 32), 1, 32),
             "9 loads of 32 channels of C = 32": (im2col_map(x32, 32), 1, 32)}
    for grid in (132, 264):
        fns = {name: launcher(ks["walk"], grid, WALK_SMEM, tm, tiles, W, H * W, chunks, ch)
               for name, (tm, chunks, ch) in modes.items()}
        times = rounds(fns)
        for name, t in times.items():
            print(f"  {grid} blocks  {name:42s} {t * 1e3:8.1f} us  x{times[today] / t:.2f} of today's")


if __name__ == "__main__":
    ks = kernels()
    if correctness(ks):
        speed(ks)
