"""Plain PyTorch float64 reference of the gated RMSNorm family (for tests; any device).

``y = rmsnorm(s) * silu(g)`` (normalise, then gate) with ``s = x`` or ``x + residual``.
"""

from __future__ import annotations

from typing import Optional

import torch


def reference_forward(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor,
                      residual: Optional[torch.Tensor] = None, *, eps: float = 1e-6,
                      weight_offset: float = 0.0, round_sum: bool = True) -> tuple:
    """``(y, s, rstd)`` in float64; ``s`` is added in fp32 and rounded to x's dtype when
    ``round_sum`` (as the kernels store and normalise it)."""
    s = x.double()
    if residual is not None:
        # The kernels add in fp32 and round the sum to x's dtype (it is stored and normalised).
        s = (x.float() + residual.float()).to(x.dtype).double() if round_sum else \
            s + residual.double()
    rstd = torch.rsqrt(s.square().mean(dim=-1, keepdim=True) + eps)
    gd = g.double()
    y = s * rstd * (weight.double() + weight_offset) * (gd * torch.sigmoid(gd))
    return y, s, rstd.squeeze(-1)


def reference_backward(dy: torch.Tensor, x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor,
                       *, eps: float = 1e-6, weight_offset: float = 0.0,
                       dsum: Optional[torch.Tensor] = None) -> tuple:
    """``(dx, dg, dweight)`` in float64 by autograd; x is the normalised input and ``dsum``
    (the gradient of the prenorm sum) is added to dx."""
    xd = x.detach().to(torch.float64, copy=True).requires_grad_(True)
    gd = g.detach().to(torch.float64, copy=True).requires_grad_(True)
    wd = weight.detach().to(torch.float64, copy=True).requires_grad_(True)
    rstd = torch.rsqrt(xd.square().mean(dim=-1, keepdim=True) + eps)
    y = xd * rstd * (wd + weight_offset) * (gd * torch.sigmoid(gd))
    dx, dg, dweight = torch.autograd.grad(y, (xd, gd, wd), dy.double())
    if dsum is not None:
        dx = dx + dsum.double()
    return dx, dg, dweight
