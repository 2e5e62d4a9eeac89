// C entry points of an RMSNorm program (see cake/program.h for the ABI and
// cake/rmsnorm_binding.cuh for the argument layouts and checks):
//   forward (12 args), backward (17 args), workspace_bytes (3 args).
#include <cstdint>

#include "cake/program.h"
#include "cake/rmsnorm_binding.cuh"

// cake:params
#define CAKE_DTYPE 0
#define CAKE_VECTOR 1
#define CAKE_GATED 0
#define CAKE_COLS_MIN 1
#define CAKE_COLS_MAX 16384
// cake:end-params

cudaError_t cake_library_launch_forward(const cake::rmsnorm::ForwardParams& p, cudaStream_t stream);
cudaError_t cake_library_launch_backward(const cake::rmsnorm::BackwardParams& p, int64_t ctas,
                                         cudaStream_t stream);
cudaError_t cake_library_launch_dweight(const cake::rmsnorm::DweightParams& p, cudaStream_t stream);
cake::rmsnorm::BackwardPartition cake_library_backward_partition(int64_t rows, int cols);

namespace {

constexpr int kElemBytes = CAKE_DTYPE == 2 ? 4 : 2;
constexpr cake::rmsnorm::ProgramShape kShape{kElemBytes, CAKE_VECTOR ? 16 / kElemBytes : 1, CAKE_GATED != 0,
                                              CAKE_COLS_MIN, CAKE_COLS_MAX};
constexpr cake::rmsnorm::Launchers kLaunchers{cake_library_launch_forward, cake_library_launch_backward,
                                              cake_library_launch_dweight,
                                              cake_library_backward_partition};

}  // namespace

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }

CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_EXPORT int cake_library_forward(const int64_t* args, int32_t nargs, void* stream, char* error,
                                     int32_t error_len) {
  return cake::rmsnorm::forward_entry(kShape, kLaunchers, args, nargs, stream, error, error_len);
}

CAKE_EXPORT int cake_library_backward(const int64_t* args, int32_t nargs, void* stream, char* error,
                                      int32_t error_len) {
  return cake::rmsnorm::backward_entry(kShape, kLaunchers, args, nargs, stream, error, error_len);
}

CAKE_EXPORT int cake_library_workspace_bytes(const int64_t* args, int32_t nargs, void* stream,
                                             char* error, int32_t error_len) {
  (void)stream;
  return cake::rmsnorm::workspace_entry(kShape, kLaunchers, args, nargs, error, error_len);
}
