"""Family table of ``cake.cake_gated_rmsnorm_det_train``: ``rmsnorm(x) * silu(g)`` (normalise,
then gate; the GDN/Mamba2 output norm), optionally prenorm, with a deterministic backward.

The same programs as ``cake_rmsnorm_det_train`` (same templates, variant and route fields; see
``tools/families/cake_rmsnorm_det_train.py``) rendered with ``CAKE_GATED`` 1: 6 programs.
"""

import importlib.util
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE.parent))
from render import Family  # noqa: E402

_spec = importlib.util.spec_from_file_location("_cake_rmsnorm_table", _HERE / "cake_rmsnorm_det_train.py")
_rmsnorm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rmsnorm)

FAMILY = Family(name="cake_gated_rmsnorm_det_train", templates=_rmsnorm.TEMPLATES,
                specs=_rmsnorm.specs(gated=True))
