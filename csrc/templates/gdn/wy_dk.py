# Kernel `wy_dk` of a Gated DeltaNet program (cake/triton/gdn.py: gdn_bwd_wy_dk):
# backward through the WY/UT transform, part 2: the rest of dk, dbeta, dg.
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
K = tl.constexpr(128)
DOT_PREC = tl.constexpr("tf32")
DETERMINISTIC = tl.constexpr(True)
WY_DK_BK = tl.constexpr(64)
DQKWG_BK = tl.constexpr(64)
WY_DK_WARPS = 8
WY_DK_STAGES = 1
# cake:end-params

NUM_WARPS = WY_DK_WARPS
NUM_STAGES = WY_DK_STAGES
BT = tl.constexpr(64)  # tokens per chunk
NKB = tl.constexpr(K.value // DQKWG_BK.value)  # dg partials: one per K block of dqkwg
gdn = cake_include("cake/triton/gdn.py")

SIGNATURE = {"k": "*" + DTYPE, "beta": "*fp32", "gc": "*fp32", "tm": "*fp32", "dw": "*fp32",
             "de": "*fp32", "dbp": "*fp32", "rk": "*fp32", "dgp": "*fp32", "cu": "*i32",
             "chunk_doc": "*i32", "chunk_idx": "*i32", "dk": "*fp32", "dbeta": "*fp32",
             "dg": "*fp32", "T": "i32", "H": "i32", "HV": "i32", "l2norm": "i32"}
# Every pointer is 16-byte aligned (the host checks or allocates so); no integer is.
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*")}


@triton.jit
def kernel_cake_library_wy_dk(k, beta, gc, tm, dw, de, dbp, rk, dgp, cu, chunk_doc, chunk_idx, dk,
                              dbeta, dg, T, H, HV, l2norm):
    gdn.gdn_bwd_wy_dk(k, beta, gc, tm, dw, de, dbp, rk, dgp, cu, chunk_doc, chunk_idx, dk, dbeta,
                      dg, T, H, HV, l2norm, K, BT, WY_DK_BK, NKB, DETERMINISTIC, DOT_PREC)
