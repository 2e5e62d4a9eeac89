# Kernel `prep` of a Gated DeltaNet program (cake/triton/gdn.py: gdn_prep):
# per chunk: gc (local cumsum of g), Tm = (I + A)^-1, W and U (the WY/UT transform).
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
K = tl.constexpr(128)
V = tl.constexpr(128)
DOT_PREC = tl.constexpr("tf32")
PREP_BK = tl.constexpr(64)
PREP_BV = tl.constexpr(64)
PREP_WARPS = 8
PREP_STAGES = 1
# cake:end-params

NUM_WARPS = PREP_WARPS
NUM_STAGES = PREP_STAGES
BT = tl.constexpr(64)  # tokens per chunk
gdn = cake_include("cake/triton/gdn.py")

SIGNATURE = {"k": "*" + DTYPE, "v": "*" + DTYPE, "g": "*fp32", "beta": "*fp32", "rk": "*fp32",
             "cu": "*i32", "chunk_doc": "*i32", "chunk_idx": "*i32", "gc": "*fp32", "tm": "*fp32",
             "w": "*fp32", "u": "*fp32", "H": "i32", "HV": "i32", "l2norm": "i32"}
# Every pointer is 16-byte aligned (the host checks or allocates so); no integer is.
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*")}


@triton.jit
def kernel_cake_library_prep(k, v, g, beta, rk, cu, chunk_doc, chunk_idx, gc, tm, w, u, H, HV,
                             l2norm):
    gdn.gdn_prep(k, v, g, beta, rk, cu, chunk_doc, chunk_idx, gc, tm, w, u, H, HV, l2norm, K, V,
                 BT, PREP_BK, PREP_BV, DOT_PREC)
