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
// of that time; this one measures 80-89%.)
//
// Determinism: the backward writes one fp32 partial per (token tile, channel, tap) into the
// workspace (no atomics); the reduction kernel sums the tiles of each column in a fixed order
// that depends only on the number of tiles. Neither depends on the SM count or on timing.
//
// Memory safety: every global index is checked against [0, S) x [0, C) on its own, so any
// cu_seqlens content (even one that fails the host checks) reads and writes only in bounds.
//
// Kernel sources of the family's programs include this header after their knobs and define their
// kernels with the CAKE_CONV1D_*_KERNEL macros at the end: one extern "C" kernel each, named
// kernel_<library>_<direction>_<weight><access> (weight: a = the activation dtype, f = fp32;
// access: v = vectors (forward: 16-byte async copies, C % 8 == 0; backward: VEC-wide loads,
// C % VEC == 0), s = element accesses), which the entries (cake/causal_conv1d/entries.h) look up
// by name.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "cake/causal_conv1d/config.h"
#include "cake/fast_math.cuh"

namespace cake {
namespace causal_conv1d {

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

template <bool kFp32Weight>
using Weight = typename std::conditional<kFp32Weight, float, Act>::type;

}  // namespace causal_conv1d
}  // namespace cake

#define CAKE_CONV1D_FORWARD_KERNEL(name, fp32_weight, vector_access)                             \
  extern "C" __global__ void __launch_bounds__(::cake::causal_conv1d::kThreads,                \
                                               ::cake::causal_conv1d::kForwardMinBlocks)       \
      name(const ::cake::causal_conv1d::Params p) {                                            \
    ::cake::causal_conv1d::forward_body<::cake::causal_conv1d::Weight<fp32_weight>,            \
                                        vector_access>(p);                                     \
  }

#define CAKE_CONV1D_BACKWARD_KERNEL(name, fp32_weight, vector_access)                            \
  extern "C" __global__ void __launch_bounds__(                                                \
      ::cake::causal_conv1d::kBackwardThreads,                                                 \
      vector_access ? ::cake::causal_conv1d::kBackwardMinBlocks                                \
                    : ::cake::causal_conv1d::kBackwardScalarMinBlocks)                         \
      name(const ::cake::causal_conv1d::Params p) {                                            \
    ::cake::causal_conv1d::backward_body<::cake::causal_conv1d::Weight<fp32_weight>,           \
                                         vector_access>(p);                                    \
  }

#define CAKE_CONV1D_REDUCE_KERNEL(name, fp32_out)                                                \
  extern "C" __global__ void __launch_bounds__(::cake::causal_conv1d::kReduceColumns *         \
                                               ::cake::causal_conv1d::kReduceGroups)           \
      name(const ::cake::causal_conv1d::Params p) {                                            \
    ::cake::causal_conv1d::reduce_body<::cake::causal_conv1d::Weight<fp32_out>>(p);            \
  }
