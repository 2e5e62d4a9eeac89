// C entries of one Gated DeltaNet program: a launcher per kernel (cake/triton_launch.h), each
// taking grid_x, grid_y, grid_z and then the kernel's arguments (its SIGNATURE).
// cake:params
// cake:end-params
// cake:entries
// cake:end-entries
#include "cake/image.h"
#include "cake/triton_launch.h"

CAKE_EXPORT const char* cake_library_digest(void) { return CAKE_PROGRAM_DIGEST; }
CAKE_EXPORT int cake_library_abi_version(void) { return CAKE_ABI_VERSION; }

CAKE_TRITON_KERNEL(rstd, KERNEL_RSTD)
CAKE_EXPORT int cake_library_rstd(CAKE_ENTRY_PARAMS) { return cake_triton_rstd(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(prep, KERNEL_PREP)
CAKE_EXPORT int cake_library_prep(CAKE_ENTRY_PARAMS) { return cake_triton_prep(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(fwd_h, KERNEL_FWD_H)
CAKE_EXPORT int cake_library_fwd_h(CAKE_ENTRY_PARAMS) { return cake_triton_fwd_h(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(fwd_o, KERNEL_FWD_O)
CAKE_EXPORT int cake_library_fwd_o(CAKE_ENTRY_PARAMS) { return cake_triton_fwd_o(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(dv_local, KERNEL_DV_LOCAL)
CAKE_EXPORT int cake_library_dv_local(CAKE_ENTRY_PARAMS) { return cake_triton_dv_local(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(dh, KERNEL_DH)
CAKE_EXPORT int cake_library_dh(CAKE_ENTRY_PARAMS) { return cake_triton_dh(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(dqkwg, KERNEL_DQKWG)
CAKE_EXPORT int cake_library_dqkwg(CAKE_ENTRY_PARAMS) { return cake_triton_dqkwg(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(wy_da, KERNEL_WY_DA)
CAKE_EXPORT int cake_library_wy_da(CAKE_ENTRY_PARAMS) { return cake_triton_wy_da(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(wy_dk, KERNEL_WY_DK)
CAKE_EXPORT int cake_library_wy_dk(CAKE_ENTRY_PARAMS) { return cake_triton_wy_dk(CAKE_ENTRY_ARGS); }

CAKE_TRITON_KERNEL(finalize, KERNEL_FINALIZE)
CAKE_EXPORT int cake_library_finalize(CAKE_ENTRY_PARAMS) { return cake_triton_finalize(CAKE_ENTRY_ARGS); }
