# Kernel `dqkwg` of a Gated DeltaNet program (cake/triton/gdn.py: gdn_bwd_dqkwg):
# backward: dq^, dk^ (output and state parts), dW and the dg partials, per chunk and K block.
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
K = tl.constexpr(128)
V = tl.constexpr(128)
DOT_PREC = tl.constexpr("tf32")
DETERMINISTIC = tl.constexpr(True)
DQKWG_BK = tl.constexpr(64)
DQKWG_BV = tl.constexpr(32)
DQKWG_WARPS = 8
DQKWG_STAGES = 2
# cake:end-params

NUM_WARPS = DQKWG_WARPS
NUM_STAGES = DQKWG_STAGES
BT = tl.constexpr(64)  # tokens per chunk
gdn = cake_include("cake/triton/gdn.py")

SIGNATURE = {"q": "*" + DTYPE, "k": "*" + DTYPE, "vn": "*fp32", "gc": "*fp32",
             "dout": "*" + DTYPE, "dvn": "*fp32", "hs": "*fp32", "dhs": "*fp32", "rq": "*fp32",
             "rk": "*fp32", "cu": "*i32", "chunk_doc": "*i32", "chunk_idx": "*i32", "dq": "*fp32",
             "dk": "*fp32", "dw": "*fp32", "dgp": "*fp32", "scale": "fp32", "T": "i32",
             "H": "i32", "HV": "i32", "l2norm": "i32"}
# Every pointer is 16-byte aligned (the host checks or allocates so); no integer is.
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*")}


@triton.jit
def kernel_cake_library_dqkwg(q, k, vn, gc, dout, dvn, hs, dhs, rq, rk, cu, chunk_doc, chunk_idx,
                              dq, dk, dw, dgp, scale, T, H, HV, l2norm):
    gdn.gdn_bwd_dqkwg(q, k, vn, gc, dout, dvn, hs, dhs, rq, rk, cu, chunk_doc, chunk_idx, dq, dk,
                      dw, dgp, scale, T, H, HV, l2norm, K, V, BT, DQKWG_BK, DQKWG_BV,
                      DETERMINISTIC, DOT_PREC)
