// C entries of one nondet LM head program: a launcher per kernel (cake/triton_launch.h),
// each taking grid_x, grid_y, grid_z and then the kernel's arguments (its SIGNATURE). In
// these programs the backward's one heavy kernel (fused) adds dhidden and dweight with fp32 atomics.
// cake:params
// cake:end-params
// cake:entries
// cake:end-entries
#include "cake/image.h"
#include "cake/triton_launch.h"

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }
CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_TRITON_KERNEL(stats, KERNEL_STATS)
CAKE_EXPORT int cake_library_stats(CAKE_ENTRY_PARAMS) { return cake_triton_stats(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(finalize, KERNEL_FINALIZE)
CAKE_EXPORT int cake_library_finalize(CAKE_ENTRY_PARAMS) { return cake_triton_finalize(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(reduce, KERNEL_REDUCE)
CAKE_EXPORT int cake_library_reduce(CAKE_ENTRY_PARAMS) { return cake_triton_reduce(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(coef, KERNEL_COEF)
CAKE_EXPORT int cake_library_coef(CAKE_ENTRY_PARAMS) { return cake_triton_coef(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(fused, KERNEL_FUSED)
CAKE_EXPORT int cake_library_fused(CAKE_ENTRY_PARAMS) { return cake_triton_fused(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(cast, KERNEL_CAST)
CAKE_EXPORT int cake_library_cast(CAKE_ENTRY_PARAMS) { return cake_triton_cast(CAKE_ENTRY_ARGS); }
