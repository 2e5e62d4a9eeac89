"""Gated DeltaNet (chunked, Triton), non-deterministic training: forward, backward (dq and dk
summed over value heads with fp32 atomics) and autograd over packed documents.

Public names (docs/architecture.md, Names): the autograd functional :func:`cake_gdn_nondet`, its
class :class:`CakeGDNNondetFunction`, the chunk plan type :class:`CakeGDNNondetPlan`, the helpers
``cake_gdn_nondet_train_forward`` / ``_backward`` / ``_backward_workspace_bytes`` and the query
``is_cake_gdn_nondet_train_supported``. The float64 references are in ``.reference``; the family
page is docs/families/gdn.md.
"""

from ..core.requirements import require_torch

require_torch(__name__)

from ._function import (  # noqa: E402
    CakeGDNNondetFunction,
    CakeGDNNondetPlan,
    cake_gdn_nondet,
    cake_gdn_nondet_train_backward,
    cake_gdn_nondet_train_backward_workspace_bytes,
    cake_gdn_nondet_train_forward,
    is_cake_gdn_nondet_train_supported,
)

__all__ = [
    "CakeGDNNondetFunction",
    "CakeGDNNondetPlan",
    "cake_gdn_nondet",
    "cake_gdn_nondet_train_backward",
    "cake_gdn_nondet_train_backward_workspace_bytes",
    "cake_gdn_nondet_train_forward",
    "is_cake_gdn_nondet_train_supported",
]
