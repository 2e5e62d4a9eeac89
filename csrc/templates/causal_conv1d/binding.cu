// C entry points of a causal conv1d program (see cake/program.h for the ABI).
//
//   forward          (10 args): x, weight, bias, cu_seqlens, y, tokens, channels, num_docs,
//                               doc_len, weight_fp32
//   backward         (16 args): x, weight, bias, cu_seqlens, dy, dx, dweight, dbias, workspace,
//                               workspace_bytes, tokens, channels, num_docs, doc_len,
//                               weight_fp32, grad_fp32
//   workspace_bytes  (3 args):  tokens, channels, pointer to a host int64 that receives the
//                               backward's workspace size in bytes (no launch; stream unused)
// Pointers are device addresses (0 for none) except workspace_bytes' output. Without
// cu_seqlens the tokens are documents of doc_len tokens each. The checks and launches live
// next to the kernels (the kernel source); these entries only adapt the ABI.
#include <cstdint>

#include "cake/program.h"

// cake:params
// cake:end-params

namespace cake_library_ns {
int forward(const cake::Args& a, cudaStream_t stream, char* error, int32_t error_len);
int backward(const cake::Args& a, cudaStream_t stream, char* error, int32_t error_len);
int query_workspace_bytes(const cake::Args& a, char* error, int32_t error_len);
}  // namespace cake_library_ns

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }

CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_EXPORT int cake_library_forward(const int64_t* args, int32_t nargs, void* stream, char* error,
                                     int32_t error_len) {
  if (args == nullptr) return cake::fail(error, error_len, cake::kInvalidArgument, "args is null");
  return cake_library_ns::forward(cake::Args{args, nargs}, static_cast<cudaStream_t>(stream),
                                  error, error_len);
}

CAKE_EXPORT int cake_library_backward(const int64_t* args, int32_t nargs, void* stream,
                                      char* error, int32_t error_len) {
  if (args == nullptr) return cake::fail(error, error_len, cake::kInvalidArgument, "args is null");
  return cake_library_ns::backward(cake::Args{args, nargs}, static_cast<cudaStream_t>(stream),
                                   error, error_len);
}

CAKE_EXPORT int cake_library_workspace_bytes(const int64_t* args, int32_t nargs, void* stream,
                                             char* error, int32_t error_len) {
  (void)stream;
  if (args == nullptr) return cake::fail(error, error_len, cake::kInvalidArgument, "args is null");
  return cake_library_ns::query_workspace_bytes(cake::Args{args, nargs}, error, error_len);
}
