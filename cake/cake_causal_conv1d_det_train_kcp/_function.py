"""Public entries of context-parallel causal conv1d: the autograd functional and its class, the
helpers without autograd, the support query, and the layout and reduction helpers."""

from __future__ import annotations

from typing import Optional

import torch

from ..core import autograd, checks, plans
from . import _step
from ._agreement import all_gather_single
from ._compute import CudaCompute, ReferenceCompute
from ._plan import CakeCausalConv1dDetKcpPlan
from ._tables import LAYOUTS, token_ranges
from ._validate import check_step, checked


def cake_causal_conv1d_det_train_kcp_token_ranges(total_tokens: int, world_size: int,
                                                  rank: int,
                                                  layout: str = "contiguous") -> list:
    """The global token ranges ``[(start, end), ...]`` rank ``rank`` of ``world_size`` holds,
    in its local order (no communication).

    contiguous: ``[(floor(r*S/P), floor((r+1)*S/P))]``; zigzag: chunk r then chunk 2P-1-r of
    the 2P chunks ``[floor(k*S/(2P)), floor((k+1)*S/(2P)))``. Ranges may be empty.

    Example::

        >>> cake_causal_conv1d_det_train_kcp_token_ranges(10, 2, 0, "zigzag")
        [(0, 2), (7, 10)]
    """
    checks.check_choice("layout", layout, LAYOUTS)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size = {world_size}, got {rank}")
    return token_ranges(int(total_tokens), int(world_size), int(rank), layout)


def cake_causal_conv1d_det_train_kcp_forward(
        x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
        plan: CakeCausalConv1dDetKcpPlan, *, activation: Optional[str] = "silu",
        out: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None,
        group=None, return_x_halo: bool = False):
    """Forward of this rank's tokens (no autograd); a collective over ``plan.group``.

    Args:
        x: ``[L, C]`` this rank's tokens (its pieces in slot order:
            :func:`cake_causal_conv1d_det_train_kcp_shard`), ``plan.dtype``, contiguous.
        weight: ``[C, 4]`` in x's dtype or fp32. bias: ``[C]`` in weight's dtype, or None.
        plan: this rank's :class:`CakeCausalConv1dDetKcpPlan`.
        activation: ``"silu"`` or None. out: optional preallocated y (x's shape and dtype).
        cu_seqlens: optional global cu_seqlens of this step: a plan built from other values is
            refused (free for the tensor the plan was built from).
        group: optional; refused unless it is the plan's group.
        return_x_halo: also return the x rows received from the other ranks (pass them to the
            backward helper so that it does not exchange x again).

    Returns:
        y ``[L, C]``, bitwise the single-rank y of these tokens; or ``(y, x_halo)``.

    Example::

        >>> x = cake_causal_conv1d_det_train_kcp_shard(x_global, plan)
        >>> y, halo = cake_causal_conv1d_det_train_kcp_forward(x, w, None, plan,
        ...                                                    return_x_halo=True)
    """
    checked(plan, lambda: check_step(x, weight, bias, plan, activation, cu_seqlens, group,
                                     outputs=(("out", out, x.shape, x.dtype),)),
            "cake_causal_conv1d_det_train_kcp_forward")
    y, x_halo = _step.forward(plan, x, weight, bias, activation, out)
    return (y, x_halo) if return_x_halo else y


def cake_causal_conv1d_det_train_kcp_backward(
        dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
        plan: CakeCausalConv1dDetKcpPlan, *, activation: Optional[str] = "silu",
        grad_dtype: torch.dtype = torch.float32, x_halo: Optional[torch.Tensor] = None,
        dx: Optional[torch.Tensor] = None, dweight: Optional[torch.Tensor] = None,
        dbias: Optional[torch.Tensor] = None, cu_seqlens: Optional[torch.Tensor] = None,
        group=None) -> tuple:
    """Backward of this rank's tokens from dy (no autograd); a collective over ``plan.group``.

    Args:
        dy: like x. x, weight, bias, plan, activation, cu_seqlens, group: as the forward.
        grad_dtype: dtype of the partials, ``torch.float32`` (default) or the weight's; they
            are accumulated in fp32 (float64 on the CPU) and cast at the end.
        x_halo: the forward's (``return_x_halo=True``); without it x is exchanged again first.
        dx, dweight, dbias: optional preallocated outputs.

    Returns:
        ``(dx, dweight_partial, dbias_partial)``: dx bitwise the single-rank dx of these
        tokens; the partials are the sums over this rank's tokens (dbias None without bias):
        sum them over the group (the caller's gradient reduction, or
        :func:`cake_causal_conv1d_det_train_kcp_reduce_weight_grads`).

    Example::

        >>> dx, dw, db = cake_causal_conv1d_det_train_kcp_backward(dy, x, w, None, plan,
        ...                                                        x_halo=halo)
    """
    checked(plan, lambda: check_step(
        x, weight, bias, plan, activation, cu_seqlens, group, dy=dy, grad_dtype=grad_dtype,
        x_halo=x_halo, outputs=(("dx", dx, x.shape, x.dtype),
                                ("dweight", dweight, weight.shape, grad_dtype),
                                ("dbias", dbias, None if bias is None else bias.shape,
                                 grad_dtype))),
        "cake_causal_conv1d_det_train_kcp_backward")
    if x_halo is None:
        x_halo = _step.exchange_x(plan, x)
    return _step.backward(plan, dy, x, weight, bias, activation, x_halo, grad_dtype, dx,
                          dweight, dbias)


def is_cake_causal_conv1d_det_train_kcp_supported(device: Optional[torch.device | int] = None,
                                                  *, dtype: torch.dtype = torch.bfloat16) -> bool:
    """True when plans on ``device`` (default: the current CUDA device) serve x of ``dtype``:
    on CUDA, bf16 or fp16 on a device whose arch the single-rank family and this package are
    built for; on the CPU (the float64 reference, for tests), bf16, fp16, fp32 or fp64. Needs
    no process group; compiles nothing.

    Example::

        >>> is_cake_causal_conv1d_det_train_kcp_supported("cpu", dtype=torch.float64)
        True
    """
    if device is not None and not isinstance(device, int) and torch.device(device).type == "cpu":
        return ReferenceCompute.supported(torch.device(device), dtype)
    return (plans.supported(__file__, device, dtype, CudaCompute.x_dtypes)
            and CudaCompute.supported(device, dtype))


class CakeCausalConv1dDetFunctionKcp(torch.autograd.Function):
    """``apply(x_local, weight, bias, plan, activation, cu_seqlens, group)``: this rank's y, with
    a backward that exchanges dy rows and returns dx and this rank's dweight/dbias partials (in
    the weight's dtype). Saves x, weight, bias and the x rows the forward received."""

    @staticmethod
    def forward(ctx, x, weight, bias, plan, activation, cu_seqlens, group):
        checked(plan, lambda: check_step(x, weight, bias, plan, activation, cu_seqlens, group),
                "cake_causal_conv1d_det_kcp")
        y, x_halo = _step.forward(plan, x, weight, bias, activation)
        ctx.plan, ctx.activation = plan, activation
        ctx.save_for_backward(x, weight, bias, x_halo)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, bias, x_halo = ctx.saved_tensors
        plan = ctx.plan
        # Upstream gradients may be broadcast views; the programs read dense rows.
        dy = dy.contiguous()
        checked(plan, lambda: None, "CakeCausalConv1dDetFunctionKcp.backward")
        dx, dweight, dbias = _step.backward(plan, dy, x, weight, bias, ctx.activation, x_halo,
                                            weight.dtype)
        return autograd.backward_result(len(ctx.needs_input_grad),
                                        {0: dx, 1: dweight, 2: dbias})


def cake_causal_conv1d_det_kcp(x_local: torch.Tensor, weight: torch.Tensor,
                               bias: Optional[torch.Tensor], plan: CakeCausalConv1dDetKcpPlan,
                               *, activation: Optional[str] = "silu",
                               cu_seqlens: Optional[torch.Tensor] = None,
                               group=None) -> torch.Tensor:
    """Context-parallel causal depthwise conv1d (width 4) + SiLU over packed documents, with
    autograd: one packed sequence split over the ranks of ``plan.group``.

    Every rank calls it with its own tokens (forward and backward are collectives). y and dx,
    gathered in layout order, are bitwise the single-rank op's
    (:func:`cake.cake_causal_conv1d_det_train.cake_causal_conv1d_det`); weight.grad and
    bias.grad get this rank's partials (the sums over its tokens), which the data- or
    context-parallel gradient reduction sums like any parameter's gradient.

    Args:
        x_local: ``[L, C]`` this rank's tokens in the plan's layout
            (:func:`cake_causal_conv1d_det_train_kcp_shard`).
        weight, bias: as the single-rank functional's.
        plan: :meth:`CakeCausalConv1dDetKcpPlan.build` of this batch's global cu_seqlens.
        activation: ``"silu"`` (default) or None.
        cu_seqlens: optional global cu_seqlens of this batch; refuses a stale plan.
        group: optional; must be the plan's group.

    Returns:
        y ``[L, C]`` in x's dtype.

    Example::

        >>> import torch, torch.distributed as dist
        >>> from cake.cake_causal_conv1d_det_train_kcp import (
        ...     CakeCausalConv1dDetKcpPlan, cake_causal_conv1d_det_kcp,
        ...     cake_causal_conv1d_det_train_kcp_shard)
        >>> dist.init_process_group("nccl")  # under torchrun, one GPU a rank
        >>> cu = torch.tensor([0, 3000, 8192], dtype=torch.int32, device="cuda")
        >>> plan = CakeCausalConv1dDetKcpPlan.build(cu, 8192, 512, torch.bfloat16,
        ...                                         layout="zigzag")
        >>> x = cake_causal_conv1d_det_train_kcp_shard(x_global, plan).requires_grad_()
        >>> y = cake_causal_conv1d_det_kcp(x, w, None, plan, cu_seqlens=cu)
        >>> y.float().square().sum().backward()  # x.grad: this rank's dx; w.grad: a partial
    """
    return CakeCausalConv1dDetFunctionKcp.apply(x_local, weight, bias, plan, activation,
                                                cu_seqlens, group)


def cake_causal_conv1d_det_train_kcp_shard(x_global: torch.Tensor,
                                           plan: CakeCausalConv1dDetKcpPlan) -> torch.Tensor:
    """This rank's rows of a global ``[S, ...]`` tensor in the plan's layout: its pieces
    concatenated in slot order, as a new contiguous tensor. No communication.

    Example::

        >>> x = cake_causal_conv1d_det_train_kcp_shard(x_global, plan)  # [plan.local_tokens, C]
    """
    if not isinstance(x_global, torch.Tensor) or x_global.dim() < 1 or \
            x_global.shape[0] != plan.total_tokens:
        got = checks.describe(x_global) if isinstance(x_global, torch.Tensor) else \
            type(x_global).__name__
        raise ValueError(f"x_global: expected a tensor [S, ...] with S = {plan.total_tokens}, "
                         f"got {got}")
    return torch.cat([x_global[p.start:p.end] for p in plan.pieces]).contiguous()


def cake_causal_conv1d_det_train_kcp_unshard(x_local: torch.Tensor,
                                             plan: CakeCausalConv1dDetKcpPlan) -> torch.Tensor:
    """The global ``[S, ...]`` tensor from every rank's ``[L, ...]`` rows, the same on every
    rank: a collective (one all_gather of the rows padded to the largest rank's; no host sync).

    Example::

        >>> y_global = cake_causal_conv1d_det_train_kcp_unshard(y, plan)
    """
    if not isinstance(x_local, torch.Tensor) or x_local.dim() < 1 or \
            x_local.shape[0] != plan.local_tokens:
        raise ValueError(f"x_local: expected a tensor [L, ...] with L = {plan.local_tokens}")
    plan.check_group(None)
    width = max(plan.local_sizes)
    padded = x_local.new_zeros((width, *x_local.shape[1:]))
    padded[:x_local.shape[0]] = x_local
    gathered = x_local.new_empty((plan.world_size * width, *x_local.shape[1:]))
    all_gather_single(gathered, padded, group=plan.group)
    return gathered.index_select(0, plan.unshard_rows(width))


def cake_causal_conv1d_det_train_kcp_reduce_weight_grads(
        dweight_partial: torch.Tensor, dbias_partial: Optional[torch.Tensor],
        plan: CakeCausalConv1dDetKcpPlan, *,
        out_dtype: Optional[torch.dtype] = None) -> tuple:
    """dweight and dbias of the whole pack: every rank's partials summed in rank order 0, 1,
    ..., P-1 (one all_gather; fp32 additions, float64 for float64 partials). A collective.

    The result is the same on every rank and bitwise the same run to run for a fixed P, layout
    and cu_seqlens. It differs from the single-rank dweight only by the grouping of the fp32
    sum over tokens (docs/families/causal_conv1d_kcp.md, "Determinism"). Returns
    ``(dweight, dbias)`` in ``out_dtype`` (default: the accumulation dtype); dbias is None when
    ``dbias_partial`` is.

    Example::

        >>> dw, db = cake_causal_conv1d_det_train_kcp_reduce_weight_grads(w.grad, None, plan)
    """
    plan.check_group(None)
    accumulate = torch.float64 if dweight_partial.dtype == torch.float64 else torch.float32
    parts = [dweight_partial.reshape(-1)]
    if dbias_partial is not None:
        parts.append(dbias_partial.reshape(-1))
    mine = torch.cat(parts).to(accumulate)
    gathered = mine.new_empty(plan.world_size * mine.numel())
    all_gather_single(gathered, mine, group=plan.group)
    rows = gathered.view(plan.world_size, -1)
    total = rows[0].clone()
    for r in range(1, plan.world_size):
        total = total + rows[r]
    total = total.to(out_dtype or accumulate)
    count = dweight_partial.numel()
    dweight = total[:count].view(dweight_partial.shape)
    dbias = total[count:].view(dbias_partial.shape) if dbias_partial is not None else None
    return dweight, dbias
