// Toy family for the build tests: scales a float vector. Not a product kernel.
#include "cake/program.h"

// cake:params
#define TOY_SCALE 2.0f
// cake:end-params

__global__ void kernel_cake_library_forward(float* x, int64_t n) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= TOY_SCALE;
}
