# Kernel `wy_da` of a Gated DeltaNet program (cake/triton/gdn.py: gdn_bwd_wy_da):
# backward through the WY/UT transform, part 1: E, dv, partial dbeta.
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
K = tl.constexpr(128)
V = tl.constexpr(128)
DOT_PREC = tl.constexpr("tf32")
WY_DA_BK = tl.constexpr(64)
WY_DA_BV = tl.constexpr(64)
WY_DA_WARPS = 8
WY_DA_STAGES = 1
# cake:end-params

NUM_WARPS = WY_DA_WARPS
NUM_STAGES = WY_DA_STAGES
BT = tl.constexpr(64)  # tokens per chunk
gdn = cake_include("cake/triton/gdn.py")

SIGNATURE = {"k": "*" + DTYPE, "v": "*" + DTYPE, "beta": "*fp32", "gc": "*fp32", "tm": "*fp32",
             "dw": "*fp32", "dvn": "*fp32", "rk": "*fp32", "cu": "*i32", "chunk_doc": "*i32",
             "chunk_idx": "*i32", "de": "*fp32", "dv": "*" + DTYPE, "dbp": "*fp32", "H": "i32",
             "HV": "i32", "l2norm": "i32"}
# Every pointer is 16-byte aligned (the host checks or allocates so); no integer is.
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*")}


@triton.jit
def kernel_cake_library_wy_da(k, v, beta, gc, tm, dw, dvn, rk, cu, chunk_doc, chunk_idx, de, dv,
                              dbp, H, HV, l2norm):
    gdn.gdn_bwd_wy_da(k, v, beta, gc, tm, dw, dvn, rk, cu, chunk_doc, chunk_idx, de, dv, dbp, H,
                      HV, l2norm, K, V, BT, WY_DA_BK, WY_DA_BV, DOT_PREC)
