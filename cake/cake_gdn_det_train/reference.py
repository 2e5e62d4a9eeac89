"""Float64 references of the Gated DeltaNet det family (shared with the other GDN family):
:func:`gdn_reference` (the recurrence, token by token, differentiable),
:func:`gdn_reference_backward` (its gradients by autograd in float64) and
:func:`gdn_chunked_reference` (the chunked WY/UT form the kernels compute)."""

from .._shared.gdn_reference import (  # noqa: F401
    gdn_chunked_reference,
    gdn_reference,
    gdn_reference_backward,
    l2norm,
)
