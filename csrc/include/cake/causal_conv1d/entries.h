// The C entries of a causal conv1d program (host code): they check their arguments again (sizes,
// null pointers, limits), pick the kernel and launch it through the driver (cake/driver.h). No
// allocation, no synchronization.
//
// The binding defines, before including this: the knobs (cake/causal_conv1d/config.h),
// CAKE_LIBRARY_NAME (the library's name as a string: kernels are kernel_<library>_<suffix>) and
// the declared arguments of each entry, CAKE_ENTRY_forward, CAKE_ENTRY_backward and
// CAKE_ENTRY_workspace_bytes (the X-macros the renderer writes from the family table):
//   forward:          x, weight, bias, cu_seqlens, y, tokens, channels, num_docs, doc_len,
//                     weight_fp32
//   backward:         x, weight, bias, cu_seqlens, dy, dx, dweight, dbias, workspace,
//                     workspace_bytes, tokens, channels, num_docs, doc_len, weight_fp32, grad_fp32
//   workspace_bytes:  tokens, channels, out (a host int64 that receives the backward's workspace
//                     size in bytes; no launch, the stream is unused)
// Pointers are device addresses (0 for none) except workspace_bytes' out. Without cu_seqlens the
// tokens are documents of doc_len tokens each.
#pragma once

#include <stdint.h>

#include "cake/causal_conv1d/config.h"
#include "cake/driver.h"
#include "cake/program.h"

#ifndef CAKE_LIBRARY_NAME
#error "the binding defines CAKE_LIBRARY_NAME (its library's name) before this header"
#endif

namespace cake {
namespace causal_conv1d {

CAKE_ARGUMENTS(ForwardArgs, CAKE_ENTRY_forward)
CAKE_ARGUMENTS(BackwardArgs, CAKE_ENTRY_backward)
CAKE_ARGUMENTS(WorkspaceArgs, CAKE_ENTRY_workspace_bytes)

constexpr int64_t kMaxGrid = 0x7fffffff;

inline bool aligned(const void* ptr, int bytes) {
  return (reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(bytes)) == 0;
}
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Token tiles of the backward: the workspace holds kTaps * C floats per tile.
inline int64_t backward_tiles(int64_t tokens) { return ceil_div(tokens, kBackwardTileTokens); }
inline int64_t workspace_bytes(int64_t tokens, int64_t channels) {
  return backward_tiles(tokens) * kTaps * channels * static_cast<int64_t>(sizeof(float));
}

// A kernel of this program: its symbol and its launch state.
struct KernelRef {
  const char* name;
  Kernel* slot;
};

#define CAKE_CONV1D_KERNEL_REF_(suffix)                  \
  [] {                                                   \
    static ::cake::Kernel slot;                          \
    return KernelRef{"kernel_" CAKE_LIBRARY_NAME "_" suffix, &slot}; \
  }()

// Kernels by direction, weight dtype (fp32 or the activation dtype) and access path.
inline KernelRef forward_kernel(bool fp32_weight, bool vector) {
  if (fp32_weight) return vector ? CAKE_CONV1D_KERNEL_REF_("forward_fv") : CAKE_CONV1D_KERNEL_REF_("forward_fs");
  return vector ? CAKE_CONV1D_KERNEL_REF_("forward_av") : CAKE_CONV1D_KERNEL_REF_("forward_as");
}
inline KernelRef backward_kernel(bool fp32_weight, bool vector) {
  if (fp32_weight) return vector ? CAKE_CONV1D_KERNEL_REF_("backward_fv") : CAKE_CONV1D_KERNEL_REF_("backward_fs");
  return vector ? CAKE_CONV1D_KERNEL_REF_("backward_av") : CAKE_CONV1D_KERNEL_REF_("backward_as");
}
inline KernelRef reduce_kernel(bool fp32_out) {
  return fp32_out ? CAKE_CONV1D_KERNEL_REF_("reduce_f") : CAKE_CONV1D_KERNEL_REF_("reduce_a");
}

inline int launch(KernelRef kernel, const Params& p, int64_t blocks, int threads, int shared,
                  void* stream, char* error, int32_t error_len) {
  void* params[] = {const_cast<Params*>(&p)};
  Dim3 grid, block;
  grid.x = static_cast<unsigned>(blocks);
  block.x = static_cast<unsigned>(threads);
  return cake::launch(*kernel.slot, kernel.name, grid, block, shared, stream, params, error,
                      error_len, 0, /*prefer_shared=*/true);
}

// Fills the fields shared by forward and backward; returns 0 or an error status with the
// message written.
template <typename A>
inline int common(const A& a, Params& p, char* error, int32_t error_len) {
  if (a.tokens < 0 || a.channels < 1)
    return fail(error, error_len, kInvalidArgument,
                "tokens must be >= 0 and channels >= 1, got tokens=%lld channels=%lld",
                static_cast<long long>(a.tokens), static_cast<long long>(a.channels));
  if (a.channels > (int64_t{1} << 31) || a.tokens > (int64_t{1} << 40) / a.channels)
    return fail(error, error_len, kInvalidArgument,
                "tokens*channels too large (tokens=%lld channels=%lld)",
                static_cast<long long>(a.tokens), static_cast<long long>(a.channels));
  p.x = static_cast<const Act*>(a.x);
  p.weight = a.weight;
  p.bias = a.bias;
  p.cu_seqlens = static_cast<const int32_t*>(a.cu_seqlens);
  p.num_docs = a.num_docs;
  p.doc_len = a.doc_len;
  p.tokens = a.tokens;
  p.channels = a.channels;
  p.vectors = ceil_div(a.channels, kVec);
  p.channel_tiles = ceil_div(a.channels, kTile);
  if (p.weight == nullptr) return fail(error, error_len, kInvalidArgument, "weight is null");
  if (CAKE_HAS_BIAS && p.bias == nullptr)
    return fail(error, error_len, kInvalidArgument, "bias is null but this program adds a bias");
  if (!CAKE_HAS_BIAS && p.bias != nullptr)
    return fail(error, error_len, kInvalidArgument, "bias given but this program has no bias");
  if (a.tokens > 0 && p.x == nullptr) return fail(error, error_len, kInvalidArgument, "x is null");
  if (p.cu_seqlens != nullptr && a.tokens > 0 && a.num_docs < 1)
    return fail(error, error_len, kInvalidArgument, "num_docs must be >= 1, got %lld",
                static_cast<long long>(a.num_docs));
  if (p.cu_seqlens == nullptr && a.tokens > 0 && a.doc_len < 1)
    return fail(error, error_len, kInvalidArgument,
                "doc_len must be >= 1 without cu_seqlens, got %lld",
                static_cast<long long>(a.doc_len));
  return kOk;
}

inline int forward(const ForwardArgs& a, void* stream, char* error, int32_t error_len) {
  Params p{};
  const int status = common(a, p, error, error_len);
  if (status != kOk) return status;
  p.y = static_cast<Act*>(a.y);
  if (p.tokens == 0) return kOk;
  if (p.y == nullptr) return fail(error, error_len, kInvalidArgument, "y is null");
  const int64_t blocks = p.channel_tiles * ceil_div(p.tokens, Fwd::kSpan);
  if (blocks > kMaxGrid)
    return fail(error, error_len, kInvalidArgument, "too many blocks (%lld)",
                static_cast<long long>(blocks));
  // 16-byte copies need every row to start on a 16-byte boundary: C % 8 == 0, aligned bases.
  const bool vector = p.channels % kPiece == 0 && aligned(p.x, 16) && aligned(p.y, 16);
  return launch(forward_kernel(a.weight_fp32 != 0, vector), p, blocks, kThreads, kForwardShared,
                stream, error, error_len);
}

inline int backward(const BackwardArgs& a, void* stream, char* error, int32_t error_len) {
  Params p{};
  int status = common(a, p, error, error_len);
  if (status != kOk) return status;
  p.dy = static_cast<const Act*>(a.dy);
  p.dx = static_cast<Act*>(a.dx);
  p.dweight = a.dweight;
  p.dbias = a.dbias;
  p.partials = static_cast<float*>(a.workspace);
  if (p.dweight == nullptr) return fail(error, error_len, kInvalidArgument, "dweight is null");
  if (CAKE_HAS_BIAS && p.dbias == nullptr)
    return fail(error, error_len, kInvalidArgument, "dbias is null");
  if (p.tokens > 0 && (p.dy == nullptr || p.dx == nullptr))
    return fail(error, error_len, kInvalidArgument, "dy or dx is null");
  const int64_t need = workspace_bytes(p.tokens, p.channels);
  if (a.workspace_bytes < need || (need > 0 && p.partials == nullptr))
    return fail(error, error_len, kInvalidArgument, "workspace has %lld bytes, needs %lld",
                static_cast<long long>(a.workspace_bytes), static_cast<long long>(need));
  p.token_tiles = backward_tiles(p.tokens);
  const int64_t blocks = p.channel_tiles * p.token_tiles;
  if (blocks > kMaxGrid)
    return fail(error, error_len, kInvalidArgument, "too many blocks (%lld)",
                static_cast<long long>(blocks));
  if (p.tokens > 0) {
    const bool vector = p.channels % kVec == 0 && aligned(p.x, kBackwardAccessBytes) &&
                        aligned(p.dy, kBackwardAccessBytes) && aligned(p.dx, kBackwardAccessBytes);
    status = launch(backward_kernel(a.weight_fp32 != 0, vector), p, blocks, kBackwardThreads, 0,
                    stream, error, error_len);
    if (status != kOk) return status;
  }
  // dweight/dbias in fp32, or in the weight's dtype (the activation dtype or fp32).
  return launch(reduce_kernel(a.grad_fp32 != 0 || a.weight_fp32 != 0), p,
                ceil_div(kTaps * p.channels, kReduceColumns), kReduceColumns * kReduceGroups, 0,
                stream, error, error_len);
}

inline int query_workspace_bytes(const WorkspaceArgs& a, void*, char* error, int32_t error_len) {
  int64_t* out = static_cast<int64_t*>(a.out);
  if (a.tokens < 0 || a.channels < 1 || out == nullptr)
    return fail(error, error_len, kInvalidArgument,
                "workspace_bytes: need tokens >= 0, channels >= 1 and an output pointer");
  *out = workspace_bytes(a.tokens, a.channels);
  return kOk;
}

}  // namespace causal_conv1d
}  // namespace cake
