# Kernel `dh` of a det LM head program (cake/triton/lm_head.py: lm_head_dh): dhidden, each
# (token block, vocabulary split) accumulated in a fixed order, no atomics.
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
DH_BT = tl.constexpr(64)
DH_BV = tl.constexpr(128)
DH_BK = tl.constexpr(64)
DH_BD = tl.constexpr(16)
DH_WARPS = 8
DH_STAGES = 3
# cake:end-params

NUM_WARPS = DH_WARPS
NUM_STAGES = DH_STAGES
lm = cake_include("cake/triton/lm_head.py")

SIGNATURE = {"h": "*" + DTYPE, "w": "*" + DTYPE, "labels": "*i64", "rmax": "*fp32",
             "logl": "*fp32", "ca": "*fp32", "cb": "*fp32", "cg": "*fp32", "acc": "*fp32",
             "out": "*" + DTYPE, "T": "i32", "V": "i32", "D": "i32", "num_splits": "i32",
             "tiles_per_split": "i32", "inv_softcap": "fp32", "tanh_scale": "fp32",
             "linear_scale": "fp32", "inv_temp": "fp32", "final_cast": "i32"}
# Pointers 16-byte aligned but labels (see stats.py); D a multiple of 8.
HINTS = {**{name: 16 for name, kind in SIGNATURE.items()
            if kind.startswith("*") and name != "labels"}, "D": 8}


@triton.jit
def kernel_cake_library_dh(h, w, labels, rmax, logl, ca, cb, cg, acc, out, T, V, D, num_splits,
                           tiles_per_split, inv_softcap, tanh_scale, linear_scale, inv_temp,
                           final_cast):
    lm.lm_head_dh(h, w, labels, rmax, logl, ca, cb, cg, acc, out, T, V, D, num_splits,
                  tiles_per_split, inv_softcap, tanh_scale, linear_scale, inv_temp, final_cast,
                  DH_BT, DH_BV, DH_BK, DH_BD)
