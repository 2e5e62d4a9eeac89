// Kernels of one causal conv1d program: its knobs, then the family's kernels
// (cake/causal_conv1d/kernels.cuh) under this library's names.
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
#include "cake/causal_conv1d/kernels.cuh"

// (name, fp32 weight, vector access)
CAKE_CONV1D_FORWARD_KERNEL(kernel_cake_library_forward_av, false, true)
CAKE_CONV1D_FORWARD_KERNEL(kernel_cake_library_forward_as, false, false)
CAKE_CONV1D_FORWARD_KERNEL(kernel_cake_library_forward_fv, true, true)
CAKE_CONV1D_FORWARD_KERNEL(kernel_cake_library_forward_fs, true, false)
CAKE_CONV1D_BACKWARD_KERNEL(kernel_cake_library_backward_av, false, true)
CAKE_CONV1D_BACKWARD_KERNEL(kernel_cake_library_backward_as, false, false)
CAKE_CONV1D_BACKWARD_KERNEL(kernel_cake_library_backward_fv, true, true)
CAKE_CONV1D_BACKWARD_KERNEL(kernel_cake_library_backward_fs, true, false)
// (name, fp32 output): dweight/dbias in the activation dtype or fp32.
CAKE_CONV1D_REDUCE_KERNEL(kernel_cake_library_reduce_a, false)
CAKE_CONV1D_REDUCE_KERNEL(kernel_cake_library_reduce_f, true)
