"""Plain PyTorch float64 reference of the RMSNorm family (for tests; any device).

``reference_forward`` computes in float64 and returns float64 tensors; gradients come from
float64 autograd through it (see ``reference_backward``).
"""

from __future__ import annotations

from typing import Optional

import torch


def reference_forward(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor] = None,
                      *, eps: float = 1e-6, weight_offset: float = 0.0,
                      round_sum: bool = True) -> tuple:
    """``(y, s, rstd)`` in float64: ``s = x + residual`` (added in fp32 and rounded to
    x's dtype when ``round_sum``, as the kernels store and normalise it), ``rstd = rsqrt(mean(s^2) + eps)``,
    ``y = s * rstd * (weight + weight_offset)``."""
    s = x.double()
    if residual is not None:
        # The kernels add in fp32 and round the sum to x's dtype (it is stored and normalised).
        s = (x.float() + residual.float()).to(x.dtype).double() if round_sum else \
            s + residual.double()
    rstd = torch.rsqrt(s.square().mean(dim=-1, keepdim=True) + eps)
    y = s * rstd * (weight.double() + weight_offset)
    return y, s, rstd.squeeze(-1)


def reference_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, *,
                       eps: float = 1e-6, weight_offset: float = 0.0,
                       dsum: Optional[torch.Tensor] = None) -> tuple:
    """``(dx, dweight)`` in float64 for ``y = rmsnorm(x)`` with upstream ``dy`` (and ``dsum``,
    the gradient of the prenorm sum, added to dx). Here x is the normalised input."""
    xd = x.detach().to(torch.float64, copy=True).requires_grad_(True)
    wd = weight.detach().to(torch.float64, copy=True).requires_grad_(True)
    rstd = torch.rsqrt(xd.square().mean(dim=-1, keepdim=True) + eps)
    y = xd * rstd * (wd + weight_offset)
    dx, dweight = torch.autograd.grad(y, (xd, wd), dy.double())
    if dsum is not None:
        dx = dx + dsum.double()
    return dx, dweight
