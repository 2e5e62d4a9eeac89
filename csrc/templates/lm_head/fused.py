# Kernel `fused` of a nondet LM head program (cake/triton/lm_head.py: lm_head_fused): dhidden and
# dweight of one (token block, vocabulary tile), added with fp32 atomics.
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
FUSED_BT = tl.constexpr(128)
FUSED_BV = tl.constexpr(128)
FUSED_BK = tl.constexpr(32)
FUSED_BD = tl.constexpr(16)
FUSED_GROUP = tl.constexpr(8)
FUSED_WARPS = 8
FUSED_STAGES = 3
# cake:end-params

NUM_WARPS = FUSED_WARPS
NUM_STAGES = FUSED_STAGES
lm = cake_include("cake/triton/lm_head.py")

SIGNATURE = {"h": "*" + DTYPE, "w": "*" + DTYPE, "labels": "*i64", "rmax": "*fp32",
             "logl": "*fp32", "ca": "*fp32", "cb": "*fp32", "cg": "*fp32", "dh_acc": "*fp32",
             "dw_acc": "*fp32", "T": "i32", "V": "i32", "D": "i32", "inv_softcap": "fp32",
             "tanh_scale": "fp32", "linear_scale": "fp32", "inv_temp": "fp32"}
# Pointers 16-byte aligned but labels (the host checks dweight_accumulator too); D a multiple
# of 8.
HINTS = {**{name: 16 for name, kind in SIGNATURE.items()
            if kind.startswith("*") and name != "labels"}, "D": 8}


@triton.jit
def kernel_cake_library_fused(h, w, labels, rmax, logl, ca, cb, cg, dh_acc, dw_acc, T, V, D,
                              inv_softcap, tanh_scale, linear_scale, inv_temp):
    lm.lm_head_fused(h, w, labels, rmax, logl, ca, cb, cg, dh_acc, dw_acc, T, V, D, inv_softcap,
                     tanh_scale, linear_scale, inv_temp, FUSED_BT, FUSED_BV, FUSED_BK, FUSED_BD,
                     FUSED_GROUP)
