"""Family table of ``cake.cake_lm_head_det_train``: the fused LM head (Triton), cross-entropy and
log-probabilities of ``softcap(hidden @ weight^T)`` without the (T, V) logits, with a
deterministic backward.

One program per dtype (bf16, fp16, fp32), each built for sm_90a, sm_100a and sm_103a; each holds
the seven kernels of a det step (roles ``kernel_<name>``: ``stats``, ``finalize``, ``reduce``,
``coef``, ``dh``, ``dw``, ``cast``), one C entry a kernel (``grid_x``, ``grid_y``, ``grid_z``,
then the kernel's ``SIGNATURE``), so one library serves every call of that dtype. Per-call
choices (the entry, reduction, softcap, entropy, upstream gradients, the final cast of dhidden,
the dweight accumulator) are runtime flags inside the kernels, so they add no specialization.

Knobs: ``DTYPE`` (the pointer type of hidden, weight and their gradients) and the tile sizes,
warps and stages of each kernel from ``cake/_shared/lm_head_tiles.py`` (one source for these
programs and the host's launch grids; its docstring gives the reasons).
"""

from cake._shared.lm_head_tiles import ARGUMENTS, DTYPES, KERNELS, tiles
from tools.render import Family, Spec

DETERMINISTIC = True
POINTER = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
GRID = (("grid_x", "i32"), ("grid_y", "i32"), ("grid_z", "i32"))


def family(name: str, deterministic: bool) -> Family:
    """The table of one mode (shared with ``cake_lm_head_nondet_train``): its kernels, their
    entries, one program per dtype."""
    kernels = KERNELS[deterministic]
    mode = "det" if deterministic else "nondet"
    templates = {f"kernel_{k}": f"csrc/templates/lm_head/{k}.py" for k in kernels}
    templates["binding"] = f"csrc/templates/lm_head/binding_{mode}.cu"
    specs = tuple(Spec(variant={"dtype": dtype}, route={},
                       params={"DTYPE": POINTER[dtype], **tiles(dtype, deterministic)})
                  for dtype in DTYPES)
    return Family(name=name, kind="triton", templates=templates, specs=specs,
                  entries={k: (*GRID, *ARGUMENTS[k]) for k in kernels})


FAMILY = family("cake_lm_head_det_train", DETERMINISTIC)
