// Causal conv1d programs: the constants a program's knobs fix, and the launch parameters. Shared
// by the kernels (cake/causal_conv1d/kernels.cuh, nvcc) and the entries
// (cake/causal_conv1d/entries.h, the host compiler). A program defines the knobs (its `cake:params`
// block) before it includes this: CAKE_DTYPE_BF16, CAKE_HAS_BIAS, CAKE_SILU, CAKE_VEC,
// CAKE_CHANNEL_THREADS, CAKE_ROW_GROUPS, CAKE_FORWARD_ROWS, CAKE_FORWARD_STAGES,
// CAKE_FORWARD_CHUNKS, CAKE_FORWARD_MIN_BLOCKS, CAKE_TOKEN_THREADS, CAKE_TOKENS_PER_THREAD,
// CAKE_ITERATIONS, CAKE_BACKWARD_MIN_BLOCKS, CAKE_BACKWARD_SCALAR_MIN_BLOCKS.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace cake {
namespace causal_conv1d {

// The activation dtype (x, y, dy, dx). Host code only needs its size and a distinct type.
#if defined(__CUDACC__)
#if CAKE_DTYPE_BF16
using Act = __nv_bfloat16;
#else
using Act = __half;
#endif
#else
struct Act {
  uint16_t bits;
};
#endif
static_assert(sizeof(Act) == 2, "the activation dtype is bf16 or fp16");

constexpr int kVec = CAKE_VEC;  // channels per thread (one 16- or 8-byte access)
static_assert(kVec == 8 || kVec == 4, "a thread owns 8 or 4 channels");
constexpr int kWidth = 4;
constexpr int kChannelThreads = CAKE_CHANNEL_THREADS;
constexpr int kRowGroups = CAKE_ROW_GROUPS;
constexpr int kThreads = kChannelThreads * kRowGroups;  // forward
constexpr int kTile = kChannelThreads * kVec;  // channels per block
// Backward: a block of kChannelThreads x kTokenThreads threads; each thread walks a span of
// kIterations * kRun consecutive tokens, kRun at a time (registers only), the block a tile of
// kBackwardTileTokens tokens.
constexpr int kTokenThreads = CAKE_TOKEN_THREADS;
constexpr int kBackwardThreads = kChannelThreads * kTokenThreads;
constexpr int kRun = CAKE_TOKENS_PER_THREAD;
constexpr int kIterations = CAKE_ITERATIONS;
constexpr int kBackwardTileTokens = kTokenThreads * kRun * kIterations;
// Resident blocks per SM the compiler must allow for the backward kernels (caps registers at
// 64K / (threads * blocks)), for the vector and the scalar (C % VEC != 0) access paths; chosen
// per tile so that neither spills (checked by tests/causal_conv1d/test_causal_conv1d_cpu.py).
constexpr int kBackwardMinBlocks = CAKE_BACKWARD_MIN_BLOCKS;
// The forward's: more resident blocks keep more stages in flight per SM.
constexpr int kForwardMinBlocks = CAKE_FORWARD_MIN_BLOCKS;
constexpr int kBackwardScalarMinBlocks = CAKE_BACKWARD_SCALAR_MIN_BLOCKS;
constexpr int kPiece = 16 / sizeof(Act);       // channels per 16-byte copy
constexpr int kTaps = CAKE_HAS_BIAS ? kWidth + 1 : kWidth;  // partial rows: 4 taps (+ bias)
// The reduction: 32 columns a block, their token tiles split into 32 groups, so that a thread
// sums few partials (8 at S = 32768 with 128-token tiles), all its loads in flight at once:
// small packs wait on the reduction's latency, not on its bytes.
constexpr int kReduceColumns = 32;
constexpr int kReduceGroups = 32;
constexpr int kReduceBatch = 8;  // loads a thread issues before summing them

// The forward's streaming geometry: rows per stage, ring stages, stages per block.
template <int kRows_, int kStages_, int kChunks_>
struct Stream {
  static constexpr int kRows = kRows_;
  static constexpr int kStages = kStages_;
  static constexpr int kSpan = kRows_ * kChunks_;   // tokens per block
  static constexpr int kChunks = kChunks_;
  static constexpr int kRing = kRows_ * kStages_;   // ring rows (a power of two: index by mask)
  static constexpr int kRun = kRows_ / kRowGroups;  // rows per thread per stage
  static_assert((kRing & (kRing - 1)) == 0, "ring rows must be a power of two");
  static_assert(kStages_ >= 4, "the ring holds the stage computed, its history and 2+ in flight");
  static_assert(kRows_ % kRowGroups == 0 && kRun >= 1, "rows per stage: a multiple of row groups");
  static_assert(kRows_ >= 3, "a stage must cover the three history rows of the next");
};
using Fwd = Stream<CAKE_FORWARD_ROWS, CAKE_FORWARD_STAGES, CAKE_FORWARD_CHUNKS>;

static_assert(kThreads <= 1024 && kThreads % 32 == 0, "block must be whole warps, at most 1024");
static_assert(kBackwardThreads <= 1024 && kBackwardThreads % 32 == 0,
              "block must be whole warps, at most 1024");
static_assert(kRun >= 1 && kIterations >= 1, "runs and iterations must be positive");
// Backward smem: one float per (token thread, tap row * VEC channels, channel thread).
static_assert(kTokenThreads * kTaps * kVec * kChannelThreads * 4 <= 48 * 1024,
              "backward partial reduction must fit the static 48 KB shared memory");
static_assert(kTile % kPiece == 0, "a tile is whole 16-byte pieces");

struct Params {
  const Act* x;
  const void* weight;  // (C, 4), Act or float
  const void* bias;    // (C,), same dtype as weight, or null
  const int32_t* cu_seqlens;  // (num_docs + 1,) or null
  int64_t num_docs;
  int64_t doc_len;  // documents of this length when cu_seqlens is null
  int64_t tokens;   // S
  int64_t channels; // C
  int64_t vectors;  // ceil(C / VEC)
  int64_t channel_tiles;
  int64_t token_tiles;
  Act* y;
  const Act* dy;
  Act* dx;
  float* partials;  // (token_tiles, kTaps, C)
  void* dweight;    // (C, 4)
  void* dbias;      // (C,)
};

// Dynamic shared memory of the forward kernels, in bytes.
constexpr int kForwardShared = Fwd::kRing * kTile * static_cast<int>(sizeof(Act));
// Bytes of one backward access (kVec channels): the alignment its vector path needs.
constexpr int kBackwardAccessBytes = kVec * static_cast<int>(sizeof(Act));

}  // namespace causal_conv1d
}  // namespace cake
