// Shared C entry logic of the RMSNorm families: unpacks and re-validates the int64 argument
// arrays, then calls the program's launchers (defined in its kernel source, which also fixes
// the launch shapes and the backward's row partition).
//
// forward args (kForwardArgs):
//   0 x, 1 residual|0, 2 gate|0, 3 weight, 4 y, 5 residual_out|0, 6 rstd|0,
//   7 rows, 8 cols, 9 weight_fp32, 10 eps (float bits), 11 weight_offset (float bits)
// backward args (kBackwardArgs):
//   0 s, 1 gate|0, 2 weight, 3 dy, 4 rstd, 5 dsum|0, 6 dx, 7 dresidual|0, 8 dgate|0,
//   9 workspace|0, 10 workspace_bytes, 11 dweight|0, 12 rows, 13 cols,
//   14 weight_fp32, 15 dweight dtype (0 bf16, 1 fp16, 2 fp32), 16 weight_offset (float bits)
// workspace_bytes args (kWorkspaceArgs): 0 rows, 1 cols, 2 host pointer to an int64 that
//   receives the backward's workspace size in bytes (no launch; the stream is unused).
// Pointers are device addresses (0 for none) except workspace_bytes' output.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cake/program.h"
#include "cake/rmsnorm_common.cuh"

namespace cake {
namespace rmsnorm {

constexpr int kForwardArgs = 12;
constexpr int kBackwardArgs = 17;
constexpr int kWorkspaceArgs = 3;

// What a program's kernel source provides to its entries.
struct Launchers {
  cudaError_t (*forward)(const ForwardParams&, cudaStream_t);
  cudaError_t (*backward)(const BackwardParams&, int64_t ctas, cudaStream_t);
  cudaError_t (*dweight)(const DweightParams&, cudaStream_t);
  BackwardPartition (*backward_partition)(int64_t rows, int cols);  // its band of rows, its CTAs
};

// What one program was compiled for.
struct ProgramShape {
  int elem_bytes;  // sizeof(T)
  int vec;         // elements per load (16 / elem_bytes on the vector route, 1 on the scalar route)
  bool gated;
  int cols_min, cols_max;  // its route's band of D: the kernels exist for these widths only
};

inline float float_from_bits(int64_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits);
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

// A launcher's status as an entry status.
inline int launched(cudaError_t status, char* error, int32_t error_len, const char* what) {
  if (status == cudaSuccess) return kOk;
  return fail(error, error_len, kCudaError, "%s: %s", what, cudaGetErrorString(status));
}

class Checker {
 public:
  Checker(char* error, int32_t error_len, const char* entry) : error_(error), len_(error_len), entry_(entry) {}

  // Null is allowed only when `required` is false; otherwise the pointer must be aligned.
  bool pointer(const Args& args, int index, const char* name, bool required, int alignment) {
    const int64_t value = args.i64(index);
    if (value == 0) {
      if (!required) return true;
      status_ = fail(error_, len_, kInvalidArgument, "%s: %s is null", entry_, name);
      return false;
    }
    if (value % alignment != 0) {
      status_ = fail(error_, len_, kInvalidArgument, "%s: %s is not %d-byte aligned", entry_, name, alignment);
      return false;
    }
    return true;
  }

  bool require(bool ok, const char* what) {
    if (!ok) status_ = fail(error_, len_, kInvalidArgument, "%s: %s", entry_, what);
    return ok;
  }

  int status() const { return status_; }

 private:
  char* error_;
  int32_t len_;
  const char* entry_;
  int status_ = kOk;
};

inline bool check_shape(Checker& check, const ProgramShape& shape, int64_t rows, int64_t cols) {
  return check.require(rows >= 0, "rows must be >= 0") &&
         check.require(cols >= 1 && cols <= kMaxCols, "cols must be in [1, 16384]") &&
         check.require(cols % shape.vec == 0,
                       "cols is not a multiple of this program's vector width (wrong route)");
}

// The entries' own check of the route: a program compiles kernels for its band of D only, and its
// backward partition (so the workspace size) follows its own knobs, which differ between bands.
inline bool check_band(Checker& check, const ProgramShape& shape, int64_t cols) {
  return check.require(cols >= shape.cols_min && cols <= shape.cols_max,
                       "cols is outside this program's band of D (wrong route)");
}

inline int forward_entry(const ProgramShape& shape, const Launchers& launch, const int64_t* values,
                         int32_t nargs, void* stream, char* error, int32_t error_len) {
  Checker check(error, error_len, "forward");
  if (!check.require(values != nullptr && nargs == kForwardArgs, "expected 12 arguments")) return check.status();
  const Args args{values, nargs};
  const int64_t rows = args.i64(7), cols = args.i64(8);
  const int64_t weight_fp32 = args.i64(9);
  const float eps = float_from_bits(args.i64(10));
  const float weight_offset = float_from_bits(args.i64(11));
  const int align = shape.elem_bytes * shape.vec;
  const bool live = rows > 0;
  const bool has_residual = args.i64(1) != 0;
  if (!check_shape(check, shape, rows, cols) || !check_band(check, shape, cols) ||
      !check.require(weight_fp32 == 0 || weight_fp32 == 1, "weight_fp32 must be 0 or 1") ||
      !check.require(std::isfinite(eps) && eps > 0.0f, "eps must be finite and > 0") ||
      !check.require(std::isfinite(weight_offset), "weight_offset must be finite") ||
      !check.pointer(args, 0, "x", live, align) ||
      !check.pointer(args, 1, "residual", false, align) ||
      !check.pointer(args, 2, "gate", live && shape.gated, align) ||
      !check.require(shape.gated || args.i64(2) == 0, "gate given to a program without a gate") ||
      !check.pointer(args, 3, "weight", live, weight_fp32 ? 4 : shape.elem_bytes) ||
      !check.pointer(args, 4, "y", live, align) ||
      !check.pointer(args, 5, "residual_out", live && has_residual, align) ||
      !check.require(has_residual || args.i64(5) == 0, "residual_out given without residual") ||
      !check.pointer(args, 6, "rstd", false, 4)) {
    return check.status();
  }
  if (!live) return kOk;
  ForwardParams p{};
  p.x = args.ptr<const void>(0);
  p.residual = args.ptr<const void>(1);
  p.gate = args.ptr<const void>(2);
  p.weight = args.ptr<const void>(3);
  p.y = args.ptr<void>(4);
  p.residual_out = args.ptr<void>(5);
  p.rstd = args.ptr<float>(6);
  p.rows = rows;
  p.cols = static_cast<int32_t>(cols);
  p.weight_fp32 = static_cast<int32_t>(weight_fp32);
  p.eps = eps;
  p.weight_offset = weight_offset;
  p.inv_cols = 1.0f / static_cast<float>(cols);
  return launched(launch.forward(p, static_cast<cudaStream_t>(stream)), error, error_len, "forward launch");
}

inline int backward_entry(const ProgramShape& shape, const Launchers& launch, const int64_t* values,
                          int32_t nargs, void* stream, char* error, int32_t error_len) {
  Checker check(error, error_len, "backward");
  if (!check.require(values != nullptr && nargs == kBackwardArgs, "expected 17 arguments")) return check.status();
  const Args args{values, nargs};
  const int64_t rows = args.i64(12), cols = args.i64(13);
  const int64_t weight_fp32 = args.i64(14), dweight_dtype = args.i64(15);
  const float weight_offset = float_from_bits(args.i64(16));
  const int64_t workspace_size = args.i64(10);
  const int align = shape.elem_bytes * shape.vec;
  const bool live = rows > 0;
  const bool want_dweight = args.i64(11) != 0;
  if (!check_shape(check, shape, rows, cols) || !check_band(check, shape, cols)) return check.status();
  const int width = static_cast<int>(cols);  // in [1, kMaxCols] (check_shape)
  const BackwardPartition partition = launch.backward_partition(rows, width);
  const int64_t needed = want_dweight ? workspace_bytes(partition.ctas, width) : 0;
  const int dweight_bytes = dweight_dtype == kF32 ? 4 : 2;
  if (!check.require(weight_fp32 == 0 || weight_fp32 == 1, "weight_fp32 must be 0 or 1") ||
      !check.require(dweight_dtype >= kBF16 && dweight_dtype <= kF32, "dweight dtype code must be 0, 1 or 2") ||
      !check.require(std::isfinite(weight_offset), "weight_offset must be finite") ||
      !check.require(workspace_size >= needed, "workspace is smaller than backward_workspace_bytes") ||
      !check.pointer(args, 0, "s", live, align) ||
      !check.pointer(args, 1, "gate", live && shape.gated, align) ||
      !check.require(shape.gated || (args.i64(1) == 0 && args.i64(8) == 0),
                     "gate or dgate given to a program without a gate") ||
      !check.pointer(args, 2, "weight", live, weight_fp32 ? 4 : shape.elem_bytes) ||
      !check.pointer(args, 3, "dy", live, align) ||
      !check.pointer(args, 4, "rstd", live, 4) ||
      !check.pointer(args, 5, "dsum", false, align) ||
      !check.pointer(args, 6, "dx", live, align) ||
      !check.pointer(args, 7, "dresidual", false, align) ||
      !check.pointer(args, 8, "dgate", live && shape.gated, align) ||
      !check.pointer(args, 9, "workspace", needed > 0, 16) ||
      !check.pointer(args, 11, "dweight", false, dweight_bytes)) {
    return check.status();
  }
  const int padded = padded_cols(width);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (live) {
    BackwardParams p{};
    p.s = args.ptr<const void>(0);
    p.gate = args.ptr<const void>(1);
    p.weight = args.ptr<const void>(2);
    p.dy = args.ptr<const void>(3);
    p.rstd = args.ptr<const float>(4);
    p.dsum = args.ptr<const void>(5);
    p.dx = args.ptr<void>(6);
    p.dresidual = args.ptr<void>(7);
    p.dgate = args.ptr<void>(8);
    p.partials = want_dweight ? args.ptr<float>(9) : nullptr;
    p.rows = rows;
    p.rows_per_cta = partition.rows_per_cta;
    p.cols = static_cast<int32_t>(cols);
    p.cols_padded = padded;
    p.weight_fp32 = static_cast<int32_t>(weight_fp32);
    p.weight_offset = weight_offset;
    p.inv_cols = 1.0f / static_cast<float>(cols);
    const int status = launched(launch.backward(p, partition.ctas, s), error, error_len, "backward launch");
    if (status != kOk) return status;
  }
  if (!want_dweight) return kOk;
  DweightParams d{};
  d.partials = live ? args.ptr<const float>(9) : nullptr;
  d.dweight = args.ptr<void>(11);
  d.chunks = live ? partition.ctas : 0;
  d.cols = static_cast<int32_t>(cols);
  d.cols_padded = padded;
  d.out_dtype = static_cast<int32_t>(dweight_dtype);
  return launched(launch.dweight(d, s), error, error_len, "dweight launch");
}

inline int workspace_entry(const ProgramShape& shape, const Launchers& launch, const int64_t* values,
                           int32_t nargs, char* error, int32_t error_len) {
  Checker check(error, error_len, "workspace_bytes");
  if (!check.require(values != nullptr && nargs == kWorkspaceArgs, "expected 3 arguments")) return check.status();
  const Args args{values, nargs};
  const int64_t rows = args.i64(0), cols = args.i64(1);
  if (!check_shape(check, shape, rows, cols) || !check_band(check, shape, cols) ||
      !check.pointer(args, 2, "out", true, 8)) {
    return check.status();
  }
  const int width = static_cast<int>(cols);
  *args.ptr<int64_t>(2) = workspace_bytes(launch.backward_partition(rows, width).ctas, width);
  return kOk;
}

}  // namespace rmsnorm
}  // namespace cake
