// Host timing for the C++ benchmarks (export_host.cc, probes/launch_parts.cc): a driver
// call checked, and the median host time of a call as bench.py's host_time_per_call
// takes it (100 warm-up calls, then 10,000 timed, a stream sync every 1,000).
#pragma once

#include <cuda.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

inline void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = "?";
  cuGetErrorName(r, &name);
  std::fprintf(stderr, "%s failed: %s\n", what, name);
  std::exit(2);
}

template <class Call>
double median_us(Call call, CUstream stream) {
  for (int i = 0; i < 100; ++i) call();
  check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  std::vector<double> us;
  us.reserve(10000);
  for (int i = 0; i < 10000; ++i) {
    const auto t = std::chrono::steady_clock::now();
    call();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
    if (us.size() % 1000 == 0) check(cuStreamSynchronize(stream), "cuStreamSynchronize");
  }
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  return us[us.size() / 2];
}

// The primary context of device 0 made current, and a non-blocking stream on it.
inline CUstream device0_stream() {
  CUdevice device;
  CUcontext ctx;
  CUstream stream;
  check(cuInit(0), "cuInit");
  check(cuDeviceGet(&device, 0), "cuDeviceGet");
  check(cuDevicePrimaryCtxRetain(&ctx, device), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  check(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return stream;
}
