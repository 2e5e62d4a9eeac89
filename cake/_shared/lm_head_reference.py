"""Float64 references of the LM head families (any device; the tests' and the self-test's
ground truth).

Everything is computed in float64 from the inputs' exact values (``hidden.double()``,
``weight.double()``), as PyTorch computes it without fusion: ``z = F.linear(h, w)``, the optional
softcap ``c * tanh(z / c)``, then ``F.cross_entropy`` (the loss) or ``log_softmax`` (log-probs and
entropy). Gradients come from float64 autograd through these (``*_with_grads``). Leading dims are
flattened as the entries flatten them. Labels outside [0, V) that are not ``ignore_index`` are not
handled here (torch raises on them): tests build their expectation for those tokens separately.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def softcap(z: torch.Tensor, logit_softcap: Optional[float]) -> torch.Tensor:
    """``c * tanh(z / c)``, or ``z`` when ``logit_softcap`` is None."""
    if logit_softcap is None:
        return z
    return logit_softcap * torch.tanh(z / logit_softcap)


def _flat(hidden: torch.Tensor, labels: torch.Tensor) -> tuple:
    return hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)


def reference_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                   ignore_index: int = -100, reduction: str = "mean",
                   logit_softcap: Optional[float] = None) -> torch.Tensor:
    """Cross-entropy of ``softcap(hidden @ weight^T)`` in float64 with torch's semantics (``mean``
    over non-ignored tokens, NaN when none is left); ``none`` in labels' shape."""
    h, y = _flat(hidden, labels)
    z = softcap(F.linear(h.double(), weight.double()), logit_softcap)
    loss = F.cross_entropy(z, y, ignore_index=ignore_index, reduction=reduction)
    return loss.reshape(labels.shape) if reduction == "none" else loss


def reference_logprob(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                      ignore_index: int = -100, temperature: float = 1.0,
                      logit_softcap: Optional[float] = None,
                      compute_dtype: torch.dtype = torch.float64) -> tuple:
    """``(logprob, entropy)`` per token (labels' shape) of
    ``log_softmax(softcap(z) / temperature)``, in ``compute_dtype`` (float64; float32 gives
    eager fp32 PyTorch, a yardstick for ill-conditioned cases). Ignored tokens give 0 for both."""
    h, y = _flat(hidden, labels)
    z = softcap(F.linear(h.to(compute_dtype), weight.to(compute_dtype)), logit_softcap)
    logp = torch.log_softmax(z / temperature, dim=-1)
    valid = y != ignore_index
    picked = logp.gather(1, torch.where(valid, y, torch.zeros_like(y))[:, None]).squeeze(1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    zero = torch.zeros((), dtype=z.dtype, device=z.device)
    return (torch.where(valid, picked, zero).reshape(labels.shape),
            torch.where(valid, entropy, zero).reshape(labels.shape))


def _leaves(hidden: torch.Tensor, weight: torch.Tensor) -> tuple:
    return (hidden.detach().to(torch.float64, copy=True).requires_grad_(True),
            weight.detach().to(torch.float64, copy=True).requires_grad_(True))


def reference_loss_with_grads(hidden, weight, labels, grad_out, **options) -> tuple:
    """``(loss, dhidden, dweight)`` in float64 for the upstream gradient ``grad_out`` (a scalar
    for ``mean``/``sum``, labels' shape for ``none``)."""
    h, w = _leaves(hidden, weight)
    loss = reference_loss(h, w, labels, **options)
    if labels.numel() == 0:
        return loss.detach(), torch.zeros_like(h), torch.zeros_like(w)
    dh, dw = torch.autograd.grad(loss, (h, w), grad_out.double())
    return loss.detach(), dh, dw


def reference_logprob_with_grads(hidden, weight, labels, grad_logprob, grad_entropy=None,
                                 **options) -> tuple:
    """``(logprob, entropy, dhidden, dweight)`` in float64 for the upstream gradients
    (``grad_entropy`` None: the entropy is not differentiated)."""
    h, w = _leaves(hidden, weight)
    logprob, entropy = reference_logprob(h, w, labels, **options)
    if labels.numel() == 0:
        return logprob.detach(), entropy.detach(), torch.zeros_like(h), torch.zeros_like(w)
    total = (logprob * grad_logprob.double()).sum()
    if grad_entropy is not None:
        total = total + (entropy * grad_entropy.double()).sum()
    dh, dw = torch.autograd.grad(total, (h, w))
    return logprob.detach(), entropy.detach(), dh, dw
