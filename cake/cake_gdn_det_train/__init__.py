"""Gated DeltaNet (chunked, Triton), deterministic training: forward, backward and autograd
over packed documents.

Public names (docs/architecture.md, Names): the autograd functional :func:`cake_gdn_det`, its
class :class:`CakeGDNDetFunction`, the chunk plan type :class:`CakeGDNDetPlan`, the helpers
``cake_gdn_det_train_forward`` / ``_backward`` / ``_backward_workspace_bytes`` and the query
``is_cake_gdn_det_train_supported``. The float64 references are in ``.reference``; the family
page is docs/families/gdn.md.
"""

from ..core.requirements import require_torch

require_torch(__name__)

from ._function import (  # noqa: E402
    CakeGDNDetFunction,
    CakeGDNDetPlan,
    cake_gdn_det,
    cake_gdn_det_train_backward,
    cake_gdn_det_train_backward_workspace_bytes,
    cake_gdn_det_train_forward,
    is_cake_gdn_det_train_supported,
)

__all__ = [
    "CakeGDNDetFunction",
    "CakeGDNDetPlan",
    "cake_gdn_det",
    "cake_gdn_det_train_backward",
    "cake_gdn_det_train_backward_workspace_bytes",
    "cake_gdn_det_train_forward",
    "is_cake_gdn_det_train_supported",
]
