// Causal depthwise conv1d (width 4) + optional SiLU over packed documents: forward,
// backward and the fixed-order reduction of the weight/bias gradient partials.
//
// Layout: x, y, dy, dx are (S, C) row-major (channels contiguous); weight is (C, 4); bias (C,).
//
// Forward (streaming). A block owns a tile of TILE = CHANNEL_THREADS * VEC channels and a span
// of FORWARD_CHUNKS * FORWARD_ROWS tokens, which it walks in stages of FORWARD_ROWS rows. Each
// stage's rows are copied into a ring of FORWARD_STAGES stages in shared memory (cp.async,
// 16-byte pieces, when C % 8 == 0 and the tensors are 16-byte aligned; element copies
// otherwise) FORWARD_STAGES - 2 stages ahead of the arithmetic, so later stages' loads are in
// flight while a stage is computed. The ring also keeps the three rows before each stage (the
// taps' history). Each thread computes VEC channels of FORWARD_ROWS / ROW_GROUPS consecutive
// rows of a stage and stores them straight to global memory.
//
// Backward (registers). A block covers CHANNEL_THREADS * VEC channels and TOKEN_THREADS spans of
// TOKENS_PER_THREAD * ITERATIONS consecutive tokens, one span a thread. A thread walks its span
// TOKENS_PER_THREAD rows a step (the step's x and dy loads issued together): it recomputes z,
// forms dz = dy * silu'(z) and scatters w[k] dz into a rolling window of dx rows, carrying its
// x window and the open dx rows from step to step, so only the three rows past the span are
// computed twice. (A shared-memory streaming backward like the forward's, with dz kept in shared
// memory, measured 55-60% of copy bandwidth on the H200 against 60-68% for the register design
// of that time; this one measures 80-89%; see tests/causal_conv1d/NOTES.md.)
//
// Determinism: the backward writes one fp32 partial per (token tile, channel, tap) into the
// workspace (no atomics); the reduction kernel sums the tiles of each column in a fixed order
// that depends only on the number of tiles. Neither depends on the SM count or on timing.
//
// Memory safety: every global index is checked against [0, S) x [0, C) on its own, so any
// cu_seqlens content (even one that fails the host checks) reads and writes only in bounds.
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cake/fast_math.cuh"
#include "cake/launch.h"
#include "cake/program.h"

// cake:params
#define CAKE_DTYPE_BF16 1
#define CAKE_HAS_BIAS 1
#define CAKE_SILU 1
#define CAKE_VEC 4
#define CAKE_CHANNEL_THREADS 32
#define CAKE_ROW_GROUPS 8
#define CAKE_FORWARD_ROWS 32
#define CAKE_FORWARD_STAGES 4
#define CAKE_FORWARD_CHUNKS 16
#define CAKE_FORWARD_MIN_BLOCKS 4
#define CAKE_TOKEN_THREADS 8
#define CAKE_TOKENS_PER_THREAD 8
#define CAKE_ITERATIONS 8
#define CAKE_BACKWARD_MIN_BLOCKS 2
#define CAKE_BACKWARD_SCALAR_MIN_BLOCKS 1
// cake:end-params

namespace cake_library_ns {

#if CAKE_DTYPE_BF16
using Act = __nv_bfloat16;
#else
using Act = __half;
#endif

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

using cake::from_float;
using cake::to_float;

// VEC channels of one row, packed (one 16- or 8-byte register group).
using PackRaw = typename std::conditional<kVec == 8, uint4, uint2>::type;
struct Pack {
  PackRaw raw;
  __device__ __forceinline__ float operator[](int j) const {
    return to_float(reinterpret_cast<const Act*>(&raw)[j]);
  }
  __device__ __forceinline__ void to_floats(float (&out)[kVec]) const {
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = (*this)[j];
  }
};

// The four rows x[u-3..u] of a thread's VEC channels, as floats. The runs slide it one row a
// token, so that each row is converted once (not once per tap that reads it).
using Window = float[kWidth][kVec];

__device__ __forceinline__ void slide(Window& x, const Pack& next) {
#pragma unroll
  for (int k = 0; k + 1 < kWidth; ++k)
#pragma unroll
    for (int j = 0; j < kVec; ++j) x[k][j] = x[k + 1][j];
  next.to_floats(x[kWidth - 1]);
}

// ------------------------------------------------------------------------------ staging

__device__ __forceinline__ void cp_async16(void* shared, const void* global, bool valid) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  // src-size 0 fills the 16 bytes with zeros and reads nothing.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Copies rows [q0, q0 + kRows) of the block's span (token tb + q) of `src` into `ring` (row q at
// q & (kRing - 1)); rows outside [0, S) and channels past C read as zero. kAsync: 16-byte
// cp.async pieces (C % 8 == 0, 16-byte aligned src), each thread always the same piece of a row
// (so its column and its checks are worked out once); otherwise element by element.
template <int kRing, bool kAsync, int kRows>
__device__ __forceinline__ void copy_rows(Act* ring, const Act* __restrict__ src, int64_t tb,
                                          int q0, int64_t tile0, const Params& p) {
  if constexpr (kAsync) {
    constexpr int kPieces = kTile / kPiece;
    static_assert(kThreads % kPieces == 0, "a block copies whole rows of pieces per pass");
    constexpr int kRowsPerPass = kThreads / kPieces;
    constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
    const int piece = threadIdx.x % kPieces;
    const int r0 = threadIdx.x / kPieces;
    const int64_t c = tile0 + piece * kPiece;
    const bool column_ok = c < p.channels;
    int64_t t = tb + q0 + r0;
    const Act* from = src + t * p.channels + c;  // stepped by whole passes; read only when valid
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int r = r0 + pass * kRowsPerPass;
      if (kRows % kRowsPerPass == 0 || r < kRows) {
        const bool valid = column_ok && t >= 0 && t < p.tokens;
        cp_async16(ring + ((q0 + r) & (kRing - 1)) * kTile + piece * kPiece, valid ? from : src, valid);
      }
      t += kRowsPerPass;
      from += static_cast<int64_t>(kRowsPerPass) * p.channels;
    }
  } else {
    for (int i = threadIdx.x; i < kRows * kTile; i += kThreads) {
      const int r = i / kTile, col = i % kTile;
      const int64_t t = tb + q0 + r, c = tile0 + col;
      ring[((q0 + r) & (kRing - 1)) * kTile + col] =
          (t >= 0 && t < p.tokens && c < p.channels) ? src[t * p.channels + c] : from_float<Act>(0.f);
    }
  }
}

template <int kRing>
__device__ __forceinline__ Pack ring_row(const Act* ring, int q, int tx) {
  Pack out;
  out.raw = *reinterpret_cast<const PackRaw*>(ring + (q & (kRing - 1)) * kTile + tx * kVec);
  return out;
}

// Loads VEC channels of row `t`; zeros outside [0, S) x [0, C). kChecked = false: the caller
// guarantees 0 <= t < S (interior runs), so the row check is left out.
template <bool kAligned, bool kChecked = true>
__device__ __forceinline__ Pack load_row(const Act* __restrict__ base, int64_t t, int64_t c0,
                                         const Params& p) {
  Pack out;
  out.raw = PackRaw{};
  if (kChecked && (t < 0 || t >= p.tokens)) return out;
  const Act* row = base + t * p.channels + c0;
  if constexpr (kAligned) {
    out.raw = __ldg(reinterpret_cast<const PackRaw*>(row));
  } else {
    Act* v = reinterpret_cast<Act*>(&out.raw);
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (c0 + j < p.channels) v[j] = row[j];
  }
  return out;
}

// Stores VEC channels of row t; kChecked = false: the caller guarantees 0 <= t < S. Channels
// past C are skipped on the element path.
template <bool kAligned, bool kChecked = true>
__device__ __forceinline__ void store_row(Act* __restrict__ base, int64_t t, int64_t c0,
                                          const Params& p, const float (&v)[kVec]) {
  if (kChecked && (t < 0 || t >= p.tokens)) return;
  Act* row = base + t * p.channels + c0;
  if constexpr (kAligned) {
    PackRaw raw;
    uint32_t* words = reinterpret_cast<uint32_t*>(&raw);
#pragma unroll
    for (int j = 0; j < kVec; j += 2) words[j / 2] = cake::pack2<Act>(v[j], v[j + 1]);
    __stwb(reinterpret_cast<PackRaw*>(row), raw);  // one vector store (a plain copy splits it)
  } else {
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      if (c0 + j < p.channels) row[j] = from_float<Act>(v[j]);
  }
}

// Per-channel weights (C, 4) and bias for the thread's VEC channels, as floats (0 past C).
template <typename W>
__device__ __forceinline__ void load_weights(const Params& p, int64_t c0, float (&w)[kWidth][kVec],
                                             float (&b)[kVec]) {
  const W* weight = static_cast<const W*>(p.weight);
  const W* bias = static_cast<const W*>(p.bias);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const bool in = c0 + j < p.channels;
#pragma unroll
    for (int k = 0; k < kWidth; ++k) w[k][j] = in ? to_float(weight[(c0 + j) * kWidth + k]) : 0.f;
    b[j] = (CAKE_HAS_BIAS && in) ? to_float(bias[c0 + j]) : 0.f;
  }
}

// The document holding token t: [start, end). `seek` finds it (cu_seqlens: binary search for
// the last document starting at or before t); `advance` moves forward as t grows. Values are
// clamped so that garbage cu_seqlens yields garbage boundaries, never an out-of-bounds access
// (the cu_seqlens index stays in [0, num_docs]).
struct DocCursor {
  int64_t doc, start, end;

  __device__ __forceinline__ void seek(const Params& p, int64_t t) {
    if (p.cu_seqlens == nullptr) {
      const int64_t tt = t < 0 ? 0 : t;
      start = tt / p.doc_len * p.doc_len;  // doc_len >= 1 (checked by the binding)
      end = start + p.doc_len;
      return;
    }
    int64_t lo = 0, hi = p.num_docs - 1;  // num_docs >= 1 (checked by the binding)
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) >> 1;
      if (static_cast<int64_t>(__ldg(p.cu_seqlens + mid)) <= t) lo = mid; else hi = mid - 1;
    }
    doc = lo;
    bounds(p);
  }

  __device__ __forceinline__ void advance(const Params& p, int64_t t) {
    if (p.cu_seqlens == nullptr) {
      while (t >= end) { start = end; end += p.doc_len; }
      return;
    }
    while (t >= end && doc + 1 < p.num_docs) {
      ++doc;
      bounds(p);
    }
  }

  __device__ __forceinline__ void bounds(const Params& p) {
    start = __ldg(p.cu_seqlens + doc);
    end = __ldg(p.cu_seqlens + doc + 1);
    if (start < 0) start = 0;
  }
};

// Number of the 3 past taps (x[u-3], x[u-2], x[u-1]) that lie before the document start:
// tap k is live iff k >= masked_taps(start, u).
__device__ __forceinline__ int masked_taps(int64_t start, int64_t u) {
  const int64_t m = start - u + 3;
  return m < 0 ? 0 : (m > 3 ? 3 : static_cast<int>(m));
}

// z = bias + sum_k w[k] x[u-3+k] over live taps (k >= m), for the VEC channels.
template <bool kMasked>
__device__ __forceinline__ void conv(const float (&w)[kWidth][kVec], const float (&b)[kVec],
                                     const Window& x, int m, float (&z)[kVec]) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    float acc = fmaf(w[3][j], x[3][j], b[j]);
    if (kMasked) {
      acc = m <= 2 ? fmaf(w[2][j], x[2][j], acc) : acc;
      acc = m <= 1 ? fmaf(w[1][j], x[1][j], acc) : acc;
      acc = m <= 0 ? fmaf(w[0][j], x[0][j], acc) : acc;
    } else {
      acc = fmaf(w[2][j], x[2][j], acc);
      acc = fmaf(w[1][j], x[1][j], acc);
      acc = fmaf(w[0][j], x[0][j], acc);
    }
    z[j] = acc;
  }
}

// The forward block's coordinates.
struct Place {
  int64_t tile0;  // first channel of the tile
  int64_t c0;     // first of the thread's channels
  int64_t tile;   // token tile (span) index
  int tx, rg;     // channel thread, row group
  bool active;    // the thread has channels (c0 < C)
};

__device__ __forceinline__ Place place(const Params& p) {
  Place at;
  const int64_t ct = blockIdx.x % p.channel_tiles;
  at.tile = blockIdx.x / p.channel_tiles;
  at.tx = threadIdx.x % kChannelThreads;
  at.rg = threadIdx.x / kChannelThreads;
  at.tile0 = ct * kTile;
  at.c0 = at.tile0 + at.tx * kVec;
  at.active = at.c0 < p.channels;
  return at;
}

__device__ __forceinline__ int64_t ceil_div_d(int64_t a, int64_t b) { return (a + b - 1) / b; }
__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// ------------------------------------------------------------------------------ forward

// Rows [q0, q0 + n) of the span (tokens t0 = tb + q0 ...), n <= kRun, from the ring.
// kFast: every row of [t0-3, t0+n) is in the document of t0 (no masks) and below S.
template <bool kVector, bool kFast>
__device__ __forceinline__ void forward_run(const Params& p, const Act* ring, int q0, int64_t t0,
                                            int n, const Place& at,
                                            const float (&w)[kWidth][kVec],
                                            const float (&b)[kVec], DocCursor& d) {
  constexpr int kRun = Fwd::kRun;
  Pack xs[kRun + 3];
#pragma unroll
  for (int i = 0; i < kRun + 3; ++i) xs[i] = ring_row<Fwd::kRing>(ring, q0 - 3 + i, at.tx);
  Window x;
#pragma unroll
  for (int k = 1; k < kWidth; ++k) xs[k - 1].to_floats(x[k]);
#pragma unroll
  for (int i = 0; i < kRun; ++i) {
    if (!kFast && i >= n) break;
    slide(x, xs[i + 3]);
    const int64_t u = t0 + i;
    int m = 0;
    if (!kFast) {
      d.advance(p, u);
      m = masked_taps(d.start, u);
    }
    float z[kVec];
    if (m == 0) conv<false>(w, b, x, 0, z);
    else conv<true>(w, b, x, m, z);
    if (CAKE_SILU) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) z[j] *= cake::sigmoid(z[j]);
    }
    store_row<kVector>(p.y, u, at.c0, p, z);
  }
}

template <typename W, bool kAsync>
__device__ __forceinline__ void forward_body(const Params& p) {
  extern __shared__ __align__(16) unsigned char shared[];
  Act* ring = reinterpret_cast<Act*>(shared);
  const Place at = place(p);
  const int64_t tb = at.tile * Fwd::kSpan;
  const int stages = static_cast<int>(min64(Fwd::kChunks, ceil_div_d(p.tokens - tb, Fwd::kRows)));

  copy_rows<Fwd::kRing, kAsync, 3>(ring, p.x, tb, -3, at.tile0, p);  // history of stage 0
#pragma unroll
  for (int s = 0; s < Fwd::kStages - 2; ++s) {
    if (s < stages) copy_rows<Fwd::kRing, kAsync, Fwd::kRows>(ring, p.x, tb, s * Fwd::kRows, at.tile0, p);
    cp_async_commit();
  }
  float w[kWidth][kVec], b[kVec];
  load_weights<W>(p, at.c0, w, b);
  DocCursor d;
  d.seek(p, tb + at.rg * Fwd::kRun);

  for (int k = 0; k < stages; ++k) {
    cp_async_wait<Fwd::kStages - 3>();  // stage k has landed (this thread's pieces) ...
    __syncthreads();                     // ... everyone's; and stage k-1 is computed
    const int next = k + Fwd::kStages - 2;  // into the slot of stage k-2
    if (next < stages) copy_rows<Fwd::kRing, kAsync, Fwd::kRows>(ring, p.x, tb, next * Fwd::kRows, at.tile0, p);
    cp_async_commit();
    const int q0 = k * Fwd::kRows + at.rg * Fwd::kRun;
    const int64_t t0 = tb + q0;
    if (!at.active || t0 >= p.tokens) continue;
    const int n = static_cast<int>(min64(Fwd::kRun, p.tokens - t0));
    d.advance(p, t0);
    const bool fast = n == Fwd::kRun && d.start <= t0 - 3 && d.end >= t0 + Fwd::kRun;
    if (fast) forward_run<kAsync, true>(p, ring, q0, t0, n, at, w, b, d);
    else forward_run<kAsync, false>(p, ring, q0, t0, n, at, w, b, d);
  }
}

// Dynamic shared memory of the forward kernels, in bytes.
constexpr int kForwardShared = Fwd::kRing * kTile * static_cast<int>(sizeof(Act));

// ------------------------------------------------------------------------------ backward

// A thread's backward state along its span of tokens: the x window (x[u-3..u-1] before row u)
// and the dx rows being accumulated (dx[u-3+k] in acc[k], k < 3, before row u).
struct SpanState {
  Window x;
  float acc[kWidth][kVec];
};

// Rows u = u0 .. u0 + kRows - 1 of a thread's span walk: recomputes z[u], forms dz[u] =
// dy[u] silu'(z[u]), scatters w[k] dz[u] into dx[u-3+k] for live taps (dx[u-3] is then
// complete and stored when it is the thread's: u - 3 >= s0), and, for the thread's own rows
// (kOwn), adds dz[u] x[u-3+k] to dweight[k] and dz[u] to dbias. The window and the dx
// partials carry over from the rows before, so a span recomputes only the three rows past its
// end. kFast: every row of [u0-3, u0+kRows) is in [0, S) and in one document (no bounds checks,
// no masks).
template <int kRows, bool kAligned, bool kFast, bool kOwn>
__device__ __forceinline__ void backward_rows(const Params& p, int64_t u0, int64_t s0, int64_t c0,
                                              const float (&w)[kWidth][kVec], const float (&b)[kVec],
                                              float (&dw)[kWidth][kVec], float (&db)[kVec],
                                              SpanState& st, DocCursor& d) {
  Pack xs[kRows], gs[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    xs[i] = load_row<kAligned, !kFast>(p.x, u0 + i, c0, p);
    gs[i] = load_row<kAligned, !kFast>(p.dy, u0 + i, c0, p);  // zero past S: dz = 0 there
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t u = u0 + i;
    slide(st.x, xs[i]);
    int m = 0;
    if (!kFast) {
      d.advance(p, u);
      m = masked_taps(d.start, u);
    }
    float dz[kVec];
    if (m == 0) conv<false>(w, b, st.x, 0, dz);
    else conv<true>(w, b, st.x, m, dz);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (CAKE_SILU) {
        const float z = dz[j];
        const float s = cake::sigmoid(z);
        dz[j] = gs[i][j] * s * fmaf(z, 1.f - s, 1.f);
      } else {
        dz[j] = gs[i][j];
      }
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      st.acc[3][j] = fmaf(w[3][j], dz[j], st.acc[3][j]);
#pragma unroll
      for (int k = 0; k < 3; ++k)
        st.acc[k][j] = (kFast || k >= m) ? fmaf(w[k][j], dz[j], st.acc[k][j]) : st.acc[k][j];
    }
    if (kOwn) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        db[j] += dz[j];
        dw[3][j] = fmaf(dz[j], st.x[3][j], dw[3][j]);
#pragma unroll
        for (int k = 2; k >= 0; --k)
          dw[k][j] = (kFast || k >= m) ? fmaf(dz[j], st.x[k][j], dw[k][j]) : dw[k][j];
      }
    }
    if (u - 3 >= s0) store_row<kAligned, !kFast>(p.dx, u - 3, c0, p, st.acc[0]);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      st.acc[0][j] = st.acc[1][j];
      st.acc[1][j] = st.acc[2][j];
      st.acc[2][j] = st.acc[3][j];
      st.acc[3][j] = 0.f;
    }
  }
}

// backward_rows, on the fast path when the rows allow it.
template <int kRows, bool kAligned, bool kOwn>
__device__ __forceinline__ void backward_step(const Params& p, int64_t u0, int64_t s0, int64_t c0,
                                              const float (&w)[kWidth][kVec], const float (&b)[kVec],
                                              float (&dw)[kWidth][kVec], float (&db)[kVec],
                                              SpanState& st, DocCursor& d) {
  d.advance(p, u0);
  const bool fast = u0 >= 3 && u0 + kRows <= p.tokens && d.start <= u0 - 3 && d.end >= u0 + kRows;
  if (fast) backward_rows<kRows, kAligned, true, kOwn>(p, u0, s0, c0, w, b, dw, db, st, d);
  else backward_rows<kRows, kAligned, false, kOwn>(p, u0, s0, c0, w, b, dw, db, st, d);
}

// Each thread walks one span of kThreadSpan consecutive tokens, kRun rows at a time (a step's
// loads issued together), then the kWidth - 1 rows past the span that reach back into its dx.
constexpr int kThreadSpan = kRun * kIterations;

template <typename W, bool kAligned>
__device__ __forceinline__ void backward_body(const Params& p) {
  __shared__ float red[kTokenThreads][kTaps * kVec][kChannelThreads];
  const int64_t block = blockIdx.x;
  const int64_t ct = block % p.channel_tiles;
  const int64_t tt = block / p.channel_tiles;
  const int tx = threadIdx.x % kChannelThreads;
  const int ty = threadIdx.x / kChannelThreads;
  const int64_t vec = ct * kChannelThreads + tx;
  const int64_t c0 = vec * kVec;

  float dw[kWidth][kVec], db[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    db[j] = 0.f;
#pragma unroll
    for (int k = 0; k < kWidth; ++k) dw[k][j] = 0.f;
  }
  const int64_t s0 = tt * kBackwardTileTokens + static_cast<int64_t>(ty) * kThreadSpan;
  if (vec < p.vectors && s0 < p.tokens) {
    float w[kWidth][kVec], b[kVec];
    load_weights<W>(p, c0, w, b);
    SpanState st;
#pragma unroll
    for (int k = 1; k < kWidth; ++k)
      load_row<kAligned>(p.x, s0 - kWidth + k, c0, p).to_floats(st.x[k]);  // x[s0-3..s0-1]
#pragma unroll
    for (int k = 0; k < kWidth; ++k)
#pragma unroll
      for (int j = 0; j < kVec; ++j) st.acc[k][j] = 0.f;
    DocCursor d;
    d.seek(p, s0);
    int64_t u0 = s0;
#pragma unroll 1
    for (int it = 0; it < kIterations && u0 < p.tokens; ++it, u0 += kRun)
      backward_step<kRun, kAligned, true>(p, u0, s0, c0, w, b, dw, db, st, d);
    backward_step<kWidth - 1, kAligned, false>(p, u0, s0, c0, w, b, dw, db, st, d);
  }

  // Fixed-order block reduction over the token threads: one partial per (tile, row, channel).
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
#pragma unroll
    for (int k = 0; k < kWidth; ++k) red[ty][k * kVec + j][tx] = dw[k][j];
    if (CAKE_HAS_BIAS) red[ty][(kTaps - 1) * kVec + j][tx] = db[j];
  }
  __syncthreads();
  for (int item = threadIdx.x; item < kTaps * kVec * kChannelThreads; item += kBackwardThreads) {
    const int row = item / kChannelThreads;  // tap * kVec + channel within the vector
    const int col = item % kChannelThreads;
    float sum = 0.f;
#pragma unroll 8
    for (int y = 0; y < kTokenThreads; ++y) sum += red[y][row][col];
    const int64_t c = (ct * kChannelThreads + col) * kVec + row % kVec;
    if (c < p.channels) p.partials[(tt * kTaps + row / kVec) * p.channels + c] = sum;
  }
}

// ------------------------------------------------------------------------------ reduction

// Column col = row * C + c of the partials (row: tap 0..3, or 4 for the bias). Its token tiles
// are split into kReduceGroups contiguous groups; each group is summed in tile order, then the
// groups in group order. The split depends only on the number of tiles.
template <typename Out>
__device__ __forceinline__ void reduce_body(const Params& p) {
  __shared__ float part[kReduceGroups][kReduceColumns];
  const int64_t columns = static_cast<int64_t>(kTaps) * p.channels;
  const int lane = threadIdx.x % kReduceColumns;
  const int group = threadIdx.x / kReduceColumns;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kReduceColumns + lane;
  const int64_t chunk = (p.token_tiles + kReduceGroups - 1) / kReduceGroups;
  const int64_t first = group * chunk;
  const int64_t last = first + chunk < p.token_tiles ? first + chunk : p.token_tiles;
  float sum = 0.f;
  if (col < columns) {
    const float* src = p.partials + col;
    int64_t tile = first;
    for (; tile + kReduceBatch <= last; tile += kReduceBatch) {
      float a[kReduceBatch];
#pragma unroll
      for (int i = 0; i < kReduceBatch; ++i) a[i] = src[(tile + i) * columns];
#pragma unroll
      for (int i = 0; i < kReduceBatch; ++i) sum += a[i];
    }
    for (; tile < last; ++tile) sum += src[tile * columns];
  }
  part[group][lane] = sum;
  __syncthreads();
  if (group == 0 && col < columns) {
    float total = 0.f;
#pragma unroll
    for (int g = 0; g < kReduceGroups; ++g) total += part[g][lane];
    const int64_t row = col / p.channels, c = col % p.channels;
    if (row < kWidth) static_cast<Out*>(p.dweight)[c * kWidth + row] = from_float<Out>(total);
    else static_cast<Out*>(p.dbias)[c] = from_float<Out>(total);
  }
}

}  // namespace cake_library_ns

using cake_library_ns::Act;
using cake_library_ns::Params;

// Kernel names: <weight: a = activation dtype, f = fp32><access: v = vectors (forward: 16-byte
// async copies, C % 8 == 0; backward: VEC-wide loads, C % VEC == 0), s = element accesses>.
constexpr int kThreads = cake_library_ns::kThreads;
constexpr int kForwardMinBlocks = cake_library_ns::kForwardMinBlocks;
constexpr int kBackwardThreads = cake_library_ns::kBackwardThreads;
constexpr int kBackwardMinBlocks = cake_library_ns::kBackwardMinBlocks;
constexpr int kScalarMinBlocks = cake_library_ns::kBackwardScalarMinBlocks;

__global__ void __launch_bounds__(kThreads, kForwardMinBlocks) kernel_cake_library_forward_av(const Params p) {
  cake_library_ns::forward_body<Act, true>(p);
}
__global__ void __launch_bounds__(kThreads, kForwardMinBlocks) kernel_cake_library_forward_as(const Params p) {
  cake_library_ns::forward_body<Act, false>(p);
}
__global__ void __launch_bounds__(kThreads, kForwardMinBlocks) kernel_cake_library_forward_fv(const Params p) {
  cake_library_ns::forward_body<float, true>(p);
}
__global__ void __launch_bounds__(kThreads, kForwardMinBlocks) kernel_cake_library_forward_fs(const Params p) {
  cake_library_ns::forward_body<float, false>(p);
}
__global__ void __launch_bounds__(kBackwardThreads, kBackwardMinBlocks) kernel_cake_library_backward_av(const Params p) {
  cake_library_ns::backward_body<Act, true>(p);
}
__global__ void __launch_bounds__(kBackwardThreads, kScalarMinBlocks) kernel_cake_library_backward_as(const Params p) {
  cake_library_ns::backward_body<Act, false>(p);
}
__global__ void __launch_bounds__(kBackwardThreads, kBackwardMinBlocks) kernel_cake_library_backward_fv(const Params p) {
  cake_library_ns::backward_body<float, true>(p);
}
__global__ void __launch_bounds__(kBackwardThreads, kScalarMinBlocks) kernel_cake_library_backward_fs(const Params p) {
  cake_library_ns::backward_body<float, false>(p);
}

constexpr int kReduceThreads = cake_library_ns::kReduceColumns * cake_library_ns::kReduceGroups;

__global__ void __launch_bounds__(kReduceThreads) kernel_cake_library_reduce_a(const Params p) {
  cake_library_ns::reduce_body<Act>(p);
}
__global__ void __launch_bounds__(kReduceThreads) kernel_cake_library_reduce_f(const Params p) {
  cake_library_ns::reduce_body<float>(p);
}

// ------------------------------------------------------------------------------ launchers
// Called by the binding's entries with the entry's arguments; they check them again (count,
// sizes, null pointers, limits) and launch. No allocation, no synchronization.

namespace cake_library_ns {

constexpr int64_t kMaxGrid = 0x7fffffff;

inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) % 16) == 0; }
inline bool aligned_vec(const void* ptr) {
  return (reinterpret_cast<uintptr_t>(ptr) % sizeof(PackRaw)) == 0;  // the backward's access width
}
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Token tiles of the backward: the workspace holds kTaps * C floats per tile.
inline int64_t backward_tiles(int64_t tokens) { return ceil_div(tokens, kBackwardTileTokens); }
inline int64_t workspace_bytes(int64_t tokens, int64_t channels) {
  return backward_tiles(tokens) * kTaps * channels * static_cast<int64_t>(sizeof(float));
}

template <void (*kKernel)(const Params), int kBlock = kThreads>
inline int launch(const Params& p, int64_t blocks, int shared, cudaStream_t stream, char* error,
                  int32_t error_len, const char* what) {
  static cake::SmemLimits limits;
  const cudaError_t status = cake::allow_smem(kKernel, shared, 0, limits, true);
  if (status != cudaSuccess)
    return cake::fail(error, error_len, cake::kCudaError, "%s: shared memory opt-in: %s", what,
                      cudaGetErrorString(status));
  kKernel<<<dim3(static_cast<unsigned>(blocks)), dim3(kBlock), shared, stream>>>(p);
  return cake::launch_status(error, error_len, what);
}

// Fills the fields shared by forward and backward from args[0..3] and the sizes; returns 0 or
// an error status with the message written.
inline int common(const cake::Args& a, int64_t tokens, int64_t channels, int64_t num_docs,
                  int64_t doc_len, Params& p, char* error, int32_t error_len) {
  using cake::fail;
  using cake::kInvalidArgument;
  if (tokens < 0 || channels < 1)
    return fail(error, error_len, kInvalidArgument,
                "tokens must be >= 0 and channels >= 1, got tokens=%lld channels=%lld",
                static_cast<long long>(tokens), static_cast<long long>(channels));
  if (channels > (int64_t{1} << 31) || tokens > (int64_t{1} << 40) / channels)
    return fail(error, error_len, kInvalidArgument,
                "tokens*channels too large (tokens=%lld channels=%lld)",
                static_cast<long long>(tokens), static_cast<long long>(channels));
  p.x = a.ptr<const Act>(0);
  p.weight = a.ptr<const void>(1);
  p.bias = a.ptr<const void>(2);
  p.cu_seqlens = a.ptr<const int32_t>(3);
  p.num_docs = num_docs;
  p.doc_len = doc_len;
  p.tokens = tokens;
  p.channels = channels;
  p.vectors = ceil_div(channels, kVec);
  p.channel_tiles = ceil_div(channels, kTile);
  if (p.weight == nullptr) return fail(error, error_len, kInvalidArgument, "weight is null");
  if (CAKE_HAS_BIAS && p.bias == nullptr)
    return fail(error, error_len, kInvalidArgument, "bias is null but this program adds a bias");
  if (!CAKE_HAS_BIAS && p.bias != nullptr)
    return fail(error, error_len, kInvalidArgument, "bias given but this program has no bias");
  if (tokens > 0 && p.x == nullptr) return fail(error, error_len, kInvalidArgument, "x is null");
  if (p.cu_seqlens != nullptr && tokens > 0 && num_docs < 1)
    return fail(error, error_len, kInvalidArgument, "num_docs must be >= 1, got %lld",
                static_cast<long long>(num_docs));
  if (p.cu_seqlens == nullptr && tokens > 0 && doc_len < 1)
    return fail(error, error_len, kInvalidArgument,
                "doc_len must be >= 1 without cu_seqlens, got %lld", static_cast<long long>(doc_len));
  return cake::kOk;
}

int forward(const cake::Args& a, cudaStream_t stream, char* error, int32_t error_len) {
  using cake::fail;
  if (a.count != 10)
    return fail(error, error_len, cake::kInvalidArgument, "forward takes 10 arguments, got %d",
                a.count);
  Params p{};
  int status = common(a, a.i64(5), a.i64(6), a.i64(7), a.i64(8), p, error, error_len);
  if (status != cake::kOk) return status;
  p.y = a.ptr<Act>(4);
  const bool weight_fp32 = a.i64(9) != 0;
  if (p.tokens == 0) return cake::kOk;
  if (p.y == nullptr) return fail(error, error_len, cake::kInvalidArgument, "y is null");
  const int64_t blocks = p.channel_tiles * ceil_div(p.tokens, Fwd::kSpan);
  if (blocks > kMaxGrid)
    return fail(error, error_len, cake::kInvalidArgument, "too many blocks (%lld)",
                static_cast<long long>(blocks));
  // 16-byte copies need every row to start on a 16-byte boundary: C % 8 == 0, aligned bases.
  const bool vec = p.channels % kPiece == 0 && aligned16(p.x) && aligned16(p.y);
  const char* what = "forward launch";
  if (weight_fp32)
    return vec ? launch<kernel_cake_library_forward_fv>(p, blocks, kForwardShared, stream, error, error_len, what)
               : launch<kernel_cake_library_forward_fs>(p, blocks, kForwardShared, stream, error, error_len, what);
  return vec ? launch<kernel_cake_library_forward_av>(p, blocks, kForwardShared, stream, error, error_len, what)
             : launch<kernel_cake_library_forward_as>(p, blocks, kForwardShared, stream, error, error_len, what);
}

int backward(const cake::Args& a, cudaStream_t stream, char* error, int32_t error_len) {
  using cake::fail;
  if (a.count != 16)
    return fail(error, error_len, cake::kInvalidArgument, "backward takes 16 arguments, got %d",
                a.count);
  Params p{};
  int status = common(a, a.i64(10), a.i64(11), a.i64(12), a.i64(13), p, error, error_len);
  if (status != cake::kOk) return status;
  p.dy = a.ptr<const Act>(4);
  p.dx = a.ptr<Act>(5);
  p.dweight = a.ptr<void>(6);
  p.dbias = a.ptr<void>(7);
  p.partials = a.ptr<float>(8);
  const int64_t have = a.i64(9);
  const bool weight_fp32 = a.i64(14) != 0;
  const bool grad_fp32 = a.i64(15) != 0;
  if (p.dweight == nullptr) return fail(error, error_len, cake::kInvalidArgument, "dweight is null");
  if (CAKE_HAS_BIAS && p.dbias == nullptr)
    return fail(error, error_len, cake::kInvalidArgument, "dbias is null");
  if (p.tokens > 0 && (p.dy == nullptr || p.dx == nullptr))
    return fail(error, error_len, cake::kInvalidArgument, "dy or dx is null");
  const int64_t need = workspace_bytes(p.tokens, p.channels);
  if (have < need || (need > 0 && p.partials == nullptr))
    return fail(error, error_len, cake::kInvalidArgument,
                "workspace has %lld bytes, needs %lld", static_cast<long long>(have),
                static_cast<long long>(need));
  p.token_tiles = backward_tiles(p.tokens);
  const int64_t blocks = p.channel_tiles * p.token_tiles;
  if (blocks > kMaxGrid)
    return fail(error, error_len, cake::kInvalidArgument, "too many blocks (%lld)",
                static_cast<long long>(blocks));
  if (p.tokens > 0) {
    const bool vec = p.channels % kVec == 0 && aligned_vec(p.x) && aligned_vec(p.dy) &&
                     aligned_vec(p.dx);
    const char* what = "backward launch";
    constexpr int kB = kBackwardThreads;
    if (weight_fp32)
      status = vec ? launch<kernel_cake_library_backward_fv, kB>(p, blocks, 0, stream, error, error_len, what)
                   : launch<kernel_cake_library_backward_fs, kB>(p, blocks, 0, stream, error, error_len, what);
    else
      status = vec ? launch<kernel_cake_library_backward_av, kB>(p, blocks, 0, stream, error, error_len, what)
                   : launch<kernel_cake_library_backward_as, kB>(p, blocks, 0, stream, error, error_len, what);
    if (status != cake::kOk) return status;
  }
  const dim3 rgrid(static_cast<unsigned>(ceil_div(kTaps * p.channels, kReduceColumns)));
  const dim3 rblock(kReduceColumns * kReduceGroups);
  // dweight/dbias in fp32, or in the weight's dtype (the activation dtype or fp32).
  if (grad_fp32 || weight_fp32) kernel_cake_library_reduce_f<<<rgrid, rblock, 0, stream>>>(p);
  else kernel_cake_library_reduce_a<<<rgrid, rblock, 0, stream>>>(p);
  return cake::launch_status(error, error_len, "reduce launch");
}

int query_workspace_bytes(const cake::Args& a, char* error, int32_t error_len) {
  using cake::fail;
  if (a.count != 3)
    return fail(error, error_len, cake::kInvalidArgument,
                "workspace_bytes takes 3 arguments, got %d", a.count);
  const int64_t tokens = a.i64(0), channels = a.i64(1);
  int64_t* out = a.ptr<int64_t>(2);
  if (tokens < 0 || channels < 1 || out == nullptr)
    return fail(error, error_len, cake::kInvalidArgument,
                "workspace_bytes: need tokens >= 0, channels >= 1 and an output pointer");
  *out = workspace_bytes(tokens, channels);
  return cake::kOk;
}

}  // namespace cake_library_ns
