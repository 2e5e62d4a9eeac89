// The row moves of context-parallel (KCP) causal conv1d: the row-code encoding, the constants a
// program's knob fixes and the launch parameters, shared by the kernels
// (cake/causal_conv1d/kcp.cuh, nvcc) and the entries (cake/causal_conv1d/kcp_entries.h, the host
// compiler). A program defines its knob CAKE_KCP_THREADS before it includes this.
//
// Rows are C elements of 2 bytes (bf16 or fp16: both move as their bits), row-major and dense.
//   gather:  out[i, :] = the row that table[i] (a row code, below) names, for i < rows;
//   scatter: out[table[i], :] = src[i, :] for i < rows, skipping table[i] < 0 or >= out_rows.
//
// A row code (int64) names a row of one of two sources, or a zero row:
//   code < 0                     a zero row (the plans write kZeroRow);
//   bits 0..39                   the row r of the source;
//   bit 40 (kExchangedBit)       the source: 0 = the local rows, 1 = the exchanged rows;
//   bit 41 (kNegateBit)          the row negated: bit 15 of every element flipped (exact
//                                negation for bf16 and fp16, zeros and NaNs included);
//   any other bit set            a zero row;
//   r >= the source's rows       a zero row (negated when bit 41 is set: -0).
// So any table content reads and writes only in bounds. The plans build the tables on the host
// (cake/cake_causal_conv1d_det_train_kcp/_tables.py spells the same constants; a test keeps them
// together).
#pragma once

#include <stdint.h>

namespace cake {
namespace causal_conv1d_kcp {

constexpr int64_t kZeroRow = -1;
constexpr int kRowBits = 40;
constexpr int64_t kRowMask = (int64_t{1} << kRowBits) - 1;
constexpr int64_t kExchangedBit = int64_t{1} << 40;
constexpr int64_t kNegateBit = int64_t{1} << 41;
constexpr int64_t kCodeBits = kRowMask | kExchangedBit | kNegateBit;
constexpr uint16_t kSignBit = 0x8000;

constexpr int kThreads = CAKE_KCP_THREADS;  // threads a block, one 16-byte piece or element each
static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block must be whole warps, at most 1024");
constexpr int kPieceElements = 8;  // elements of one 16-byte piece (the vector path's unit)

struct Params {
  const int64_t* table;       // gather: a row code per output row; scatter: a destination row
  const uint16_t* local;      // gather: the local rows; scatter: the rows to scatter
  const uint16_t* exchanged;  // gather: the exchanged rows (null for none); scatter: null
  uint16_t* out;
  int64_t rows;            // table entries
  int64_t local_rows;      // rows of `local`
  int64_t exchanged_rows;  // rows of `exchanged`
  int64_t out_rows;        // rows of `out`
  int64_t channels;        // C: elements a row
  int64_t units;           // a row's work items: 16-byte pieces (vector path) or elements
};

}  // namespace causal_conv1d_kcp
}  // namespace cake
