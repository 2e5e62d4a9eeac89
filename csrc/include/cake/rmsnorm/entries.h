// The C entries of an RMSNorm program (host code, both families): they check their declared
// arguments again, pick the kernel instance serving D (with_instance), work out its launch
// (threads, ring slots, shared memory, grid) and launch it through the driver (cake/driver.h).
//
// The binding defines, before including this, the program's knobs (cake/rmsnorm/config.h),
// CAKE_LIBRARY_NAME (the library's name as a string: its kernels are kernel_<library>_forward,
// _backward (templates) and _dweight) and the declared arguments (the X-macros the renderer
// writes from the family table):
//   forward:          x, residual|0, gate|0, weight, y, residual_out|0, rstd|0, rows, cols,
//                     weight_fp32, eps, weight_offset
//   backward:         s, gate|0, weight, dy, rstd, dsum|0, dx, dresidual|0, dgate|0, workspace|0,
//                     workspace_bytes, dweight|0, rows, cols, weight_fp32, dweight_dtype (0 bf16,
//                     1 fp16, 2 fp32), weight_offset
//   workspace_bytes:  rows, cols, out (a host int64 that receives the backward's workspace size
//                     in bytes; no launch, the stream is unused)
// Pointers are device addresses (0 for none) except workspace_bytes' out.
#pragma once

#include <stdint.h>
#include <string.h>

#include "cake/driver.h"
#include "cake/program.h"
#include "cake/rmsnorm/config.h"

#ifndef CAKE_LIBRARY_NAME
#error "the binding defines CAKE_LIBRARY_NAME (its library's name) before this header"
#endif

namespace cake {
namespace rmsnorm {
namespace program {

CAKE_ARGUMENTS(ForwardArgs, CAKE_ENTRY_forward)
CAKE_ARGUMENTS(BackwardArgs, CAKE_ENTRY_backward)
CAKE_ARGUMENTS(WorkspaceArgs, CAKE_ENTRY_workspace_bytes)

constexpr int kElemBytes = static_cast<int>(sizeof(Elem));
constexpr int kVec = CAKE_VECTOR ? 16 / kElemBytes : 1;  // elements a load on this route

// The kernels' static shared memory (256 bytes), with margin: what the launch adds to the
// dynamic bytes before comparing with the 48 KiB default.
constexpr int kStaticSmem = 1024;

// ------------------------------------------------------------------------------ kernel symbols

// A kernel symbol, built at compile time.
struct Symbol {
  char text[256] = {};
  int size = 0;
  constexpr void put(const char* s) {
    while (*s != '\0') text[size++] = *s++;
  }
  constexpr void put(int value) {
    char digits[12] = {};
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value > 0);
    while (n > 0) text[size++] = digits[--n];
  }
};

constexpr int length(const char* s) {
  int n = 0;
  while (s[n] != '\0') ++n;
  return n;
}

// The symbol of the template kernel instance <name><kEpt, kTpr>(cake::rmsnorm::<params>), as
// the Itanium C++ ABI (nvcc's) mangles it: _Z<len>nameILi<ept>ELi<tpr>EEvN4cake7rmsnorm<len>paramsE.
template <int kEpt, int kTpr>
constexpr Symbol instance_symbol(const char* name, const char* params) {
  Symbol s;
  s.put("_Z");
  s.put(length(name));
  s.put(name);
  s.put("ILi");
  s.put(kEpt);
  s.put("ELi");
  s.put(kTpr);
  s.put("EEvN4cake7rmsnorm");
  s.put(length(params));
  s.put(params);
  s.put("E");
  return s;
}

template <int kEpt, int kTpr>
inline constexpr Symbol kForwardSymbol =
    instance_symbol<kEpt, kTpr>("kernel_" CAKE_LIBRARY_NAME "_forward", "ForwardParams");
template <int kEpt, int kTpr>
inline constexpr Symbol kBackwardSymbol =
    instance_symbol<kEpt, kTpr>("kernel_" CAKE_LIBRARY_NAME "_backward", "BackwardParams");
constexpr const char* kDweightSymbol = "kernel_" CAKE_LIBRARY_NAME "_dweight";

// ------------------------------------------------------------------------------ launchers

inline int no_instance(int cols, char* error, int32_t error_len) {
  return fail(error, error_len, kInvalidArgument,
              "no kernel instance of this program serves cols=%d (wrong route)", cols);
}

// Forward of one instance: grid-stride over rows, with one wave of CTAs or CTAs of about
// Config::kForwardCtaRows rows (rows are independent, so the grid changes no result).
template <int kEpt, int kTpr>
int launch_forward(ForwardParams p, void* stream, char* error, int32_t error_len) {
  using T = Elem;
  p.tpr = threads_per_row(p.cols, kEpt);
  if (kTpr != 0 && p.tpr != kTpr) return no_instance(p.cols, error, error_len);
  const int groups = row_groups_per_cta<Config, false>(p.tpr);
  const int threads = p.tpr * groups;
  size_t smem = 0;
  if constexpr (uses_registers<T, kAligned, kEpt, kGated, Config, false>()) {
    p.stages = 0;
    smem = weight_smem_bytes<kEpt>(weight_source<T, true, kEpt, kGated, Config, false>(), p.tpr);
  } else {
    // The weights (if staged), then the ring of x (, g) (, residual).
    const size_t weights =
        weight_smem_bytes<kEpt>(weight_source<T, kAligned, kEpt, kGated, Config, false>(), p.tpr);
    const int tensors = (kGated ? 2 : 1) + (p.residual != nullptr ? 1 : 0);
    const size_t slot = static_cast<size_t>(tensors) * kEpt * threads * sizeof(T);
    p.stages = ring_stages(Config::kForwardStages, slot, weights, async_copies<T, kAligned>());
    smem = weights + p.stages * slot;
  }
  static Kernel slot;
  const char* name = kForwardSymbol<kEpt, kTpr>.text;
  Prepared prepared{};
  int status = prepare(slot, name, static_cast<int>(smem), kStaticSmem, false, stream, &prepared,
                       error, error_len);
  if (status != kOk) return status;
  const int64_t needed = (p.rows + groups - 1) / groups;
  int64_t grid = 0;
  if constexpr (Config::kForwardCtaRows > 0) {
    constexpr int64_t kMaxGrid = int64_t{1} << 30;  // grid-stride covers the rest
    const int64_t steps = Config::kForwardCtaRows > groups ? Config::kForwardCtaRows / groups : 1;
    grid = (needed + steps - 1) / steps;
    grid = grid < kMaxGrid ? grid : kMaxGrid;
  } else {
    int64_t wave = 0;
    status = wave_size(prepared, name, threads, static_cast<int>(smem), &wave, error, error_len);
    if (status != kOk) return status;
    grid = needed < wave ? needed : wave;
  }
  void* params[] = {&p};
  Dim3 blocks, block;
  blocks.x = static_cast<unsigned>(grid);
  block.x = static_cast<unsigned>(threads);
  return launch_prepared(prepared, name, blocks, block, static_cast<int>(smem), stream, params,
                         error, error_len);
}

// Backward of one instance: `ctas` CTAs, fixed by the row count (BackwardSpan: which rows each
// takes).
template <int kEpt, int kTpr>
int launch_backward(BackwardParams p, int64_t ctas, void* stream, char* error, int32_t error_len) {
  using T = Elem;
  p.tpr = threads_per_row(p.cols, kEpt);
  if (kTpr != 0 && p.tpr != kTpr) return no_instance(p.cols, error, error_len);
  const int groups = row_groups_per_cta<Config, true>(p.tpr);
  const int threads = p.tpr * groups;
  size_t smem = 0;
  if constexpr (uses_registers<T, kAligned, kEpt, kGated, Config, true>()) {
    // Staged weights, then the row groups' partials.
    p.stages = 0;
    smem = static_cast<size_t>(p.tpr + (groups > 1 ? threads : 0)) * kEpt * sizeof(float);
  } else {
    // The weights (if staged), the ring of s, dy (and g) plus one rstd a thread per slot, then
    // the weight-gradient sums (if in shared memory). The partials (threads * kEpt floats) fit
    // in the ring: it holds at least two tensors of threads * kEpt elements of 2 or 4 bytes.
    const size_t weights =
        weight_smem_bytes<kEpt>(weight_source<T, kAligned, kEpt, kGated, Config, true>(), p.tpr);
    const int tensors = kGated ? 3 : 2;
    const size_t slot = static_cast<size_t>(tensors) * kEpt * threads * sizeof(T) +
                        static_cast<size_t>(threads) * sizeof(float);
    const size_t sums =
        dw_in_shared<T, kEpt, kGated>() ? static_cast<size_t>(threads) * kEpt * sizeof(float) : 0;
    p.stages = ring_stages(Config::kBackwardStages, slot, weights + sums, async_copies<T, kAligned>());
    smem = weights + p.stages * slot + sums;
  }
  static Kernel slot;
  void* params[] = {&p};
  Dim3 grid, block;
  grid.x = static_cast<unsigned>(ctas);
  block.x = static_cast<unsigned>(threads);
  return launch(slot, kBackwardSymbol<kEpt, kTpr>.text, grid, block, static_cast<int>(smem),
                stream, params, error, error_len, kStaticSmem);
}

inline int launch_dweight(DweightParams p, void* stream, char* error, int32_t error_len) {
  static Kernel slot;
  const int columns_per_cta = kColLanes * 4;
  Dim3 grid, block;
  grid.x = static_cast<unsigned>((p.cols_padded + columns_per_cta - 1) / columns_per_cta);
  block.x = kColLanes;
  block.y = kColSegments;
  void* params[] = {&p};
  return launch(slot, kDweightSymbol, grid, block, 0, stream, params, error, error_len);
}

// The backward's row partition at (rows, D): fixed by them and the program alone.
inline BackwardPartition partition_at(int64_t rows, int cols) {
  return backward_partition<Config>(rows, bands_at(cols));
}

// ------------------------------------------------------------------------------ checks

class Checker {
 public:
  Checker(char* error, int32_t error_len, const char* entry)
      : error_(error), len_(error_len), entry_(entry) {}

  // Null is allowed only when `required` is false; otherwise the pointer must be aligned.
  bool pointer(const void* value, const char* name, bool required, int alignment) {
    if (value == nullptr) {
      if (!required) return true;
      status_ = fail(error_, len_, kInvalidArgument, "%s: %s is null", entry_, name);
      return false;
    }
    if (reinterpret_cast<uintptr_t>(value) % static_cast<uintptr_t>(alignment) != 0) {
      status_ = fail(error_, len_, kInvalidArgument, "%s: %s is not %d-byte aligned", entry_, name,
                     alignment);
      return false;
    }
    return true;
  }

  bool require(bool ok, const char* what) {
    if (!ok) status_ = fail(error_, len_, kInvalidArgument, "%s: %s", entry_, what);
    return ok;
  }

  // rows >= 0, D in [1, kMaxCols] and on this program's route: a multiple of its vector width,
  // in its band (it compiles kernels for its band of D only, and its backward partition, so the
  // workspace size, follows its own knobs, which differ between bands).
  bool shape(int64_t rows, int64_t cols) {
    return require(rows >= 0, "rows must be >= 0") &&
           require(cols >= 1 && cols <= kMaxCols, "cols must be in [1, 16384]") &&
           require(cols % kVec == 0,
                   "cols is not a multiple of this program's vector width (wrong route)") &&
           require(cols >= Config::kColsMin && cols <= Config::kColsMax,
                   "cols is outside this program's band of D (wrong route)");
  }

  int status() const { return status_; }

 private:
  char* error_;
  int32_t len_;
  const char* entry_;
  int status_ = kOk;
};

// ------------------------------------------------------------------------------ entries

inline int forward(const ForwardArgs& a, void* stream, char* error, int32_t error_len) {
  Checker check(error, error_len, "forward");
  const int align = kElemBytes * kVec;
  const bool live = a.rows > 0;
  const bool has_residual = a.residual != nullptr;
  if (!check.shape(a.rows, a.cols) ||
      !check.require(a.weight_fp32 == 0 || a.weight_fp32 == 1, "weight_fp32 must be 0 or 1") ||
      !check.require(__builtin_isfinite(a.eps) && a.eps > 0.0f, "eps must be finite and > 0") ||
      !check.require(__builtin_isfinite(a.weight_offset), "weight_offset must be finite") ||
      !check.pointer(a.x, "x", live, align) ||
      !check.pointer(a.residual, "residual", false, align) ||
      !check.pointer(a.gate, "gate", live && kGated, align) ||
      !check.require(kGated || a.gate == nullptr, "gate given to a program without a gate") ||
      !check.pointer(a.weight, "weight", live, a.weight_fp32 ? 4 : kElemBytes) ||
      !check.pointer(a.y, "y", live, align) ||
      !check.pointer(a.residual_out, "residual_out", live && has_residual, align) ||
      !check.require(has_residual || a.residual_out == nullptr,
                     "residual_out given without residual") ||
      !check.pointer(a.rstd, "rstd", false, 4)) {
    return check.status();
  }
  if (!live) return kOk;
  ForwardParams p{};
  p.x = a.x;
  p.residual = a.residual;
  p.gate = a.gate;
  p.weight = a.weight;
  p.y = a.y;
  p.residual_out = a.residual_out;
  p.rstd = static_cast<float*>(a.rstd);
  p.rows = a.rows;
  p.cols = static_cast<int32_t>(a.cols);
  p.weight_fp32 = a.weight_fp32;
  p.eps = a.eps;
  p.weight_offset = a.weight_offset;
  p.inv_cols = 1.0f / static_cast<float>(a.cols);
  const int status = with_instance<Config, false, kAligned>(p.cols, [&](auto instance) {
    using I = decltype(instance);
    return launch_forward<I::ept, I::tpr>(p, stream, error, error_len);
  });
  return status == kNoInstance ? no_instance(p.cols, error, error_len) : status;
}

inline int backward(const BackwardArgs& a, void* stream, char* error, int32_t error_len) {
  Checker check(error, error_len, "backward");
  const int align = kElemBytes * kVec;
  const bool live = a.rows > 0;
  const bool want_dweight = a.dweight != nullptr;
  if (!check.shape(a.rows, a.cols)) return check.status();
  const int width = static_cast<int>(a.cols);  // in [1, kMaxCols] (Checker::shape)
  const BackwardPartition partition = partition_at(a.rows, width);
  const int64_t needed = want_dweight ? workspace_bytes(partition.ctas, width) : 0;
  const int dweight_bytes = a.dweight_dtype == kF32 ? 4 : 2;
  if (!check.require(a.weight_fp32 == 0 || a.weight_fp32 == 1, "weight_fp32 must be 0 or 1") ||
      !check.require(a.dweight_dtype >= kBF16 && a.dweight_dtype <= kF32,
                     "dweight dtype code must be 0, 1 or 2") ||
      !check.require(__builtin_isfinite(a.weight_offset), "weight_offset must be finite") ||
      !check.require(a.workspace_bytes >= needed,
                     "workspace is smaller than backward_workspace_bytes") ||
      !check.pointer(a.s, "s", live, align) ||
      !check.pointer(a.gate, "gate", live && kGated, align) ||
      !check.require(kGated || (a.gate == nullptr && a.dgate == nullptr),
                     "gate or dgate given to a program without a gate") ||
      !check.pointer(a.weight, "weight", live, a.weight_fp32 ? 4 : kElemBytes) ||
      !check.pointer(a.dy, "dy", live, align) ||
      !check.pointer(a.rstd, "rstd", live, 4) ||
      !check.pointer(a.dsum, "dsum", false, align) ||
      !check.pointer(a.dx, "dx", live, align) ||
      !check.pointer(a.dresidual, "dresidual", false, align) ||
      !check.pointer(a.dgate, "dgate", live && kGated, align) ||
      !check.pointer(a.workspace, "workspace", needed > 0, 16) ||
      !check.pointer(a.dweight, "dweight", false, dweight_bytes)) {
    return check.status();
  }
  const int padded = padded_cols(width);
  if (live) {
    BackwardParams p{};
    p.s = a.s;
    p.gate = a.gate;
    p.weight = a.weight;
    p.dy = a.dy;
    p.rstd = static_cast<const float*>(a.rstd);
    p.dsum = a.dsum;
    p.dx = a.dx;
    p.dresidual = a.dresidual;
    p.dgate = a.dgate;
    p.partials = want_dweight ? static_cast<float*>(a.workspace) : nullptr;
    p.rows = a.rows;
    p.rows_per_cta = partition.rows_per_cta;
    p.cols = width;
    p.cols_padded = padded;
    p.weight_fp32 = a.weight_fp32;
    p.weight_offset = a.weight_offset;
    p.inv_cols = 1.0f / static_cast<float>(a.cols);
    const int status = with_instance<Config, true, kAligned>(width, [&](auto instance) {
      using I = decltype(instance);
      return launch_backward<I::ept, I::tpr>(p, partition.ctas, stream, error, error_len);
    });
    if (status != kOk) return status == kNoInstance ? no_instance(width, error, error_len) : status;
  }
  if (!want_dweight) return kOk;
  DweightParams d{};
  d.partials = live ? static_cast<const float*>(a.workspace) : nullptr;
  d.dweight = a.dweight;
  d.chunks = live ? partition.ctas : 0;
  d.cols = width;
  d.cols_padded = padded;
  d.out_dtype = a.dweight_dtype;
  return launch_dweight(d, stream, error, error_len);
}

inline int query_workspace_bytes(const WorkspaceArgs& a, void*, char* error, int32_t error_len) {
  Checker check(error, error_len, "workspace_bytes");
  if (!check.shape(a.rows, a.cols) || !check.pointer(a.out, "out", true, 8)) return check.status();
  const int width = static_cast<int>(a.cols);
  *static_cast<int64_t*>(a.out) = workspace_bytes(partition_at(a.rows, width).ctas, width);
  return kOk;
}

}  // namespace program
}  // namespace rmsnorm
}  // namespace cake
