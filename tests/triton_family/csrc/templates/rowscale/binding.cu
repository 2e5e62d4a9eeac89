// C entries of one row-scale program: a launcher per kernel (cake/triton_launch.h).
// cake:params
// cake:end-params
// cake:entries
// cake:end-entries
#include "cake/image.h"
#include "cake/triton_launch.h"

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }
CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_TRITON_KERNEL(scale, KERNEL_SCALE)
CAKE_EXPORT int cake_library_scale(CAKE_ENTRY_PARAMS) { return cake_triton_scale(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(dot, KERNEL_DOT)
CAKE_EXPORT int cake_library_dot(CAKE_ENTRY_PARAMS) { return cake_triton_dot(CAKE_ENTRY_ARGS); }
