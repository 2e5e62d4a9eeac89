"""Family table of ``cake.cake_gdn_nondet_train``: chunked Gated DeltaNet (Triton) whose backward
accumulates dq and dk over a group's value heads with fp32 atomics (``DETERMINISTIC=False`` in
the ``dqkwg`` and ``wy_dk`` kernels): no (T, HV, K) per-value-head partials, at the price of an
order that varies run to run when HV > H. Same programs as ``cake_gdn_det_train`` otherwise (its
table, :func:`specs`, gives the dtypes, head dimensions, knobs and their reasons).
"""

from tools.families.cake_gdn_det_train import ENTRIES, TEMPLATES, specs
from tools.render import Family

FAMILY = Family(name="cake_gdn_nondet_train", kind="triton", templates=TEMPLATES,
                entries=ENTRIES, specs=specs(deterministic=False))
