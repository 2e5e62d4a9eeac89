"""Fused LM head (Triton): cross-entropy and per-token log-probabilities (and entropy) of
``softcap(hidden @ weight^T)`` without materialising the (T, V) logits, with a deterministic
backward.

Public names (docs/architecture.md, Names; this family has two differentiable entries, so the
multi-entry form): the autograd entries :func:`cake_lm_head_det_train_loss` and
:func:`cake_lm_head_det_train_logprob`, their classes :class:`CakeLMHeadDetLossFunction` and
:class:`CakeLMHeadDetLogprobFunction`, the module :class:`CakeLMHeadDetLoss` (the loss's options
only, in place of ``F.linear`` then ``F.cross_entropy``), the memory query
``cake_lm_head_det_train_workspace_bytes`` and ``is_cake_lm_head_det_train_supported``. The
float64 references are in ``.reference``; the family page is docs/families/lm_head.md.
"""

from ..core.requirements import require_torch

require_torch(__name__)

from ._function import (  # noqa: E402
    CakeLMHeadDetLogprobFunction,
    CakeLMHeadDetLoss,
    CakeLMHeadDetLossFunction,
    cake_lm_head_det_train_logprob,
    cake_lm_head_det_train_loss,
    cake_lm_head_det_train_workspace_bytes,
    is_cake_lm_head_det_train_supported,
)

__all__ = [
    "CakeLMHeadDetLogprobFunction",
    "CakeLMHeadDetLoss",
    "CakeLMHeadDetLossFunction",
    "cake_lm_head_det_train_logprob",
    "cake_lm_head_det_train_loss",
    "cake_lm_head_det_train_workspace_bytes",
    "is_cake_lm_head_det_train_supported",
]
