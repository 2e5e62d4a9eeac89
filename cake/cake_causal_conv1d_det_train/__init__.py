"""Causal depthwise conv1d (width 4) + SiLU over packed documents, deterministic training.

Public names (docs/architecture.md, Names): the autograd functional
:func:`cake_causal_conv1d_det`, its class :class:`CakeCausalConv1dDetFunction`, the helpers
``cake_causal_conv1d_det_train_forward`` / ``_backward`` / ``_backward_workspace_bytes`` and the
query ``is_cake_causal_conv1d_det_train_supported``. The float64 reference is in ``.reference``.
"""

from ..core.requirements import require_torch

require_torch(__name__)

from ._function import (  # noqa: E402
    CakeCausalConv1dDetFunction,
    cake_causal_conv1d_det,
    cake_causal_conv1d_det_train_backward,
    cake_causal_conv1d_det_train_backward_workspace_bytes,
    cake_causal_conv1d_det_train_forward,
    is_cake_causal_conv1d_det_train_supported,
)

__all__ = [
    "CakeCausalConv1dDetFunction",
    "cake_causal_conv1d_det",
    "cake_causal_conv1d_det_train_backward",
    "cake_causal_conv1d_det_train_backward_workspace_bytes",
    "cake_causal_conv1d_det_train_forward",
    "is_cake_causal_conv1d_det_train_supported",
]
