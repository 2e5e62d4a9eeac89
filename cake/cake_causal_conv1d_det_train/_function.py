"""Autograd function and public entries of the causal conv1d family.

The functional and its class come from the family skeleton (``core.autograd.Differentiable``):
eager calls launch first, then record the call in autograd; under ``torch.compile`` the opaque
custom ops ``<package>::conv1d`` / ``::conv1d_backward`` run instead. Both launch through
:func:`_forward` and :func:`_backward`.

Host path: a call's signature (``plans.signature``) keys a memo of its :class:`plans.Plan`
(validated problem, the program's entries bound to it, backward workspace size), so a call
whose signature was seen before runs only the ``recheck_*`` checks and one entry call; the
autograd backward reuses the forward's plan.

CUDA graphs: the entries never synchronize and, with ``out``/``dx``/``dweight``/``dbias``/
``workspace`` given, never allocate. cu_seqlens' values are checked (one device read) only when
the stream is not capturing; under capture only its dtype/shape/device are checked, and the
kernels stay memory-safe for any content.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..core import autograd, plans
from . import _routes
from ._validate import (DTYPES, recheck_backward, recheck_forward, validate_backward,
                        validate_forward, validate_inputs)


def _bindings(problem) -> dict:
    """The program's entries bound to a problem: sizes fixed, tensors per call."""
    sizes = {"tokens": problem.tokens, "channels": problem.channels, "num_docs": problem.num_docs,
             "doc_len": problem.doc_len, "weight_fp32": int(problem.weight_fp32)}
    return {
        "forward": (("x", "weight", "bias", "cu_seqlens", "y"), sizes),
        "backward": (("x", "weight", "bias", "cu_seqlens", "dy", "dx", "dweight", "dbias",
                      "workspace", "workspace_bytes", "grad_fp32"), sizes),
    }


# Problem -> Plan, and call signature -> Plan.
_plan = plans.Plans(__file__, _routes.select, _bindings,
                    lambda problem: {"tokens": problem.tokens, "channels": problem.channels})
_forward_plans = plans.Memo()
_backward_plans = plans.Memo()


def _forward_plan(x, weight, bias, cu_seqlens, activation, out) -> plans.Plan:
    # No closures here: their cells would be made on every call (see plans.Memo).
    key = plans.signature(x, weight, bias, cu_seqlens, out, activation)
    plan = _forward_plans.get(key)
    if plan is None:
        return _forward_plans.put(key, _plan(validate_forward(x, weight, bias, cu_seqlens,
                                                              activation, out)))
    recheck_forward(x, weight, bias, cu_seqlens, out, plan.problem)
    return plan


def _backward_plan(dy, x, weight, bias, cu_seqlens, activation, grad_dtype, dx, dweight, dbias,
                   workspace) -> plans.Plan:
    key = plans.signature(dy, x, weight, bias, cu_seqlens, dx, dweight, dbias, workspace,
                          activation, grad_dtype)
    plan = _backward_plans.get(key)
    if plan is None:
        return _backward_plans.put(key, _plan(validate_backward(
            dy, x, weight, bias, cu_seqlens, activation, grad_dtype, dx, dweight, dbias,
            workspace, _workspace_need)))
    recheck_backward(dy, x, weight, bias, cu_seqlens, dx, dweight, dbias, workspace,
                     plan.problem)
    return plan


def _workspace_need(problem) -> int:
    return _plan(problem).workspace_bytes


def _launch_forward(x, weight, bias, cu_seqlens, activation, out=None) -> tuple:
    """Validates, allocates y (unless given) and launches: ``(plan, y)``."""
    plan = _forward_plan(x, weight, bias, cu_seqlens, activation, out)
    y = torch.empty_like(x) if out is None else out
    if plan.problem.tokens:
        plan.forward(plans.stream_handle(plan.device), x, weight, bias, cu_seqlens, y)
    return plan, y


def _launch_backward(plan: plans.Plan, dy, x, weight, bias, cu_seqlens, grad_dtype, dx=None,
                     dweight=None, dbias=None, workspace=None):
    """Allocates what the caller did not provide, then launches; returns (dx, dweight, dbias)."""
    if dx is None:
        dx = torch.empty_like(x)
    if dweight is None:
        dweight = torch.empty_like(weight, dtype=grad_dtype)
    if dbias is None and bias is not None:
        dbias = torch.empty_like(bias, dtype=grad_dtype)
    workspace, size = plans.workspace_or_new(plan, workspace, x)
    plan.backward(plans.stream_handle(plan.device), x, weight, bias, cu_seqlens, dy, dx, dweight,
                  dbias, workspace, size, int(dweight.dtype == torch.float32))
    return dx, dweight, dbias


# --------------------------------------------------------------------------- public helpers


def cake_causal_conv1d_det_train_forward(
        x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None, *, activation: Optional[str] = "silu",
        out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Forward only (no autograd): ``y = silu(causal_conv1d(x))`` per document.

    Args:
        x: bf16/fp16 ``[S, C]`` (packed documents) or ``[B, T, C]`` (B documents of T tokens),
            contiguous, on a CUDA device.
        weight: ``[C, 4]``, x's dtype or fp32. bias: ``[C]`` in weight's dtype, or None.
        cu_seqlens: int32 ``[N + 1]`` document offsets on x's device (0, ..., S), or None for
            one document (``[S, C]``) or with ``[B, T, C]``.
        activation: ``"silu"`` or None (y = z).
        out: optional preallocated y (x's shape and dtype); written and returned.

    Returns:
        y, shaped like x.

    Example::

        >>> x = torch.randn(1000, 512, device="cuda", dtype=torch.bfloat16)
        >>> w = torch.randn(512, 4, device="cuda", dtype=torch.bfloat16)
        >>> cu = torch.tensor([0, 300, 1000], device="cuda", dtype=torch.int32)
        >>> y = cake_causal_conv1d_det_train_forward(x, w, None, cu)
    """
    return _launch_forward(x, weight, bias, cu_seqlens, activation, out)[1]


def cake_causal_conv1d_det_train_backward(
        dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
        bias: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None, *,
        activation: Optional[str] = "silu", grad_dtype: torch.dtype = torch.float32,
        dx: Optional[torch.Tensor] = None, dweight: Optional[torch.Tensor] = None,
        dbias: Optional[torch.Tensor] = None,
        workspace: Optional[torch.Tensor] = None) -> tuple:
    """Backward from dy (recomputes z from the inputs): returns ``(dx, dweight, dbias)``.

    Args:
        dy: like x (shape and dtype). x, weight, bias, cu_seqlens, activation: as the forward.
        grad_dtype: dtype of dweight/dbias, ``torch.float32`` (default) or the weight's dtype;
            both are accumulated in fp32.
        dx, dweight, dbias: optional preallocated outputs (``[*x.shape]`` x.dtype; ``[C, 4]``
            and ``[C]`` grad_dtype).
        workspace: optional device buffer of at least
            :func:`cake_causal_conv1d_det_train_backward_workspace_bytes` bytes, 16-byte
            aligned; with it and all outputs given, nothing is allocated.

    Returns:
        ``(dx, dweight, dbias)``; dbias is None without bias. Bitwise identical run to run.

    Example::

        >>> dy = torch.randn_like(x)
        >>> dx, dw, db = cake_causal_conv1d_det_train_backward(dy, x, w, None, cu)
    """
    plan = _backward_plan(dy, x, weight, bias, cu_seqlens, activation, grad_dtype, dx, dweight,
                          dbias, workspace)
    return _launch_backward(plan, dy, x, weight, bias, cu_seqlens, grad_dtype, dx, dweight,
                            dbias, workspace)


def cake_causal_conv1d_det_train_backward_workspace_bytes(
        x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None, *,
        activation: Optional[str] = "silu") -> int:
    """Bytes of device workspace the backward needs for these inputs (0 for S = 0).

    It depends on S, C, the bias and the program the call routes to (one fp32 partial per
    backward token tile, tap and channel). Loads (or JIT-compiles) that program.

    Example::

        >>> n = cake_causal_conv1d_det_train_backward_workspace_bytes(x, w, None, cu)
        >>> ws = torch.empty(n, dtype=torch.uint8, device="cuda")
    """
    return _plan(validate_inputs(x, weight, bias, cu_seqlens, activation)).workspace_bytes


def is_cake_causal_conv1d_det_train_supported(device: Optional[torch.device | int] = None, *,
                                              dtype: torch.dtype = torch.bfloat16) -> bool:
    """True when a CUDA device is present (``device``, default the current one), its arch is
    one the programs are built for, and ``dtype`` (x's) is bf16 or fp16. Compiles nothing."""
    return plans.supported(__file__, device, dtype, DTYPES)


# --------------------------------------------------------------------------- autograd


def _forward(x, weight, bias, cu_seqlens, activation) -> tuple:
    plan, y = _launch_forward(x, weight, bias, cu_seqlens, activation)
    return (y,), plan


def _backward(plan, constants, saved, grads) -> dict:
    x, weight, bias, cu_seqlens = saved
    (dy,) = grads
    if dy is None:  # y took no part in the loss
        return {}
    # Upstream gradients may be broadcast views (e.g. from .sum()); the kernel reads dense rows,
    # so this internal copy is needed (autograd gives dy y's shape, dtype and device).
    dy = dy.contiguous()
    if plan is None:  # under torch.compile: the forward's plan is not at hand
        plan = _backward_plan(dy, x, weight, bias, cu_seqlens, constants["activation"],
                              weight.dtype, None, None, None, None)
    dx, dweight, dbias = _launch_backward(plan, dy, x, weight, bias, cu_seqlens, weight.dtype)
    return {"x": dx, "weight": dweight, "bias": dbias}


_OP = autograd.Differentiable(
    package=__package__, name="conv1d", function_name="CakeCausalConv1dDetFunction",
    module=__name__,
    doc="""``apply(x, weight, bias, cu_seqlens, activation)``: y with a deterministic backward.

    Saves only the inputs; the backward recomputes z. Gradients come in the inputs' dtypes
    (dweight/dbias in the weight's dtype, accumulated in fp32).
    """,
    arguments="Tensor x, Tensor weight, Tensor? bias, Tensor? cu_seqlens, str? activation",
    forward=_forward,
    fake=lambda x, weight, bias, cu_seqlens, activation: (torch.empty_like(x),),
    outputs=lambda args: (0,),
    save=lambda args, results: args[:4],
    backward=_backward,
    grad_like={"x": 0, "weight": 1, "bias": 2},
)
CakeCausalConv1dDetFunction = _OP.function


def cake_causal_conv1d_det(x: torch.Tensor, weight: torch.Tensor,
                           bias: Optional[torch.Tensor] = None,
                           cu_seqlens: Optional[torch.Tensor] = None, *,
                           activation: Optional[str] = "silu") -> torch.Tensor:
    """Causal depthwise conv1d (width 4) + SiLU over packed documents, with autograd.

    For token t of document [s, e): ``z[t, c] = bias[c] + sum_k weight[c, k] * x[t-3+k, c]``
    (terms before s are 0) and ``y = silu(z)`` (or z with ``activation=None``). The backward
    is deterministic (bitwise identical run to run, process to process, stream to stream).

    Args:
        x: bf16/fp16 ``[S, C]`` with ``cu_seqlens`` (or one document), or ``[B, T, C]``.
        weight: ``[C, 4]`` in x's dtype or fp32. bias: ``[C]`` in weight's dtype, or None.
        cu_seqlens: int32 ``[N + 1]`` on x's device: 0, non-decreasing, S; or None.
        activation: ``"silu"`` (default) or None.

    Returns:
        y, shaped like x, in x's dtype.

    Example::

        >>> import torch
        >>> from cake.cake_causal_conv1d_det_train import cake_causal_conv1d_det
        >>> x = torch.randn(4096, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        >>> w = torch.randn(512, 4, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        >>> cu = torch.tensor([0, 1000, 4096], device="cuda", dtype=torch.int32)
        >>> cake_causal_conv1d_det(x, w, None, cu).float().square().sum().backward()
    """
    return _OP.functional(x, weight, bias, cu_seqlens, activation)
