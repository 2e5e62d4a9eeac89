// One RMSNorm program's configuration, from its knobs (the `cake:params` block the program
// defines before including this; the meanings are in cake/rmsnorm/kernels.cuh and the Config
// requirements in cake/rmsnorm/common.h): its element type, route and tuning, and the launch
// bounds of its kernel instances. Shared by the program's kernels (nvcc) and entries (the host
// compiler).
//
// Knobs: CAKE_DTYPE 0 bf16, 1 fp16, 2 fp32 (x, gate, dy, y, dx); CAKE_VECTOR 1 for 16-byte
// loads (D a multiple of 16 / sizeof(T), 16-byte aligned tensors), 0 for element loads (any D);
// CAKE_GATED; the tuning: CAKE_{FORWARD,BACKWARD}_STAGES (ring slots),
// CAKE_{FORWARD,BACKWARD}_MIN_ELEMS_PER_THREAD, CAKE_{FORWARD,BACKWARD}_MAX_ROW_THREADS,
// CAKE_{FORWARD,BACKWARD}_COMMON_WIDTHS, CAKE_COLS_MIN, CAKE_COLS_MAX (the program's route),
// CAKE_{FORWARD,BACKWARD}_CTA_THREADS, CAKE_L2_PREFETCH, CAKE_{FORWARD,BACKWARD}_WEIGHTS,
// CAKE_FORWARD_CTA_ROWS, CAKE_BACKWARD_BANDS, CAKE_BACKWARD_OVERLAP_STAGING,
// CAKE_BACKWARD_INTERLEAVE, CAKE_BACKWARD_GUIDED, and CAKE_{FORWARD,BACKWARD}_MIN_BLOCKS: the
// launch bound of the instances (but the widest staged ones and the forward's run-time-width
// ones: kForwardMinBlocks, backward_min_blocks) is kMaxCtaThreads threads and that many CTAs an
// SM (1: up to 128 registers a thread, 2: 64, 3: 40, 4: 32; 0 gives none, and ptxas then trades
// a few spilled bytes for occupancy).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "cake/rmsnorm/common.h"

namespace cake {
namespace rmsnorm {
namespace program {


// The element dtype (x, gate, dy, y, dx). Host code only needs its size and a distinct type.
#if defined(__CUDACC__) && CAKE_DTYPE == 0
using Elem = __nv_bfloat16;
#elif defined(__CUDACC__) && CAKE_DTYPE == 1
using Elem = __half;
#elif CAKE_DTYPE == 0 || CAKE_DTYPE == 1
struct Elem {
  uint16_t bits;
};
#elif CAKE_DTYPE == 2
using Elem = float;
#else
#error "CAKE_DTYPE must be 0 (bf16), 1 (fp16) or 2 (fp32)"
#endif

constexpr bool kAligned = CAKE_VECTOR != 0;
constexpr bool kGated = CAKE_GATED != 0;

// The program's tuning, in the form cake/rmsnorm/common.h documents.
struct Config {
  static constexpr int kForwardStages = CAKE_FORWARD_STAGES;
  static constexpr int kBackwardStages = CAKE_BACKWARD_STAGES;
  static constexpr int kForwardMinEpt = CAKE_FORWARD_MIN_ELEMS_PER_THREAD;
  static constexpr int kBackwardMinEpt = CAKE_BACKWARD_MIN_ELEMS_PER_THREAD;
  static constexpr int kForwardMaxRowThreads = CAKE_FORWARD_MAX_ROW_THREADS;
  static constexpr int kBackwardMaxRowThreads = CAKE_BACKWARD_MAX_ROW_THREADS;
  static constexpr int kForwardCommonWidths = CAKE_FORWARD_COMMON_WIDTHS;
  static constexpr int kBackwardCommonWidths = CAKE_BACKWARD_COMMON_WIDTHS;
  static constexpr int kColsMin = CAKE_COLS_MIN;
  static constexpr int kColsMax = CAKE_COLS_MAX;
  static constexpr int kForwardCtaThreads = CAKE_FORWARD_CTA_THREADS;
  static constexpr int kBackwardCtaThreads = CAKE_BACKWARD_CTA_THREADS;
  static constexpr int kL2Prefetch = CAKE_L2_PREFETCH;
  static constexpr int kForwardWeights = CAKE_FORWARD_WEIGHTS;
  static constexpr int kBackwardWeights = CAKE_BACKWARD_WEIGHTS;
  static constexpr int kForwardCtaRows = CAKE_FORWARD_CTA_ROWS;
  static constexpr int kBackwardBands = CAKE_BACKWARD_BANDS;
  static constexpr int kBackwardOverlapStaging = CAKE_BACKWARD_OVERLAP_STAGING;
  static constexpr int kBackwardInterleave = CAKE_BACKWARD_INTERLEAVE;
  static constexpr int kBackwardGuided = CAKE_BACKWARD_GUIDED;
};
static_assert(cake::rmsnorm::valid_config<Config>(),
              "tuning knobs out of range (see the Config requirements in cake/rmsnorm/common.h)");

// CTAs an SM in each instance's launch bound: the knob's, except for the widest staged instances
// (32 elements a thread), which need up to 128 registers a thread: one CTA; and the forward's
// any-width instances (kTpr 0: the unaligned route's, and the aligned route's in tune variants
// below CAKE_FORWARD_COMMON_WIDTHS 3), whose run-time row shape takes more registers than the fixed
// widths: at most 3 (40 registers; RMSNorm's registers path spills at 32), 2 in the gated family
// (64; with the gate's packs it spills 88-96 bytes at 40). The forward's widest instances on the
// registers path (one row a CTA) keep the knob's bound: RMSNorm's 224-thread rows of 32 elements
// take 48 registers at the table's 2 CTAs (40 at 3) without spills.
constexpr int kAnyWidthForwardMaxBlocks = kGated ? 2 : 3;
template <int kEpt, int kTpr>
constexpr int kForwardMinBlocks =
    kEpt == cake::rmsnorm::kMaxEpt && !cake::rmsnorm::uses_registers<Elem, kAligned, kEpt, kGated, Config, false>() ? 1
    : (kTpr == 0 && CAKE_FORWARD_MIN_BLOCKS > kAnyWidthForwardMaxBlocks ? kAnyWidthForwardMaxBlocks
                                                                       : CAKE_FORWARD_MIN_BLOCKS);
constexpr int backward_min_blocks(int ept) { return ept == cake::rmsnorm::kMaxEpt ? 1 : CAKE_BACKWARD_MIN_BLOCKS; }
template <int kEpt>
constexpr int kBackwardMinBlocks = backward_min_blocks(kEpt);

// The backward's bands at D = cols: backward_bands for the instance serving it (its elements a
// thread and launch bound).
inline int64_t bands_at(int cols) {
  const int ept = cake::rmsnorm::Widths<Config, true>::ept(cols);
  return cake::rmsnorm::backward_bands<Config>(cols, ept, backward_min_blocks(ept));
}

}  // namespace program
}  // namespace rmsnorm
}  // namespace cake
