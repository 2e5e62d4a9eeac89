# Kernel `finalize` of a Gated DeltaNet program (cake/triton/gdn.py: gdn_bwd_qk_finalize):
# backward: dq/dk summed over the group's value heads in order, the l2-norm backward, cast.
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
K = tl.constexpr(128)
FINALIZE_BT = tl.constexpr(32)
FINALIZE_WARPS = 4
FINALIZE_STAGES = 1
# cake:end-params

NUM_WARPS = FINALIZE_WARPS
NUM_STAGES = FINALIZE_STAGES
gdn = cake_include("cake/triton/gdn.py")

SIGNATURE = {"q": "*" + DTYPE, "k": "*" + DTYPE, "dqp": "*fp32", "dkp": "*fp32", "rq": "*fp32",
             "rk": "*fp32", "dq": "*" + DTYPE, "dk": "*" + DTYPE, "T": "i32", "H": "i32",
             "NG": "i32", "l2norm": "i32"}
# Every pointer is 16-byte aligned (the host checks or allocates so); no integer is.
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*")}


@triton.jit
def kernel_cake_library_finalize(q, k, dqp, dkp, rq, rk, dq, dk, T, H, NG, l2norm):
    gdn.gdn_bwd_qk_finalize(q, k, dqp, dkp, rq, rk, dq, dk, T, H, NG, l2norm, K, FINALIZE_BT)
