/* A fake CUDA driver (libcuda.so.1) for CPU tests: the driver calls that cake-train's loader and
 * program libraries make, recorded instead of run. tests/fake_cuda.py builds it with the system C
 * compiler and reads its record.
 *
 * Device 0 is an "NVIDIA H200 (fake)" of compute capability 9.0 with 132 SMs (fake_set_device
 * changes it). Each call appends one line to the record: the call, then its arguments, e.g.
 *   cuLibraryLoadData library=1 bytes=98320
 *   cuLibraryGetKernel library=1 name=kernel_cake_x_forward_av kernel=1
 *   cuKernelSetAttribute kernel=1 attribute=8 value=65536 device=0
 *   cuLaunchKernel kernel=1 grid=78,1,1 block=256,1,1 smem=65536 stream=0x5 params=<hex>
 * where params is the hex of the first parameter's first 256 bytes (a program's Params struct).
 * fake_fail(call, error, after) makes a call fail with `error` once `after` more calls of it
 * succeeded; fake_set_kernels(names) restricts cuLibraryGetKernel to those symbols (newline
 * separated; the others are CUDA_ERROR_NOT_FOUND, as a real image without them);
 * fake_set_current_device(d) makes cuCtxGetDevice answer d (the device of the current context);
 * fake_drop_context() leaves the calling thread without a current context, as a thread is before
 * its first CUDA runtime call: cuCtxGetDevice and cuLaunchKernel then fail with
 * CUDA_ERROR_INVALID_CONTEXT until cuCtxSetCurrent (contexts are 0x100 + device; a stream's is
 * the current device's);
 * fake_set_quiet(1) makes cuLaunchKernel count launches (fake_launch_count) instead of recording
 * them, so that a benchmark of the host path does not time the record's formatting.
 * No CUDA runtime function is defined here: a library that needed one would not load. */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_LINES 65536
#define MAX_KERNELS 4096
#define PARAM_BYTES 256

typedef int CUresult;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char* lines[MAX_LINES];
static int line_count = 0;
static char* kernel_names[MAX_KERNELS];
static int kernel_count = 0;
static int library_count = 0;
static char* allowed_kernels = NULL; /* newline separated, with a newline at both ends */
static char fail_call[128] = "";
static int fail_error = 0;
static int fail_after = 0;
static int device_major = 9, device_minor = 0, device_sms = 132, device_count = 1;
static int current_device = 0; /* what cuCtxGetDevice answers (fake_set_current_device) */
static int quiet = 0;          /* launches counted, not recorded (fake_set_quiet) */
static __thread int context_dropped = 0; /* this thread has none unless it set one */
static __thread int context_set = -1;    /* the device of the context it set, or -1 */
static long launch_count = 0;

static void record(const char* format, ...) {
  char buffer[1024];
  va_list args;
  va_start(args, format);
  vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  if (line_count < MAX_LINES) lines[line_count++] = strdup(buffer);
}

/* Nonzero when `call` is to fail now (lock held). */
static int failing(const char* call) {
  if (strcmp(fail_call, call) != 0) return 0;
  if (fail_after > 0) {
    --fail_after;
    return 0;
  }
  return fail_error;
}

/* ----------------------------------------------------------------------------- test controls */

EXPORT void fake_reset(void) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < line_count; ++i) free(lines[i]);
  line_count = 0;
  fail_call[0] = '\0';
  fail_error = 0;
  fail_after = 0;
  current_device = 0;
  quiet = 0;
  launch_count = 0;
  pthread_mutex_unlock(&lock);
}

EXPORT void fake_set_quiet(int on) { quiet = on; }

EXPORT long fake_launch_count(void) { return launch_count; }

EXPORT int fake_line_count(void) { return line_count; }

EXPORT const char* fake_line(int i) { return i >= 0 && i < line_count ? lines[i] : NULL; }

EXPORT void fake_fail(const char* call, int error, int after) {
  pthread_mutex_lock(&lock);
  snprintf(fail_call, sizeof fail_call, "%s", call);
  fail_error = error;
  fail_after = after;
  pthread_mutex_unlock(&lock);
}

EXPORT void fake_set_kernels(const char* names) {
  pthread_mutex_lock(&lock);
  free(allowed_kernels);
  allowed_kernels = NULL;
  if (names != NULL) {
    size_t size = strlen(names) + 3;
    allowed_kernels = malloc(size);
    snprintf(allowed_kernels, size, "\n%s\n", names);
  }
  pthread_mutex_unlock(&lock);
}

EXPORT void fake_set_device(int major, int minor, int sms, int count) {
  device_major = major;
  device_minor = minor;
  device_sms = sms;
  device_count = count;
}

/* The device of the calling thread's current context, as cuCtxGetDevice reports it (0 until
 * set; fake_reset sets it back to 0). */
EXPORT void fake_set_current_device(int device) {
  pthread_mutex_lock(&lock);
  current_device = device;
  pthread_mutex_unlock(&lock);
}

EXPORT void fake_drop_context(void) {
  context_dropped = 1;
  context_set = -1;
}

/* The device of the calling thread's current context, or -1 without one (lock held). */
static int context_device(void) {
  if (context_set >= 0) return context_set;
  return context_dropped ? -1 : current_device;
}

/* ----------------------------------------------------------------------------- the driver */

EXPORT CUresult cuInit(unsigned flags) {
  (void)flags;
  return 0;
}

EXPORT CUresult cuDriverGetVersion(int* version) {
  *version = 13000;
  return 0;
}

EXPORT CUresult cuDeviceGetCount(int* count) {
  *count = device_count;
  return 0;
}

EXPORT CUresult cuDeviceGet(int* device, int ordinal) {
  if (ordinal < 0 || ordinal >= device_count) return 101; /* CUDA_ERROR_INVALID_DEVICE */
  *device = ordinal;
  return 0;
}

EXPORT CUresult cuDeviceGetName(char* name, int length, int device) {
  (void)device;
  snprintf(name, (size_t)length, "NVIDIA H200 (fake)");
  return 0;
}

EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, int device) {
  (void)device;
  switch (attribute) {
    case 75: *value = device_major; return 0; /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *value = device_minor; return 0; /* COMPUTE_CAPABILITY_MINOR */
    case 16: *value = device_sms; return 0;   /* MULTIPROCESSOR_COUNT */
    default: return 1;                        /* CUDA_ERROR_INVALID_VALUE */
  }
}

EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
  switch (error) {
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; return 0;
    case 2: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return 0;
    case 200: *name = "CUDA_ERROR_INVALID_IMAGE"; return 0;
    case 201: *name = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
    case 500: *name = "CUDA_ERROR_NOT_FOUND"; return 0;
    case 701: *name = "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"; return 0;
    default: *name = NULL; return 1;
  }
}

EXPORT CUresult cuCtxGetDevice(int* device) {
  pthread_mutex_lock(&lock);
  CUresult error = failing("cuCtxGetDevice");
  int current = context_device();
  pthread_mutex_unlock(&lock);
  if (!error && current < 0) error = 201; /* CUDA_ERROR_INVALID_CONTEXT */
  if (error) return error;
  *device = current;
  return 0;
}

EXPORT CUresult cuCtxGetCurrent(void** context) {
  pthread_mutex_lock(&lock);
  CUresult error = failing("cuCtxGetCurrent");
  int device = context_device();
  pthread_mutex_unlock(&lock);
  if (!error) *context = device < 0 ? NULL : (void*)(intptr_t)(0x100 + device);
  return error;
}

EXPORT CUresult cuCtxSetCurrent(void* context) {
  pthread_mutex_lock(&lock);
  CUresult error = failing("cuCtxSetCurrent");
  if (!error) context_set = context == NULL ? -1 : (int)((intptr_t)context - 0x100);
  record("cuCtxSetCurrent context=%p error=%d", context, error);
  pthread_mutex_unlock(&lock);
  return error;
}

EXPORT CUresult cuStreamGetCtx(void* stream, void** context) {
  pthread_mutex_lock(&lock);
  CUresult error = failing("cuStreamGetCtx");
  if (!error) *context = (void*)(intptr_t)(0x100 + current_device);
  record("cuStreamGetCtx stream=%p error=%d", stream, error);
  pthread_mutex_unlock(&lock);
  return error;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(void** context, int device) {
  pthread_mutex_lock(&lock);
  CUresult error = failing("cuDevicePrimaryCtxRetain");
  if (!error) *context = (void*)(intptr_t)(0x100 + device);
  record("cuDevicePrimaryCtxRetain device=%d error=%d", device, error);
  pthread_mutex_unlock(&lock);
  return error;
}

EXPORT CUresult cuLibraryLoadData(void** library, const void* image, void* jit_options,
                                  void** jit_values, unsigned jit_count, void* options,
                                  void** values, unsigned count) {
  (void)jit_options, (void)jit_values, (void)jit_count, (void)options, (void)values, (void)count;
  pthread_mutex_lock(&lock);
  CUresult error = failing("cuLibraryLoadData");
  /* A fatbin starts with 0xba55ed50, an ELF cubin with 0x7f 'E' 'L' 'F'. */
  const unsigned char* bytes = (const unsigned char*)image;
  const char* kind = bytes[0] == 0x50 && bytes[1] == 0xed ? "fatbin"
                     : bytes[0] == 0x7f && bytes[1] == 'E' ? "cubin" : "unknown";
  if (!error) *library = (void*)(intptr_t)(++library_count);
  record("cuLibraryLoadData library=%d image=%s error=%d", error ? 0 : library_count, kind, error);
  pthread_mutex_unlock(&lock);
  return error;
}

EXPORT CUresult cuLibraryGetKernel(void** kernel, void* library, const char* name) {
  pthread_mutex_lock(&lock);
  CUresult error = failing("cuLibraryGetKernel");
  if (!error && allowed_kernels != NULL) {
    char wanted[512];
    snprintf(wanted, sizeof wanted, "\n%s\n", name);
    if (strstr(allowed_kernels, wanted) == NULL) error = 500; /* CUDA_ERROR_NOT_FOUND */
  }
  if (!error && kernel_count < MAX_KERNELS) {
    kernel_names[kernel_count++] = strdup(name);
    *kernel = (void*)(intptr_t)kernel_count;
  }
  record("cuLibraryGetKernel library=%d name=%s kernel=%d error=%d", (int)(intptr_t)library, name,
         error ? 0 : kernel_count, error);
  pthread_mutex_unlock(&lock);
  return error;
}

static const char* kernel_name(void* kernel) {
  intptr_t index = (intptr_t)kernel;
  return index >= 1 && index <= kernel_count ? kernel_names[index - 1] : "?";
}

EXPORT CUresult cuKernelSetAttribute(int attribute, int value, void* kernel, int device) {
  pthread_mutex_lock(&lock);
  CUresult error = failing("cuKernelSetAttribute");
  record("cuKernelSetAttribute kernel=%s attribute=%d value=%d device=%d error=%d",
         kernel_name(kernel), attribute, value, device, error);
  pthread_mutex_unlock(&lock);
  return error;
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, void* function,
                                                             int threads, size_t smem) {
  pthread_mutex_lock(&lock);
  CUresult error = failing("cuOccupancyMaxActiveBlocksPerMultiprocessor");
  /* A simple model: 2048 threads and 228 KiB of shared memory an SM. */
  int by_threads = threads > 0 ? 2048 / threads : 0;
  int by_smem = smem > 0 ? (int)((228 * 1024) / (smem + 1024)) : 32;
  *blocks = by_threads < by_smem ? by_threads : by_smem;
  record("cuOccupancy kernel=%s threads=%d smem=%zu blocks=%d error=%d", kernel_name(function),
         threads, smem, *blocks, error);
  pthread_mutex_unlock(&lock);
  return error;
}

EXPORT CUresult cuLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned smem, void* stream,
                               void** params, void** extra) {
  (void)extra;
  if (context_device() < 0) return 201; /* CUDA_ERROR_INVALID_CONTEXT, as the driver's */
  if (quiet) {
    pthread_mutex_lock(&lock);
    CUresult error = failing("cuLaunchKernel");
    ++launch_count;
    pthread_mutex_unlock(&lock);
    return error;
  }
  char hex[2 * PARAM_BYTES + 1] = "";
  if (params != NULL && params[0] != NULL) {
    const unsigned char* first = (const unsigned char*)params[0];
    for (int i = 0; i < PARAM_BYTES; ++i) snprintf(hex + 2 * i, 3, "%02x", first[i]);
  }
  pthread_mutex_lock(&lock);
  CUresult error = failing("cuLaunchKernel");
  ++launch_count;
  record("cuLaunchKernel kernel=%s grid=%u,%u,%u block=%u,%u,%u smem=%u stream=%p error=%d "
         "params=%s",
         kernel_name(function), gx, gy, gz, bx, by, bz, smem, stream, error, hex);
  pthread_mutex_unlock(&lock);
  return error;
}
