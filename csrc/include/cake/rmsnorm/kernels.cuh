// Device code of the RMSNorm families (cake_rmsnorm_det_train, cake_gated_rmsnorm_det_train).
//
// Math, per row of D elements (fp32 arithmetic throughout):
//   s     = x (+ residual, rounded to the input dtype: the prenorm sum that is also returned)
//   rstd  = rsqrt(mean(s^2) + eps)
//   xhat  = s * rstd,  w' = weight + weight_offset,  n = xhat * w'
//   y     = n                       (RMSNorm)
//   y     = n * silu(g)             (gated: normalise, then gate)
// Backward, with dn = dy (RMSNorm) or dy * silu(g) (gated):
//   dg    = dy * n * sigmoid(g) * (1 + g * (1 - sigmoid(g)))
//   dx    = rstd * (dn * w' - xhat * mean(dn * w' * xhat)) (+ dsum, the gradient of the sum output)
//   dw    = sum over rows of dn * xhat
//
// Layout. A row is handled by a "row group" of `tpr` threads (a power of two up to 32, or a
// multiple of 32 up to 512); a CTA holds `groups` row groups. Each thread owns kEpt elements of
// the row as kEpt / kVec packs of kVec = 16 / sizeof(T) consecutive elements, pack c at column
// (c * tpr + lane) * kVec, so the packs of a row group are consecutive. On the aligned route (D a
// multiple of kVec, 16-byte aligned rows) a pack moves as one 16-byte access; on the unaligned
// route (any D, any element alignment) as kVec element accesses, the last pack of a row partly
// (elements past D read as 0 and are not written). A program compiles instances for kEpt in
// {8 (optional), 16, 32} and picks one per D and direction (elems_per_thread: the narrowest
// whose row group stays within the direction's widest); on the aligned route, the power-of-two
// row groups of 64 to 512 threads that a direction reaches in the program's band of D (e.g.
// D = 1024 .. 8192 at 16 elements a thread, 16384 at 32), and with the direction's
// common-widths knob the multiples of 64 (or of 32) between them (e.g. D = 3072, 5120, 6144,
// 7168; 1536, 2560, 3584, 4608 at 16 elements a thread) and the row groups of a warp or less
// (D <= 512 at 16), get instances with that width fixed
// at compile time (Shape, with_instance), whose ring, row and column offsets are immediates:
// the row loop then spends its instructions on the data. Only the instances that serve some D
// of the program's band are compiled. Fewer threads a row with more
// elements each spread a row step's fixed instructions (copies, sum, rstd, loop) over more data.
//
// Two ways to keep rows in flight (the kernels are bound by DRAM latency times bytes in flight):
// * staged (every instance unless the direction's stages knob is 0): the next rows' packs go
//   into a ring of `stages` slots in shared memory with cp.async (16-byte copies; 4-byte element
//   copies on the unaligned fp32 route; the unaligned 16-bit route copies synchronously and uses
//   one slot), so stages - 1 rows are in flight while one is reduced, at no register cost (see
//   Ring for who copies what, and the barriers of the unaligned route).
// * registers (the direction's stages knob 0, aligned instances only, and in the backward not
//   the widest; other instances of such a program use a 2-slot ring): the next row is loaded
//   into a second set of registers while the current one is reduced. The one-row forwards
//   (tools/families/cake_rmsnorm_det_train.py) take it with one row a CTA: the row in
//   registers, nothing staged.
// Both paths compute the same expressions in the same order, so for the same D band and
// partition they give the same bits.
//
// Determinism. Forward rows are independent, so the forward grid is free (kForwardCtaRows). The
// weight gradient is reduced in an order fixed by (rows, cols) and the program only: the grid
// has one CTA per band of rows_per_cta rows (rows_per_cta from the row count and the bands
// backward_bands gives D), or with Config::kBackwardGuided half as many per region
// (backward_partition), and CTA b owns either the rows [b * rows_per_cta, (b + 1) * rows_per_cta), or
// (Config::kBackwardInterleave) every ctas-th step of `groups` rows from step b, or every
// wave-th step of its region (BackwardSpan); its row groups take those rows round-robin and
// accumulate in row order (WeightGrad); the groups are summed in group order through shared
// memory into the CTA's fp32 partial row of the workspace; a second kernel sums the partial rows
// of each column in a fixed order. No atomics in the kernels; nothing depends on the device's SM
// count.
#pragma once

#include <stdint.h>

#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cake/fast_math.cuh"
#include "cake/rmsnorm/common.h"

namespace cake {
namespace rmsnorm {

// --------------------------------------------------------------------------- element access

// 16 bytes of T (kVec elements) as four 32-bit words; elements are unpacked to fp32 where used.
template <typename T>
struct Pack {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  uint32_t w[4];

  __device__ __forceinline__ void set_raw(const uint4& raw) {
    w[0] = raw.x; w[1] = raw.y; w[2] = raw.z; w[3] = raw.w;
  }
  __device__ __forceinline__ uint4 raw() const { return make_uint4(w[0], w[1], w[2], w[3]); }
  // Element v as fp32 (v is a compile-time constant after unrolling).
  __device__ __forceinline__ float get(int v) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(w[v]);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      return __uint_as_float((v & 1) ? (w[v >> 1] & 0xffff0000u) : (w[v >> 1] << 16));
    } else {
      return __half2float(__ushort_as_half(bits(v)));
    }
  }
  // The raw bits of element v (16-bit T).
  __device__ __forceinline__ unsigned short bits(int v) const {
    return static_cast<unsigned short>((v & 1) ? (w[v >> 1] >> 16) : (w[v >> 1] & 0xffffu));
  }
  // Sets every element from fp32 values (round to nearest even).
  __device__ __forceinline__ void set(const float (&f)[kVec]) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) w[v] = __float_as_uint(f[v]);
    } else {
#pragma unroll
      for (int v = 0; v < kVec; v += 2) w[v >> 1] = cake::pack2<T>(f[v], f[v + 1]);
    }
  }
};

template <typename T>
__device__ __forceinline__ Pack<T> zero_pack() {
  Pack<T> out;
#pragma unroll
  for (int i = 0; i < 4; ++i) out.w[i] = 0u;
  return out;
}

// The pack at `p` with `valid` (>= 1) elements left in its row. Aligned: one 16-byte load with
// the default cache policy and the L2 prefetch size hint kL2 (the evict-first form, ld.global.cs,
// measured level to 2.4 points of copy bandwidth slower in the one-row forward on the H200,
// 2026-12-02); unaligned: element loads
// through L1 (a warp's loads of one pack element touch every line its next ones need), zeros past
// the row.
template <typename T, bool kAligned, int kL2 = 0>
__device__ __forceinline__ Pack<T> load_pack(const T* p, int valid) {
  Pack<T> out;
  if constexpr (kAligned && kL2 == 128) {
    asm("ld.global.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(out.w[0]), "=r"(out.w[1]), "=r"(out.w[2]), "=r"(out.w[3]) : "l"(p));
  } else if constexpr (kAligned && kL2 == 256) {
    asm("ld.global.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(out.w[0]), "=r"(out.w[1]), "=r"(out.w[2]), "=r"(out.w[3]) : "l"(p));
  } else if constexpr (kAligned) {
    asm("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(out.w[0]), "=r"(out.w[1]), "=r"(out.w[2]), "=r"(out.w[3]) : "l"(p));
  } else if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int v = 0; v < 4; ++v) out.w[v] = v < valid ? __ldg(reinterpret_cast<const unsigned*>(p) + v) : 0u;
  } else {
    const unsigned short* e = reinterpret_cast<const unsigned short*>(p);
#pragma unroll
    for (int v = 0; v < 8; v += 2) {
      const uint32_t lo = v < valid ? __ldg(e + v) : 0u;
      const uint32_t hi = v + 1 < valid ? __ldg(e + v + 1) : 0u;
      out.w[v >> 1] = lo | (hi << 16);
    }
  }
  return out;
}

// Stores the first `valid` (>= 1) elements of a pack (all of them on the aligned route).
template <typename T, bool kAligned>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& value, int valid) {
  if constexpr (kAligned) {
    *reinterpret_cast<uint4*>(p) = value.raw();
  } else if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      if (v < valid) reinterpret_cast<unsigned*>(p)[v] = value.w[v];
    }
  } else {
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      if (v < valid) reinterpret_cast<unsigned short*>(p)[v] = value.bits(v);
    }
  }
}

// `pointer`, opaque to the compiler: it is computed once where it stands, and offsets from it
// stay offsets (see row_pointer and load_slice).
template <typename T>
__device__ __forceinline__ T* opaque(T* pointer) {
  asm("" : "+l"(pointer));
  return pointer;
}

// base + offset + thread_offset (a row's first element: a staged step's first row, the same for
// the whole CTA, plus the thread's row from there), opaque to the compiler, or null for a null
// base. Left visible, base + offset + col gets split into a loop-invariant base + col per pack:
// 64-bit registers that spill on the widest instances.
template <typename T>
__device__ __forceinline__ T* row_pointer(T* base, int64_t offset, int thread_offset = 0) {
  if (base == nullptr) return nullptr;
  return opaque(base + offset + thread_offset);
}

template <typename T>
__device__ __forceinline__ float load_weight(const void* weight, int weight_fp32, int index) {
  if constexpr (sizeof(T) == 4) return __ldg(static_cast<const float*>(weight) + index);
  return weight_fp32 ? __ldg(static_cast<const float*>(weight) + index)
                     : to_float(static_cast<const T*>(weight)[index]);
}

// --------------------------------------------------------------------------- cp.async

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Shared memory at a shared-space address, as a pointer the compiler knows to be shared. (Ring
// addresses are kept as 32-bit shared-space offsets: as generic pointers, every use re-derives
// the shared window's base.)
template <typename V>
__device__ __forceinline__ V* shared_pointer(unsigned address) {
  return static_cast<V*>(__cvta_shared_to_generic(address));
}

// Starts copying 16 bytes to shared memory (a shared-space address) through L2 only (.cg),
// with the L2 prefetch hint kL2.
template <int kL2>
__device__ __forceinline__ void copy16_async(unsigned dst, const void* src) {
  if constexpr (kL2 == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
  } else if constexpr (kL2 == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
  }
}

// Starts copying 4 bytes to shared memory (.ca: .cg takes only 16).
__device__ __forceinline__ void copy4_async(unsigned dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Waits until at most `pending` (< kMaxStages, uniform across the CTA) groups are in flight.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  static_assert(kMaxStages == 4, "one case per possible pending count");
  switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<3>(); break;
  }
}

// A CTA's row layout: row groups of `tpr` threads (see the top of this file), `groups` of them
// (row_groups), `threads` in all, and the calling thread's group and lane. An instance that
// fixes kTpr (> 0: has_fixed_instance's widths, aligned route) has them at compile time, so
// ring, row and column offsets fold into immediates; kTpr 0 takes tpr from the launch
// parameters (any D).
template <int kTpr, int kCtaThreads>
struct Shape {
  // (The launchers refuse a fixed-width kernel for another width, and launch tpr * row_groups.)
  // A fixed-width row that fills its CTA is group 0 at compile time (its launch has tpr
  // threads): no division by the width, and one row for the whole CTA.
  static constexpr bool kOneGroup = kTpr > 0 && row_groups<kCtaThreads>(kTpr) == 1;
  int tpr;
  int threads;
  int groups;
  int group;
  int lane;

  __device__ __forceinline__ explicit Shape(int launched_tpr)
      : tpr(kTpr > 0 ? kTpr : launched_tpr),
        threads(kTpr > 0 ? kTpr * row_groups<kCtaThreads>(kTpr) : static_cast<int>(blockDim.x)),
        groups(threads / tpr),
        group(kOneGroup ? 0 : static_cast<int>(threadIdx.x) / tpr),
        lane(static_cast<int>(threadIdx.x) - group * tpr) {}
};

// --------------------------------------------------------------------------- row-group sum

// Sums over each row group of `tpr` threads: every thread of a group gets the same bits
// (butterfly order within a warp, then the group's warps in order; IEEE addition commutes).
// Made once per thread, so that what depends only on the thread stays out of the row loop.
// A group wider than a warp meets its other warps at a barrier: with kGroupBarriers a named
// barrier of its own (id 1 + group; 0 is __syncthreads'), so that row groups never wait for
// each other, and every thread of a group must call it the same number of times; else the
// CTA's, and every thread of the CTA must. A register barrier id reserves all 16 of the CTA's
// barriers, which caps the CTAs an SM, so only the backward's fixed-width instances with four
// or more row groups a CTA take named barriers (group_barriers). `scratch` holds 2 * 32
// floats, 16-byte aligned; calls alternate between its halves, so one barrier a call suffices.
template <bool kGroupBarriers>
class GroupSum {
 public:
  // Groups wider than a warp are at least 64 threads: at most this many a CTA, each a barrier.
  static_assert(kMaxCtaThreads / 64 < 16, "a CTA has 16 named barriers");

  __device__ __forceinline__ GroupSum(int tpr, int group, float* scratch)
      : scratch_(scratch), width_(tpr < 32 ? tpr : 32), warps_(tpr > 32 ? tpr >> 5 : 0),
        first_(group * (tpr >> 5)), barrier_(1 + group), threads_(tpr) {}

  __device__ __forceinline__ float operator()(float value) {
#pragma unroll
    for (int offset = 16; offset >= 1; offset >>= 1) {
      if (offset < width_) value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
    if (warps_ == 0) return value;
    float* slots = scratch_ + half_;
    half_ ^= 32;
    if ((threadIdx.x & 31) == 0) slots[threadIdx.x >> 5] = value;
    if constexpr (kGroupBarriers) {
      asm volatile("bar.sync %0, %1;" ::"r"(barrier_), "r"(threads_) : "memory");
    } else {
      __syncthreads();
    }
    const float* mine = slots + first_;
    float total = 0.0f;
    if ((warps_ & 3) == 0) {  // the group's slots start at a multiple of 4: 16-byte reads
#pragma unroll 1
      for (int w = 0; w < warps_; w += 4) {
        const float4 q = *reinterpret_cast<const float4*>(mine + w);
        total = total + q.x + q.y + q.z + q.w;
      }
    } else {
#pragma unroll 1
      for (int w = 0; w < warps_; ++w) total += mine[w];
    }
    return total;
  }

 private:
  float* scratch_;
  int width_;  // lanes of a warp in the group
  int warps_;  // warps of a group wider than a warp, else 0
  int first_;  // the group's first warp in the CTA
  int barrier_;  // the group's named barrier
  int threads_;  // threads that meet there (the group's)
  int half_ = 0;
};

// Whether a backward instance's row sums take named barriers (GroupSum): its fixed-width rows
// of 64 or 128 threads, 4 or more row groups a CTA. On the H200 (2026-12-02, A/B runs of
// tools/bench/rmsnorm.py) named barriers measured +1.2..2.5
// points of copy in RMSNorm's backward at T = 65536 and D = 1024, 2048 in three runs, but 0.4-3
// behind at D = 4096 (2 groups) and 8192 (1), and cost the one-row forward (up to 16 CTAs an SM)
// up to 36 points: there the CTA's barrier stays.
template <int kTpr, int kCtaThreads>
__host__ __device__ constexpr bool group_barriers() {
  return kTpr > 32 && row_groups<kCtaThreads>(kTpr) >= 4;
}

// --------------------------------------------------------------------------- slices, weights

// One thread's kEpt elements of a row: kVpt packs of kVec, pack c at column (c * tpr + lane) * kVec.
template <typename T, int kEpt>
struct Slice {
  static constexpr int kVec = Pack<T>::kVec;
  static constexpr int kVpt = kEpt / kVec;
  static_assert(kEpt % kVec == 0, "a thread's elements must be whole packs");
  __device__ __forceinline__ static int column(int c, int tpr, int lane) { return (c * tpr + lane) * kVec; }
};

// kAligned: D is a multiple of kVec, so a pack of weights is in the row or past it as a whole.
template <typename T, bool kAligned, int kEpt, WeightSource kSource>
class Weights {
 public:
  static constexpr int kVec = Pack<T>::kVec;
  static constexpr int kVpt = kEpt / kVec;

  // Shared memory the weights take at the start of the dynamic shared memory.
  __host__ __device__ static size_t smem_bytes(int tpr) { return weight_smem_bytes<kEpt>(kSource, tpr); }

  // Every thread of the CTA constructs it. Shared-memory weights are staged here, an element an
  // iteration, unless `stage_now` is false: then every thread calls stage() before the first at().
  __device__ __forceinline__ Weights(float* smem, const void* weight, int weight_fp32, float offset, int cols,
                                     int tpr, int lane, bool stage_now = true)
      : smem_(smem), weight_(weight), weight_fp32_(weight_fp32), offset_(offset), cols_(cols),
        vector_(kAligned && (reinterpret_cast<uintptr_t>(weight) & 15) == 0) {
    if constexpr (kSource == WeightSource::kShared) {
      if (stage_now) {
        const int row_elems = tpr * kEpt;
        for (int i = threadIdx.x; i < row_elems; i += blockDim.x) {
          smem[i] = i < cols ? load_weight<T>(weight, weight_fp32, i) + offset : 0.0f;
        }
        __syncthreads();
      }
    } else if constexpr (kSource == WeightSource::kRegisters) {
#pragma unroll
      for (int c = 0; c < kVpt; ++c) load(Slice<T, kEpt>::column(c, tpr, lane), reg_[c]);
    }
  }

  // Stages the weights in shared memory (then a barrier) a pack an iteration, 16-byte loads where
  // the weight allows (the constructor's loop waits for each element's load in turn: 16 round
  // trips a CTA at D = 8192). Every thread of the CTA calls it. (Inlined into the gated backward,
  // it raised that kernel from 76 to 98 registers and cost it 1.9-2.6 points of copy bandwidth at
  // D = 8192, so the constructor keeps its own loop.)
  __device__ __forceinline__ void stage(int tpr) const {
    static_assert(kSource == WeightSource::kShared, "only shared-memory weights are staged");
    const int row_elems = tpr * kEpt;
    for (int col = threadIdx.x * kVec; col < row_elems; col += blockDim.x * kVec) {
      float w[kVec];
      load(col, w);
#pragma unroll
      for (int v = 0; v < kVec; v += 4) {
        *reinterpret_cast<float4*>(smem_ + col + v) = make_float4(w[v], w[v + 1], w[v + 2], w[v + 3]);
      }
    }
    __syncthreads();
  }

  // The kVec weights of pack c, at column `col`.
  __device__ __forceinline__ void at(int c, int col, float (&w)[kVec]) const {
    if constexpr (kSource == WeightSource::kShared) {
#pragma unroll
      for (int v = 0; v < kVec; v += 4) {
        const float4 q = *reinterpret_cast<const float4*>(smem_ + col + v);
        w[v] = q.x; w[v + 1] = q.y; w[v + 2] = q.z; w[v + 3] = q.w;
      }
    } else if constexpr (kSource == WeightSource::kRegisters) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) w[v] = reg_[c][v];
    } else {
      load<true>(col, w);
    }
  }

 private:
  // A pack of weights from global memory: 16-byte loads when the weight is 16-byte aligned (the
  // pack then is too: kAligned), else one load an element. kByDtype (reads at every use): one
  // branch on the weight's dtype around the pack instead of one an element, which ptxas
  // if-converts so that both dtypes' loads are live at once (12 bytes spilled in the gated
  // forward's paired 256-thread rows at 40 registers); the staging keeps the element branch.
  template <bool kByDtype = false>
  __device__ __forceinline__ void load(int col, float (&w)[kVec]) const {
    if constexpr (kAligned) {
      if (vector_) {
        load_vector(col, w);
        return;
      }
    }
    if constexpr (kByDtype) {
      if (sizeof(T) == 4 || weight_fp32_) {
        load_elements(static_cast<const float*>(weight_), col, w);
      } else {
        load_elements(static_cast<const T*>(weight_), col, w);
      }
    } else {
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const bool in = kAligned ? col < cols_ : col + v < cols_;
        w[v] = in ? load_weight<T>(weight_, weight_fp32_, col + v) + offset_ : 0.0f;
      }
    }
  }

  template <typename W>
  __device__ __forceinline__ void load_elements(const W* weight, int col, float (&w)[kVec]) const {
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const bool in = kAligned ? col < cols_ : col + v < cols_;
      w[v] = in ? to_float(__ldg(weight + col + v)) + offset_ : 0.0f;
    }
  }

  __device__ __forceinline__ void load_vector(int col, float (&w)[kVec]) const {
    if (col >= cols_) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) w[v] = 0.0f;
      return;
    }
    if (sizeof(T) == 4 || weight_fp32_) {
      const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(weight_) + col);
#pragma unroll
      for (int v = 0; v < kVec; v += 4) {
        const float4 f = __ldg(q + v / 4);
        w[v] = f.x + offset_; w[v + 1] = f.y + offset_; w[v + 2] = f.z + offset_; w[v + 3] = f.w + offset_;
      }
    } else {
      Pack<T> pack;
      pack.set_raw(__ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(weight_) + col)));
#pragma unroll
      for (int v = 0; v < kVec; ++v) w[v] = pack.get(v) + offset_;
    }
  }

  float reg_[kSource == WeightSource::kRegisters ? kVpt : 1][kVec];
  float* smem_;
  const void* weight_;
  int weight_fp32_;
  float offset_;
  int cols_;
  bool vector_;  // the weight is 16-byte aligned (a pack of it then is too)
};

// Loads one thread's slice of row `row` of `base` into registers (zeros past the row's end or
// for a row outside the call, which is not read). Aligned route.
template <typename T, int kEpt, int kL2>
__device__ __forceinline__ void load_slice(Pack<T> (&dst)[kEpt / Pack<T>::kVec], const T* base, int64_t row,
                                           bool row_ok, int cols, int tpr, int lane) {
  using S = Slice<T, kEpt>;
  // The thread's first pack, computed once (opaque: else ptxas recomputes it under each pack's
  // predicate); pack c is c * tpr packs on (an immediate offset when tpr is fixed).
  const T* first = opaque(base + row * cols + lane * S::kVec);
#pragma unroll
  for (int c = 0; c < S::kVpt; ++c) {
    const int col = S::column(c, tpr, lane);
    dst[c] = row_ok && col < cols ? load_pack<T, true, kL2>(first + c * tpr * S::kVec, S::kVec) : zero_pack<T>();
  }
}

// The ring of the staged path: `stages` slots, each holding the packs of one step's rows of
// `tensors` tensors.
// * Aligned route: pack c of tensor t of thread i in slot s at ((s * tensors + t) * kVpt + c) *
//   threads + i (a warp's packs consecutive). Each thread copies its own packs, and reads only
//   what it copied: no barrier.
// * Unaligned route: row g of tensor t in slot s at ((s * tensors + t) * groups + g) * row_elems,
//   padded to row_elems = tpr * kEpt elements (a whole number of packs); thread (g, lane) finds its
//   pack c at element (c * tpr + lane) * kVec of its row. Every thread of the CTA copies the
//   step's rows element by element (coalesced), so consumers wait at a barrier. The padding is
//   zeroed once and never written by a copy, so the part of a row's last pack past D reads as 0.
// Either way a thread's pack c of tensor t in slot s is at mine + s * slot_stride + t *
// tensor_stride + c * pack_stride, with the four worked out once (the row loop only adds).
template <typename T, bool kAligned, int kEpt>
class Ring {
 public:
  using S = Slice<T, kEpt>;
  static constexpr int kVec = S::kVec;
  static constexpr int kVpt = S::kVpt;
  static constexpr int kPack = 16;  // bytes

  template <class Shape>
  __device__ __forceinline__ Ring(void* base, int tensors, int stages, const Shape& shape)
      : data_(static_cast<char*>(base)),
        base_(smem_address(base)),
        mine_(base_ + kPack * (kAligned ? static_cast<int>(threadIdx.x)
                                        : shape.group * shape.tpr * kVpt + shape.lane)),
        pack_stride_(kPack * (kAligned ? shape.threads : shape.tpr)),
        tensor_stride_(kPack * kVpt * shape.threads),
        slot_stride_(tensors * tensor_stride_),
        stages_(stages),
        threads_(shape.threads),
        tpr_(shape.tpr),
        lane_(shape.lane) {}

  // Shared-space address of the ring's first byte and of the first byte past it (both layouts
  // take stages * tensors * threads * kVpt packs).
  __device__ __forceinline__ unsigned base() const { return base_; }
  __device__ __forceinline__ unsigned end() const { return base_ + stages_ * slot_stride_; }
  // The thread's pack c of tensor t in the slot.
  __device__ __forceinline__ unsigned at(int slot, int tensor, int c) const {
    return mine_ + slot * slot_stride_ + tensor * tensor_stride_ + c * pack_stride_;
  }
  __device__ __forceinline__ Pack<T> get(int slot, int tensor, int c) const {
    Pack<T> out;
    out.set_raw(*shared_pointer<const uint4>(at(slot, tensor, c)));
    return out;
  }
  __device__ __forceinline__ void put(int slot, int tensor, int c, const Pack<T>& value) const {
    *shared_pointer<uint4>(at(slot, tensor, c)) = value.raw();
  }

  // Unaligned route: zeros the padding [cols, row_elems) of every row of every slot (then a
  // barrier).
  __device__ __forceinline__ void zero_padding(int cols) const {
    if constexpr (!kAligned) {
      T* elems = reinterpret_cast<T*>(data_);
      const int row_elems = tpr_ * kEpt;
      const int pad = row_elems - cols;
      const int rows = stages_ * slot_stride_ / (kPack * tpr_ * kVpt);
      for (int i = threadIdx.x; i < rows * pad; i += threads_) {
        elems[(i / pad) * row_elems + cols + i % pad] = T(0.0f);
      }
      __syncthreads();
    }
  }

  // Aligned route: starts copying the thread's packs of its row, whose pack 0 is at `src`.
  template <int kL2>
  __device__ __forceinline__ void fill_own(int slot, int tensor, const T* src, int cols) const {
#pragma unroll
    for (int c = 0; c < kVpt; ++c) {
      if (S::column(c, tpr_, lane_) < cols) copy16_async<kL2>(at(slot, tensor, c), src + c * tpr_ * kVec);
    }
  }

  // Unaligned route: starts copying (or copies, see async_copies) `count` (<= groups)
  // consecutive rows starting at `src` into the slot; every thread of the CTA takes part.
  __device__ __forceinline__ void fill_rows(int slot, int tensor, const T* src, int count, int cols) const {
    // Element i of the rows is column i % cols of row i / cols, at that column of its padded
    // row in the slot.
    const int first = slot * slot_stride_ + tensor * tensor_stride_;
    const int row_elems = tpr_ * kEpt;
    const int total = count * cols;
    if constexpr (async_copies<T, kAligned>()) {
      for (int i = threadIdx.x; i < total; i += threads_) {
        const int g = i / cols;
        const int element = g * row_elems + (i - g * cols);
        copy4_async(base_ + first + static_cast<unsigned>(sizeof(T) * element), src + i);
      }
    } else {
      T* rows = reinterpret_cast<T*>(data_ + first);
#pragma unroll 4  // synchronous: several loads in flight
      for (int i = threadIdx.x; i < total; i += threads_) {
        const int g = i / cols;
        rows[g * row_elems + (i - g * cols)] = src[i];
      }
    }
  }

 private:
  char* data_;      // the ring's first byte (generic), for the unaligned route's plain stores
  unsigned base_;   // the same as a shared-space address
  unsigned mine_;  // the thread's pack 0 of tensor 0 in slot 0
  int pack_stride_;
  int tensor_stride_;
  int slot_stride_;
  int stages_;
  int threads_;
  int tpr_;
  int lane_;
};

// The rows of a staged loop, one step at a time: step k holds rows first + k * stride + g for
// the row groups g < groups, below `limit`. A cursor holds one step (its first row and that
// row's element offset, both the same for the whole CTA) and moves to the next with advance();
// the copies and the computation each walk their own. A thread adds its own constant part
// (its group's row, its column), so its per-step state stays uniform.
struct StepRows {
  int64_t row0;    // the step's first row
  int64_t offset;  // row0 * cols
  int64_t stride;
  int64_t offset_stride;
  int64_t limit;

  __device__ __forceinline__ StepRows(int64_t first, int64_t stride_rows, int64_t limit_rows, int cols)
      : row0(first), offset(first * cols), stride(stride_rows), offset_stride(stride_rows * cols),
        limit(limit_rows) {}
  __device__ __forceinline__ void advance() {
    row0 += stride;
    offset += offset_stride;
  }
  // Whether the step has row group g's row.
  __device__ __forceinline__ bool has(int g) const { return g < limit - row0; }
  // Rows of the step (0 .. groups).
  __device__ __forceinline__ int count(int groups) const {
    return limit - row0 < groups ? static_cast<int>(limit - row0) : groups;
  }
};

// The cp.async discipline of a staged loop over `steps` steps: one group committed per step
// (empty past the CTA's rows), so "step k is in" is always "at most stages - 1 groups pending".
// `fill(slot)` starts the copies of the next step not yet started (steps are filled in order;
// called only for steps < steps).
// * begin(): steps 0 .. stages - 2 into slots 0 .. stages - 2.
// * before(k): step k + stages - 1 into the slot step k - 1 used, then waits for step k. The
//   unaligned route's copies cross threads: a barrier before the refill (every thread is done
//   with step k - 1) and one after the wait (every thread's copies for step k have landed).
// * after(): moves to the next slot.
template <bool kAligned>
struct Pipeline {
  int64_t steps;
  int stages;
  int slot = 0;    // the slot of the current step
  int refill = 0;  // the slot the previous step used

  template <typename Fill>
  __device__ __forceinline__ void begin(Fill& fill) {
    for (int k = 0; k < stages - 1; ++k) {
      if (k < steps) fill(k);
      cp_async_commit();
    }
    refill = stages - 1;
  }
  template <typename Fill>
  __device__ __forceinline__ void before(int64_t step, Fill& fill) {
    if constexpr (!kAligned) __syncthreads();
    if (step + stages - 1 < steps) fill(refill);
    cp_async_commit();
    cp_async_wait_pending(stages - 1);
    if constexpr (!kAligned) __syncthreads();
  }
  __device__ __forceinline__ void after() {
    slot = slot + 1 == stages ? 0 : slot + 1;
    refill = refill + 1 == stages ? 0 : refill + 1;
  }
};

// The row tensors of a staged step in ring order (t a compile-time constant after unrolling,
// so each read is of the launch parameters themselves): forward x (, g) (, residual); backward
// s, dy (, g).
template <bool kGated>
__device__ __forceinline__ const void* ring_source(const ForwardParams& p, int t) {
  return t == 0 ? p.x : (kGated && t == 1 ? p.gate : p.residual);
}
template <bool kGated>
__device__ __forceinline__ const void* ring_source(const BackwardParams& p, int t) {
  return t == 0 ? p.s : (t == 1 ? p.dy : p.gate);
}

// Starts the copies of the next step into a slot and moves to the step after: the `kTensors`
// row tensors of ring_source (each read at the cursor's rows; the last may be absent: the
// forward's residual) and, with kRstd (the backward), each row group's rstd into the rstd ring.
template <typename T, bool kAligned, int kEpt, bool kGated, int kTensors, bool kRstd, int kL2, class Params>
struct StepFill {
  const Ring<T, kAligned, kEpt>& ring;
  const Params& p;
  StepRows rows;
  int cols;
  int groups;
  int group;
  int thread_offset;            // aligned: the thread's pack 0 in its row of a step, group * cols + lane * kVec
  unsigned rstd_ring = 0;       // kRstd: shared-space address of the thread's rstd in slot 0
  int rstd_slot = 0;            // kRstd: bytes a slot of the rstd ring

  __device__ __forceinline__ void operator()(int slot) {
    const bool mine = rows.has(group);
#pragma unroll
    for (int t = 0; t < kTensors; ++t) {
      const T* source = static_cast<const T*>(ring_source<kGated>(p, t));
      if (t + 1 == kTensors && source == nullptr) continue;
      if constexpr (kAligned) {
        if (mine) ring.template fill_own<kL2>(slot, t, source + rows.offset + thread_offset, cols);
      } else {
        ring.fill_rows(slot, t, source + rows.offset, rows.count(groups), cols);
      }
    }
    if constexpr (kRstd) {
      if (mine) copy4_async(rstd_ring + slot * rstd_slot, p.rstd + rows.row0 + group);
    }
    rows.advance();
  }
};

// --------------------------------------------------------------------------- forward

// Whether a registers-path forward instance loads its next row step while it reduces and
// writes the current one: not when its CTAs take one step each (kForwardCtaRows rows in one
// step of a fixed-width instance: see launch_forward), where the second set of registers would
// only cost occupancy. (A grid capped at kMaxGrid still gives such CTAs more steps; each then
// loads its rows when it gets to them.)
template <int kTpr, class Cfg>
__host__ __device__ constexpr bool forward_prefetches() {
  return !(kTpr > 0 && Cfg::kForwardCtaRows > 0 &&
           Cfg::kForwardCtaRows < 2 * row_groups<Cfg::kForwardCtaThreads>(kTpr));
}

// Registers path: the next row is loaded while the current one is reduced and written (see
// forward_prefetches).
template <typename T, int kEpt, int kTpr, bool kGated, class Cfg>
__device__ __forceinline__ void forward_registers(const ForwardParams& p) {
  using S = Slice<T, kEpt>;
  using P = Pack<T>;
  constexpr int kVec = S::kVec;
  constexpr int kVpt = S::kVpt;
  constexpr int kL2 = Cfg::kL2Prefetch;
  __shared__ __align__(16) float scratch[64];
  const Shape<kTpr, Cfg::kForwardCtaThreads> shape(p.tpr);
  const int tpr = shape.tpr;
  const int groups = shape.groups;
  const int group = shape.group;
  const int lane = shape.lane;
  const int cols = p.cols;

  constexpr bool kPrefetch = forward_prefetches<kTpr, Cfg>();
  extern __shared__ float4 dynamic_smem[];
  using W = Weights<T, true, kEpt, weight_source<T, true, kEpt, kGated, Cfg, false>()>;
  const W weights(reinterpret_cast<float*>(dynamic_smem), p.weight, p.weight_fp32, p.weight_offset, cols, tpr,
                  lane);

  const T* x = static_cast<const T*>(p.x);
  const T* residual = static_cast<const T*>(p.residual);
  const T* gate = static_cast<const T*>(p.gate);
  T* y = static_cast<T*>(p.y);
  T* residual_out = static_cast<T*>(p.residual_out);
  const float inv_cols = p.inv_cols;
  GroupSum<false> group_sum(tpr, group, scratch);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groups;
  int64_t base = static_cast<int64_t>(blockIdx.x) * groups;
  P s[kVpt], g[kVpt], s_next[kVpt], g_next[kVpt];
  if constexpr (kPrefetch) {
    load_slice<T, kEpt, kL2>(s, x, base + group, base + group < p.rows, cols, tpr, lane);
    if (kGated) load_slice<T, kEpt, kL2>(g, gate, base + group, base + group < p.rows, cols, tpr, lane);
  }
  for (; base < p.rows; base += stride) {
    const int64_t row = base + group;
    const bool row_ok = row < p.rows;
    const int64_t offset = row * cols;
    if constexpr (kPrefetch) {
      const int64_t next = row + stride;
      load_slice<T, kEpt, kL2>(s_next, x, next, next < p.rows, cols, tpr, lane);
      if (kGated) load_slice<T, kEpt, kL2>(g_next, gate, next, next < p.rows, cols, tpr, lane);
    } else {
      load_slice<T, kEpt, kL2>(s, x, row, row_ok, cols, tpr, lane);
      if (kGated) load_slice<T, kEpt, kL2>(g, gate, row, row_ok, cols, tpr, lane);
    }
    if (residual != nullptr) {
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        const int col = S::column(c, tpr, lane);
        if (row_ok && col < cols) {
          const P r = load_pack<T, true>(residual + offset + col, kVec);
          float sum[kVec];
#pragma unroll
          for (int v = 0; v < kVec; ++v) sum[v] = s[c].get(v) + r.get(v);
          s[c].set(sum);
          store_pack<T, true>(residual_out + offset + col, s[c], kVec);
        }
      }
    }
    float ssq = 0.0f;
#pragma unroll
    for (int c = 0; c < kVpt; ++c) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const float f = s[c].get(v);
        ssq = fmaf(f, f, ssq);
      }
    }
    ssq = group_sum(ssq);
    const float rstd = rsqrtf(ssq * inv_cols + p.eps);
    if (row_ok) {
      if (p.rstd != nullptr && lane == 0) p.rstd[row] = rstd;
      T* y_first = y + offset + lane * kVec;  // the thread's first pack in the row (load_slice's pointer)
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        const int col = S::column(c, tpr, lane);
        if (col < cols) {
          float w[kVec], out[kVec];
          weights.at(c, col, w);
#pragma unroll
          for (int v = 0; v < kVec; ++v) {
            out[v] = s[c].get(v) * rstd * w[v];
            if (kGated) {
              const float gv = g[c].get(v);
              out[v] *= gv * sigmoid(gv);
            }
          }
          P packed;
          packed.set(out);
          store_pack<T, true>(y_first + c * tpr * kVec, packed, kVec);
        }
      }
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        s[c] = s_next[c];
        if (kGated) g[c] = g_next[c];
      }
    }
  }
}

// How far a staged instance unrolls its second pass over its packs (the outputs): fully, except
// the widest instances, which roll it: unrolled, ptxas loads every pack of the pass at once and
// spills there. (Nothing in that pass is indexed by pack: their weights are never in registers.)
template <typename T, int kEpt>
__host__ __device__ constexpr int second_pass_unroll() {
  return kEpt == kMaxEpt ? 1 : kEpt / Pack<T>::kVec;
}

// Staged path: rows arrive through the shared-memory ring (see the top of this file). Dynamic
// shared memory: the weights (if staged), then the ring of x, g (gated) and residual (when
// given). The CTA's rows are first + k * stride + group (grid-stride, k = 0, 1, ...).
template <typename T, bool kAligned, int kEpt, int kTpr, bool kGated, class Cfg>
__device__ __forceinline__ void forward_staged(const ForwardParams& p) {
  using S = Slice<T, kEpt>;
  using P = Pack<T>;
  constexpr int kVec = S::kVec;
  constexpr int kVpt = S::kVpt;
  constexpr int kSecondPassUnroll = second_pass_unroll<T, kEpt>();
  constexpr int kGate = 1;
  constexpr int kResidual = kGated ? 2 : 1;
  __shared__ __align__(16) float scratch[64];
  extern __shared__ float4 dynamic_smem[];
  const Shape<kTpr, Cfg::kForwardCtaThreads> shape(p.tpr);
  const int tpr = shape.tpr;
  const int groups = shape.groups;
  const int group = shape.group;
  const int lane = shape.lane;
  const int cols = p.cols;
  const bool has_residual = p.residual != nullptr;
  using W = Weights<T, kAligned, kEpt, weight_source<T, kAligned, kEpt, kGated, Cfg, false>()>;
  char* smem = reinterpret_cast<char*>(dynamic_smem);
  const W weights(reinterpret_cast<float*>(smem), p.weight, p.weight_fp32, p.weight_offset, cols, tpr, lane);
  const Ring<T, kAligned, kEpt> ring(smem + W::smem_bytes(tpr), kResidual + (has_residual ? 1 : 0), p.stages,
                                     shape);
  ring.zero_padding(cols);
  GroupSum<false> group_sum(tpr, group, scratch);

  T* y = static_cast<T*>(p.y);
  T* residual_out = static_cast<T*>(p.residual_out);
  const float inv_cols = p.inv_cols;
  // The CTA's rows: first + k * stride + group (grid-stride, k = 0, 1, ...).
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groups;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * groups;
  using Fill = StepFill<T, kAligned, kEpt, kGated, kGated ? 3 : 2, false, Cfg::kL2Prefetch, ForwardParams>;
  Fill fill{ring, p, StepRows(first, stride, p.rows, cols), cols, groups, group, group * cols + lane * kVec};
  StepRows rows(first, stride, p.rows, cols);
  const int row_offset = group * cols;  // the thread's row in a step, from the step's first
  Pipeline<kAligned> pipe{first < p.rows ? (p.rows - first + stride - 1) / stride : 0, p.stages};
  pipe.begin(fill);
  for (int64_t step = 0; step < pipe.steps; ++step, rows.advance()) {
    pipe.before(step, fill);
    const int slot = pipe.slot;
    const int64_t row = rows.row0 + group;
    const bool row_ok = rows.has(group);
    float ssq = 0.0f;
#pragma unroll
    for (int c = 0; c < kVpt; ++c) {
      const int col = S::column(c, tpr, lane);
      P s = zero_pack<T>();
      if (row_ok && col < cols) {
        s = ring.get(slot, 0, c);
        if (has_residual) {
          const P r = ring.get(slot, kResidual, c);
          float sum[kVec];
#pragma unroll
          for (int v = 0; v < kVec; ++v) sum[v] = s.get(v) + r.get(v);
          s.set(sum);
          ring.put(slot, 0, c, s);  // the second pass normalises the rounded sum
          store_pack<T, kAligned>(row_pointer(residual_out, rows.offset, row_offset) + col, s, cols - col);
        }
      }
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const float f = s.get(v);
        ssq = fmaf(f, f, ssq);
      }
    }
    ssq = group_sum(ssq);
    const float rstd = rsqrtf(ssq * inv_cols + p.eps);
    if (row_ok) {
      if (p.rstd != nullptr && lane == 0) p.rstd[row] = rstd;
      T* y_row = row_pointer(y, rows.offset, row_offset);
#pragma unroll(kSecondPassUnroll)
      for (int c = 0; c < kVpt; ++c) {
        const int col = S::column(c, tpr, lane);
        if (col < cols) {
          const P s = ring.get(slot, 0, c);
          float w[kVec], out[kVec];
          weights.at(c, col, w);
#pragma unroll
          for (int v = 0; v < kVec; ++v) out[v] = s.get(v) * rstd * w[v];
          if (kGated) {
            const P g = ring.get(slot, kGate, c);
#pragma unroll
            for (int v = 0; v < kVec; ++v) {
              const float gv = g.get(v);
              out[v] *= gv * sigmoid(gv);
            }
          }
          P packed;
          packed.set(out);
          store_pack<T, kAligned>(y_row + col, packed, cols - col);
        }
      }
    }
    pipe.after();
  }
}

template <typename T, bool kAligned, int kEpt, int kTpr, bool kGated, class Cfg>
__device__ __forceinline__ void forward(const ForwardParams& p) {
  if constexpr (uses_registers<T, kAligned, kEpt, kGated, Cfg, false>()) {
    forward_registers<T, kEpt, kTpr, kGated, Cfg>(p);
  } else {
    forward_staged<T, kAligned, kEpt, kTpr, kGated, Cfg>(p);
  }
}

// --------------------------------------------------------------------------- backward
// A thread's weight-gradient sums (one per element of its slice), in registers or, for the
// widest staged instances (dw_in_shared), in shared memory: there 32 sums in registers next
// to the loads of 32 elements of two or three tensors spill. Either way, write() sums the row
// groups through a [groups][row_elems] float array of shared memory: in shared memory mode the
// sums already live there (a thread touches only its own columns, so no barrier until write()).
template <typename T, int kEpt, bool kInShared>
class WeightGrad {
 public:
  static constexpr int kVec = Pack<T>::kVec;
  static constexpr int kVpt = kEpt / kVec;

  // `sums`: the [groups][row_elems] array (shared memory mode; unused otherwise).
  __device__ __forceinline__ WeightGrad(float* sums, int tpr, int group, int lane)
      : sums_(sums), mine_(group * tpr * kEpt) {
#pragma unroll
    for (int c = 0; c < kVpt; ++c) {
      float* acc = at(c, Slice<T, kEpt>::column(c, tpr, lane));
#pragma unroll
      for (int v = 0; v < kVec; ++v) acc[v] = 0.0f;
    }
  }

  // The kVec sums of pack c (at column `col`).
  __device__ __forceinline__ float* at(int c, int col) {
    if constexpr (kInShared) {
      return sums_ + mine_ + col;
    } else {
      return reg_[c];
    }
  }

  // Writes the CTA's partial row of the workspace: the row groups' sums added in group order.
  // Registers mode goes through `scratch` ([groups][row_elems] floats of shared memory that no
  // thread reads any more).
  __device__ __forceinline__ void write(const BackwardParams& p, float* scratch, int tpr, int groups,
                                        int lane) {
    using S = Slice<T, kEpt>;
    float* out = p.partials + static_cast<int64_t>(blockIdx.x) * p.cols_padded;
    if (groups == 1) {
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        const int col = S::column(c, tpr, lane);
        const float* acc = at(c, col);
#pragma unroll
        for (int v = 0; v < kVec; ++v) {
          if (col + v < p.cols_padded) out[col + v] = col + v < p.cols ? acc[v] : 0.0f;
        }
      }
      return;
    }
    float* all = kInShared ? sums_ : scratch;
    if constexpr (!kInShared) {
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        const int col = S::column(c, tpr, lane);
#pragma unroll
        for (int v = 0; v < kVec; ++v) all[mine_ + col + v] = reg_[c][v];
      }
    }
    __syncthreads();
    const int row_elems = tpr * kEpt;
    for (int col = threadIdx.x; col < p.cols_padded; col += blockDim.x) {
      float total = 0.0f;
      if (col < p.cols) {
        for (int k = 0; k < groups; ++k) total += all[k * row_elems + col];
      }
      out[col] = total;
    }
  }

 private:
  float reg_[kInShared ? 1 : kVpt][kVec];
  float* sums_;
  int mine_;  // this row group's offset in the [groups][row_elems] array
};

// The first pass over one pack of a row: accumulates dw (kVec sums) and the row's dot product.
template <typename T, bool kGated>
__device__ __forceinline__ void backward_sums(const Pack<T>& s, const Pack<T>& dy, const Pack<T>& g,
                                              const float (&w)[Pack<T>::kVec], float rstd, float* dw,
                                              float& dot) {
#pragma unroll
  for (int v = 0; v < Pack<T>::kVec; ++v) {
    const float xhat = s.get(v) * rstd;
    float dn = dy.get(v);
    if (kGated) {
      const float gv = g.get(v);
      dn *= gv * sigmoid(gv);
    }
    dw[v] = fmaf(dn, xhat, dw[v]);
    dot = fmaf(dn * w[v], xhat, dot);
  }
}

// The rows of one backward CTA, a step of `groups` rows at a time: step k holds rows first +
// k * stride + g for the row groups g, below end (as StepRows walks them). Either the CTA's band
// of rows_per_cta consecutive rows, or (Cfg::kBackwardInterleave) every gridDim.x-th step of the
// whole tensor from step blockIdx.x: then the CTAs stream through one window of the tensors
// together instead of gridDim.x windows of their own; or (Cfg::kBackwardGuided h) the steps split
// into h + 1 regions (halves for h = 1; else 1/2, 1/4, ..., 1/2^h, 1/2^h) with a wave of
// gridDim.x / (h + 1) CTAs each, region r's in grid order after region r - 1's (the order the
// block scheduler starts them), every wave-th step of the region from the CTA's place in its
// wave. Either way a row group's rows come in row order, and which CTA takes a row depends on
// (rows, cols) and the program alone.
struct BackwardSpan {
  int64_t first;
  int64_t stride;
  int64_t end;
  int64_t steps;

  template <class Cfg>
  __device__ __forceinline__ static BackwardSpan of(const BackwardParams& p, int groups) {
    BackwardSpan span;
    if constexpr (Cfg::kBackwardGuided > 0) {
      constexpr int kRegions = Cfg::kBackwardGuided + 1;
      const int64_t wave = gridDim.x / kRegions;
      const int64_t region = blockIdx.x / wave;
      const int64_t all_steps = (p.rows + groups - 1) / groups;
      const int64_t begin = all_steps - (all_steps >> region);
      const int64_t stop = region + 1 < kRegions ? all_steps - (all_steps >> (region + 1)) : all_steps;
      span.first = (begin + blockIdx.x - region * wave) * groups;
      span.stride = wave * groups;
      span.end = stop * groups < p.rows ? stop * groups : p.rows;
    } else if constexpr (Cfg::kBackwardInterleave != 0) {
      span.first = static_cast<int64_t>(blockIdx.x) * groups;
      span.stride = static_cast<int64_t>(gridDim.x) * groups;
      span.end = p.rows;
    } else {
      span.first = static_cast<int64_t>(blockIdx.x) * p.rows_per_cta;
      span.stride = groups;
      span.end = span.first + p.rows_per_cta < p.rows ? span.first + p.rows_per_cta : p.rows;
    }
    span.steps = span.end > span.first ? (span.end - span.first + span.stride - 1) / span.stride : 0;
    return span;
  }
};

// The row pointers of the backward's outputs (and dsum) for one row (see row_pointer).
template <typename T>
struct BackwardRow {
  T* dx;
  T* dresidual;
  T* dgate;
  const T* dsum;

  __device__ __forceinline__ BackwardRow(const BackwardParams& p, int64_t offset, int thread_offset = 0)
      : dx(row_pointer(static_cast<T*>(p.dx), offset, thread_offset)),
        dresidual(row_pointer(static_cast<T*>(p.dresidual), offset, thread_offset)),
        dgate(row_pointer(static_cast<T*>(p.dgate), offset, thread_offset)),
        dsum(row_pointer(static_cast<const T*>(p.dsum), offset, thread_offset)) {}
};

// dx (and dg) of one pack of a row, and their stores at column `col` of `out`; `valid` is the
// elements left in the row.
template <typename T, bool kAligned, bool kGated>
__device__ __forceinline__ void backward_outputs(const BackwardRow<T>& out, const Pack<T>& s,
                                                 const Pack<T>& dy, const Pack<T>& g,
                                                 const float (&w)[Pack<T>::kVec], float rstd, float mean_dot,
                                                 int col, int valid) {
  constexpr int kVec = Pack<T>::kVec;
  Pack<T> dsum_pack = zero_pack<T>();
  if (out.dsum != nullptr) dsum_pack = load_pack<T, kAligned>(out.dsum + col, valid);
  float dx[kVec], dg[kVec];
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    const float xhat = s.get(v) * rstd;
    const float dyv = dy.get(v);
    float dn = dyv;
    if (kGated) {
      const float gv = g.get(v);
      const float sig = sigmoid(gv);
      dn *= gv * sig;
      dg[v] = dyv * xhat * w[v] * (sig * (1.0f + gv * (1.0f - sig)));
    }
    dx[v] = rstd * (dn * w[v] - xhat * mean_dot) + dsum_pack.get(v);
  }
  Pack<T> packed;
  packed.set(dx);
  store_pack<T, kAligned>(out.dx + col, packed, valid);
  if (out.dresidual != nullptr) store_pack<T, kAligned>(out.dresidual + col, packed, valid);
  if (kGated) {
    packed.set(dg);
    store_pack<T, kAligned>(out.dgate + col, packed, valid);
  }
}

// Registers path. Dynamic shared memory: the staged weights (tpr * kEpt floats), then, when the
// CTA has several row groups, their weight-gradient partials (blockDim.x * kEpt floats).
template <typename T, int kEpt, int kTpr, bool kGated, class Cfg>
__device__ __forceinline__ void backward_registers(const BackwardParams& p) {
  using S = Slice<T, kEpt>;
  using P = Pack<T>;
  constexpr int kVec = S::kVec;
  constexpr int kVpt = S::kVpt;
  constexpr int kL2 = Cfg::kL2Prefetch;
  __shared__ __align__(16) float scratch[64];
  extern __shared__ float4 dynamic_smem[];
  const Shape<kTpr, Cfg::kBackwardCtaThreads> shape(p.tpr);
  const int tpr = shape.tpr;
  const int groups = shape.groups;
  const int group = shape.group;
  const int lane = shape.lane;
  const int cols = p.cols;
  float* wsm = reinterpret_cast<float*>(dynamic_smem);
  using W = Weights<T, true, kEpt, WeightSource::kShared>;
  const W weights(wsm, p.weight, p.weight_fp32, p.weight_offset, cols, tpr, lane);
  WeightGrad<T, kEpt, false> dw(nullptr, tpr, group, lane);

  const T* s_in = static_cast<const T*>(p.s);
  const T* gate = static_cast<const T*>(p.gate);
  const T* dy_in = static_cast<const T*>(p.dy);
  const float inv_cols = p.inv_cols;
  const BackwardSpan span = BackwardSpan::of<Cfg>(p, groups);
  const int64_t end = span.end;
  GroupSum<group_barriers<kTpr, Cfg::kBackwardCtaThreads>()> group_sum(tpr, group, scratch);
  P s[kVpt], dy[kVpt], g[kVpt];
  P s_next[kVpt], dy_next[kVpt], g_next[kVpt];
  const int64_t first = span.first + group;
  load_slice<T, kEpt, kL2>(s, s_in, first, first < end, cols, tpr, lane);
  load_slice<T, kEpt, kL2>(dy, dy_in, first, first < end, cols, tpr, lane);
  if (kGated) load_slice<T, kEpt, kL2>(g, gate, first, first < end, cols, tpr, lane);
  float rstd = first < end ? __ldg(p.rstd + first) : 0.0f;
  for (int64_t base = span.first; base < end; base += span.stride) {
    const int64_t row = base + group;
    const bool row_ok = row < end;
    const int64_t offset = row * cols;
    const int64_t next = row + span.stride;
    load_slice<T, kEpt, kL2>(s_next, s_in, next, next < end, cols, tpr, lane);
    load_slice<T, kEpt, kL2>(dy_next, dy_in, next, next < end, cols, tpr, lane);
    if (kGated) load_slice<T, kEpt, kL2>(g_next, gate, next, next < end, cols, tpr, lane);
    const float rstd_next = next < end ? __ldg(p.rstd + next) : 0.0f;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kVpt; ++c) {
      float w[kVec];
      const int col = S::column(c, tpr, lane);
      weights.at(c, col, w);
      backward_sums<T, kGated>(s[c], dy[c], g[c], w, rstd, dw.at(c, col), dot);
    }
    dot = group_sum(dot);
    const float mean_dot = dot * inv_cols;
    if (row_ok) {
      const BackwardRow<T> out(p, offset);
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        const int col = S::column(c, tpr, lane);
        if (col < cols) {
          float w[kVec];
          weights.at(c, col, w);
          backward_outputs<T, true, kGated>(out, s[c], dy[c], g[c], w, rstd, mean_dot, col, kVec);
        }
      }
    }
#pragma unroll
    for (int c = 0; c < kVpt; ++c) {
      s[c] = s_next[c];
      dy[c] = dy_next[c];
      if (kGated) g[c] = g_next[c];
    }
    rstd = rstd_next;
  }
  if (p.partials == nullptr) return;
  dw.write(p, wsm + tpr * kEpt, tpr, groups, lane);
}

// Staged path. Dynamic shared memory: the weights (if staged), the ring (tensors s, dy, then
// g), a ring of rstd values (stages * threads floats), then the weight-gradient sums if they
// are kept there (dw_in_shared); otherwise the row groups' partials reuse the ring at the end.
template <typename T, bool kAligned, int kEpt, int kTpr, bool kGated, class Cfg>
__device__ __forceinline__ void backward_staged(const BackwardParams& p) {
  using S = Slice<T, kEpt>;
  using P = Pack<T>;
  constexpr int kVec = S::kVec;
  constexpr int kVpt = S::kVpt;
  constexpr int kSecondPassUnroll = second_pass_unroll<T, kEpt>();
  constexpr int kTensors = kGated ? 3 : 2;
  constexpr int kDy = 1;
  constexpr int kGate = 2;
  __shared__ __align__(16) float scratch[64];
  extern __shared__ float4 dynamic_smem[];
  const Shape<kTpr, Cfg::kBackwardCtaThreads> shape(p.tpr);
  const int tpr = shape.tpr;
  const int groups = shape.groups;
  const int group = shape.group;
  const int lane = shape.lane;
  const int cols = p.cols;
  const int stages = p.stages;
  using W = Weights<T, kAligned, kEpt, weight_source<T, kAligned, kEpt, kGated, Cfg, true>()>;
  char* smem = reinterpret_cast<char*>(dynamic_smem);
  // With Cfg::kBackwardOverlapStaging the weights are staged a pack at a time once the ring's
  // first copies are on their way: every CTA of the first wave starts at once, and staging first,
  // an element at a time, left DRAM idle for 1-10 us (H200 timelines, 2026-12-02).
  constexpr bool kOverlapStaging = Cfg::kBackwardOverlapStaging != 0 &&
                                   weight_source<T, kAligned, kEpt, kGated, Cfg, true>() == WeightSource::kShared;
  const W weights(reinterpret_cast<float*>(smem), p.weight, p.weight_fp32, p.weight_offset, cols, tpr, lane,
                  !kOverlapStaging);
  const Ring<T, kAligned, kEpt> ring(smem + W::smem_bytes(tpr), kTensors, stages, shape);
  ring.zero_padding(cols);
  GroupSum<group_barriers<kTpr, Cfg::kBackwardCtaThreads>()> group_sum(tpr, group, scratch);
  // The rstd ring (one float a thread a slot) follows the ring.
  const unsigned rstd_ring = ring.end() + 4 * threadIdx.x;
  // Shared-memory weight-gradient sums (if so) follow the rstd ring.
  using DW = WeightGrad<T, kEpt, dw_in_shared<T, kEpt, kGated>()>;
  const int rstd_slot = 4 * shape.threads;  // bytes
  float* dw_sums = reinterpret_cast<float*>(smem + W::smem_bytes(tpr) + (ring.end() - ring.base()) +
                                            stages * rstd_slot);
  DW dw(dw_in_shared<T, kEpt, kGated>() ? dw_sums : nullptr, tpr, group, lane);

  const float inv_cols = p.inv_cols;
  const BackwardSpan span = BackwardSpan::of<Cfg>(p, groups);
  using Fill = StepFill<T, kAligned, kEpt, kGated, kTensors, true, Cfg::kL2Prefetch, BackwardParams>;
  Fill fill{ring, p, StepRows(span.first, span.stride, span.end, cols), cols, groups, group,
            group * cols + lane * kVec, rstd_ring, rstd_slot};
  StepRows rows(span.first, span.stride, span.end, cols);
  Pipeline<kAligned> pipe{span.steps, stages};
  pipe.begin(fill);
  if constexpr (kOverlapStaging) weights.stage(tpr);
  for (int64_t step = 0; step < pipe.steps; ++step, rows.advance()) {
    pipe.before(step, fill);
    const int slot = pipe.slot;
    const bool row_ok = rows.has(group);
    const float rstd = row_ok ? *shared_pointer<const float>(rstd_ring + slot * rstd_slot) : 0.0f;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kVpt; ++c) {
      const int col = S::column(c, tpr, lane);
      const bool in = row_ok && col < cols;
      const P s = in ? ring.get(slot, 0, c) : zero_pack<T>();
      const P dy = in ? ring.get(slot, kDy, c) : zero_pack<T>();
      const P g = kGated && in ? ring.get(slot, kGate, c) : zero_pack<T>();
      float w[kVec];
      weights.at(c, col, w);
      backward_sums<T, kGated>(s, dy, g, w, rstd, dw.at(c, col), dot);
    }
    dot = group_sum(dot);
    const float mean_dot = dot * inv_cols;
    if (row_ok) {
      const BackwardRow<T> out(p, rows.offset, group * cols);
#pragma unroll(kSecondPassUnroll)
      for (int c = 0; c < kVpt; ++c) {
        const int col = S::column(c, tpr, lane);
        if (col < cols) {
          const P g = kGated ? ring.get(slot, kGate, c) : zero_pack<T>();
          float w[kVec];
          weights.at(c, col, w);
          backward_outputs<T, kAligned, kGated>(out, ring.get(slot, 0, c), ring.get(slot, kDy, c), g, w, rstd,
                                                mean_dot, col, cols - col);
        }
      }
    }
    pipe.after();
  }
  if (p.partials == nullptr) return;
  // The partials reuse the ring: every copy has landed (the last groups were empty) and every
  // thread must be done reading its slots.
  cp_async_wait<0>();
  __syncthreads();
  dw.write(p, reinterpret_cast<float*>(smem + W::smem_bytes(tpr)), tpr, groups, lane);
}

template <typename T, bool kAligned, int kEpt, int kTpr, bool kGated, class Cfg>
__device__ __forceinline__ void backward(const BackwardParams& p) {
  if constexpr (uses_registers<T, kAligned, kEpt, kGated, Cfg, true>()) {
    backward_registers<T, kEpt, kTpr, kGated, Cfg>(p);
  } else {
    backward_staged<T, kAligned, kEpt, kTpr, kGated, Cfg>(p);
  }
}

// Sums the partial rows of each column: thread (lane, segment) sums rows segment,
// segment + kColSegments, ... in order; a fixed pairwise tree then adds the segments.
__device__ __forceinline__ void reduce_dweight(const DweightParams& p) {
  __shared__ float4 sums[kColSegments][kColLanes];
  const int lane = threadIdx.x;
  const int segment = threadIdx.y;
  const int col = (blockIdx.x * kColLanes + lane) * 4;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (col < p.cols_padded) {
    const float* base = p.partials + col;
#pragma unroll 4
    for (int64_t k = segment; k < p.chunks; k += kColSegments) {
      const float4 v = __ldcs(reinterpret_cast<const float4*>(base + k * p.cols_padded));
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
  }
  sums[segment][lane] = acc;
  __syncthreads();
#pragma unroll
  for (int half = kColSegments / 2; half >= 1; half >>= 1) {
    if (segment < half) {
      const float4 other = sums[segment + half][lane];
      float4& mine = sums[segment][lane];
      mine.x += other.x;
      mine.y += other.y;
      mine.z += other.z;
      mine.w += other.w;
    }
    __syncthreads();
  }
  if (segment != 0 || col >= p.cols) return;
  const float4 total4 = sums[0][lane];
  const float total[4] = {total4.x, total4.y, total4.z, total4.w};
  for (int j = 0; j < 4 && col + j < p.cols; ++j) {
    switch (p.out_dtype) {
      case kBF16: static_cast<__nv_bfloat16*>(p.dweight)[col + j] = __float2bfloat16_rn(total[j]); break;
      case kF16: static_cast<__half*>(p.dweight)[col + j] = __float2half_rn(total[j]); break;
      default: static_cast<float*>(p.dweight)[col + j] = total[j]; break;
    }
  }
}

}  // namespace rmsnorm
}  // namespace cake

// A program's kernels, defined in its kernel source after cake/rmsnorm/config.h:
//   CAKE_RMSNORM_FORWARD_KERNEL(kernel_<library>_forward)    a template <int kEpt, int kTpr>
//   CAKE_RMSNORM_BACKWARD_KERNEL(kernel_<library>_backward)  the same
//   CAKE_RMSNORM_DWEIGHT_KERNEL(kernel_<library>_dweight)    extern "C"
// Each template kernel is instantiated for every instance with_instance can choose in the
// program's band (and no other), under its C++ symbol (the entries build it:
// cake/rmsnorm/entries.h).
#define CAKE_RMSNORM_PROGRAM_ ::cake::rmsnorm::program

#define CAKE_RMSNORM_FORWARD_KERNEL(name)                                                          \
  template <int kEpt, int kTpr>                                                                  \
  __global__ void __launch_bounds__(::cake::rmsnorm::kMaxCtaThreads,                             \
                                    CAKE_RMSNORM_PROGRAM_::kForwardMinBlocks<kEpt, kTpr>)        \
      name(const __grid_constant__ ::cake::rmsnorm::ForwardParams p) {                           \
    ::cake::rmsnorm::forward<CAKE_RMSNORM_PROGRAM_::Elem, CAKE_RMSNORM_PROGRAM_::kAligned, kEpt, \
                             kTpr, CAKE_RMSNORM_PROGRAM_::kGated, CAKE_RMSNORM_PROGRAM_::Config>(p); \
  }                                                                                              \
  [[maybe_unused]] inline int name##_instances() {                                               \
    return ::cake::rmsnorm::with_instance<CAKE_RMSNORM_PROGRAM_::Config, false,                  \
                                          CAKE_RMSNORM_PROGRAM_::kAligned>(0, [](auto i) {       \
      (void)&name<decltype(i)::ept, decltype(i)::tpr>;                                           \
      return 0;                                                                                  \
    });                                                                                          \
  }

#define CAKE_RMSNORM_BACKWARD_KERNEL(name)                                                         \
  template <int kEpt, int kTpr>                                                                  \
  __global__ void __launch_bounds__(::cake::rmsnorm::kMaxCtaThreads,                             \
                                    CAKE_RMSNORM_PROGRAM_::kBackwardMinBlocks<kEpt>)             \
      name(const __grid_constant__ ::cake::rmsnorm::BackwardParams p) {                          \
    ::cake::rmsnorm::backward<CAKE_RMSNORM_PROGRAM_::Elem, CAKE_RMSNORM_PROGRAM_::kAligned, kEpt, \
                              kTpr, CAKE_RMSNORM_PROGRAM_::kGated, CAKE_RMSNORM_PROGRAM_::Config>(p); \
  }                                                                                              \
  [[maybe_unused]] inline int name##_instances() {                                               \
    return ::cake::rmsnorm::with_instance<CAKE_RMSNORM_PROGRAM_::Config, true,                   \
                                          CAKE_RMSNORM_PROGRAM_::kAligned>(0, [](auto i) {       \
      (void)&name<decltype(i)::ept, decltype(i)::tpr>;                                           \
      return 0;                                                                                  \
    });                                                                                          \
  }

#define CAKE_RMSNORM_DWEIGHT_KERNEL(name)                                                          \
  extern "C" __global__ void __launch_bounds__(::cake::rmsnorm::kColLanes *                     \
                                               ::cake::rmsnorm::kColSegments)                    \
      name(const __grid_constant__ ::cake::rmsnorm::DweightParams p) {                           \
    ::cake::rmsnorm::reduce_dweight(p);                                                          \
  }
