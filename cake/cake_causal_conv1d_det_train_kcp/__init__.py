"""Context-parallel causal depthwise conv1d (width 4) + SiLU over packed documents (KCP), on
torch.distributed: one packed sequence split over the ranks of a process group, y and dx
bitwise the single-rank family's (``cake.cake_causal_conv1d_det_train``), deterministic.

Public names (docs/families/causal_conv1d_kcp.md): the autograd functional
:func:`cake_causal_conv1d_det_kcp`, its class :class:`CakeCausalConv1dDetFunctionKcp`, the
helpers ``cake_causal_conv1d_det_train_kcp_forward`` / ``_backward``, the query
``is_cake_causal_conv1d_det_train_kcp_supported``, the per-rank plan
:class:`CakeCausalConv1dDetKcpPlan` and its pieces :class:`CakeCausalConv1dDetKcpPiece`, and the
layout and reduction helpers ``cake_causal_conv1d_det_train_kcp_token_ranges`` / ``_shard`` /
``_unshard`` / ``_reduce_weight_grads``.
"""

from ..core.requirements import require_torch

require_torch(__name__)

from ._function import (  # noqa: E402
    CakeCausalConv1dDetFunctionKcp,
    cake_causal_conv1d_det_kcp,
    cake_causal_conv1d_det_train_kcp_backward,
    cake_causal_conv1d_det_train_kcp_forward,
    cake_causal_conv1d_det_train_kcp_reduce_weight_grads,
    cake_causal_conv1d_det_train_kcp_shard,
    cake_causal_conv1d_det_train_kcp_token_ranges,
    cake_causal_conv1d_det_train_kcp_unshard,
    is_cake_causal_conv1d_det_train_kcp_supported,
)
from ._plan import CakeCausalConv1dDetKcpPlan  # noqa: E402
from ._tables import CakeCausalConv1dDetKcpPiece  # noqa: E402

__all__ = [
    "CakeCausalConv1dDetFunctionKcp",
    "CakeCausalConv1dDetKcpPiece",
    "CakeCausalConv1dDetKcpPlan",
    "cake_causal_conv1d_det_kcp",
    "cake_causal_conv1d_det_train_kcp_backward",
    "cake_causal_conv1d_det_train_kcp_forward",
    "cake_causal_conv1d_det_train_kcp_reduce_weight_grads",
    "cake_causal_conv1d_det_train_kcp_shard",
    "cake_causal_conv1d_det_train_kcp_token_ranges",
    "cake_causal_conv1d_det_train_kcp_unshard",
    "is_cake_causal_conv1d_det_train_kcp_supported",
]
