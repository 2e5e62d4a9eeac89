# Kernel `cast` of an LM head program (cake/triton/lm_head.py: lm_head_cast): sums fp32 parts in
# order into a gradient of the program's dtype.
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
CAST_BLOCK = tl.constexpr(2048)
CAST_WARPS = 4
# cake:end-params

NUM_WARPS = CAST_WARPS
NUM_STAGES = 1
lm = cake_include("cake/triton/lm_head.py")

SIGNATURE = {"src": "*fp32", "dst": "*" + DTYPE, "N": "i64", "num_parts": "i32"}
# Both buffers are the host's (16-byte aligned).
HINTS = {"src": 16, "dst": 16}


@triton.jit
def kernel_cake_library_cast(src, dst, N, num_parts):
    lm.lm_head_cast(src, dst, N, num_parts, CAST_BLOCK)
