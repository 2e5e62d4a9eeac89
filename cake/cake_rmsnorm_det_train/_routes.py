"""Program choice for one call, from the manifest's ``variant`` and ``route`` fields.

The family table (``tools/families/cake_rmsnorm_det_train.py``) gives every program a variant
(``dtype`` of x, ``load``: ``vector`` for 16-byte loads, ``scalar`` for any D) and a D band
(``cols_min`` .. ``cols_max``). A call takes the program of its dtype whose band holds D, on the
vector route when D is a multiple of 16 / sizeof(dtype) and every row tensor is 16-byte aligned.
The choice depends only on (dtype, D, alignment, arch), never on timing.
"""

from __future__ import annotations

from ..core.rmsnorm import select

__all__ = ["select"]
