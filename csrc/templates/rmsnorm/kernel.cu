// Kernels of an RMSNorm program (both families: cake_rmsnorm_det_train with CAKE_GATED 0,
// cake_gated_rmsnorm_det_train with CAKE_GATED 1). The math, the layout, the two pipelines and
// the determinism argument are in cake/rmsnorm_common.cuh; this file fixes the element type, the
// route and the tuning.
//
// Knobs: CAKE_DTYPE 0 bf16, 1 fp16, 2 fp32 (x, gate, dy, y, dx); CAKE_VECTOR 1 for 16-byte
// loads (D a multiple of 16 / sizeof(T), 16-byte aligned tensors), 0 for element loads (any D).
// Tuning (see Config below and cake/rmsnorm_common.cuh; the family table sets them, and
// `tools/bench/rmsnorm.py --tune` sweeps them): CAKE_{FORWARD,BACKWARD}_STAGES (ring slots),
// CAKE_{FORWARD,BACKWARD}_MIN_ELEMS_PER_THREAD, CAKE_{FORWARD,BACKWARD}_MAX_ROW_THREADS,
// CAKE_{FORWARD,BACKWARD}_COMMON_WIDTHS, CAKE_COLS_MIN, CAKE_COLS_MAX (the program's route),
// CAKE_{FORWARD,BACKWARD}_CTA_THREADS, CAKE_L2_PREFETCH,
// CAKE_{FORWARD,BACKWARD}_WEIGHTS, CAKE_FORWARD_CTA_ROWS, CAKE_BACKWARD_BANDS,
// CAKE_BACKWARD_OVERLAP_STAGING, CAKE_BACKWARD_INTERLEAVE, CAKE_BACKWARD_GUIDED, and
// CAKE_{FORWARD,BACKWARD}_MIN_BLOCKS: the launch bound of the instances (but the widest staged
// ones and the forward's run-time-width ones: kForwardMinBlocks, backward_min_blocks) is
// kMaxCtaThreads threads and that many CTAs an SM (1: up to 128 registers a thread, 2: 64, 3: 40,
// 4: 32; 0 gives none, and ptxas then trades a few spilled bytes for occupancy).
#include <cstdint>
#include <type_traits>

#include "cake/rmsnorm_common.cuh"

// cake:params
#define CAKE_DTYPE 0
#define CAKE_VECTOR 1
#define CAKE_GATED 0
#define CAKE_FORWARD_STAGES 3
#define CAKE_BACKWARD_STAGES 2
#define CAKE_FORWARD_MIN_ELEMS_PER_THREAD 16
#define CAKE_BACKWARD_MIN_ELEMS_PER_THREAD 16
#define CAKE_FORWARD_MAX_ROW_THREADS 512
#define CAKE_BACKWARD_MAX_ROW_THREADS 512
#define CAKE_FORWARD_COMMON_WIDTHS 1
#define CAKE_BACKWARD_COMMON_WIDTHS 0
#define CAKE_COLS_MIN 1
#define CAKE_COLS_MAX 16384
#define CAKE_FORWARD_CTA_THREADS 256
#define CAKE_BACKWARD_CTA_THREADS 256
#define CAKE_L2_PREFETCH 0
#define CAKE_FORWARD_WEIGHTS 0
#define CAKE_BACKWARD_WEIGHTS 2
#define CAKE_FORWARD_CTA_ROWS 0
#define CAKE_BACKWARD_BANDS 1024
#define CAKE_BACKWARD_OVERLAP_STAGING 0
#define CAKE_BACKWARD_INTERLEAVE 0
#define CAKE_BACKWARD_GUIDED 0
#define CAKE_FORWARD_MIN_BLOCKS 3
#define CAKE_BACKWARD_MIN_BLOCKS 2
// cake:end-params

namespace {

#if CAKE_DTYPE == 0
using Elem = __nv_bfloat16;
#elif CAKE_DTYPE == 1
using Elem = __half;
#elif CAKE_DTYPE == 2
using Elem = float;
#else
#error "CAKE_DTYPE must be 0 (bf16), 1 (fp16) or 2 (fp32)"
#endif

constexpr bool kAligned = CAKE_VECTOR != 0;
constexpr bool kGated = CAKE_GATED != 0;

// The program's tuning, in the form cake/rmsnorm_common.cuh documents.
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
              "tuning knobs out of range (see the Config requirements in cake/rmsnorm_common.cuh)");

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
int64_t bands_at(int cols) {
  const int ept = cake::rmsnorm::Widths<Config, true>::ept(cols);
  return cake::rmsnorm::backward_bands<Config>(cols, ept, backward_min_blocks(ept));
}

}  // namespace

template <int kEpt, int kTpr>
__global__ void __launch_bounds__(cake::rmsnorm::kMaxCtaThreads, kForwardMinBlocks<kEpt, kTpr>)
kernel_cake_library_forward(const __grid_constant__ cake::rmsnorm::ForwardParams p) {
  cake::rmsnorm::forward<Elem, kAligned, kEpt, kTpr, kGated, Config>(p);
}

template <int kEpt, int kTpr>
__global__ void __launch_bounds__(cake::rmsnorm::kMaxCtaThreads, kBackwardMinBlocks<kEpt>)
kernel_cake_library_backward(const __grid_constant__ cake::rmsnorm::BackwardParams p) {
  cake::rmsnorm::backward<Elem, kAligned, kEpt, kTpr, kGated, Config>(p);
}

__global__ void __launch_bounds__(cake::rmsnorm::kColLanes * cake::rmsnorm::kColSegments)
kernel_cake_library_dweight(const __grid_constant__ cake::rmsnorm::DweightParams p) {
  cake::rmsnorm::reduce_dweight(p);
}

cudaError_t cake_library_launch_forward(const cake::rmsnorm::ForwardParams& p, cudaStream_t stream) {
  return cake::rmsnorm::with_instance<Config, false, kAligned>(p.cols, [&](auto instance) {
    using I = decltype(instance);
    return cake::rmsnorm::launch_forward<Elem, kAligned, I::ept, I::tpr, kGated, Config,
                                         kernel_cake_library_forward<I::ept, I::tpr>>(p, stream);
  });
}

cudaError_t cake_library_launch_backward(const cake::rmsnorm::BackwardParams& p, int64_t ctas,
                                         cudaStream_t stream) {
  return cake::rmsnorm::with_instance<Config, true, kAligned>(p.cols, [&](auto instance) {
    using I = decltype(instance);
    return cake::rmsnorm::launch_backward<Elem, kAligned, I::ept, I::tpr, kGated, Config,
                                          kernel_cake_library_backward<I::ept, I::tpr>>(p, ctas, stream);
  });
}

cudaError_t cake_library_launch_dweight(const cake::rmsnorm::DweightParams& p, cudaStream_t stream) {
  return cake::rmsnorm::launch_dweight(kernel_cake_library_dweight, p, stream);
}

cake::rmsnorm::BackwardPartition cake_library_backward_partition(int64_t rows, int cols) {
  return cake::rmsnorm::backward_partition<Config>(rows, bands_at(cols));
}
