"""RMSNorm (optionally prenorm, optionally Gemma's ``1 + weight``), deterministic training.

Public names (docs/architecture.md, Names): the autograd functional :func:`cake_rmsnorm_det`,
its class :class:`CakeRMSNormDetFunction`, the layer :class:`CakeRMSNormDet`, the helpers
``cake_rmsnorm_det_train_forward`` / ``_backward`` / ``_backward_workspace_bytes`` and the query
``is_cake_rmsnorm_det_train_supported``. The float64 reference is in ``.reference``.
"""

from ..core.requirements import require_torch

require_torch(__name__)

from ._function import (  # noqa: E402
    CakeRMSNormDet,
    CakeRMSNormDetFunction,
    cake_rmsnorm_det,
    cake_rmsnorm_det_train_backward,
    cake_rmsnorm_det_train_backward_workspace_bytes,
    cake_rmsnorm_det_train_forward,
    is_cake_rmsnorm_det_train_supported,
)

__all__ = [
    "CakeRMSNormDet",
    "CakeRMSNormDetFunction",
    "cake_rmsnorm_det",
    "cake_rmsnorm_det_train_backward",
    "cake_rmsnorm_det_train_backward_workspace_bytes",
    "cake_rmsnorm_det_train_forward",
    "is_cake_rmsnorm_det_train_supported",
]
