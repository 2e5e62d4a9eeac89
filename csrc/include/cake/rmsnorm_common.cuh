// Shared device code of the RMSNorm families (cake_rmsnorm_det_train, cake_gated_rmsnorm_det_train).
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
// multiple of 32 up to 512); a CTA holds `groups` row groups. Each thread keeps its kEpt elements
// of the row in registers (as packed words) between the sum-of-squares pass and the normalize
// pass: kEpt / kVec loads of kVec elements at element offsets (c * tpr + lane) * kVec, so every
// load of a row group is coalesced. kVec * sizeof(T) is 16 bytes on the vector route (D a multiple
// of 16 / sizeof(T), 16-byte aligned rows) and sizeof(T) on the scalar route (any D). kEpt is 16
// up to D = 8192 and 32 above (the "wide" instance), so D <= 32 * 512 = 16384.
//
// Determinism. Forward rows are independent, so the forward grid may follow the occupancy. The
// weight gradient is reduced in an order fixed by (rows, cols, rows_per_cta) only: CTA b owns rows
// [b * rows_per_cta, (b + 1) * rows_per_cta); its row groups take those rows round-robin and
// accumulate in registers in row order; the groups are summed in group order through shared
// memory into the CTA's fp32 partial row of the workspace; a second kernel sums the partial rows
// of each column in CTA order. No atomics anywhere.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace cake {
namespace rmsnorm {

// Every kernel runs at most kMaxCtaThreads threads a CTA (its launch bound, so 128 registers).
constexpr int kMaxCtaThreads = 512;
constexpr int kMaxCols = 16384;
// Elements per thread: kNarrowEpt up to kNarrowMaxCols columns, else kWideEpt. Either way a row
// group has at most kMaxCtaThreads threads (each kernel's launch bound).
constexpr int kNarrowEpt = 16;
constexpr int kWideEpt = 32;
constexpr int kNarrowMaxCols = kNarrowEpt * kMaxCtaThreads;
// Threads per CTA the launcher aims for when a row needs fewer (several row groups per CTA).
constexpr int kTargetCtaThreads = 256;
// Weight-gradient column reduction: a CTA covers kColLanes float4 lanes (4 columns each) and
// splits the partial rows into kColSegments interleaved segments, summed in segment order.
constexpr int kColLanes = 8;
constexpr int kColSegments = 32;

// dtype codes shared with the Python side.
enum DType : int { kBF16 = 0, kF16 = 1, kF32 = 2 };

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
  int32_t tpr;           // threads per row group
  int32_t weight_fp32;
  float eps;
  float weight_offset;
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
  int32_t tpr;
  int32_t weight_fp32;
  float weight_offset;
};

struct DweightParams {
  const float* partials;  // (chunks, cols_padded) fp32
  void* dweight;          // (cols,) of dtype `out_dtype`
  int64_t chunks;
  int32_t cols;
  int32_t cols_padded;
  int32_t out_dtype;
};

// --------------------------------------------------------------------------- element access

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

template <int kBytes> struct RawOf;
template <> struct RawOf<16> { using type = uint4; };
template <> struct RawOf<4> { using type = unsigned int; };
template <> struct RawOf<2> { using type = unsigned short; };

// kVec elements of T kept as raw 32-bit words (two 16-bit elements a word), so a 16-byte load
// occupies 4 registers however it is used; elements are unpacked to fp32 where they are used.
template <typename T, int kVec>
struct Pack {
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * kVec;
  static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  using Raw = typename RawOf<kBytes>::type;
  uint32_t w[kWords];

  __device__ __forceinline__ void set_raw(const Raw& raw) {
    if constexpr (kBytes == 16) {
      w[0] = raw.x; w[1] = raw.y; w[2] = raw.z; w[3] = raw.w;
    } else {
      w[0] = raw;
    }
  }
  __device__ __forceinline__ Raw raw() const {
    if constexpr (kBytes == 16) {
      return make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      return static_cast<Raw>(w[0]);
    }
  }
  // Element v as fp32 (v is a compile-time constant after unrolling).
  __device__ __forceinline__ float get(int v) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(w[v]);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      return __uint_as_float((v & 1) ? (w[v >> 1] & 0xffff0000u) : (w[v >> 1] << 16));
    } else {
      const uint32_t bits = (v & 1) ? (w[v >> 1] >> 16) : (w[v >> 1] & 0xffffu);
      return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    }
  }
  // Sets every element from fp32 values (round to nearest even).
  __device__ __forceinline__ void set(const float (&f)[kVec]) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) w[v] = __float_as_uint(f[v]);
    } else if constexpr (kVec == 1) {
      w[0] = bits16(f[0]);
    } else {
#pragma unroll
      for (int v = 0; v < kVec; v += 2) w[v >> 1] = bits16(f[v]) | (bits16(f[v + 1]) << 16);
    }
  }
  __device__ __forceinline__ static uint32_t bits16(float f) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      return __bfloat16_as_ushort(__float2bfloat16_rn(f));
    } else {
      return __half_as_ushort(__float2half_rn(f));
    }
  }
};

// Streaming load (read once: evict first).
template <typename T, int kVec>
__device__ __forceinline__ Pack<T, kVec> load_pack(const T* p) {
  using P = Pack<T, kVec>;
  P out;
  out.set_raw(__ldcs(reinterpret_cast<const typename P::Raw*>(p)));
  return out;
}

template <typename T, int kVec>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, kVec>& value) {
  *reinterpret_cast<typename Pack<T, kVec>::Raw*>(p) = value.raw();
}

template <typename T, int kVec>
__device__ __forceinline__ Pack<T, kVec> zero_pack() {
  Pack<T, kVec> out;
#pragma unroll
  for (int i = 0; i < Pack<T, kVec>::kWords; ++i) out.w[i] = 0u;
  return out;
}

template <typename T>
__device__ __forceinline__ float load_weight(const void* weight, int weight_fp32, int index) {
  return weight_fp32 ? __ldg(static_cast<const float*>(weight) + index)
                     : to_float(static_cast<const T*>(weight)[index]);
}

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

// --------------------------------------------------------------------------- row-group sum

// Sum of `value` over the row group of `tpr` threads; every thread of the group gets the same
// bits (butterfly order; IEEE addition commutes). Every thread of the CTA must call it the same
// number of times. `scratch` holds 2 * 32 floats; `parity` alternates per call so that one
// barrier per call suffices.
__device__ __forceinline__ float group_sum(float value, int tpr, float* scratch, int parity) {
  const int width = tpr < 32 ? tpr : 32;
#pragma unroll
  for (int offset = 16; offset >= 1; offset >>= 1) {
    if (offset < width) value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if (tpr <= 32) return value;
  float* slots = scratch + 32 * parity;
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) slots[warp] = value;
  __syncthreads();
  const int warps = tpr >> 5;
  const int first = (warp / warps) * warps;
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += slots[first + w];
  return total;
}

// --------------------------------------------------------------------------- forward

// One thread's kEpt elements of a row: kVpt loads of kVec, load c at column (c * tpr + lane) * kVec.
template <typename T, int kVec, int kEpt>
struct Slice {
  static constexpr int kVpt = kEpt / kVec;
  static_assert(kEpt % kVec == 0, "a thread's elements must be whole loads");
  __device__ __forceinline__ static int column(int c, int tpr, int lane) { return (c * tpr + lane) * kVec; }
};

// Stages weight + weight_offset as fp32 in shared memory (row_elems floats, zero past cols).
template <typename T>
__device__ __forceinline__ void stage_weights(float* wsm, const void* weight, int weight_fp32, float offset,
                                              int cols, int row_elems) {
  for (int i = threadIdx.x; i < row_elems; i += blockDim.x) {
    wsm[i] = i < cols ? load_weight<T>(weight, weight_fp32, i) + offset : 0.0f;
  }
  __syncthreads();
}

// The kVec staged weights from column `col` (16-byte shared-memory loads where they fit).
template <int kVec>
__device__ __forceinline__ void weights_at(float (&w)[kVec], const float* wsm, int col) {
  if constexpr (kVec % 4 == 0) {
#pragma unroll
    for (int v = 0; v < kVec; v += 4) {
      const float4 q = *reinterpret_cast<const float4*>(wsm + col + v);
      w[v] = q.x; w[v + 1] = q.y; w[v + 2] = q.z; w[v + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int v = 0; v < kVec; ++v) w[v] = wsm[col + v];
  }
}

// Whether an instance keeps a second row in flight (software pipelining): the narrow vector
// instances, except gated fp32, where the second set of registers would spill.
template <typename T, int kVec, int kEpt, bool kGated>
__host__ __device__ constexpr bool prefetches() {
  return kEpt == kNarrowEpt && kVec > 1 && !(kGated && sizeof(T) == 4);
}

// Loads one thread's slice of row `row` of `base` (zeros past the row's end or for a row
// outside the call, which is not read).
template <typename T, int kVec, int kEpt>
__device__ __forceinline__ void load_slice(Pack<T, kVec> (&dst)[kEpt / kVec], const T* base, int64_t row,
                                           bool row_ok, int cols, int tpr, int lane) {
  using S = Slice<T, kVec, kEpt>;
  const int64_t offset = row * cols;
#pragma unroll
  for (int c = 0; c < S::kVpt; ++c) {
    const int col = S::column(c, tpr, lane);
    dst[c] = row_ok && col < cols ? load_pack<T, kVec>(base + offset + col) : zero_pack<T, kVec>();
  }
}

template <typename T, int kVec, int kEpt, bool kGated>
__device__ __forceinline__ void forward(const ForwardParams& p) {
  using S = Slice<T, kVec, kEpt>;
  constexpr int kVpt = S::kVpt;
  __shared__ float scratch[64];
  const int tpr = p.tpr;
  const int groups = blockDim.x / tpr;
  const int group = threadIdx.x / tpr;
  const int lane = threadIdx.x - group * tpr;
  const int cols = p.cols;

  extern __shared__ float4 dynamic_smem[];
  float* wsm = reinterpret_cast<float*>(dynamic_smem);
  stage_weights<T>(wsm, p.weight, p.weight_fp32, p.weight_offset, cols, tpr * kEpt);

  const T* x = static_cast<const T*>(p.x);
  const T* residual = static_cast<const T*>(p.residual);
  const T* gate = static_cast<const T*>(p.gate);
  T* y = static_cast<T*>(p.y);
  T* residual_out = static_cast<T*>(p.residual_out);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  int parity = 0;
  // The narrow vector instances load the next row while they reduce and write the current one.
  constexpr bool kPrefetch = prefetches<T, kVec, kEpt, kGated>();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groups;
  int64_t base = static_cast<int64_t>(blockIdx.x) * groups;
  Pack<T, kVec> s[kVpt], g[kVpt], s_next[kVpt], g_next[kVpt];
  if (kPrefetch) {
    load_slice<T, kVec, kEpt>(s, x, base + group, base + group < p.rows, cols, tpr, lane);
    if (kGated) load_slice<T, kVec, kEpt>(g, gate, base + group, base + group < p.rows, cols, tpr, lane);
  }
  for (; base < p.rows; base += stride) {
    const int64_t row = base + group;
    const bool row_ok = row < p.rows;
    const int64_t offset = row * cols;
    const int64_t next = row + stride;
    if (kPrefetch) {
      load_slice<T, kVec, kEpt>(s_next, x, next, next < p.rows, cols, tpr, lane);
      if (kGated) load_slice<T, kVec, kEpt>(g_next, gate, next, next < p.rows, cols, tpr, lane);
    } else {
      load_slice<T, kVec, kEpt>(s, x, row, row_ok, cols, tpr, lane);
      if (kGated) load_slice<T, kVec, kEpt>(g, gate, row, row_ok, cols, tpr, lane);
    }
    if (residual != nullptr) {
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        const int col = S::column(c, tpr, lane);
        if (row_ok && col < cols) {
          const Pack<T, kVec> r = load_pack<T, kVec>(residual + offset + col);
          float sum[kVec];
#pragma unroll
          for (int v = 0; v < kVec; ++v) sum[v] = s[c].get(v) + r.get(v);
          s[c].set(sum);
          store_pack<T, kVec>(residual_out + offset + col, s[c]);
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
    ssq = group_sum(ssq, tpr, scratch, parity);
    parity ^= 1;
    const float rstd = rsqrtf(ssq * inv_cols + p.eps);
    if (row_ok) {
      if (p.rstd != nullptr && lane == 0) p.rstd[row] = rstd;
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        const int col = S::column(c, tpr, lane);
        if (col < cols) {
          float w[kVec], out[kVec];
          weights_at<kVec>(w, wsm, col);
#pragma unroll
          for (int v = 0; v < kVec; ++v) {
            out[v] = s[c].get(v) * rstd * w[v];
            if (kGated) {
              const float gv = g[c].get(v);
              out[v] *= gv * sigmoid(gv);
            }
          }
          Pack<T, kVec> packed;
          packed.set(out);
          store_pack<T, kVec>(y + offset + col, packed);
        }
      }
    }
    if (kPrefetch) {
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        s[c] = s_next[c];
        if (kGated) g[c] = g_next[c];
      }
    }
  }
}

// --------------------------------------------------------------------------- backward

// Dynamic shared memory: the staged weights (tpr * kEpt floats), then, when the CTA has several
// row groups, their weight-gradient partials (blockDim.x * kEpt floats), or, in the wide instance,
// the weight-gradient sums (tpr * kEpt floats).
template <typename T, int kVec, int kEpt, bool kGated>
__device__ __forceinline__ void backward(const BackwardParams& p) {
  using S = Slice<T, kVec, kEpt>;
  constexpr int kVpt = S::kVpt;
  __shared__ float scratch[64];
  extern __shared__ float4 dynamic_smem[];
  const int tpr = p.tpr;
  const int groups = blockDim.x / tpr;
  const int group = threadIdx.x / tpr;
  const int lane = threadIdx.x - group * tpr;
  const int cols = p.cols;

  // The wide instance (one row group a CTA) keeps its weight-gradient sums in shared memory
  // (each thread only its own columns): in registers they would spill.
  constexpr bool kSharedDw = kEpt == kWideEpt;
  const int row_elems = tpr * kEpt;
  float* wsm = reinterpret_cast<float*>(dynamic_smem);
  float* group_partials = wsm + row_elems;
  stage_weights<T>(wsm, p.weight, p.weight_fp32, p.weight_offset, cols, row_elems);
  float dw[kSharedDw ? 1 : kVpt][kVec];
#pragma unroll
  for (int c = 0; c < kVpt; ++c) {
    const int col = S::column(c, tpr, lane);
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      if constexpr (kSharedDw) {
        group_partials[col + v] = 0.0f;
      } else {
        dw[c][v] = 0.0f;
      }
    }
  }

  const T* s_in = static_cast<const T*>(p.s);
  const T* gate = static_cast<const T*>(p.gate);
  const T* dy_in = static_cast<const T*>(p.dy);
  const T* dsum = static_cast<const T*>(p.dsum);
  T* dx_out = static_cast<T*>(p.dx);
  T* dres_out = static_cast<T*>(p.dresidual);
  T* dg_out = static_cast<T*>(p.dgate);
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * p.rows_per_cta;
  const int64_t end = begin + p.rows_per_cta < p.rows ? begin + p.rows_per_cta : p.rows;
  int parity = 0;
  // The narrow vector instances load the next row of the band while they work on the current one.
  constexpr bool kPrefetch = prefetches<T, kVec, kEpt, kGated>();
  Pack<T, kVec> s[kVpt], dy[kVpt], g[kVpt];
  Pack<T, kVec> s_next[kVpt], dy_next[kVpt], g_next[kVpt];
  if (kPrefetch) {
    const int64_t first = begin + group;
    load_slice<T, kVec, kEpt>(s, s_in, first, first < end, cols, tpr, lane);
    load_slice<T, kVec, kEpt>(dy, dy_in, first, first < end, cols, tpr, lane);
    if (kGated) load_slice<T, kVec, kEpt>(g, gate, first, first < end, cols, tpr, lane);
  }
  for (int64_t base = begin; base < end; base += groups) {
    const int64_t row = base + group;
    const bool row_ok = row < end;
    const int64_t offset = row * cols;
    const int64_t next = row + groups;
    if (kPrefetch) {
      load_slice<T, kVec, kEpt>(s_next, s_in, next, next < end, cols, tpr, lane);
      load_slice<T, kVec, kEpt>(dy_next, dy_in, next, next < end, cols, tpr, lane);
      if (kGated) load_slice<T, kVec, kEpt>(g_next, gate, next, next < end, cols, tpr, lane);
    } else {
      load_slice<T, kVec, kEpt>(s, s_in, row, row_ok, cols, tpr, lane);
      load_slice<T, kVec, kEpt>(dy, dy_in, row, row_ok, cols, tpr, lane);
      if (kGated) load_slice<T, kVec, kEpt>(g, gate, row, row_ok, cols, tpr, lane);
    }
    const float rstd = row_ok ? __ldg(p.rstd + row) : 0.0f;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kVpt; ++c) {
      float w[kVec];
      weights_at<kVec>(w, wsm, S::column(c, tpr, lane));
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        const float xhat = s[c].get(v) * rstd;
        float dn = dy[c].get(v);
        if (kGated) {
          const float gv = g[c].get(v);
          dn *= gv * sigmoid(gv);
        }
        if constexpr (kSharedDw) {
          float& acc = group_partials[S::column(c, tpr, lane) + v];
          acc = fmaf(dn, xhat, acc);
        } else {
          dw[c][v] = fmaf(dn, xhat, dw[c][v]);
        }
        dot = fmaf(dn * w[v], xhat, dot);
      }
    }
    dot = group_sum(dot, tpr, scratch, parity);
    parity ^= 1;
    const float mean_dot = dot * inv_cols;
    if (row_ok) {
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        const int col = S::column(c, tpr, lane);
        if (col < cols) {
          Pack<T, kVec> dsum_pack = zero_pack<T, kVec>();
          if (dsum != nullptr) dsum_pack = load_pack<T, kVec>(dsum + offset + col);
          float w[kVec], dx[kVec], dg[kVec];
          weights_at<kVec>(w, wsm, col);
#pragma unroll
          for (int v = 0; v < kVec; ++v) {
            const float xhat = s[c].get(v) * rstd;
            const float dyv = dy[c].get(v);
            float dn = dyv;
            if (kGated) {
              const float gv = g[c].get(v);
              const float sig = sigmoid(gv);
              dn *= gv * sig;
              dg[v] = dyv * xhat * w[v] * (sig * (1.0f + gv * (1.0f - sig)));
            }
            dx[v] = rstd * (dn * w[v] - xhat * mean_dot) + dsum_pack.get(v);
          }
          Pack<T, kVec> packed;
          packed.set(dx);
          store_pack<T, kVec>(dx_out + offset + col, packed);
          if (dres_out != nullptr) store_pack<T, kVec>(dres_out + offset + col, packed);
          if (kGated) {
            packed.set(dg);
            store_pack<T, kVec>(dg_out + offset + col, packed);
          }
        }
      }
    }
    if (kPrefetch) {
#pragma unroll
      for (int c = 0; c < kVpt; ++c) {
        s[c] = s_next[c];
        dy[c] = dy_next[c];
        if (kGated) g[c] = g_next[c];
      }
    }
  }

  if (p.partials == nullptr) return;
  float* out = p.partials + static_cast<int64_t>(blockIdx.x) * p.cols_padded;
  if (groups == 1) {
#pragma unroll
    for (int c = 0; c < kVpt; ++c) {
      const int col = S::column(c, tpr, lane);
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        if (col + v < p.cols_padded) {
          float total = 0.0f;
          if constexpr (kSharedDw) {
            total = group_partials[col + v];
          } else {
            total = dw[c][v];
          }
          out[col + v] = col + v < cols ? total : 0.0f;
        }
      }
    }
    return;
  }
  // Several row groups (narrow instance only): sum their partials in group order through
  // shared memory.
  float* mine = group_partials + group * row_elems;
#pragma unroll
  for (int c = 0; c < kVpt; ++c) {
    const int col = S::column(c, tpr, lane);
#pragma unroll
    for (int v = 0; v < kVec; ++v) mine[col + v] = dw[c][v];
  }
  __syncthreads();
  for (int col = threadIdx.x; col < p.cols_padded; col += blockDim.x) {
    float total = 0.0f;
    if (col < cols) {
      for (int k = 0; k < groups; ++k) total += group_partials[k * row_elems + col];
    }
    out[col] = total;
  }
}

// Sums the partial rows of each column in row order: thread (lane, segment) sums rows
// segment, segment + kColSegments, ...; the segments are then summed in segment order.
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
  if (segment != 0 || col >= p.cols) return;
  float total[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k = 0; k < kColSegments; ++k) {
    const float4 v = sums[k][lane];
    total[0] += v.x;
    total[1] += v.y;
    total[2] += v.z;
    total[3] += v.w;
  }
  for (int j = 0; j < 4 && col + j < p.cols; ++j) {
    switch (p.out_dtype) {
      case kBF16: static_cast<__nv_bfloat16*>(p.dweight)[col + j] = __float2bfloat16_rn(total[j]); break;
      case kF16: static_cast<__half*>(p.dweight)[col + j] = __float2half_rn(total[j]); break;
      default: static_cast<float*>(p.dweight)[col + j] = total[j]; break;
    }
  }
}

// --------------------------------------------------------------------------- launch shapes


__host__ __device__ inline int elems_per_thread(int cols) { return cols <= kNarrowMaxCols ? kNarrowEpt : kWideEpt; }

// Threads per row group: a power of two up to 32, else a multiple of 32.
inline int threads_per_row(int cols) {
  const int ept = elems_per_thread(cols);
  const int need = (cols + ept - 1) / ept;
  if (need > 32) return (need + 31) / 32 * 32;
  int tpr = 1;
  while (tpr < need) tpr <<= 1;
  return tpr;
}

inline int row_groups_per_cta(int tpr) { return tpr >= kTargetCtaThreads ? 1 : kTargetCtaThreads / tpr; }

// The backward's row partition, fixed by the row count alone: at most kMaxBackwardCtas bands of
// at least kMinRowsPerCta rows (a constant, not the device's SM count).
constexpr int64_t kMaxBackwardCtas = 1024;
constexpr int64_t kMinRowsPerCta = 16;

inline int64_t backward_rows_per_cta(int64_t rows) {
  const int64_t even = (rows + kMaxBackwardCtas - 1) / kMaxBackwardCtas;
  return even > kMinRowsPerCta ? even : kMinRowsPerCta;
}

inline int64_t backward_ctas(int64_t rows) {
  const int64_t per = backward_rows_per_cta(rows);
  return (rows + per - 1) / per;
}

inline int padded_cols(int cols) { return (cols + 3) / 4 * 4; }

// Bytes of the weight-gradient workspace for `ctas` partial rows.
inline int64_t workspace_bytes(int64_t ctas, int cols) {
  return ctas * static_cast<int64_t>(padded_cols(cols)) * static_cast<int64_t>(sizeof(float));
}

// --------------------------------------------------------------------------- launchers

// Shared memory beyond the default 48 KiB (dynamic plus the kernels' static 256 bytes) needs
// the kernel's opt-in (a host call; no stream work).
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  if (bytes + 1024 <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

// Forward: grid-stride over rows with at most one wave of CTAs (rows are independent, so the
// grid size changes no result). `narrow`/`wide` are the kernel's kNarrowEpt/kWideEpt instances.
template <typename Kernel>
cudaError_t launch_forward(Kernel narrow, Kernel wide, const ForwardParams& p, cudaStream_t stream) {
  const Kernel kernel = elems_per_thread(p.cols) == kNarrowEpt ? narrow : wide;
  const int groups = row_groups_per_cta(p.tpr);
  const int threads = p.tpr * groups;
  const size_t smem = static_cast<size_t>(p.tpr) * elems_per_thread(p.cols) * sizeof(float);
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (status == cudaSuccess) status = allow_smem(kernel, smem);
  if (status == cudaSuccess) status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem);
  if (status != cudaSuccess) return status;
  const int64_t wave = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  const int64_t needed = (p.rows + groups - 1) / groups;
  const int64_t grid = needed < wave ? needed : wave;
  kernel<<<static_cast<unsigned>(grid), threads, smem, stream>>>(p);
  return cudaGetLastError();
}

// Backward: one CTA per band of rows (the grid is fixed by the row count).
template <typename Kernel>
cudaError_t launch_backward(Kernel narrow, Kernel wide, const BackwardParams& p, int64_t ctas,
                            cudaStream_t stream) {
  const int ept = elems_per_thread(p.cols);
  const Kernel kernel = ept == kNarrowEpt ? narrow : wide;
  const int groups = row_groups_per_cta(p.tpr);
  const int threads = p.tpr * groups;
  // Staged weights, then the row groups' partials (narrow, several groups) or the weight-gradient
  // sums (wide instance).
  const bool second = groups > 1 || ept == kWideEpt;
  const size_t smem = static_cast<size_t>(p.tpr + (second ? threads : 0)) * ept * sizeof(float);
  const cudaError_t status = allow_smem(kernel, smem);
  if (status != cudaSuccess) return status;
  kernel<<<static_cast<unsigned>(ctas), threads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename Kernel>
cudaError_t launch_dweight(Kernel kernel, const DweightParams& p, cudaStream_t stream) {
  const int columns_per_cta = kColLanes * 4;
  const unsigned grid = static_cast<unsigned>((p.cols_padded + columns_per_cta - 1) / columns_per_cta);
  kernel<<<grid, dim3(kColLanes, kColSegments), 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace rmsnorm
}  // namespace cake
