# Kernel `coef` of an LM head program (cake/triton/lm_head.py: lm_head_coef): the backward's
# per-token coefficients from the upstream gradients.
import triton
import triton.language as tl

# cake:params
ROWS_BLOCK = tl.constexpr(512)
ROWS_WARPS = 4
# cake:end-params

NUM_WARPS = ROWS_WARPS
NUM_STAGES = 1
lm = cake_include("cake/triton/lm_head.py")

SIGNATURE = {"labels": "*i64", "ent": "*fp32", "grad_out": "*fp32", "grad_ent": "*fp32",
             "count": "*fp32", "ca": "*fp32", "cb": "*fp32", "cg": "*fp32", "T": "i32",
             "V": "i32", "ignore_index": "i64", "logprob": "i32", "reduction": "i32",
             "has_grad_out": "i32", "has_grad_ent": "i32"}
# Buffers the host allocates are 16-byte aligned; labels and the upstream gradients may be any
# view (read one value a row).
HINTS = {name: 16 for name, kind in SIGNATURE.items()
         if kind.startswith("*") and name not in ("labels", "grad_out", "grad_ent")}


@triton.jit
def kernel_cake_library_coef(labels, ent, grad_out, grad_ent, count, ca, cb, cg, T, V,
                             ignore_index, logprob, reduction, has_grad_out, has_grad_ent):
    lm.lm_head_coef(labels, ent, grad_out, grad_ent, count, ca, cb, cg, T, V, ignore_index,
                    logprob, reduction, has_grad_out, has_grad_ent, ROWS_BLOCK)
