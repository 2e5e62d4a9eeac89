"""Family table of ``cake.cake_rmsnorm_det_train``: RMSNorm (optionally prenorm) with a
deterministic backward.

One program per (dtype, load). ``dtype`` is the dtype of x/y/dy/dx; ``load`` is ``vector``
(16-byte loads: D a multiple of 16 / sizeof(dtype) and 16-byte aligned tensors) or ``scalar``
(element loads: any D). Inside every program the weight dtype (x's or fp32), the weight-gradient
dtype, the residual (prenorm) form and the D band (16 elements a thread up to D = 8192, 32
above) are chosen per call. ``cols_min``/``cols_max`` bound D for the router
(``select`` in ``cake/core/rmsnorm.py``, shared by both RMSNorm families). 3 dtypes x 2 loads = 6 programs. The templates
are shared with ``cake_gated_rmsnorm_det_train`` (``CAKE_GATED``).
"""

import itertools

from tools.render import Family, Spec

DTYPES = {"bfloat16": 0, "float16": 1, "float32": 2}
LOADS = {"vector": 1, "scalar": 0}
ROUTE = {"cols_min": 1, "cols_max": 16384}
TEMPLATES = {"kernel": "csrc/templates/rmsnorm/kernel.cu",
             "binding": "csrc/templates/rmsnorm/binding.cu"}


def specs(gated: bool) -> tuple:
    """The programs of either RMSNorm family (the gated one passes ``gated=True``)."""
    return tuple(
        Spec(variant={"dtype": dtype, "load": load}, route=dict(ROUTE),
             params={"CAKE_DTYPE": code, "CAKE_VECTOR": vector, "CAKE_GATED": int(gated)})
        for (dtype, code), (load, vector) in itertools.product(DTYPES.items(), LOADS.items()))


FAMILY = Family(name="cake_rmsnorm_det_train", templates=TEMPLATES, specs=specs(gated=False))
