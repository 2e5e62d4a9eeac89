"""Family table of ``cake.cake_gated_rmsnorm_det_train``: ``rmsnorm(x) * silu(g)`` (normalise,
then gate; the GDN/Mamba2 output norm), optionally prenorm, with a deterministic backward.

The same programs as ``cake_rmsnorm_det_train`` (same templates, variant and route fields; see
``tools/families/cake_rmsnorm_det_train.py``) rendered with ``CAKE_GATED`` 1 and that table's
``GATED_TUNING`` and its own forward bands (``VECTOR_BANDS``): 12 programs.
"""

from tools.families.cake_rmsnorm_det_train import ENTRIES, TEMPLATES, specs
from tools.render import Family

FAMILY = Family(name="cake_gated_rmsnorm_det_train", templates=TEMPLATES, entries=ENTRIES,
                specs=specs(gated=True))
