// Toy family for the build tests: the C entry points of one program.
#include "cake/program.h"

// cake:params
// cake:end-params

__global__ void kernel_cake_library_forward(float* x, int64_t n);

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }

CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_EXPORT int cake_library_forward(const int64_t* args, int32_t nargs, void* stream,
                                     char* error, int32_t error_len) {
  if (nargs != 2) {
    return cake::fail(error, error_len, cake::kInvalidArgument, "expected 2 arguments, got %d",
                      nargs);
  }
  cake::Args a{args, nargs};
  float* x = a.ptr<float>(0);
  int64_t n = a.i64(1);
  if (n < 0 || (n > 0 && x == nullptr)) {
    return cake::fail(error, error_len, cake::kInvalidArgument, "bad x/n");
  }
  if (n == 0) return cake::kOk;
  kernel_cake_library_forward<<<static_cast<unsigned>((n + 255) / 256), 256, 0,
                                static_cast<cudaStream_t>(stream)>>>(x, n);
  return cake::launch_status(error, error_len, "toy forward");
}
