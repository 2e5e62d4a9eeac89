// Kernels of the context-parallel (KCP) causal conv1d row moves (the row codes and Params:
// cake/causal_conv1d/kcp_config.h). One thread moves one unit of one row: a 16-byte piece on the
// vector path (C % 8 == 0, every row 16-byte aligned), one element otherwise. Every index is
// checked against the sizes in Params, so any table content stays in bounds.
//
// A program's kernel source includes this after its knob and defines its kernels with the
// CAKE_KCP_*_KERNEL macros: one extern "C" kernel each, named kernel_<library>_<entry>_<access>
// (access: v = 16-byte pieces, s = elements), which the entries (cake/causal_conv1d/kcp_entries.h)
// look up by name.
#pragma once

#include <stdint.h>

#include "cake/causal_conv1d/kcp_config.h"

namespace cake {
namespace causal_conv1d_kcp {

// The row a code names (null: a zero row) and whether it is negated.
struct Source {
  const uint16_t* row;
  bool negate;
};

__device__ __forceinline__ Source decode(const Params& p, int64_t code) {
  Source s{nullptr, false};
  if (code < 0 || (code & ~kCodeBits) != 0) return s;
  const int64_t r = code & kRowMask;
  s.negate = (code & kNegateBit) != 0;
  if (code & kExchangedBit) {
    if (r < p.exchanged_rows) s.row = p.exchanged + r * p.channels;
  } else if (r < p.local_rows) {
    s.row = p.local + r * p.channels;
  }
  return s;
}

// The work item of this thread: (row, unit), or false past the last.
__device__ __forceinline__ bool item(const Params& p, int64_t& row, int64_t& unit) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= p.rows * p.units) return false;
  row = i / p.units;
  unit = i % p.units;
  return true;
}

template <bool kVector>
__device__ __forceinline__ void gather_body(const Params& p) {
  int64_t row, unit;
  if (!item(p, row, unit)) return;
  const Source s = decode(p, __ldg(p.table + row));
  uint16_t* dst = p.out + row * p.channels;
  if constexpr (kVector) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (s.row != nullptr) v = __ldg(reinterpret_cast<const uint4*>(s.row) + unit);
    if (s.negate) {
      constexpr unsigned kSigns = 0x80008000u;  // the sign bits of a word's two elements
      v.x ^= kSigns;
      v.y ^= kSigns;
      v.z ^= kSigns;
      v.w ^= kSigns;
    }
    reinterpret_cast<uint4*>(dst)[unit] = v;
  } else {
    uint16_t v = s.row != nullptr ? s.row[unit] : uint16_t{0};
    if (s.negate) v ^= kSignBit;
    dst[unit] = v;
  }
}

template <bool kVector>
__device__ __forceinline__ void scatter_body(const Params& p) {
  int64_t row, unit;
  if (!item(p, row, unit)) return;
  const int64_t to = __ldg(p.table + row);
  if (to < 0 || to >= p.out_rows) return;
  const uint16_t* src = p.local + row * p.channels;
  uint16_t* dst = p.out + to * p.channels;
  if constexpr (kVector) {
    reinterpret_cast<uint4*>(dst)[unit] = __ldg(reinterpret_cast<const uint4*>(src) + unit);
  } else {
    dst[unit] = src[unit];
  }
}

}  // namespace causal_conv1d_kcp
}  // namespace cake

#define CAKE_KCP_GATHER_KERNEL(name, vector_access)                                             \
  extern "C" __global__ void __launch_bounds__(::cake::causal_conv1d_kcp::kThreads)           \
      name(const ::cake::causal_conv1d_kcp::Params p) {                                        \
    ::cake::causal_conv1d_kcp::gather_body<vector_access>(p);                                  \
  }

#define CAKE_KCP_SCATTER_KERNEL(name, vector_access)                                            \
  extern "C" __global__ void __launch_bounds__(::cake::causal_conv1d_kcp::kThreads)           \
      name(const ::cake::causal_conv1d_kcp::Params p) {                                        \
    ::cake::causal_conv1d_kcp::scatter_body<vector_access>(p);                                 \
  }
