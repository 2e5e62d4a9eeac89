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

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <mutex>

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

// The dynamic shared memory limit one kernel was given on each device, in bytes (0: never
// raised). One per kernel, owned by its launcher as a function-local static.
struct SmemLimits {
  static constexpr int kDevices = 256;
  std::atomic<int> bytes[kDevices] = {};
};

// Lets `kernel` take `bytes` of dynamic shared memory (plus `reserved` bytes of static shared
// memory) on the current device. The limit is an attribute of the kernel on each device, and
// setting it is a driver call that waits for the device's queued work: per launch, it makes the
// host wait for the GPU (an idle gap before every launch). So it is raised only when a launch
// needs more than was set before (once per kernel and device in practice), under a lock, and
// never lowered, so that no thread lowers it between another's check and launch.
// `prefer_shared` also asks for the largest shared-memory carveout when raising it.
template <typename Kernel>
inline cudaError_t allow_smem(Kernel kernel, int bytes, int reserved, SmemLimits& limits,
                              bool prefer_shared = false) {
  if (bytes + reserved <= 48 * 1024) return cudaSuccess;
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  std::atomic<int>* have = device < SmemLimits::kDevices ? &limits.bytes[device] : nullptr;
  if (have != nullptr && have->load(std::memory_order_acquire) >= bytes) return cudaSuccess;
  static std::mutex lock;
  std::lock_guard<std::mutex> guard(lock);
  if (have != nullptr && have->load(std::memory_order_relaxed) >= bytes) return cudaSuccess;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status == cudaSuccess && prefer_shared)
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared);
  if (status == cudaSuccess && have != nullptr) have->store(bytes, std::memory_order_release);
  return status;
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
