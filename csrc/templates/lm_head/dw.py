# Kernel `dw` of a det LM head program (cake/triton/lm_head.py: lm_head_dw): dweight, each
# vocabulary tile accumulated over the token blocks in order, no atomics.
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
DW_BV = tl.constexpr(64)
DW_BT = tl.constexpr(256)
DW_BK = tl.constexpr(32)
DW_BD = tl.constexpr(16)
DW_WARPS = 8
DW_STAGES = 3
# cake:end-params

NUM_WARPS = DW_WARPS
NUM_STAGES = DW_STAGES
lm = cake_include("cake/triton/lm_head.py")

SIGNATURE = {"h": "*" + DTYPE, "w": "*" + DTYPE, "labels": "*i64", "rmax": "*fp32",
             "logl": "*fp32", "ca": "*fp32", "cb": "*fp32", "cg": "*fp32", "acc": "*fp32",
             "out": "*" + DTYPE, "T": "i32", "V": "i32", "D": "i32", "inv_softcap": "fp32",
             "tanh_scale": "fp32", "linear_scale": "fp32", "inv_temp": "fp32",
             "accumulate": "i32"}
# Pointers 16-byte aligned but labels (the host checks dweight_accumulator too); D a multiple
# of 8.
HINTS = {**{name: 16 for name, kind in SIGNATURE.items()
            if kind.startswith("*") and name != "labels"}, "D": 8}


@triton.jit
def kernel_cake_library_dw(h, w, labels, rmax, logl, ca, cb, cg, acc, out, T, V, D, inv_softcap,
                           tanh_scale, linear_scale, inv_temp, accumulate):
    lm.lm_head_dw(h, w, labels, rmax, logl, ca, cb, cg, acc, out, T, V, D, inv_softcap,
                  tanh_scale, linear_scale, inv_temp, accumulate, DW_BV, DW_BT, DW_BK, DW_BD)
