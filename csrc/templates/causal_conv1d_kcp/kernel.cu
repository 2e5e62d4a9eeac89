// Kernels of the context-parallel causal conv1d program: its knob, then the row moves
// (cake/causal_conv1d/kcp.cuh) under this library's names.
// cake:params
#define CAKE_KCP_THREADS 256
// cake:end-params
#include "cake/causal_conv1d/kcp.cuh"

// (name, 16-byte pieces)
CAKE_KCP_GATHER_KERNEL(kernel_cake_library_gather_v, true)
CAKE_KCP_GATHER_KERNEL(kernel_cake_library_gather_s, false)
CAKE_KCP_SCATTER_KERNEL(kernel_cake_library_scatter_v, true)
CAKE_KCP_SCATTER_KERNEL(kernel_cake_library_scatter_s, false)
