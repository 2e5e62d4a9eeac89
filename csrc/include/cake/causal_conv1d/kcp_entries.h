// The C entries of a context-parallel (KCP) causal conv1d program (host code): they check their
// arguments again (sizes, null pointers, limits), pick the access path and launch through the
// driver (cake/driver.h). No allocation, no synchronization. The row codes and what each entry
// computes: cake/causal_conv1d/kcp_config.h.
//
// The binding defines, before including this: the knob (CAKE_KCP_THREADS), CAKE_LIBRARY_NAME
// (the library's name as a string: kernels are kernel_<library>_<suffix>) and the declared
// arguments of each entry, CAKE_ENTRY_gather and CAKE_ENTRY_scatter (the X-macros the renderer
// writes from the family table):
//   gather:   table, rows, local, local_rows, exchanged, exchanged_rows, channels, out
//             (out: rows x C; the sources local_rows x C and exchanged_rows x C)
//   scatter:  table, rows, src, out, out_rows, channels
//             (src: rows x C; out: out_rows x C)
// Pointers are device addresses (0 for none); tables hold int64, rows 2-byte elements.
#pragma once

#include <stdint.h>

#include "cake/causal_conv1d/kcp_config.h"
#include "cake/driver.h"
#include "cake/program.h"

#ifndef CAKE_LIBRARY_NAME
#error "the binding defines CAKE_LIBRARY_NAME (its library's name) before this header"
#endif

namespace cake {
namespace causal_conv1d_kcp {

CAKE_ARGUMENTS(GatherArgs, CAKE_ENTRY_gather)
CAKE_ARGUMENTS(ScatterArgs, CAKE_ENTRY_scatter)

constexpr int64_t kMaxGrid = 0x7fffffff;
constexpr int64_t kMaxChannels = int64_t{1} << 31;

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

struct KernelRef {
  const char* name;
  Kernel* slot;
};

#define CAKE_KCP_KERNEL_REF_(suffix)                                     \
  [] {                                                                   \
    static ::cake::Kernel slot;                                          \
    return KernelRef{"kernel_" CAKE_LIBRARY_NAME "_" suffix, &slot};    \
  }()

inline KernelRef gather_kernel(bool vector) {
  return vector ? CAKE_KCP_KERNEL_REF_("gather_v") : CAKE_KCP_KERNEL_REF_("gather_s");
}
inline KernelRef scatter_kernel(bool vector) {
  return vector ? CAKE_KCP_KERNEL_REF_("scatter_v") : CAKE_KCP_KERNEL_REF_("scatter_s");
}

// A row count of an argument: 0 .. 2^40 (what a row code can name).
inline int check_rows(const char* name, int64_t rows, char* error, int32_t error_len) {
  if (rows < 0 || rows > kRowMask + 1)
    return fail(error, error_len, kInvalidArgument, "%s must be in [0, 2^%d], got %lld", name,
                kRowBits, static_cast<long long>(rows));
  return kOk;
}

// The sizes both entries share; fills p.rows, p.channels, p.units (given the access path).
inline int check_shape(int64_t rows, int64_t channels, Params& p, char* error, int32_t error_len) {
  if (channels < 1 || channels > kMaxChannels)
    return fail(error, error_len, kInvalidArgument, "channels must be in [1, 2^31], got %lld",
                static_cast<long long>(channels));
  const int status = check_rows("rows", rows, error, error_len);
  if (status != kOk) return status;
  p.rows = rows;
  p.channels = channels;
  return kOk;
}

// Picks the access path (16-byte pieces when C % 8 == 0 and every row pointer is 16-byte
// aligned), then launches one thread per unit of every row.
inline int launch_rows(KernelRef (*kernel)(bool), Params& p, bool pointers_aligned, void* stream,
                       char* error, int32_t error_len) {
  const bool vector = p.channels % kPieceElements == 0 && pointers_aligned;
  p.units = vector ? p.channels / kPieceElements : p.channels;
  if (p.rows == 0) return kOk;
  if (p.rows > kMaxGrid * kThreads / p.units)  // before the product: it could overflow
    return fail(error, error_len, kInvalidArgument, "too many rows for one launch (%lld x %lld)",
                static_cast<long long>(p.rows), static_cast<long long>(p.channels));
  const int64_t blocks = (p.rows * p.units + kThreads - 1) / kThreads;
  const KernelRef ref = kernel(vector);
  void* params[] = {&p};
  Dim3 grid, block;
  grid.x = static_cast<unsigned>(blocks);
  block.x = kThreads;
  return cake::launch(*ref.slot, ref.name, grid, block, 0, stream, params, error, error_len);
}

inline int gather(const GatherArgs& a, void* stream, char* error, int32_t error_len) {
  Params p{};
  int status = check_shape(a.rows, a.channels, p, error, error_len);
  if (status == kOk) status = check_rows("local_rows", a.local_rows, error, error_len);
  if (status == kOk) status = check_rows("exchanged_rows", a.exchanged_rows, error, error_len);
  if (status != kOk) return status;
  p.table = static_cast<const int64_t*>(a.table);
  p.local = static_cast<const uint16_t*>(a.local);
  p.exchanged = static_cast<const uint16_t*>(a.exchanged);
  p.out = static_cast<uint16_t*>(a.out);
  p.local_rows = a.local_rows;
  p.exchanged_rows = a.exchanged_rows;
  p.out_rows = a.rows;
  if (p.rows > 0 && (p.table == nullptr || p.out == nullptr))
    return fail(error, error_len, kInvalidArgument, "table or out is null");
  if (p.local_rows > 0 && p.local == nullptr)
    return fail(error, error_len, kInvalidArgument, "local is null but local_rows is %lld",
                static_cast<long long>(p.local_rows));
  if (p.exchanged_rows > 0 && p.exchanged == nullptr)
    return fail(error, error_len, kInvalidArgument, "exchanged is null but exchanged_rows is %lld",
                static_cast<long long>(p.exchanged_rows));
  const bool pointers_aligned = aligned16(p.local) && aligned16(p.exchanged) && aligned16(p.out);
  return launch_rows(gather_kernel, p, pointers_aligned, stream, error, error_len);
}

inline int scatter(const ScatterArgs& a, void* stream, char* error, int32_t error_len) {
  Params p{};
  int status = check_shape(a.rows, a.channels, p, error, error_len);
  if (status == kOk) status = check_rows("out_rows", a.out_rows, error, error_len);
  if (status != kOk) return status;
  p.table = static_cast<const int64_t*>(a.table);
  p.local = static_cast<const uint16_t*>(a.src);
  p.out = static_cast<uint16_t*>(a.out);
  p.local_rows = a.rows;
  p.out_rows = a.out_rows;
  if (p.rows > 0 && (p.table == nullptr || p.local == nullptr))
    return fail(error, error_len, kInvalidArgument, "table or src is null");
  if (p.out_rows > 0 && p.out == nullptr)
    return fail(error, error_len, kInvalidArgument, "out is null but out_rows is %lld",
                static_cast<long long>(p.out_rows));
  const bool pointers_aligned = aligned16(p.local) && aligned16(p.out);
  return launch_rows(scatter_kernel, p, pointers_aligned, stream, error, error_len);
}

}  // namespace causal_conv1d_kcp
}  // namespace cake
