// RMSNorm programs (both families): what host and device code share. The launch shapes (which
// kernel instance serves D, its threads, its ring slots, the backward's row partition) and the
// launch parameters, compiled by nvcc for the kernels (cake/rmsnorm/kernels.cuh) and by the host
// compiler for the entries (cake/rmsnorm/entries.h). Knob-independent: a program's tuning arrives
// as a Config class (cake/rmsnorm/config.h). The math, the layout and the determinism argument
// are at the top of cake/rmsnorm/kernels.cuh.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <type_traits>
#include <utility>

// The host compiler sees the __host__ __device__ functions as plain host functions.
#if !defined(__CUDACC__)
#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#endif

namespace cake {
namespace rmsnorm {

// Every kernel runs at most kMaxCtaThreads threads a CTA (its launch bound, so 128 registers).
constexpr int kMaxCtaThreads = 512;
constexpr int kMaxCols = 16384;
// The widest instance: 32 elements a thread, so D <= 32 * 512.
constexpr int kMaxEpt = 32;
static_assert(kMaxEpt * kMaxCtaThreads >= kMaxCols, "the widest instance must cover kMaxCols");
// Ring depth bounds, and the shared memory a CTA may take: the ring gets the asked slots while
// they fit, with the weights and sums beside it, in kStageBudget (two such CTAs share an SM),
// and at least two (overlap within the CTA) while they fit in kMaxSmem (a CTA's largest opt-in,
// less the kernels' static 256 bytes), else one (at most 194 KiB: fp32, D = 16384).
constexpr int kMaxStages = 4;
constexpr int kDefaultStages = 2;
constexpr size_t kStageBudget = 112 * 1024;
constexpr size_t kMaxSmem = 227 * 1024 - 1024;
// Weight-gradient column reduction: a CTA covers kColLanes float4 lanes (4 columns each, so one
// 32-byte sector of each partial row) and splits the partial rows into kColSegments interleaved
// segments, which a fixed pairwise tree then sums.
constexpr int kColLanes = 2;
constexpr int kColSegments = 128;
static_assert((kColSegments & (kColSegments - 1)) == 0, "the segment tree halves a power of two");

// dtype codes shared with the Python side.
enum DType : int { kBF16 = 0, kF16 = 1, kF32 = 2 };

// A program's tuning (the kernel template's knobs) arrives as a class with these members:
//   kForwardStages       0 (registers path for the aligned instances) or 1..kMaxStages
//   kBackwardStages      the same for the backward (the registers path below 32 elements a thread)
//   kForwardMinEpt       8 or 16: the narrowest forward instance compiled
//   kBackwardMinEpt      the same for the backward
//   kForwardMaxRowThreads  32 to 512 (a power of two): the widest row group a forward instance
//                        below kMaxEpt may use (fewer threads a row: more elements a thread)
//   kBackwardMaxRowThreads the same for the backward
//   kColsMin, kColsMax   the program's band of D (its route): instances that serve no D in it
//                        are not compiled (reachable_width)
//   kForwardCommonWidths 0 to 3: forward instances also fix the row groups of the multiples
//                        of 64 between the powers of two (1), or of every multiple of 32 (2),
//                        and also those of a warp or less (3) (has_fixed_instance)
//   kBackwardCommonWidths  the same for the backward
//   kForwardCtaThreads   128, 256 or 512: threads a forward CTA aims for when a row needs fewer
//   kBackwardCtaThreads  the same for the backward
//   kL2Prefetch          0, 128 or 256: L2 prefetch size hint on the aligned loads and copies
//   kForwardWeights      where forward instances read the weights from (but the widest staged
//                        ones): 0 shared memory, 1 registers, 2 global memory through L1
//                        (weight_source)
//   kBackwardWeights     the same for the backward
//   kForwardCtaRows      rows a forward CTA aims to take: 0 one wave of persistent CTAs (the
//                        grid follows the occupancy); n > 0 about rows / n CTAs (at least one
//                        row step each), so that the block scheduler evens out the SMs, which
//                        drain DRAM at different rates (a persistent wave ends with the slowest)
//   kBackwardBands       at most this many backward CTAs (weight-gradient partial rows) where
//                        they take kBackwardCtaThreads threads; more where they take fewer and
//                        more of them fit an SM (backward_bands)
//   kBackwardOverlapStaging  1: a staged backward CTA stages its shared-memory weights a pack
//                        at a time while its ring's first copies are in flight; 0: an element
//                        at a time, before them (Weights::stage)
//   kBackwardInterleave  0: a backward CTA takes a band of consecutive rows; 1: the CTAs take
//                        the row steps in turn, so that they all stream through one window of
//                        the tensors (BackwardSpan)
//   kBackwardGuided      0, or h >= 1 with kBackwardInterleave: the row steps in h + 1 regions
//                        (halves for h = 1; else 1/2, 1/4, ..., 1/2^h, 1/2^h of them), each
//                        taken in turn by a wave of half the bands' CTAs (the bands make two
//                        waves): a wave streams through its own part of the tensors, and the
//                        CTAs the block scheduler starts last are the shortest (BackwardSpan)
__host__ __device__ constexpr bool valid_cta_threads(int threads) {
  return threads == 128 || threads == 256 || threads == 512;
}

__host__ __device__ constexpr bool valid_max_row_threads(int threads) {
  return threads >= 32 && threads <= kMaxCtaThreads && (threads & (threads - 1)) == 0;
}

template <class Cfg>
__host__ __device__ constexpr bool valid_config() {
  return Cfg::kForwardStages >= 0 && Cfg::kForwardStages <= kMaxStages && Cfg::kBackwardStages >= 0 &&
         Cfg::kBackwardStages <= kMaxStages && (Cfg::kForwardMinEpt == 8 || Cfg::kForwardMinEpt == 16) &&
         (Cfg::kBackwardMinEpt == 8 || Cfg::kBackwardMinEpt == 16) &&
         valid_max_row_threads(Cfg::kForwardMaxRowThreads) && valid_max_row_threads(Cfg::kBackwardMaxRowThreads) &&
         Cfg::kForwardCommonWidths >= 0 && Cfg::kForwardCommonWidths <= 3 &&
         Cfg::kBackwardCommonWidths >= 0 && Cfg::kBackwardCommonWidths <= 3 && Cfg::kColsMin >= 1 &&
         Cfg::kColsMin <= Cfg::kColsMax && Cfg::kColsMax <= kMaxCols &&
         valid_cta_threads(Cfg::kForwardCtaThreads) && valid_cta_threads(Cfg::kBackwardCtaThreads) &&
         (Cfg::kL2Prefetch == 0 || Cfg::kL2Prefetch == 128 || Cfg::kL2Prefetch == 256) &&
         Cfg::kForwardWeights >= 0 && Cfg::kForwardWeights <= 2 && Cfg::kBackwardWeights >= 0 &&
         Cfg::kBackwardWeights <= 2 && Cfg::kForwardCtaRows >= 0 && Cfg::kBackwardBands >= 1 &&
         (Cfg::kBackwardOverlapStaging == 0 || Cfg::kBackwardOverlapStaging == 1) &&
         (Cfg::kBackwardInterleave == 0 || Cfg::kBackwardInterleave == 1) && Cfg::kBackwardGuided >= 0 &&
         Cfg::kBackwardGuided <= 8 && (Cfg::kBackwardGuided == 0 || Cfg::kBackwardInterleave == 1);
}

// --------------------------------------------------------------------------- parameters

struct ForwardParams {
  const void* x;         // (rows, cols) T
  const void* residual;  // (rows, cols) T or null
  const void* gate;      // (rows, cols) T; gated family only
  const void* weight;    // (cols,) T or fp32 (weight_fp32)
  void* y;               // (rows, cols) T
  void* residual_out;    // (rows, cols) T: x + residual; null when residual is null
  float* rstd;           // (rows,) fp32 or null
  int64_t rows;
  int32_t cols;
  int32_t tpr;           // threads per row group (set by the launcher)
  int32_t stages;        // ring slots (set by the launcher; 0 on the registers path)
  int32_t weight_fp32;
  float eps;
  float weight_offset;
  float inv_cols;        // 1 / cols, rounded as the device's division would (set by the binding:
                         // a constant, where a division in the kernel holds a register a row)
};

struct BackwardParams {
  const void* s;         // (rows, cols) T: the normalised input (x, or the saved prenorm sum)
  const void* gate;      // (rows, cols) T; gated family only
  const void* weight;    // (cols,) T or fp32
  const void* dy;        // (rows, cols) T
  const float* rstd;     // (rows,) fp32 from the forward
  const void* dsum;      // (rows, cols) T gradient of the prenorm sum output, or null
  void* dx;              // (rows, cols) T
  void* dresidual;       // (rows, cols) T copy of dx for the residual input, or null
  void* dgate;           // (rows, cols) T; gated family only
  float* partials;       // (ctas, cols_padded) fp32 weight-gradient partial rows, or null
  int64_t rows;
  int64_t rows_per_cta;
  int32_t cols;
  int32_t cols_padded;   // cols rounded up to a multiple of 4 (float4 rows)
  int32_t tpr;           // set by the launcher
  int32_t stages;        // set by the launcher
  int32_t weight_fp32;
  float weight_offset;
  float inv_cols;        // 1 / cols (as ForwardParams)
};

struct DweightParams {
  const float* partials;  // (chunks, cols_padded) fp32
  void* dweight;          // (cols,) of dtype `out_dtype`
  int64_t chunks;
  int32_t cols;
  int32_t cols_padded;
  int32_t out_dtype;
};


// --------------------------------------------------------------------------- CTA shape

// Row groups a CTA of kCtaThreads holds at `tpr` threads a group (one when a row takes more):
// the launchers and Shape both count them here.
template <int kCtaThreads>
__host__ __device__ constexpr int row_groups(int tpr) {
  return tpr >= kCtaThreads ? 1 : kCtaThreads / tpr;
}

// --------------------------------------------------------------------------- instance choices

// Whether a route's packs reach shared memory asynchronously: cp.async copies 4, 8 or 16 bytes,
// so the unaligned 16-bit route copies synchronously (and its ring has one slot).
template <typename T, bool kAligned>
__host__ __device__ constexpr bool async_copies() {
  return kAligned || sizeof(T) == 4;
}

// Whether an instance takes the registers path (see the top of this file): only when the
// program asks for it (stages 0 for the direction), only on the aligned route, and not in the
// backward's widest instances (their weight-gradient sums already take 32 registers) or gated
// fp32 (the second set of registers would spill).
template <typename T, bool kAligned, int kEpt, bool kGated, class Cfg, bool kBackward>
__host__ __device__ constexpr bool uses_registers() {
  return (kBackward ? Cfg::kBackwardStages : Cfg::kForwardStages) == 0 && kAligned &&
         (kEpt < kMaxEpt || !kBackward) && !(kGated && sizeof(T) == 4);
}

// Where an instance reads weight + weight_offset (fp32, 0 past cols) from: shared memory (staged
// once a CTA), registers (loaded once a thread), or global memory through L1 at every use (leaves
// the shared memory to the ring, and spares a CTA of one row the staging). The backward's
// registers path stages them in shared memory. The widest staged instances (32 elements a
// thread: the staged backward's weight-gradient sums already take 32 registers) stage them too,
// except fp32, which reads through L1: at D = 16384 its ring (with the plain backward's
// weight-gradient sums) takes 192-194 KiB, no room for 64 KiB of weights. Otherwise the
// program's knob for the direction chooses.
enum class WeightSource { kShared, kRegisters, kGlobal };

template <typename T, bool kAligned, int kEpt, bool kGated, class Cfg, bool kBackward>
__host__ __device__ constexpr WeightSource weight_source() {
  constexpr bool kRegisters = uses_registers<T, kAligned, kEpt, kGated, Cfg, kBackward>();
  if constexpr (kBackward && kRegisters) {
    return WeightSource::kShared;
  }
  if constexpr (kEpt == kMaxEpt && !kRegisters) {
    return sizeof(T) == 4 ? WeightSource::kGlobal : WeightSource::kShared;
  }
  constexpr int kKnob = kBackward ? Cfg::kBackwardWeights : Cfg::kForwardWeights;
  return kKnob == 1 ? WeightSource::kRegisters : (kKnob == 2 ? WeightSource::kGlobal : WeightSource::kShared);
}


// Shared memory the weights of an instance (kEpt elements a thread, read from `source`) take at
// the start of the dynamic shared memory, for row groups of `tpr` threads.
template <int kEpt>
__host__ __device__ constexpr size_t weight_smem_bytes(WeightSource source, int tpr) {
  return source == WeightSource::kShared ? static_cast<size_t>(tpr) * kEpt * sizeof(float) : 0;
}

// Whether a staged backward instance keeps its weight-gradient sums in shared memory (see
// WeightGrad): the widest ones (64 KiB at D = 16384), except gated fp32, whose ring slot (s, dy
// and g in fp32: 194 KiB) leaves no room.
template <typename T, int kEpt, bool kGated>
__host__ __device__ constexpr bool dw_in_shared() {
  return kEpt == kMaxEpt && (sizeof(T) == 2 || !kGated);
}

// --------------------------------------------------------------------------- launch shapes

// Elements a thread (the instance) for D = cols in a direction whose row groups take at most
// kMaxRow threads below kMaxEpt: the narrowest instance within that, else the widest (up to
// kMaxCtaThreads threads a row).
template <int kMinEpt, int kMaxRow>
__host__ __device__ constexpr int elems_per_thread(int cols) {
  for (int ept = kMinEpt; ept < kMaxEpt; ept *= 2) {
    if (cols <= ept * kMaxRow) return ept;
  }
  return kMaxEpt;
}

// Threads per row group: a power of two up to 32, else a multiple of 32.
inline int threads_per_row(int cols, int ept) {
  const int need = (cols + ept - 1) / ept;
  if (need > 32) return (need + 31) / 32 * 32;
  int tpr = 1;
  while (tpr < need) tpr <<= 1;
  return tpr;
}

// A kernel instance: kEpt elements a thread, and row groups of kTpr threads fixed at compile
// time (see Shape), or 0: any width, read at run time.
template <int kEpt, int kTpr>
struct Instance {
  static constexpr int ept = kEpt;
  static constexpr int tpr = kTpr;
};

// The knobs that pick a direction's instance for D (elems_per_thread, threads_per_row,
// has_fixed_instance).
template <class Cfg, bool kBackward>
struct Widths {
  static constexpr int kMinEpt = kBackward ? Cfg::kBackwardMinEpt : Cfg::kForwardMinEpt;
  static constexpr int kMaxRow = kBackward ? Cfg::kBackwardMaxRowThreads : Cfg::kForwardMaxRowThreads;
  static constexpr int kCommonWidths = kBackward ? Cfg::kBackwardCommonWidths : Cfg::kForwardCommonWidths;
  static int ept(int cols) { return elems_per_thread<kMinEpt, kMaxRow>(cols); }
};

// Whether a direction of a program serving D = Cfg::kColsMin .. Cfg::kColsMax ever
// runs `ept` elements a thread with row groups of exactly `tpr` threads (threads_per_row): some D
// of that width (ept * (tpr - 32) + 1 .. ept * tpr above 32 threads, whose row groups round up to
// a multiple of 32; ept * tpr / 2 + 1 .. ept * tpr for a power of two up to 32, and 1 .. ept for
// one thread) is in the program's band and in ept's band. elems_per_thread grows with D through
// every instance in turn, so the ends of the overlap decide.
template <class Cfg, bool kBackward>
constexpr bool reachable_width(int ept, int tpr) {
  using W = Widths<Cfg, kBackward>;
  const int narrowest = (tpr > 32 ? tpr - 32 : tpr / 2) * ept + 1;
  const int low = narrowest > Cfg::kColsMin ? narrowest : Cfg::kColsMin;
  const int high = tpr * ept < Cfg::kColsMax ? tpr * ept : Cfg::kColsMax;
  return low <= high && elems_per_thread<W::kMinEpt, W::kMaxRow>(low) <= ept &&
         elems_per_thread<W::kMinEpt, W::kMaxRow>(high) >= ept;
}

// Whether row groups of `tpr` threads have instances with that width fixed at compile time: on
// the aligned route only, the powers of two from 64 threads, and with the direction's
// common-widths knob the other multiples of 64 (1: D = 3072, 5120, 6144, 7168 at 16 elements a
// thread, common model widths that the run-time instance read at 69-90% of copy on the H200) or
// of 32 (2: also D = 1536, 2560, 3584, 4608, ...), and (3) the row groups of a warp or less
// (powers of two: D <= 512 at 16 elements a thread, e.g. a head's 64, 128 or 256). Their ring,
// row and column offsets are immediates.
constexpr bool has_fixed_instance(bool aligned, int tpr, int common_widths) {
  if (!aligned) return false;
  if (tpr <= 32) return common_widths >= 3;
  return (tpr & (tpr - 1)) == 0 || (common_widths >= 1 && tpr % 64 == 0) || common_widths >= 2;
}

// Whether some D of the program's band runs the direction's run-time-width instance (kTpr 0) at
// `ept` elements a thread: a width that has no fixed instance (every width on the scalar route).
template <class Cfg, bool kBackward, bool kAligned>
constexpr bool reachable_any_width(int ept) {
  for (int tpr = 1; tpr <= kMaxCtaThreads; tpr = tpr < 32 ? 2 * tpr : tpr + 32) {
    if (reachable_width<Cfg, kBackward>(ept, tpr) &&
        !has_fixed_instance(kAligned, tpr, Widths<Cfg, kBackward>::kCommonWidths)) {
      return true;
    }
  }
  return false;
}

// Calls f(std::integral_constant<int, tpr>{}) for every width threads_per_row gives: tpr = 1,
// 2, 4, ..., 32, then 64, 96, ..., kMaxCtaThreads.
template <typename F, int... kPowers, int... kSteps>
inline void for_each_row_width(F&& f, std::integer_sequence<int, kPowers...>,
                               std::integer_sequence<int, kSteps...>) {
  (f(std::integral_constant<int, 1 << kPowers>{}), ...);
  (f(std::integral_constant<int, 64 + 32 * kSteps>{}), ...);
}
template <typename F>
inline void for_each_row_width(F&& f) {
  for_each_row_width(f, std::make_integer_sequence<int, 6>{},  // 1 << 0 .. 1 << 5: up to a warp
                     std::make_integer_sequence<int, (kMaxCtaThreads - 64) / 32 + 1>{});
}

// Calls f(Instance<ept, tpr>{}) for the instance serving `cols` in a direction (its Widths): the
// fixed width of its row groups where they have
// one (has_fixed_instance), else the run-time-width instance. Only the instances that serve some
// D of the program's band are compiled (e.g. at 16 elements a thread and 512 threads a row,
// D = 1 .. 8192 take the fixed widths from 1 to 512 threads with the common-widths knob at 3; at
// 32, D = 8193 .. 16384 those from 288 to 512).
//
// f returns an entry status (cake/program.h); with_instance returns it, or kNoInstance when no
// instance serves cols (outside the program's band, or a width the band analysis missed).
constexpr int kNoInstance = -1;

template <class Cfg, bool kBackward, bool kAligned, typename F>
inline int with_instance(int cols, F&& f) {
  using W = Widths<Cfg, kBackward>;
  if (cols < Cfg::kColsMin || cols > Cfg::kColsMax) return kNoInstance;  // not this program's route
  const int ept = W::ept(cols);
  const int tpr = threads_per_row(cols, ept);
  const auto by_width = [&](auto width_of_ept) -> int {
    constexpr int kEpt = decltype(width_of_ept)::value;
    int status = kNoInstance;  // stays only if the band analysis missed cols
    bool launched = false;
    for_each_row_width([&](auto width) {
      constexpr int kTpr = decltype(width)::value;
      if constexpr (has_fixed_instance(kAligned, kTpr, W::kCommonWidths) &&
                    reachable_width<Cfg, kBackward>(kEpt, kTpr)) {
        if (tpr == kTpr) {
          status = f(Instance<kEpt, kTpr>{});
          launched = true;
        }
      }
    });
    if constexpr (reachable_any_width<Cfg, kBackward, kAligned>(kEpt)) {
      if (!launched) status = f(Instance<kEpt, 0>{});
    }
    return status;
  };
  if constexpr (W::kMinEpt <= 8) {
    if (ept == 8) return by_width(std::integral_constant<int, 8>{});
  }
  if (ept == 16) return by_width(std::integral_constant<int, 16>{});
  return by_width(std::integral_constant<int, kMaxEpt>{});
}

// Row groups a CTA of the direction holds (kBackward: the backward's CTA size).
template <class Cfg, bool kBackward>
inline int row_groups_per_cta(int tpr) {
  return row_groups<kBackward ? Cfg::kBackwardCtaThreads : Cfg::kForwardCtaThreads>(tpr);
}

// Ring slots for a ring of `slot_bytes` a slot next to `fixed_bytes` of weights and sums (see
// kStageBudget), asked for: `knob` (0: the registers path, which some instances cannot take).
inline int ring_stages(int knob, size_t slot_bytes, size_t fixed_bytes, bool async) {
  if (!async) return 1;
  const int want = knob > 0 ? knob : kDefaultStages;
  const auto fit = [&](size_t limit) {
    return fixed_bytes < limit ? static_cast<int>((limit - fixed_bytes) / slot_bytes) : 0;
  };
  const int budget = fit(kStageBudget) < want ? fit(kStageBudget) : want;
  const int overlap = fit(kMaxSmem) < 2 ? fit(kMaxSmem) : 2;
  const int stages = budget > overlap ? budget : (overlap < want ? overlap : want);
  return stages < 1 ? 1 : stages;
}

// CTAs of `threads` threads that an SM holds by registers when the launch bound gives each thread
// the registers of `min_blocks` CTAs of kMaxCtaThreads (the register file, 16 * min_blocks warps
// of them); at least one, and one for min_blocks 0 (no bound).
constexpr int bound_ctas_per_sm(int threads, int min_blocks) {
  const int warps = (threads + 31) / 32;
  const int fit = min_blocks * (kMaxCtaThreads / 32) / warps;
  return fit > 1 ? fit : 1;
}

// The backward's bands for D = cols at elements a thread `ept`, whose instance has a launch
// bound of `min_blocks` CTAs: Cfg::kBackwardBands is for CTAs of Cfg::kBackwardCtaThreads (whole
// waves of them); where a row group takes most of such a CTA and leaves it smaller, so that the
// SMs hold more of them (rows of 288 or 320 threads at 16 elements a thread, D = 4097 .. 5120:
// three an SM under a 2-CTA bound, not two), the bands grow in proportion and still make whole
// waves (never shrink: a row wider than the CTA size keeps the knob's count). Registers only:
// the table's 2-slot ring lets three such CTAs share an SM's shared memory (57.6 KB a CTA at
// D = 4608, 64 KB at 5120); a deeper ring would fit two, and the bands then make 1.5 waves.
template <class Cfg>
inline int64_t backward_bands(int cols, int ept, int min_blocks) {
  const int tpr = threads_per_row(cols, ept);
  const int threads = tpr * row_groups_per_cta<Cfg, true>(tpr);
  const int64_t scaled = static_cast<int64_t>(Cfg::kBackwardBands) * bound_ctas_per_sm(threads, min_blocks) /
                         bound_ctas_per_sm(Cfg::kBackwardCtaThreads, min_blocks);
  return scaled > Cfg::kBackwardBands ? scaled : Cfg::kBackwardBands;
}

// The backward's row partition, fixed by (rows, cols) and the program alone: at most `bands`
// (backward_bands) bands of at least kMinRowsPerCta rows, and its CTAs (weight-gradient partial
// rows): one a band, or (Cfg::kBackwardGuided) a wave of half as many for each region
// (BackwardSpan).
constexpr int64_t kMinRowsPerCta = 16;

struct BackwardPartition {
  int64_t rows_per_cta;
  int64_t ctas;
};

template <class Cfg>
inline BackwardPartition backward_partition(int64_t rows, int64_t bands) {
  const int64_t even = (rows + bands - 1) / bands;
  const int64_t per = even > kMinRowsPerCta ? even : kMinRowsPerCta;
  const int64_t count = (rows + per - 1) / per;
  return {per, Cfg::kBackwardGuided > 0 ? (count + 1) / 2 * (Cfg::kBackwardGuided + 1) : count};
}

inline int padded_cols(int cols) { return (cols + 3) / 4 * 4; }

// Bytes of the weight-gradient workspace for `ctas` partial rows.
inline int64_t workspace_bytes(int64_t ctas, int cols) {
  return ctas * static_cast<int64_t>(padded_cols(cols)) * static_cast<int64_t>(sizeof(float));
}


}  // namespace rmsnorm
}  // namespace cake
