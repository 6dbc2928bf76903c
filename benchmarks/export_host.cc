// Host time per call of an exported launcher (tilec export examples/copy2d.tile:
// tilec_copy2d on 64x128 f32, contiguous) beside cuMemcpyDtoDAsync of the same
// bytes on the same stream: the median of 10,000 calls' times, synchronising every
// 1,000 as bench.py's host_time_per_call does, in three alternating rounds.
// bench.py host builds and runs it; it prints "tilec_us memcpy_us" per round.
#include "copy2d.h"

#include "host_timing.h"

int main() {
  const CUstream stream = device0_stream();
  const int64_t shape[2] = {64, 128}, strides[2] = {128, 1};
  const size_t bytes = 64 * 128 * sizeof(float);
  std::vector<float> in(64 * 128), out(64 * 128);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  CUdeviceptr a, b;
  check(cuMemAlloc(&a, bytes), "cuMemAlloc");
  check(cuMemAlloc(&b, bytes), "cuMemAlloc");
  check(cuMemcpyHtoD(a, in.data(), bytes), "cuMemcpyHtoD");
  char err[512];
  auto tilec = [&] {
    if (tilec_copy2d(stream, a, shape, strides, b, shape, strides, err, sizeof err) != TILEC_OK || err[0]) {
      std::fprintf(stderr, "tilec_copy2d: %s\n", err);
      std::exit(1);
    }
  };
  auto memcpy_async = [&] { check(cuMemcpyDtoDAsync(b, a, bytes, stream), "cuMemcpyDtoDAsync"); };
  tilec();
  check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  check(cuMemcpyDtoH(out.data(), b, bytes), "cuMemcpyDtoH");
  if (out != in) {
    std::fprintf(stderr, "tilec_copy2d copied wrong values\n");
    return 1;
  }
  for (int round = 0; round < 3; ++round) {
    const double t = median_us(tilec, stream), m = median_us(memcpy_async, stream);
    std::printf("%.3f %.3f\n", t, m);
  }
  return 0;
}
