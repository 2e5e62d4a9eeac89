"""Autograd function, module and public entries of the gated RMSNorm family
(``y = rmsnorm(x) * silu(g)``: normalise, then gate; the GDN/Mamba2 output norm).

The functional and its class come from the family skeleton (``core.autograd.Differentiable``,
made by ``_shared.rmsnorm.Programs.differentiable``): eager calls launch first, then record the
call in autograd through :class:`CakeGatedRMSNormDetFunction`; under ``torch.compile`` the
opaque custom ops ``<package>::rmsnorm`` / ``::rmsnorm_backward`` run instead.

CUDA graphs: the entries never synchronize and, with every output (and ``workspace``) given,
never allocate.
"""

from __future__ import annotations

from typing import Optional

import torch

from .._shared.rmsnorm import Programs

_PROGRAMS = Programs(__file__, gated=True)


# --------------------------------------------------------------------------- public helpers


def cake_gated_rmsnorm_det_train_forward(
        x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor,
        residual: Optional[torch.Tensor] = None, *, eps: float = 1e-6,
        weight_offset: float = 0.0, out: Optional[torch.Tensor] = None,
        residual_out: Optional[torch.Tensor] = None,
        rstd: Optional[torch.Tensor] = None) -> tuple:
    """Forward only (no autograd):
    ``y = s * rsqrt(mean(s^2) + eps) * (weight + weight_offset) * silu(g)`` with ``s = x`` or,
    with ``residual``, ``s = x + residual`` (rounded to x's dtype).

    Args:
        x: bf16/fp16/fp32 ``[..., D]``, 1 <= D <= 16384, contiguous, on a CUDA device.
        g: the gate, like x.
        weight: ``[D]`` in x's dtype or fp32.
        residual: optional, like x (prenorm form: the sum is returned too).
        eps: > 0. weight_offset: added to weight.
        out, residual_out, rstd: optional preallocated outputs (like x; like x; fp32
            ``x.shape[:-1]``), written and returned.

    Returns:
        ``(y, residual_out, rstd)``; residual_out is None without residual.

    Example::

        >>> x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
        >>> g = torch.randn_like(x)
        >>> w = torch.rand(2048, device="cuda", dtype=torch.float32)
        >>> y, _, rstd = cake_gated_rmsnorm_det_train_forward(x, g, w)
    """
    return _PROGRAMS.forward_helper(x, g, weight, residual, eps, weight_offset, out,
                                    residual_out, rstd)


def cake_gated_rmsnorm_det_train_backward(
        dy: torch.Tensor, x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor,
        rstd: torch.Tensor, *, dsum: Optional[torch.Tensor] = None, has_residual: bool = False,
        weight_offset: float = 0.0, grad_dtype: torch.dtype = torch.float32,
        dx: Optional[torch.Tensor] = None, dg: Optional[torch.Tensor] = None,
        dresidual: Optional[torch.Tensor] = None, dweight: Optional[torch.Tensor] = None,
        workspace: Optional[torch.Tensor] = None) -> tuple:
    """Backward from dy: returns ``(dx, dg, dresidual, dweight)``.

    Args:
        dy: like x. x: the normalised input (the forward's x, or its ``residual_out`` in the
            prenorm form). g, weight: as the forward. rstd: the forward's rstd.
        dsum: gradient of the prenorm sum output, added to dx; only with ``has_residual``.
        has_residual: the forward had a residual: dresidual (equal to dx) is returned too.
        weight_offset: as the forward.
        grad_dtype: dtype of dweight, ``torch.float32`` (default) or the weight's dtype;
            accumulated in fp32 in an order fixed by (rows, D).
        dx, dg, dresidual, dweight: optional preallocated outputs.
        workspace: optional device buffer of at least
            :func:`cake_gated_rmsnorm_det_train_backward_workspace_bytes` bytes, 16-byte aligned.

    Returns:
        ``(dx, dg, dresidual, dweight)``; dresidual is None without ``has_residual``.

    Example::

        >>> dy = torch.randn_like(x)
        >>> dx, dg, _, dw = cake_gated_rmsnorm_det_train_backward(dy, x, g, w, rstd)
    """
    plan = _PROGRAMS.backward_plan(dy=dy, x=x, gate=g, weight=weight, rstd=rstd, dsum=dsum,
                                   weight_offset=weight_offset, has_residual=has_residual,
                                   grad_dtype=grad_dtype, dx=dx, dg=dg, dresidual=dresidual,
                                   dweight=dweight, workspace=workspace)
    return _PROGRAMS.backward(plan, dy=dy, x=x, gate=g, weight=weight, rstd=rstd, dsum=dsum,
                              weight_offset=weight_offset, grad_dtype=grad_dtype, dx=dx, dg=dg,
                              dresidual=dresidual, dweight=dweight, workspace=workspace)


def cake_gated_rmsnorm_det_train_backward_workspace_bytes(x: torch.Tensor, g: torch.Tensor,
                                                          weight: torch.Tensor) -> int:
    """Bytes of device workspace the backward needs for x ``[..., D]`` (0 without rows).

    Example::

        >>> n = cake_gated_rmsnorm_det_train_backward_workspace_bytes(x, g, w)
        >>> ws = torch.empty(n, dtype=torch.uint8, device="cuda")
    """
    return _PROGRAMS.workspace_bytes(x=x, gate=g, weight=weight)


def is_cake_gated_rmsnorm_det_train_supported(device: Optional[torch.device | int] = None, *,
                                              dtype: torch.dtype = torch.bfloat16) -> bool:
    """True when a CUDA device is present (``device``, default the current one), its arch is
    one the programs are built for, and ``dtype`` (x's) is bf16, fp16 or fp32. Compiles nothing."""
    return _PROGRAMS.supported(device, dtype)


# --------------------------------------------------------------------------- autograd

_OP = _PROGRAMS.differentiable(package=__package__, module=__name__,
                               function_name="CakeGatedRMSNormDetFunction", doc="""``apply(x, g, weight, residual, eps, weight_offset)``: y, or ``(y, x + residual)`` with
    a residual; deterministic backward. Saves the normalised input, g, the weight and rstd.

    Example::

        >>> y = CakeGatedRMSNormDetFunction.apply(x, g, w, None, 1e-6, 0.0)
    """)
CakeGatedRMSNormDetFunction = _OP.function


def cake_gated_rmsnorm_det(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor,
                           residual: Optional[torch.Tensor] = None, *, eps: float = 1e-6,
                           weight_offset: float = 0.0):
    """Gated RMSNorm ``y = rmsnorm(s) * silu(g)`` with autograd and a deterministic backward.

    ``rmsnorm(s) = s * rsqrt(mean(s^2 over D) + eps) * (weight + weight_offset)`` with
    ``s = x``, or ``s = x + residual`` (rounded to x's dtype) in the prenorm form, which
    returns ``(y, s)``. Gradients are bitwise identical run to run, process to process and
    stream to stream.

    Args:
        x: bf16/fp16/fp32 ``[..., D]``, 1 <= D <= 16384, contiguous, on a CUDA device.
        g: the gate, like x.
        weight: ``[D]`` in x's dtype or fp32.
        residual: optional, like x.
        eps: > 0 (default 1e-6). weight_offset: 0.0 (default).

    Returns:
        y like x; ``(y, s)`` with a residual.

    Example::

        >>> import torch
        >>> from cake.cake_gated_rmsnorm_det_train import cake_gated_rmsnorm_det
        >>> x = torch.randn(8192, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        >>> g = torch.randn_like(x, requires_grad=True)
        >>> w = torch.ones(2048, device="cuda", dtype=torch.float32, requires_grad=True)
        >>> cake_gated_rmsnorm_det(x, g, w).float().square().sum().backward()
    """
    return _OP.functional(x, g, weight, residual, eps, weight_offset)


class CakeGatedRMSNormDet(torch.nn.Module):
    """Gated RMSNorm layer holding its weight ``[hidden_size]`` (initialised so that
    ``weight + weight_offset`` is 1). ``forward(x, g, residual=None)`` is
    :func:`cake_gated_rmsnorm_det`.

    Example::

        >>> norm = CakeGatedRMSNormDet(2048, device="cuda", dtype=torch.float32)
        >>> x = torch.randn(16, 2048, device="cuda", dtype=torch.bfloat16)
        >>> y = norm(x, torch.randn_like(x))
    """

    def __init__(self, hidden_size: int, *, eps: float = 1e-6, weight_offset: float = 0.0,
                 device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight_offset = weight_offset
        self.weight = torch.nn.Parameter(
            torch.full((hidden_size,), 1.0 - weight_offset, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, g: torch.Tensor, residual: Optional[torch.Tensor] = None):
        return cake_gated_rmsnorm_det(x, g, self.weight, residual, eps=self.eps,
                                      weight_offset=self.weight_offset)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, weight_offset={self.weight_offset}"
