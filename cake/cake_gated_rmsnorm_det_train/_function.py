"""Autograd function, module and public entries of the gated RMSNorm family
(``y = rmsnorm(x) * silu(g)``: normalise, then gate; the GDN/Mamba2 output norm).

Eager calls launch first, then record the call in autograd through a subclass of
:class:`CakeGatedRMSNormDetFunction` (see ``host.eager_apply``); under ``torch.compile`` the
functional uses the custom ops ``<package>::forward`` /
``<package>::backward`` (see ``host.op_name``). Both launch through ``core.rmsnorm.Programs``.

CUDA graphs: the entries never synchronize and, with every output (and ``workspace``) given,
never allocate.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..core import host
from ..core.rmsnorm import Programs, upstream_gradients

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


class CakeGatedRMSNormDetFunction(torch.autograd.Function):
    """``apply(x, g, weight, residual, eps, weight_offset)``: y, or ``(y, x + residual)`` with
    a residual; deterministic backward. Saves the normalised input, g, the weight and rstd.

    Example::

        >>> y = CakeGatedRMSNormDetFunction.apply(x, g, w, None, 1e-6, 0.0)
    """

    @staticmethod
    def forward(ctx, x, g, weight, residual, eps, weight_offset):
        return _keep(ctx, x, g, weight, residual, eps, weight_offset,
                     _PROGRAMS.launch(x, g, weight, residual, eps, weight_offset))

    @staticmethod
    def backward(ctx, dy, dsum=None):
        s, g, weight, rstd = ctx.saved_tensors
        dx, dg, dresidual, dweight = _PROGRAMS.autograd_backward(
            ctx.plan, s=s, gate=g, weight=weight, rstd=rstd, dy=dy, dsum=dsum,
            weight_offset=ctx.weight_offset, has_residual=ctx.has_residual)
        return host.backward_result(len(ctx.needs_input_grad),
                                    {0: dx, 1: dg, 2: dweight, 3: dresidual})


def _keep(ctx, x, g, weight, residual, eps, weight_offset, launched):
    return _PROGRAMS.keep(ctx, launched, x=x, gate=g, weight=weight, residual=residual,
                          weight_offset=weight_offset)


# The apply's arguments are Programs.launch's: it serves as the family's launch directly.
_eager_apply = host.eager_apply(CakeGatedRMSNormDetFunction, _PROGRAMS.launch, _keep)


# --------------------------------------------------------------------------- torch.compile


@torch.library.custom_op(host.op_name(__package__, "forward"), mutates_args=())
def _forward_op(x: torch.Tensor, g: torch.Tensor, weight: torch.Tensor,
                residual: Optional[torch.Tensor], eps: float,
                weight_offset: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, s, rstd = cake_gated_rmsnorm_det_train_forward(x, g, weight, residual, eps=eps,
                                                      weight_offset=weight_offset)
    return y, (s if s is not None else x.new_empty(0)), rstd


@_forward_op.register_fake
def _(x, g, weight, residual, eps, weight_offset):
    return (torch.empty_like(x), torch.empty_like(x) if residual is not None else x.new_empty(0),
            x.new_empty(x.shape[:-1], dtype=torch.float32))


@torch.library.custom_op(host.op_name(__package__, "backward"), mutates_args=())
def _backward_op(dy: torch.Tensor, dsum: Optional[torch.Tensor], s: torch.Tensor, g: torch.Tensor,
                 weight: torch.Tensor, rstd: torch.Tensor, weight_offset: float,
                 has_residual: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dy, dsum = upstream_gradients(s, dy, dsum, has_residual)
    dx, dg, dresidual, dweight = cake_gated_rmsnorm_det_train_backward(
        dy, s, g, weight, rstd, dsum=dsum, has_residual=has_residual, weight_offset=weight_offset,
        grad_dtype=weight.dtype)
    return dx, dg, (dresidual if dresidual is not None else s.new_empty(0)), dweight


@_backward_op.register_fake
def _(dy, dsum, s, g, weight, rstd, weight_offset, has_residual):
    return (torch.empty_like(s), torch.empty_like(s),
            torch.empty_like(s) if has_residual else s.new_empty(0), torch.empty_like(weight))


def _op_setup_context(ctx, inputs, output):
    x, g, weight, residual, eps, weight_offset = inputs
    _, s, rstd = output
    ctx.has_residual = residual is not None
    ctx.weight_offset = weight_offset
    ctx.save_for_backward(s if ctx.has_residual else x, g, weight, rstd)


def _op_backward(ctx, dy, dsum, drstd):
    s, g, weight, rstd = ctx.saved_tensors
    dx, dg, dresidual, dweight = _backward_op(dy, dsum if ctx.has_residual else None, s, g, weight,
                                              rstd, ctx.weight_offset, ctx.has_residual)
    return dx, dg, dweight, (dresidual if ctx.has_residual else None), None, None


_forward_op.register_autograd(_op_backward, setup_context=_op_setup_context)


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
    if torch.compiler.is_compiling():
        y, s, _ = _forward_op(x, g, weight, residual, eps, weight_offset)
        return y if residual is None else (y, s)
    return _eager_apply(x, g, weight, residual, eps, weight_offset)


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
