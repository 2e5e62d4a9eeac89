"""Gated RMSNorm ``y = rmsnorm(x) * silu(g)`` (normalise, then gate: the GDN/Mamba2 output
norm), optionally prenorm, deterministic training.

Public names (docs/architecture.md, Names): the autograd functional
:func:`cake_gated_rmsnorm_det`, its class :class:`CakeGatedRMSNormDetFunction`, the layer
:class:`CakeGatedRMSNormDet`, the helpers ``cake_gated_rmsnorm_det_train_forward`` /
``_backward`` / ``_backward_workspace_bytes`` and the query
``is_cake_gated_rmsnorm_det_train_supported``. The float64 reference is in ``.reference``.
"""

from ..core.requirements import require_torch

require_torch(__name__)

from ._function import (  # noqa: E402
    CakeGatedRMSNormDet,
    CakeGatedRMSNormDetFunction,
    cake_gated_rmsnorm_det,
    cake_gated_rmsnorm_det_train_backward,
    cake_gated_rmsnorm_det_train_backward_workspace_bytes,
    cake_gated_rmsnorm_det_train_forward,
    is_cake_gated_rmsnorm_det_train_supported,
)

__all__ = [
    "CakeGatedRMSNormDet",
    "CakeGatedRMSNormDetFunction",
    "cake_gated_rmsnorm_det",
    "cake_gated_rmsnorm_det_train_backward",
    "cake_gated_rmsnorm_det_train_backward_workspace_bytes",
    "cake_gated_rmsnorm_det_train_forward",
    "is_cake_gated_rmsnorm_det_train_supported",
]
