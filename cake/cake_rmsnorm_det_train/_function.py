"""Autograd function, module and public entries of the RMSNorm family.

Eager calls launch first, then record the call in autograd through a subclass of
:class:`CakeRMSNormDetFunction` (a plain ``autograd.Function``: the least host work per call;
see ``host.eager_apply``). Under ``torch.compile`` the functional uses the custom ops
``<package>::forward`` / ``<package>::backward`` (see ``host.op_name``) instead, which the
compiler treats as opaque (fake implementations give the output shapes). Both launch through
``core.rmsnorm.Programs``.

CUDA graphs: the entries never synchronize and, with every output (and ``workspace``) given,
never allocate.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..core import host
from ..core.rmsnorm import Programs, upstream_gradients

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


class CakeRMSNormDetFunction(torch.autograd.Function):
    """``apply(x, weight, residual, eps, weight_offset)``: y, or ``(y, x + residual)`` with a
    residual; deterministic backward. Saves the normalised input, the weight and rstd.
    Gradients come in the inputs' dtypes (dweight in the weight's, accumulated in fp32).

    Example::

        >>> y = CakeRMSNormDetFunction.apply(x, w, None, 1e-6, 0.0)
    """

    @staticmethod
    def forward(ctx, x, weight, residual, eps, weight_offset):
        return _keep(ctx, x, weight, residual, eps, weight_offset,
                     _launch(x, weight, residual, eps, weight_offset))

    @staticmethod
    def backward(ctx, dy, dsum=None):
        s, _, weight, rstd = ctx.saved_tensors
        dx, _, dresidual, dweight = _PROGRAMS.autograd_backward(
            ctx.plan, s=s, gate=None, weight=weight, rstd=rstd, dy=dy, dsum=dsum,
            weight_offset=ctx.weight_offset, has_residual=ctx.has_residual)
        return host.backward_result(len(ctx.needs_input_grad), {0: dx, 1: dweight, 2: dresidual})


def _launch(x, weight, residual, eps, weight_offset) -> tuple:
    return _PROGRAMS.launch(x, None, weight, residual, eps, weight_offset)


def _keep(ctx, x, weight, residual, eps, weight_offset, launched):
    return _PROGRAMS.keep(ctx, launched, x=x, gate=None, weight=weight, residual=residual,
                          weight_offset=weight_offset)


_eager_apply = host.eager_apply(CakeRMSNormDetFunction, _launch, _keep)


# --------------------------------------------------------------------------- torch.compile


@torch.library.custom_op(host.op_name(__package__, "forward"), mutates_args=())
def _forward_op(x: torch.Tensor, weight: torch.Tensor, residual: Optional[torch.Tensor],
                eps: float, weight_offset: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, s, rstd = cake_rmsnorm_det_train_forward(x, weight, residual, eps=eps,
                                                weight_offset=weight_offset)
    return y, (s if s is not None else x.new_empty(0)), rstd


@_forward_op.register_fake
def _(x, weight, residual, eps, weight_offset):
    return (torch.empty_like(x), torch.empty_like(x) if residual is not None else x.new_empty(0),
            x.new_empty(x.shape[:-1], dtype=torch.float32))


@torch.library.custom_op(host.op_name(__package__, "backward"), mutates_args=())
def _backward_op(dy: torch.Tensor, dsum: Optional[torch.Tensor], s: torch.Tensor,
                 weight: torch.Tensor, rstd: torch.Tensor, weight_offset: float,
                 has_residual: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dy, dsum = upstream_gradients(s, dy, dsum, has_residual)
    dx, dresidual, dweight = cake_rmsnorm_det_train_backward(
        dy, s, weight, rstd, dsum=dsum, has_residual=has_residual, weight_offset=weight_offset,
        grad_dtype=weight.dtype)
    return dx, (dresidual if dresidual is not None else s.new_empty(0)), dweight


@_backward_op.register_fake
def _(dy, dsum, s, weight, rstd, weight_offset, has_residual):
    return (torch.empty_like(s), torch.empty_like(s) if has_residual else s.new_empty(0),
            torch.empty_like(weight))


def _op_setup_context(ctx, inputs, output):
    x, weight, residual, eps, weight_offset = inputs
    _, s, rstd = output
    ctx.has_residual = residual is not None
    ctx.weight_offset = weight_offset
    ctx.save_for_backward(s if ctx.has_residual else x, weight, rstd)


def _op_backward(ctx, dy, dsum, drstd):
    s, weight, rstd = ctx.saved_tensors
    dx, dresidual, dweight = _backward_op(dy, dsum if ctx.has_residual else None, s, weight, rstd,
                                          ctx.weight_offset, ctx.has_residual)
    return dx, dweight, (dresidual if ctx.has_residual else None), None, None


_forward_op.register_autograd(_op_backward, setup_context=_op_setup_context)


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
    if torch.compiler.is_compiling():
        y, s, _ = _forward_op(x, weight, residual, eps, weight_offset)
        return y if residual is None else (y, s)
    return _eager_apply(x, weight, residual, eps, weight_offset)


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
