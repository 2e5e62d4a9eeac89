// Kernels of one RMSNorm program (both families: CAKE_GATED 0 or 1): its knobs
// (cake/rmsnorm/config.h), then the family's kernels (cake/rmsnorm/kernels.cuh) under this
// library's names.
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
#include "cake/rmsnorm/config.h"
#include "cake/rmsnorm/kernels.cuh"

CAKE_RMSNORM_FORWARD_KERNEL(kernel_cake_library_forward)
CAKE_RMSNORM_BACKWARD_KERNEL(kernel_cake_library_backward)
CAKE_RMSNORM_DWEIGHT_KERNEL(kernel_cake_library_dweight)
