// The C ABI every cake-train program library exports (loaded through ctypes; no libtorch, no
// Python, no CUDA runtime). Host-only C++.
//
// Its binding exports, with C linkage and named after the library:
//   const char* <library>_digest(void);      // the digest the build embedded (CAKE_PROGRAM_DIGEST)
//   int         <library>_abi_version(void); // CAKE_ABI_VERSION
//   int         <library>_<entry>(const int64_t* args, int32_t nargs, void* stream,
//                                 char* error, int32_t error_len);
// for every entry the manifest declares. An entry takes one int64 slot per declared argument, in
// the declared order: a pointer's address (0 for none), an i32 or i64 value, or the bit pattern
// of an f32 (low 32 bits) or f64. The declaration is rendered into the binding as an X-macro
//   #define CAKE_ENTRY_<entry>(X) X(pointer, x) X(i64, rows) X(f32, eps) ...
// from which CAKE_ARGUMENTS makes the entry's argument struct and its unpacking; Python packs a
// call from the same declaration in the manifest. Entries launch on `stream` and return 0, or
// write a one-line message into `error` and return non-zero. They never allocate or synchronize.
#pragma once

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

// 2: libraries without the CUDA runtime, declared entry arguments (1: the CUDA runtime, entries
// whose argument order the binding and Python agreed on by hand).
#define CAKE_ABI_VERSION 2
#define CAKE_EXPORT extern "C" __attribute__((visibility("default")))

#ifndef CAKE_PROGRAM_DIGEST
#error "CAKE_PROGRAM_DIGEST must be defined by the build (the program's manifest digest)"
#endif

// An entry's parameters, and the same names as arguments (to pass them on).
#define CAKE_ENTRY_PARAMS \
  const int64_t *args, int32_t nargs, void *stream, char *error, int32_t error_len
#define CAKE_ENTRY_ARGS args, nargs, stream, error, error_len

namespace cake {

enum Status : int { kOk = 0, kInvalidArgument = 1, kCudaError = 2 };

// Writes a formatted message into the caller's buffer and returns `status`.
__attribute__((format(printf, 4, 5))) inline int fail(char* error, int32_t error_len, int status,
                                                      const char* format, ...) {
  if (error != nullptr && error_len > 0) {
    va_list args;
    va_start(args, format);
    vsnprintf(error, static_cast<size_t>(error_len), format, args);
    va_end(args);
  }
  return status;
}

// One declared argument from its int64 slot; false when the value does not fit the kind.
inline bool read_arg(int64_t slot, void*& out) {
  out = reinterpret_cast<void*>(static_cast<intptr_t>(slot));
  return true;
}
inline bool read_arg(int64_t slot, int32_t& out) {
  if (slot < INT32_MIN || slot > INT32_MAX) return false;
  out = static_cast<int32_t>(slot);
  return true;
}
inline bool read_arg(int64_t slot, int64_t& out) {
  out = slot;
  return true;
}
inline bool read_arg(int64_t slot, float& out) {
  const uint32_t bits = static_cast<uint32_t>(slot);
  memcpy(&out, &bits, sizeof(out));
  return true;
}
inline bool read_arg(int64_t slot, double& out) {
  memcpy(&out, &slot, sizeof(out));
  return true;
}

}  // namespace cake

#define CAKE_ARG_TYPE_pointer void*
#define CAKE_ARG_TYPE_i32 int32_t
#define CAKE_ARG_TYPE_i64 int64_t
#define CAKE_ARG_TYPE_f32 float
#define CAKE_ARG_TYPE_f64 double
#define CAKE_ARG_FIELD_(kind, name) CAKE_ARG_TYPE_##kind name;
#define CAKE_ARG_COUNT_(kind, name) +1
#define CAKE_ARG_READ_(kind, name)                                                           \
  if (!::cake::read_arg(values[index++], out.name))                                          \
    return ::cake::fail(error, error_len, ::cake::kInvalidArgument,                          \
                        "%s: argument %s does not fit %s", entry, #name, #kind);

// struct Name { <one field per declared argument> }, with Name::unpack(values, count, out, ...)
// checking the count and each value's kind.
#define CAKE_ARGUMENTS(Name, LIST)                                                            \
  struct Name {                                                                               \
    LIST(CAKE_ARG_FIELD_)                                                                     \
    static constexpr int kCount = 0 LIST(CAKE_ARG_COUNT_);                                    \
    static int unpack(const int64_t* values, int32_t count, Name& out, const char* entry,     \
                      char* error, int32_t error_len) {                                       \
      if (values == nullptr || count != kCount)                                               \
        return ::cake::fail(error, error_len, ::cake::kInvalidArgument,                       \
                            "%s takes %d arguments, got %d", entry, kCount,                   \
                            values == nullptr ? 0 : count);                                   \
      int index = 0;                                                                          \
      LIST(CAKE_ARG_READ_)                                                                    \
      (void)index;                                                                            \
      return ::cake::kOk;                                                                     \
    }                                                                                         \
  };

namespace cake {

// An entry's body: unpacks the declared arguments, then calls `body(arguments, stream, error,
// error_len)`.
template <typename Arguments, typename Body>
inline int call_entry(Body body, const char* entry, CAKE_ENTRY_PARAMS) {
  Arguments arguments{};
  const int status = Arguments::unpack(args, nargs, arguments, entry, error, error_len);
  if (status != kOk) return status;
  return body(arguments, stream, error, error_len);
}

}  // namespace cake
