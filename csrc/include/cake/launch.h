// Host-side launch helpers shared by the kernel templates (no ABI, no digest: kernel sources
// that are compiled on their own, as the spill tests do, can include it).
#pragma once

#include <atomic>
#include <mutex>

#include <cuda_runtime.h>

namespace cake {

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
// never lowered, so that no thread lowers it between another's check and launch (devices
// numbered past SmemLimits::kDevices are not remembered: set on every such launch).
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

}  // namespace cake
