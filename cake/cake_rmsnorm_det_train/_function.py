"""Autograd function, module and public entries of the RMSNorm family.

The functional and its class come from the family skeleton (``core.autograd.Differentiable``,
made by ``_shared.rmsnorm.Programs.differentiable``): eager calls launch first, then record the
call in autograd through :class:`CakeRMSNormDetFunction`; under ``torch.compile`` the opaque custom ops
``<package>::rmsnorm`` / ``::rmsnorm_backward`` run instead.

CUDA graphs: the entries never synchronize and, with every output (and ``workspace``) given,
never allocate.
"""

from __future__ import annotations

from typing import Optional

import torch

from .._shared.rmsnorm import Programs

_PROGRAMS = Programs(__file__, gated=False)


# --------------------------------------------------------------------------- public helpers


def cake_rmsnorm_det_train_forward(
        x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor] = None, *,
        eps: float = 1e-6, weight_offset: float = 0.0, out: Optional[torch.Tensor] = None,
        residual_out: Optional[torch.Tensor] = None,
        rstd: Optional[torch.Tensor] = None) -> tuple:
    """Forward only (no autograd): ``y = s * rsqrt(mean(s^2) + eps) * (weight + weight_offset)``
    with ``s = x`` or, with ``residual``, ``s = x + residual`` (rounded to x's dtype).

    Args:
        x: bf16/fp16/fp32 ``[..., D]``, 1 <= D <= 16384, contiguous, on a CUDA device; the
            leading dims are rows.
        weight: ``[D]`` in x's dtype or fp32.
        residual: optional, like x (prenorm form: the sum is returned too).
        eps: > 0. weight_offset: added to weight (1.0 for Gemma's ``1 + weight``).
        out, residual_out, rstd: optional preallocated outputs (like x; like x; fp32
            ``x.shape[:-1]``), written and returned.

    Returns:
        ``(y, residual_out, rstd)``: y like x; the sum ``x + residual`` (None without
        residual); rstd fp32 ``x.shape[:-1]``, what the backward needs.

    Example::

        >>> x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
        >>> w = torch.rand(2048, device="cuda", dtype=torch.float32)
        >>> y, _, rstd = cake_rmsnorm_det_train_forward(x, w)
    """
    return _PROGRAMS.forward_helper(x, None, weight, residual, eps, weight_offset, out,
                                    residual_out, rstd)


def cake_rmsnorm_det_train_backward(
        dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, *,
        dsum: Optional[torch.Tensor] = None, has_residual: bool = False,
        weight_offset: float = 0.0, grad_dtype: torch.dtype = torch.float32,
        dx: Optional[torch.Tensor] = None, dresidual: Optional[torch.Tensor] = None,
        dweight: Optional[torch.Tensor] = None,
        workspace: Optional[torch.Tensor] = None) -> tuple:
    """Backward from dy: returns ``(dx, dresidual, dweight)``.

    Args:
        dy: like x. x: the normalised input, i.e. the forward's x or, in the prenorm form, its
            ``residual_out``. weight: as the forward. rstd: the forward's rstd.
        dsum: gradient of the prenorm sum output (like x), added to dx; only with
            ``has_residual``.
        has_residual: the forward had a residual: dresidual (equal to dx) is returned too.
        weight_offset: as the forward.
        grad_dtype: dtype of dweight, ``torch.float32`` (default) or the weight's dtype; it is
            accumulated in fp32 in an order fixed by (rows, D).
        dx, dresidual, dweight: optional preallocated outputs.
        workspace: optional device buffer of at least
            :func:`cake_rmsnorm_det_train_backward_workspace_bytes` bytes, 16-byte aligned;
            with it and all outputs given, nothing is allocated.

    Returns:
        ``(dx, dresidual, dweight)``; dresidual is None without ``has_residual``. Bitwise
        identical run to run.

    Example::

        >>> dy = torch.randn_like(x)
        >>> dx, _, dw = cake_rmsnorm_det_train_backward(dy, x, w, rstd)
    """
    plan = _PROGRAMS.backward_plan(dy=dy, x=x, gate=None, weight=weight, rstd=rstd, dsum=dsum,
                                   weight_offset=weight_offset, has_residual=has_residual,
                                   grad_dtype=grad_dtype, dx=dx, dresidual=dresidual,
                                   dweight=dweight, workspace=workspace)
    dx, _, dresidual, dweight = _PROGRAMS.backward(
        plan, dy=dy, x=x, gate=None, weight=weight, rstd=rstd, dsum=dsum,
        weight_offset=weight_offset, grad_dtype=grad_dtype, dx=dx, dresidual=dresidual,
        dweight=dweight, workspace=workspace)
    return dx, dresidual, dweight


def cake_rmsnorm_det_train_backward_workspace_bytes(x: torch.Tensor, weight: torch.Tensor) -> int:
    """Bytes of device workspace the backward needs for x ``[..., D]`` (0 without rows).

    One fp32 partial weight-gradient row per band of rows (at most 528 bands; 792 at D = 4097 ..
    5120 with 16-byte aligned bf16 or fp16 rows). Loads (or JIT-compiles) the program the call
    routes to, so ask with the x the backward will get: an x that routes otherwise (e.g.
    misaligned) may get a smaller size, which the backward then rejects.

    Example::

        >>> n = cake_rmsnorm_det_train_backward_workspace_bytes(x, w)
        >>> ws = torch.empty(n, dtype=torch.uint8, device="cuda")
    """
    return _PROGRAMS.workspace_bytes(x=x, gate=None, weight=weight)


def is_cake_rmsnorm_det_train_supported(device: Optional[torch.device | int] = None, *,
                                        dtype: torch.dtype = torch.bfloat16) -> bool:
    """True when a CUDA device is present (``device``, default the current one), its arch is
    one the programs are built for, and ``dtype`` (x's) is bf16, fp16 or fp32. Compiles nothing."""
    return _PROGRAMS.supported(device, dtype)


# --------------------------------------------------------------------------- autograd

_OP = _PROGRAMS.differentiable(package=__package__, module=__name__,
                               function_name="CakeRMSNormDetFunction", doc="""``apply(x, weight, residual, eps, weight_offset)``: y, or ``(y, x + residual)`` with a
    residual; deterministic backward. Saves the normalised input, the weight and rstd.
    Gradients come in the inputs' dtypes (dweight in the weight's, accumulated in fp32).

    Example::

        >>> y = CakeRMSNormDetFunction.apply(x, w, None, 1e-6, 0.0)
    """)
CakeRMSNormDetFunction = _OP.function


def cake_rmsnorm_det(x: torch.Tensor, weight: torch.Tensor,
                     residual: Optional[torch.Tensor] = None, *, eps: float = 1e-6,
                     weight_offset: float = 0.0):
    """RMSNorm with autograd and a deterministic backward.

    ``y = s * rsqrt(mean(s^2 over D) + eps) * (weight + weight_offset)`` with ``s = x``, or
    ``s = x + residual`` (rounded to x's dtype) in the prenorm form, which returns ``(y, s)``.
    Gradients are bitwise identical run to run, process to process and stream to stream.

    Args:
        x: bf16/fp16/fp32 ``[..., D]``, 1 <= D <= 16384, contiguous, on a CUDA device.
        weight: ``[D]`` in x's dtype or fp32.
        residual: optional, like x.
        eps: > 0 (default 1e-6). weight_offset: 0.0 (default) or e.g. 1.0 (Gemma).

    Returns:
        y like x; ``(y, s)`` with a residual.

    Example::

        >>> import torch
        >>> from cake.cake_rmsnorm_det_train import cake_rmsnorm_det
        >>> x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        >>> w = torch.ones(4096, device="cuda", dtype=torch.float32, requires_grad=True)
        >>> cake_rmsnorm_det(x, w).float().square().sum().backward()
    """
    return _OP.functional(x, weight, residual, eps, weight_offset)


class CakeRMSNormDet(torch.nn.Module):
    """RMSNorm layer holding its weight ``[hidden_size]`` (initialised so that
    ``weight + weight_offset`` is 1). ``forward(x, residual=None)`` is :func:`cake_rmsnorm_det`.

    Example::

        >>> norm = CakeRMSNormDet(4096, device="cuda", dtype=torch.float32)
        >>> y = norm(torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16))
    """

    def __init__(self, hidden_size: int, *, eps: float = 1e-6, weight_offset: float = 0.0,
                 device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight_offset = weight_offset
        self.weight = torch.nn.Parameter(
            torch.full((hidden_size,), 1.0 - weight_offset, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        return cake_rmsnorm_det(x, self.weight, residual, eps=self.eps,
                                weight_offset=self.weight_offset)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, weight_offset={self.weight_offset}"
