"""Float64 references of the LM head nondet family (shared with the det family):
:func:`reference_loss` and :func:`reference_logprob` (``F.linear`` then ``F.cross_entropy`` /
``log_softmax`` in float64, with the softcap and the temperature) and their gradients by float64
autograd (:func:`reference_loss_with_grads`, :func:`reference_logprob_with_grads`)."""

from .._shared.lm_head_reference import (  # noqa: F401
    reference_logprob,
    reference_logprob_with_grads,
    reference_loss,
    reference_loss_with_grads,
    softcap,
)
