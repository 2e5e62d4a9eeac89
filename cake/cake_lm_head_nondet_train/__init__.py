"""Fused LM head (Triton): cross-entropy and per-token log-probabilities (and entropy) of
``softcap(hidden @ weight^T)`` without materialising the (T, V) logits, with a backward that adds
dhidden and dweight with fp32 atomics (one GEMM-equivalent less than the det family's; results
vary run to run by fp32 rounding). Under ``torch.use_deterministic_algorithms(True)`` its
backward raises PyTorch's alert before it allocates or launches anything.

Public names (docs/architecture.md, Names; this family has two differentiable entries, so the
multi-entry form): the autograd entries :func:`cake_lm_head_nondet_train_loss` and
:func:`cake_lm_head_nondet_train_logprob`, their classes
:class:`CakeLMHeadNondetLossFunction` and :class:`CakeLMHeadNondetLogprobFunction`, the module
:class:`CakeLMHeadNondetLoss` (the loss's options only, in place of ``F.linear`` then
``F.cross_entropy``), the memory query
``cake_lm_head_nondet_train_workspace_bytes`` and ``is_cake_lm_head_nondet_train_supported``. The
float64 references are in ``.reference``; the family page is docs/families/lm_head.md.
"""

from ..core.requirements import require_torch

require_torch(__name__)

from ._function import (  # noqa: E402
    CakeLMHeadNondetLogprobFunction,
    CakeLMHeadNondetLoss,
    CakeLMHeadNondetLossFunction,
    cake_lm_head_nondet_train_logprob,
    cake_lm_head_nondet_train_loss,
    cake_lm_head_nondet_train_workspace_bytes,
    is_cake_lm_head_nondet_train_supported,
)

__all__ = [
    "CakeLMHeadNondetLogprobFunction",
    "CakeLMHeadNondetLoss",
    "CakeLMHeadNondetLossFunction",
    "cake_lm_head_nondet_train_logprob",
    "cake_lm_head_nondet_train_loss",
    "cake_lm_head_nondet_train_workspace_bytes",
    "is_cake_lm_head_nondet_train_supported",
]
