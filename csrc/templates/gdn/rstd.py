# Kernel `rstd` of a Gated DeltaNet program (cake/triton/gdn.py: gdn_l2norm_rstd):
# rq, rk = 1/sqrt(|x|^2 + 1e-6) per row of q and k (launched only with qk_l2norm).
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
K = tl.constexpr(128)
RSTD_BR = tl.constexpr(32)
RSTD_WARPS = 4
RSTD_STAGES = 1
# cake:end-params

NUM_WARPS = RSTD_WARPS
NUM_STAGES = RSTD_STAGES
gdn = cake_include("cake/triton/gdn.py")

SIGNATURE = {"q": "*" + DTYPE, "k": "*" + DTYPE, "rq": "*fp32", "rk": "*fp32", "R": "i32"}
# Every pointer is 16-byte aligned (the host checks or allocates so); no integer is.
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*")}


@triton.jit
def kernel_cake_library_rstd(q, k, rq, rk, R):
    gdn.gdn_l2norm_rstd(q, k, rq, rk, R, K, RSTD_BR)
