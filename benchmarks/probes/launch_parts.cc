// Where an exported launcher's host time goes (tilec_copy2d on 64x128 f32): the whole
// call, a raw cuLaunchKernel of the same cubin with maps encoded once, the two
// cuTensorMapEncodeTiled calls a launch makes, the pointer checks (cuCtxGetDevice +
// cuPointerGetAttributes per tensor, alone and after a raw launch) and cuCtxGetCurrent. Medians of 10,000 calls (a
// sync every 1,000), three rounds. Build beside an export of examples/copy2d.tile:
//   tilec export examples/copy2d.tile -o build
//   g++ -std=c++17 -O2 benchmarks/probes/launch_parts.cc build/copy2d.cc -Ibuild -I<cuda.h dir> -lcuda
//   ./a.out build/copy2d.cubin
#include "copy2d.h"

#include "../host_timing.h"

int main(int argc, char** argv) {
  if (argc < 2) return 1;
  const CUstream stream = device0_stream();
  int64_t shape[2] = {64, 128}, strides[2] = {128, 1};
  CUdeviceptr a, b;
  check(cuMemAlloc(&a, 64 * 128 * 4), "cuMemAlloc");
  check(cuMemAlloc(&b, 64 * 128 * 4), "cuMemAlloc");
  char err[512];
  auto whole = [&] {
    if (tilec_copy2d(stream, a, shape, strides, b, shape, strides, err, sizeof err) != TILEC_OK) std::exit(1);
  };
  CUtensorMap map_a, map_b;
  auto encode = [&](CUtensorMap& m, CUdeviceptr p) {
    const cuuint64_t dims[2] = {128, 64}, gstrides[1] = {512};
    const cuuint32_t box[2] = {128, 64}, es[2] = {1, 1};
    check(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, reinterpret_cast<void*>(p), dims, gstrides,
                                 box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
          "cuTensorMapEncodeTiled");
  };
  auto encodes = [&] { encode(map_a, a); encode(map_b, b); };
  encodes();
  CUmodule module;
  CUfunction f;
  check(cuModuleLoad(&module, argv[1]), "cuModuleLoad");
  check(cuModuleGetFunction(&f, module, "copy2d"), "cuModuleGetFunction");
  long long M = 64, N = 128;  // B_shape, B_strides: the parameters after the maps, as the launcher passes them
  long long sb0 = 128, sb1 = 1;
  void* params[] = {&map_a, &map_b, &b, &M, &N, &sb0, &sb1};
  auto raw = [&] { check(cuLaunchKernel(f, 1, 1, 1, 128, 1, 1, 32768, stream, params, nullptr), "launch"); };
  // the launcher's pointer checks: the first n of these attributes of each tensor's pointer
  auto query = [&](unsigned n) {
    for (CUdeviceptr p : {a, b}) {
      CUdevice d;
      unsigned type = 0, managed = 0;
      int ordinal = -1;
      CUdeviceptr start = 0;
      size_t size = 0;
      CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                     CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                     CU_POINTER_ATTRIBUTE_RANGE_SIZE};
      void* values[] = {&type, &managed, &ordinal, &start, &size};
      check(cuCtxGetDevice(&d), "cuCtxGetDevice");
      check(cuPointerGetAttributes(n, which, values, p), "cuPointerGetAttributes");
    }
  };
  auto pointers = [&] { query(5); };
  // the same after a launch, as in the launcher (all five attributes; the first three)
  auto raw_then_pointers = [&] { raw(); query(5); };
  auto raw_then_three = [&] { raw(); query(3); };
  auto current = [&] {
    CUcontext c;
    check(cuCtxGetCurrent(&c), "cuCtxGetCurrent");
  };
  std::printf("whole raw_launch two_encodes pointer_checks ctx_get_current raw+checks raw+3_attribute_checks (us)\n");
  for (int round = 0; round < 3; ++round)
    std::printf("%.3f %.3f %.3f %.3f %.3f %.3f %.3f\n", median_us(whole, stream), median_us(raw, stream),
                median_us(encodes, stream), median_us(pointers, stream), median_us(current, stream),
                median_us(raw_then_pointers, stream), median_us(raw_then_three, stream));
  return 0;
}
