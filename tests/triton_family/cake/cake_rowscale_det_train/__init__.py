"""Row scale (``y[r, :] = x[r, :] * scale[r]``), a Triton family used only by tests: it proves
the Triton program kind end to end (family table, renderer, checker, build, wheel, loader on the
fake driver, the interpreter) with the family skeleton every family uses.

Public names: :func:`cake_rowscale_det`, :class:`CakeRowscaleDetFunction`,
``cake_rowscale_det_train_forward`` / ``_backward``, ``is_cake_rowscale_det_train_supported``.
"""

from ..core.requirements import require_torch

require_torch(__name__)

from ._function import (  # noqa: E402
    CakeRowscaleDetFunction,
    cake_rowscale_det,
    cake_rowscale_det_train_backward,
    cake_rowscale_det_train_forward,
    is_cake_rowscale_det_train_supported,
)

__all__ = [
    "CakeRowscaleDetFunction",
    "cake_rowscale_det",
    "cake_rowscale_det_train_backward",
    "cake_rowscale_det_train_forward",
    "is_cake_rowscale_det_train_supported",
]
