// The CUDA driver API as program libraries use it: no CUDA runtime and no CUDA headers.
//
// A program library embeds its device code (one image per kernel source: a compressed fatbin
// or a cubin, see cake/image.h) and launches through libcuda.so.1, which it opens at first use:
//   - the driver is opened, and the images are loaded (cuLibraryLoadData, context-independent),
//     once per process, whichever thread calls first;
//   - a kernel is looked up by name once (cuLibraryGetKernel);
//   - per-device work (raising a kernel's dynamic shared-memory limit) is done once per device;
//   - launches go to the caller's stream with cuLaunchKernel, in the thread's current context;
//     a thread without one gets the context the CUDA runtime would give it (ensure_context).
// A driver error becomes the entry's status (kCudaError) with a message naming the driver call,
// the driver's error name and the kernel. Host-only C++ (no exceptions, no RTTI, no libstdc++
// symbols): the library's NEEDED list is libc alone.
#pragma once

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <atomic>

#include "cake/program.h"

// Bind dlopen/dlsym/dlerror to glibc's oldest versions of them, not to the GLIBC_2.34 ones that
// a build on a newer glibc picks (glibc 2.34 moved them from libdl into libc): with this the
// library's newest glibc symbol is GLIBC_2.2.5 (x86_64) or GLIBC_2.17 (aarch64), so its wheel
// can be manylinux_2_28 like torch's. Before glibc 2.34 these versions live in libdl.so.2,
// which every CPython on such a glibc has loaded; from 2.34 on, libc.so.6 still exports them.
#if defined(__x86_64__)
#define CAKE_GLIBC_BASE_VERSION "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define CAKE_GLIBC_BASE_VERSION "GLIBC_2.17"
#endif
#ifdef CAKE_GLIBC_BASE_VERSION
__asm__(".symver dlopen,dlopen@" CAKE_GLIBC_BASE_VERSION);
__asm__(".symver dlsym,dlsym@" CAKE_GLIBC_BASE_VERSION);
__asm__(".symver dlerror,dlerror@" CAKE_GLIBC_BASE_VERSION);
#endif

namespace cake {

// The few driver types and constants used here (values from the CUDA driver API, cuda.h).
namespace cu {
using Result = int;
using Device = int;
using Context = struct ContextHandle*;
using Library = struct LibraryHandle*;
using Kernel = struct KernelHandle*;
using Function = struct FunctionHandle*;
using Stream = struct StreamHandle*;
constexpr Result kSuccess = 0;
// The legacy and per-thread default streams' handles (0 is the legacy one too).
inline const Stream kStreamLegacy = reinterpret_cast<Stream>(0x1);
inline const Stream kStreamPerThread = reinterpret_cast<Stream>(0x2);
constexpr int kFuncAttributeMaxDynamicSharedSize = 8;
constexpr int kFuncAttributePreferredSharedCarveout = 9;
constexpr int kSharedCarveoutMaxShared = 100;
constexpr int kDeviceAttributeMultiprocessorCount = 16;
}  // namespace cu

// Grid or block extents.
struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// The driver entry points, resolved once from libcuda.so.1.
struct Driver {
  cu::Result (*init)(unsigned);
  cu::Result (*get_error_name)(cu::Result, const char**);
  cu::Result (*ctx_get_device)(cu::Device*);
  cu::Result (*ctx_get_current)(cu::Context*);
  cu::Result (*ctx_set_current)(cu::Context);
  cu::Result (*stream_get_ctx)(cu::Stream, cu::Context*);
  cu::Result (*device_get)(cu::Device*, int);
  cu::Result (*device_primary_ctx_retain)(cu::Context*, cu::Device);
  cu::Result (*device_get_attribute)(int*, int, cu::Device);
  cu::Result (*library_load_data)(cu::Library*, const void*, void*, void**, unsigned, void*, void**,
                                  unsigned);
  cu::Result (*library_get_kernel)(cu::Kernel*, cu::Library, const char*);
  cu::Result (*kernel_set_attribute)(int, int, cu::Kernel, cu::Device);
  cu::Result (*occupancy_max_active_blocks)(int*, cu::Function, int, size_t);
  cu::Result (*launch_kernel)(cu::Function, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, cu::Stream, void**, void**);
};

// The error of one driver call as an entry status: "<what>: <call> failed: CUDA_ERROR_... (n)".
inline int driver_fail(const Driver* driver, cu::Result result, const char* call, const char* what,
                       char* error, int32_t error_len) {
  const char* name = nullptr;
  if (driver == nullptr || driver->get_error_name == nullptr ||
      driver->get_error_name(result, &name) != cu::kSuccess || name == nullptr)
    name = "unknown CUDA driver error";
  return fail(error, error_len, kCudaError, "%s: %s failed: %s (%d)", what, call, name, result);
}

namespace detail {

// One lock for the library's first-use work (it is rare; launches never take it).
inline pthread_mutex_t* first_use_lock() {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  return &lock;
}

struct Guard {
  explicit Guard(pthread_mutex_t* lock) : lock_(lock) { pthread_mutex_lock(lock_); }
  ~Guard() { pthread_mutex_unlock(lock_); }
  pthread_mutex_t* lock_;
};

template <typename F>
inline bool resolve(void* handle, const char* name, F& slot) {
  slot = reinterpret_cast<F>(dlsym(handle, name));
  return slot != nullptr;
}

}  // namespace detail

// The images of this library (defined by cake/image.h in the binding).
extern "C" const unsigned char* const cake_program_images[];
extern "C" const int cake_program_image_count;

// The library's state: the driver and the loaded images, made by the first call of any entry.
class Program {
 public:
  // A program has at most 31 kernel sources (the build's step limit, CMakeLists.txt).
  static constexpr int kMaxImages = 31;

  // The driver with every image loaded, or null after writing the reason into `error`.
  static const Program* get(char* error, int32_t error_len) {
    static Program program;  // constant-initialized: no guard, no libstdc++
    if (program.ready_.load(std::memory_order_acquire)) return &program;
    detail::Guard guard(detail::first_use_lock());
    if (!program.ready_.load(std::memory_order_relaxed)) {
      const int status = program.load(error, error_len);
      if (status != kOk) return nullptr;
      program.ready_.store(true, std::memory_order_release);
    }
    return &program;
  }

  const Driver& driver() const { return driver_; }

  // The kernel `name` from the first image that holds it.
  int find_kernel(const char* name, cu::Kernel* kernel, char* error, int32_t error_len) const {
    cu::Result result = cu::kSuccess;
    for (int i = 0; i < image_count_; ++i) {
      result = driver_.library_get_kernel(kernel, libraries_[i], name);
      if (result == cu::kSuccess) return kOk;
    }
    return driver_fail(&driver_, result, "cuLibraryGetKernel", name, error, error_len);
  }

  constexpr Program() = default;

 private:
  int load(char* error, int32_t error_len) {
    void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr)
      return fail(error, error_len, kCudaError,
                  "cannot open the NVIDIA driver (libcuda.so.1): %s", dlerror());
    Driver d{};
    if (!detail::resolve(handle, "cuInit", d.init) ||
        !detail::resolve(handle, "cuGetErrorName", d.get_error_name) ||
        !detail::resolve(handle, "cuCtxGetDevice", d.ctx_get_device) ||
        !detail::resolve(handle, "cuCtxGetCurrent", d.ctx_get_current) ||
        !detail::resolve(handle, "cuCtxSetCurrent", d.ctx_set_current) ||
        !detail::resolve(handle, "cuStreamGetCtx", d.stream_get_ctx) ||
        !detail::resolve(handle, "cuDeviceGet", d.device_get) ||
        !detail::resolve(handle, "cuDevicePrimaryCtxRetain", d.device_primary_ctx_retain) ||
        !detail::resolve(handle, "cuDeviceGetAttribute", d.device_get_attribute) ||
        !detail::resolve(handle, "cuLibraryLoadData", d.library_load_data) ||
        !detail::resolve(handle, "cuLibraryGetKernel", d.library_get_kernel) ||
        !detail::resolve(handle, "cuKernelSetAttribute", d.kernel_set_attribute) ||
        !detail::resolve(handle, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                         d.occupancy_max_active_blocks) ||
        !detail::resolve(handle, "cuLaunchKernel", d.launch_kernel))
      return fail(error, error_len, kCudaError,
                  "the NVIDIA driver (libcuda.so.1) lacks %s: it predates CUDA 12.0; update the "
                  "driver", dlerror());
    cu::Result result = d.init(0);
    if (result != cu::kSuccess) return driver_fail(&d, result, "cuInit", "driver", error, error_len);
    if (cake_program_image_count > kMaxImages)
      return fail(error, error_len, kCudaError, "%d images, at most %d", cake_program_image_count,
                  kMaxImages);
    for (int i = 0; i < cake_program_image_count; ++i) {
      result = d.library_load_data(&libraries_[i], cake_program_images[i], nullptr, nullptr, 0,
                                   nullptr, nullptr, 0);
      if (result != cu::kSuccess)
        return driver_fail(&d, result, "cuLibraryLoadData", "program image", error, error_len);
    }
    image_count_ = cake_program_image_count;
    driver_ = d;
    return kOk;
  }

  std::atomic<bool> ready_{false};
  Driver driver_{};
  cu::Library libraries_[kMaxImages] = {};
  int image_count_ = 0;
};

// One kernel of the library: looked up once, its shared-memory limit raised once per device.
// Declared as a function-local or namespace-scope static (constant-initialized).
class Kernel {
 public:
  static constexpr int kDevices = 256;

  // The handle, looked up on first use; `name` is the kernel's symbol in the image.
  int handle(const Program& program, const char* name, cu::Kernel* out, char* error,
             int32_t error_len) {
    cu::Kernel found = handle_.load(std::memory_order_acquire);
    if (found == nullptr) {
      detail::Guard guard(detail::first_use_lock());
      found = handle_.load(std::memory_order_relaxed);
      if (found == nullptr) {
        const int status = program.find_kernel(name, &found, error, error_len);
        if (status != kOk) return status;
        handle_.store(found, std::memory_order_release);
      }
    }
    *out = found;
    return kOk;
  }

  // Lets the kernel take `bytes` of dynamic shared memory on the current device. Raising the
  // limit is a driver call that waits for the device's queued work, so it is done only when a
  // launch needs more than was set before (once per kernel and device in practice), and never
  // lowered, so that no thread lowers it between another's check and launch. Devices past
  // kDevices are not remembered (set on every such launch).
  int allow_smem(const Program& program, cu::Kernel kernel, const char* name, int bytes,
                 bool prefer_shared, char* error, int32_t error_len) {
    const Driver& d = program.driver();
    cu::Device device = 0;
    cu::Result result = d.ctx_get_device(&device);
    if (result != cu::kSuccess)
      return driver_fail(&d, result, "cuCtxGetDevice", name, error, error_len);
    std::atomic<int>* have = device >= 0 && device < kDevices ? &smem_[device] : nullptr;
    if (have != nullptr && have->load(std::memory_order_acquire) >= bytes) return kOk;
    detail::Guard guard(detail::first_use_lock());
    if (have != nullptr && have->load(std::memory_order_relaxed) >= bytes) return kOk;
    result = d.kernel_set_attribute(cu::kFuncAttributeMaxDynamicSharedSize, bytes, kernel, device);
    if (result == cu::kSuccess && prefer_shared)
      result = d.kernel_set_attribute(cu::kFuncAttributePreferredSharedCarveout,
                                      cu::kSharedCarveoutMaxShared, kernel, device);
    if (result != cu::kSuccess)
      return driver_fail(&d, result, "cuKernelSetAttribute", name, error, error_len);
    if (have != nullptr) have->store(bytes, std::memory_order_release);
    return kOk;
  }

  constexpr Kernel() = default;

 private:
  std::atomic<cu::Kernel> handle_{nullptr};
  std::atomic<int> smem_[kDevices] = {};
};

// Makes a context current on the calling thread when it has none, as the CUDA runtime does at a
// thread's first call: `stream`'s context, or for a default stream the primary context of
// device 0. A thread has none until its first runtime call that needs one, and torch skips
// cudaSetDevice(0) on a thread whose runtime device is already 0: autograd's backward thread
// reaches an entry so. A thread that set another device has that device's context current
// (cudaSetDevice makes it current since CUDA 12), so "none" means the runtime's device is 0.
inline int ensure_context(const Driver& d, void* stream, const char* name, char* error,
                          int32_t error_len) {
  cu::Context context = nullptr;
  cu::Result result = d.ctx_get_current(&context);
  if (result != cu::kSuccess)
    return driver_fail(&d, result, "cuCtxGetCurrent", name, error, error_len);
  if (context != nullptr) return kOk;
  const cu::Stream handle = static_cast<cu::Stream>(stream);
  if (handle != nullptr && handle != cu::kStreamLegacy && handle != cu::kStreamPerThread) {
    result = d.stream_get_ctx(handle, &context);
    if (result != cu::kSuccess)
      return driver_fail(&d, result, "cuStreamGetCtx", name, error, error_len);
  } else {
    cu::Device device = 0;
    result = d.device_get(&device, 0);
    if (result == cu::kSuccess) result = d.device_primary_ctx_retain(&context, device);
    if (result != cu::kSuccess)
      return driver_fail(&d, result, "cuDevicePrimaryCtxRetain", name, error, error_len);
  }
  result = d.ctx_set_current(context);
  if (result != cu::kSuccess)
    return driver_fail(&d, result, "cuCtxSetCurrent", name, error, error_len);
  return kOk;
}

// A kernel ready to launch on the current device: looked up, its shared-memory limit raised.
struct Prepared {
  const Program* program;
  cu::Kernel kernel;
};

// Prepares `name` (its Kernel slot `slot`) for launches on `stream` with `smem` bytes of dynamic
// shared memory: the thread gets a current context if it has none; above the 48 KiB default
// (plus `reserved` bytes of static shared memory) the kernel's limit is raised first;
// `prefer_shared` also asks for the largest shared-memory carveout then.
inline int prepare(Kernel& slot, const char* name, int smem, int reserved, bool prefer_shared,
                   void* stream, Prepared* out, char* error, int32_t error_len) {
  out->program = Program::get(error, error_len);
  if (out->program == nullptr) return kCudaError;
  int status = ensure_context(out->program->driver(), stream, name, error, error_len);
  if (status != kOk) return status;
  status = slot.handle(*out->program, name, &out->kernel, error, error_len);
  if (status != kOk || smem + reserved <= 48 * 1024) return status;
  return slot.allow_smem(*out->program, out->kernel, name, smem, prefer_shared, error, error_len);
}

// Launches a prepared kernel with `params` (one pointer per kernel parameter) on `stream`.
inline int launch_prepared(const Prepared& prepared, const char* name, Dim3 grid, Dim3 block,
                           int smem, void* stream, void** params, char* error, int32_t error_len) {
  const Driver& d = prepared.program->driver();
  const cu::Result result =
      d.launch_kernel(reinterpret_cast<cu::Function>(prepared.kernel), grid.x, grid.y, grid.z,
                      block.x, block.y, block.z, static_cast<unsigned>(smem),
                      static_cast<cu::Stream>(stream), params, nullptr);
  if (result != cu::kSuccess) return driver_fail(&d, result, "cuLaunchKernel", name, error, error_len);
  return kOk;
}

// prepare, then launch_prepared.
inline int launch(Kernel& slot, const char* name, Dim3 grid, Dim3 block, int smem, void* stream,
                  void** params, char* error, int32_t error_len, int reserved = 0,
                  bool prefer_shared = false) {
  Prepared prepared{};
  const int status =
      prepare(slot, name, smem, reserved, prefer_shared, stream, &prepared, error, error_len);
  if (status != kOk) return status;
  return launch_prepared(prepared, name, grid, block, smem, stream, params, error, error_len);
}

// The CTAs of a prepared kernel at `threads` threads and `smem` bytes that the current device
// holds at once (its SM count times the CTAs an SM holds): what a persistent grid launches.
inline int wave_size(const Prepared& prepared, const char* name, int threads, int smem,
                     int64_t* ctas, char* error, int32_t error_len) {
  const Driver& d = prepared.program->driver();
  cu::Device device = 0;
  int sms = 0, per_sm = 0;
  cu::Result result = d.ctx_get_device(&device);
  if (result != cu::kSuccess) return driver_fail(&d, result, "cuCtxGetDevice", name, error, error_len);
  result = d.device_get_attribute(&sms, cu::kDeviceAttributeMultiprocessorCount, device);
  if (result != cu::kSuccess)
    return driver_fail(&d, result, "cuDeviceGetAttribute", name, error, error_len);
  result = d.occupancy_max_active_blocks(&per_sm, reinterpret_cast<cu::Function>(prepared.kernel),
                                         threads, static_cast<size_t>(smem));
  if (result != cu::kSuccess)
    return driver_fail(&d, result, "cuOccupancyMaxActiveBlocksPerMultiprocessor", name, error,
                       error_len);
  *ctas = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  return kOk;
}

}  // namespace cake
