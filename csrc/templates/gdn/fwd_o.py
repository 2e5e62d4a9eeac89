# Kernel `fwd_o` of a Gated DeltaNet program (cake/triton/gdn.py: gdn_fwd_o):
# the output o per chunk and V block.
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
K = tl.constexpr(128)
V = tl.constexpr(128)
DOT_PREC = tl.constexpr("tf32")
FWD_O_BK = tl.constexpr(64)
FWD_O_BV = tl.constexpr(128)
FWD_O_WARPS = 8
FWD_O_STAGES = 2
# cake:end-params

NUM_WARPS = FWD_O_WARPS
NUM_STAGES = FWD_O_STAGES
BT = tl.constexpr(64)  # tokens per chunk
gdn = cake_include("cake/triton/gdn.py")

SIGNATURE = {"q": "*" + DTYPE, "k": "*" + DTYPE, "vn": "*fp32", "gc": "*fp32", "hs": "*fp32",
             "rq": "*fp32", "rk": "*fp32", "cu": "*i32", "chunk_doc": "*i32", "chunk_idx": "*i32",
             "o": "*" + DTYPE, "scale": "fp32", "H": "i32", "HV": "i32", "l2norm": "i32"}
# Every pointer is 16-byte aligned (the host checks or allocates so); no integer is.
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*")}


@triton.jit
def kernel_cake_library_fwd_o(q, k, vn, gc, hs, rq, rk, cu, chunk_doc, chunk_idx, o, scale, H, HV,
                              l2norm):
    gdn.gdn_fwd_o(q, k, vn, gc, hs, rq, rk, cu, chunk_doc, chunk_idx, o, scale, H, HV, l2norm, K,
                  V, BT, FWD_O_BK, FWD_O_BV, DOT_PREC)
