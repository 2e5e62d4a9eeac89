# Kernel `dv_local` of a Gated DeltaNet program (cake/triton/gdn.py: gdn_bwd_dv_local):
# backward: the intra-chunk part of d(vn).
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
K = tl.constexpr(128)
V = tl.constexpr(128)
DOT_PREC = tl.constexpr("tf32")
DV_LOCAL_BK = tl.constexpr(64)
DV_LOCAL_BV = tl.constexpr(128)
DV_LOCAL_WARPS = 8
DV_LOCAL_STAGES = 2
# cake:end-params

NUM_WARPS = DV_LOCAL_WARPS
NUM_STAGES = DV_LOCAL_STAGES
BT = tl.constexpr(64)  # tokens per chunk
gdn = cake_include("cake/triton/gdn.py")

SIGNATURE = {"q": "*" + DTYPE, "k": "*" + DTYPE, "gc": "*fp32", "dout": "*" + DTYPE,
             "rq": "*fp32", "rk": "*fp32", "cu": "*i32", "chunk_doc": "*i32", "chunk_idx": "*i32",
             "dvn": "*fp32", "scale": "fp32", "H": "i32", "HV": "i32", "l2norm": "i32"}
# Every pointer is 16-byte aligned (the host checks or allocates so); no integer is.
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*")}


@triton.jit
def kernel_cake_library_dv_local(q, k, gc, dout, rq, rk, cu, chunk_doc, chunk_idx, dvn, scale, H,
                                 HV, l2norm):
    gdn.gdn_bwd_dv_local(q, k, gc, dout, rq, rk, cu, chunk_doc, chunk_idx, dvn, scale, H, HV,
                         l2norm, K, V, BT, DV_LOCAL_BK, DV_LOCAL_BV, DOT_PREC)
