# Kernel `fwd_h` of a Gated DeltaNet program (cake/triton/gdn.py: gdn_fwd_h):
# the state recurrence over a document's chunks: per-chunk states, new values vn, final state.
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
K = tl.constexpr(128)
V = tl.constexpr(128)
DOT_PREC = tl.constexpr("tf32")
FWD_H_BV = tl.constexpr(64)
FWD_H_WARPS = 8
FWD_H_STAGES = 2
# cake:end-params

NUM_WARPS = FWD_H_WARPS
NUM_STAGES = FWD_H_STAGES
BT = tl.constexpr(64)  # tokens per chunk
gdn = cake_include("cake/triton/gdn.py")

SIGNATURE = {"k": "*" + DTYPE, "w": "*fp32", "u": "*fp32", "gc": "*fp32", "rk": "*fp32",
             "h0": "*fp32", "cu": "*i32", "chunk_off": "*i32", "hs": "*fp32", "vn": "*fp32",
             "ht": "*fp32", "H": "i32", "HV": "i32", "l2norm": "i32", "use_h0": "i32",
             "store_ht": "i32"}
# Every pointer is 16-byte aligned (the host checks or allocates so); no integer is.
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*")}


@triton.jit
def kernel_cake_library_fwd_h(k, w, u, gc, rk, h0, cu, chunk_off, hs, vn, ht, H, HV, l2norm,
                              use_h0, store_ht):
    gdn.gdn_fwd_h(k, w, u, gc, rk, h0, cu, chunk_off, hs, vn, ht, H, HV, l2norm, use_h0, store_ht,
                  K, V, BT, FWD_H_BV, DOT_PREC)
