// The launcher of a Triton program: one C entry per kernel, which checks the declared hints and
// launches the embedded cubin through the driver (cake/driver.h). Host-only C++.
//
// An entry of kernel role kernel_<name> declares (the renderer writes it from the family table)
//   #define CAKE_ENTRY_<name>(X) X(i32, grid_x) X(i32, grid_y) X(i32, grid_z) <the kernel's args>
// and the build's Triton compile (cake/core/triton_aot.py) writes, per kernel source, the header
// the host compiler includes first (-include): CAKE_TRITON_<ROLE>_NAME (the kernel symbol),
// _SHARED (its dynamic shared memory), _WARPS, _SIGNATURE (its arguments as "kind name," ...)
// and _HINTS(X) (X(argument, divisor) for every value the compile assumed divisible). The
// binding defines each kernel's launcher and exports it:
//   CAKE_TRITON_KERNEL(<name>, KERNEL_<NAME>)
//   CAKE_EXPORT int <library>_<name>(CAKE_ENTRY_PARAMS) { return cake_triton_<name>(CAKE_ENTRY_ARGS); }
// A compile whose kernel arguments differ from the declaration fails (static_assert); a call
// whose pointer or integer breaks a hint is refused, never launched; an empty grid launches
// nothing.
#pragma once

#include <stdint.h>

#include "cake/driver.h"
#include "cake/program.h"

namespace cake {
namespace triton {

constexpr bool same_text(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

inline bool divisible(const void* value, int divisor) {
  return reinterpret_cast<uintptr_t>(value) % static_cast<uintptr_t>(divisor) == 0;
}
inline bool divisible(int32_t value, int divisor) { return value % divisor == 0; }
inline bool divisible(int64_t value, int divisor) { return value % divisor == 0; }

// Launches `name` on a grid of (gx, gy, gz) CTAs of `warps` warps with `smem` bytes of dynamic
// shared memory; `params` holds the kernel's declared arguments, then its two scratch pointers.
inline int launch(Kernel& slot, const char* name, int smem, int warps, int32_t gx, int32_t gy,
                  int32_t gz, void** params, void* stream, char* error, int32_t error_len) {
  if (gx < 0 || gy < 0 || gz < 0)
    return fail(error, error_len, kInvalidArgument, "%s: negative grid (%d, %d, %d)", name, gx, gy,
                gz);
  if (gx == 0 || gy == 0 || gz == 0) return kOk;
  Dim3 grid, block;
  grid.x = static_cast<unsigned>(gx);
  grid.y = static_cast<unsigned>(gy);
  grid.z = static_cast<unsigned>(gz);
  block.x = static_cast<unsigned>(warps * 32);
  return cake::launch(slot, name, grid, block, smem, stream, params, error, error_len);
}

}  // namespace triton
}  // namespace cake

#define CAKE_TRITON_SIGNATURE_(kind, name) #kind " " #name ","
#define CAKE_TRITON_PARAM_(kind, name) &arguments.name,
#define CAKE_TRITON_HINT_(name, divisor)                                                        \
  if (!::cake::triton::divisible(arguments.name, divisor))                                     \
    return ::cake::fail(error, error_len, ::cake::kInvalidArgument,                            \
                        "%s: %s must be a multiple of %d (the compile assumed it)", kEntry,     \
                        #name, divisor);

// The launcher of the kernel of role ROLE (upper case, e.g. KERNEL_SCALE) for the entry declared
// as CAKE_ENTRY_<entry>: int cake_triton_<entry>(CAKE_ENTRY_PARAMS), at namespace scope.
#define CAKE_TRITON_KERNEL(entry, ROLE)                                                          \
  static_assert(::cake::triton::same_text("i32 grid_x,i32 grid_y,i32 grid_z,"                  \
                                          CAKE_TRITON_##ROLE##_SIGNATURE,                      \
                                          CAKE_ENTRY_##entry(CAKE_TRITON_SIGNATURE_)),         \
                "entry " #entry ": its declared arguments are not the grid and the kernel's"); \
  namespace {                                                                                  \
  CAKE_ARGUMENTS(entry##_arguments, CAKE_ENTRY_##entry)                                        \
  int cake_triton_##entry(CAKE_ENTRY_PARAMS) {                                                 \
    static constexpr char kEntry[] = #entry;                                                   \
    entry##_arguments arguments{};                                                             \
    const int status =                                                                         \
        entry##_arguments::unpack(args, nargs, arguments, kEntry, error, error_len);           \
    if (status != ::cake::kOk) return status;                                                  \
    CAKE_TRITON_##ROLE##_HINTS(CAKE_TRITON_HINT_)                                              \
    static ::cake::Kernel slot;                                                                \
    void* scratch = nullptr;                                                                   \
    void* params[] = {CAKE_ENTRY_##entry(CAKE_TRITON_PARAM_) & scratch, &scratch};            \
    return ::cake::triton::launch(slot, CAKE_TRITON_##ROLE##_NAME, CAKE_TRITON_##ROLE##_SHARED, \
                                  CAKE_TRITON_##ROLE##_WARPS, arguments.grid_x,                \
                                  arguments.grid_y, arguments.grid_z, params + 3, stream,      \
                                  error, error_len);                                           \
  }                                                                                            \
  }
