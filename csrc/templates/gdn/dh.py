# Kernel `dh` of a Gated DeltaNet program (cake/triton/gdn.py: gdn_bwd_dh):
# backward: the reverse recurrence (per-chunk state gradients, d(vn), d initial state).
import triton
import triton.language as tl

# cake:params
DTYPE = "bf16"
K = tl.constexpr(128)
V = tl.constexpr(128)
DOT_PREC = tl.constexpr("tf32")
DH_BV = tl.constexpr(32)
DH_WARPS = 8
DH_STAGES = 2
# cake:end-params

NUM_WARPS = DH_WARPS
NUM_STAGES = DH_STAGES
BT = tl.constexpr(64)  # tokens per chunk
gdn = cake_include("cake/triton/gdn.py")

SIGNATURE = {"q": "*" + DTYPE, "k": "*" + DTYPE, "w": "*fp32", "gc": "*fp32", "dout": "*" + DTYPE,
             "dvn": "*fp32", "rq": "*fp32", "rk": "*fp32", "dht": "*fp32", "cu": "*i32",
             "chunk_off": "*i32", "dhs": "*fp32", "dh0": "*fp32", "scale": "fp32", "H": "i32",
             "HV": "i32", "l2norm": "i32", "use_dht": "i32", "store_dh0": "i32"}
# Every pointer is 16-byte aligned (the host checks or allocates so); no integer is.
HINTS = {name: 16 for name, kind in SIGNATURE.items() if kind.startswith("*")}


@triton.jit
def kernel_cake_library_dh(q, k, w, gc, dout, dvn, rq, rk, dht, cu, chunk_off, dhs, dh0, scale, H,
                           HV, l2norm, use_dht, store_dh0):
    gdn.gdn_bwd_dh(q, k, w, gc, dout, dvn, rq, rk, dht, cu, chunk_off, dhs, dh0, scale, H, HV,
                   l2norm, use_dht, store_dh0, K, V, BT, DH_BV, DOT_PREC)
