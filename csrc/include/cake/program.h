// The C ABI every cake-train program exports (loaded through ctypes; no libtorch, no Python).
//
// A program is one shared library built from <library>_kernel.cu and <library>_binding.cu.
// Its binding exports, all with C linkage and named after the library:
//   const char* <library>_digest(void);      // the digest the build embedded (CAKE_PROGRAM_DIGEST)
//   int         <library>_abi_version(void); // CAKE_ABI_VERSION
//   int         <library>_<entry>(const int64_t* args, int32_t nargs, void* stream,
//                                 char* error, int32_t error_len);
// Entries take their arguments as one int64 array (pointers, sizes, flags, in an order the
// family's Python side and binding agree on), launch on `stream` and return 0, or write a
// one-line message into `error` and return non-zero. They never allocate or synchronize.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

#define CAKE_ABI_VERSION 1
#define CAKE_EXPORT extern "C" __attribute__((visibility("default")))

#ifndef CAKE_PROGRAM_DIGEST
#error "CAKE_PROGRAM_DIGEST must be defined by the build (the program's manifest digest)"
#endif

namespace cake {

enum Status : int { kOk = 0, kInvalidArgument = 1, kCudaError = 2 };

// Writes a formatted message into the caller's buffer and returns `status`.
inline int fail(char* error, int32_t error_len, int status, const char* format, ...) {
  if (error != nullptr && error_len > 0) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(error, static_cast<size_t>(error_len), format, args);
    va_end(args);
  }
  return status;
}

// Reports the last launch error, if any, as kCudaError.
inline int launch_status(char* error, int32_t error_len, const char* what) {
  cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) return kOk;
  return fail(error, error_len, kCudaError, "%s: %s", what, cudaGetErrorString(status));
}

// Typed view of an entry's int64 argument array.
struct Args {
  const int64_t* values;
  int32_t count;
  template <typename T>
  T* ptr(int i) const { return reinterpret_cast<T*>(static_cast<intptr_t>(values[i])); }
  int64_t i64(int i) const { return values[i]; }
};

}  // namespace cake
