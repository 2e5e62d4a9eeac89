# Kernel `reduce` of an LM head program (cake/triton/lm_head.py: lm_head_reduce): the loss's sum
# or mean over the tokens in a fixed order, and the count of non-ignored tokens.
import triton
import triton.language as tl

# cake:params
REDUCE_BLOCK = tl.constexpr(1024)
REDUCE_WARPS = 4
# cake:end-params

NUM_WARPS = REDUCE_WARPS
NUM_STAGES = 1
lm = cake_include("cake/triton/lm_head.py")

SIGNATURE = {"loss": "*fp32", "labels": "*i64", "out": "*fp32", "count": "*fp32", "T": "i32",
             "ignore_index": "i64", "mean": "i32"}
# Every pointer is a buffer the host allocates (16-byte aligned) but labels (any 8-byte view).
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*") and name != "labels"}


@triton.jit
def kernel_cake_library_reduce(loss, labels, out, count, T, ignore_index, mean):
    lm.lm_head_reduce(loss, labels, out, count, T, ignore_index, mean, REDUCE_BLOCK)
