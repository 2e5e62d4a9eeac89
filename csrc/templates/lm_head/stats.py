# Kernel `stats` of an LM head program (cake/triton/lm_head.py: lm_head_stats): the forward's
# row statistics per (token block, vocabulary split).
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
STATS_BT = tl.constexpr(128)
STATS_BV = tl.constexpr(128)
STATS_BK = tl.constexpr(64)
STATS_WARPS = 8
STATS_STAGES = 3
# cake:end-params

NUM_WARPS = STATS_WARPS
NUM_STAGES = STATS_STAGES
lm = cake_include("cake/triton/lm_head.py")

SIGNATURE = {"h": "*" + DTYPE, "w": "*" + DTYPE, "labels": "*i64", "part_m": "*fp32",
             "part_l": "*fp32", "part_a": "*fp32", "part_y": "*fp32", "T": "i32", "V": "i32",
             "D": "i32", "num_splits": "i32", "tiles_per_split": "i32", "inv_softcap": "fp32",
             "tanh_scale": "fp32", "linear_scale": "fp32", "inv_temp": "fp32", "entropy": "i32"}
# Pointers 16-byte aligned (the host checks hidden and weight, allocates the rest) but labels
# (labels[1:] is a valid view, read one value a row); D a multiple of 8 (checked).
HINTS = {**{name: 16 for name, kind in SIGNATURE.items()
            if kind.startswith("*") and name != "labels"}, "D": 8}


@triton.jit
def kernel_cake_library_stats(h, w, labels, part_m, part_l, part_a, part_y, T, V, D, num_splits,
                              tiles_per_split, inv_softcap, tanh_scale, linear_scale, inv_temp,
                              entropy):
    lm.lm_head_stats(h, w, labels, part_m, part_l, part_a, part_y, T, V, D, num_splits,
                     tiles_per_split, inv_softcap, tanh_scale, linear_scale, inv_temp, entropy,
                     STATS_BT, STATS_BV, STATS_BK)
