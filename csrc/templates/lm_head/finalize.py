# Kernel `finalize` of an LM head program (cake/triton/lm_head.py: lm_head_finalize): combines
# the forward's splits into the row statistics and the per-token loss or log-prob (and entropy).
import triton
import triton.language as tl

# cake:params
ROWS_BLOCK = tl.constexpr(512)
ROWS_WARPS = 4
# cake:end-params

NUM_WARPS = ROWS_WARPS
NUM_STAGES = 1
lm = cake_include("cake/triton/lm_head.py")

SIGNATURE = {"part_m": "*fp32", "part_l": "*fp32", "part_a": "*fp32", "part_y": "*fp32",
             "labels": "*i64", "rmax": "*fp32", "logl": "*fp32", "out": "*fp32", "ent": "*fp32",
             "T": "i32", "V": "i32", "num_splits": "i32", "ignore_index": "i64", "logprob": "i32",
             "entropy": "i32"}
# Every pointer is a buffer the host allocates (16-byte aligned) but labels (any 8-byte view).
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*") and name != "labels"}


@triton.jit
def kernel_cake_library_finalize(part_m, part_l, part_a, part_y, labels, rmax, logl, out, ent, T,
                                 V, num_splits, ignore_index, logprob, entropy):
    lm.lm_head_finalize(part_m, part_l, part_a, part_y, labels, rmax, logl, out, ent, T, V,
                        num_splits, ignore_index, logprob, entropy, ROWS_BLOCK)
