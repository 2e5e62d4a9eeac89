"""The checks of a KCP step, before it communicates: this rank's arguments against its plan
(host metadata only: no device access, no communication), and, with ``plan.check_steps``, one
agreement across ranks so that a refusal on one rank raises on all."""

from __future__ import annotations

from typing import Callable

import torch

from ..core import checks
from . import _agreement
from ._plan import CakeCausalConv1dDetKcpPlan
from ._tables import WIDTH

ACTIVATIONS = ("silu", None)


def _check_x(x, plan) -> None:
    shape = f"[L, C] = [{plan.local_tokens}, {plan.channels}] (this rank's tokens)"
    checks.check_tensor("x", x, dtypes=(plan.dtype,), ndims=(2,), shape_hint=shape,
                        device_type=plan.device.type)
    if x.device != plan.device:
        raise ValueError(f"x: expected a tensor on {plan.device} (the plan's device), got "
                         f"{checks.describe(x)}")
    if tuple(x.shape) != (plan.local_tokens, plan.channels):
        raise ValueError(f"x: expected shape {shape} for the plan {plan!r}, got "
                         f"{checks.describe(x)}; a plan built for another batch or group?")


def _check_parameters(x, weight, bias, plan) -> None:
    weight_dtypes = tuple(dict.fromkeys((x.dtype, torch.float32)))
    checks.check_tensor("weight", weight, dtypes=weight_dtypes, ndims=(2,),
                        shape_hint=f"[C, {WIDTH}]", device_type=plan.device.type)
    checks.check_same_device("x", x, {"weight": weight})
    if tuple(weight.shape) != (plan.channels, WIDTH):
        raise ValueError(f"weight: expected [C, {WIDTH}] with C = {plan.channels}, got "
                         f"{checks.describe(weight)}")
    if bias is not None:
        checks.check_tensor("bias", bias, dtypes=(weight.dtype,), ndims=(1,),
                            shape_hint="[C] in weight's dtype", device_type=plan.device.type)
        checks.check_same_device("x", x, {"bias": bias})
        if bias.shape[0] != plan.channels:
            raise ValueError(f"bias: expected [C] with C = {plan.channels}, got "
                             f"{checks.describe(bias)}")


def check_step(x, weight, bias, plan, activation, cu_seqlens, group, *, dy=None,
               grad_dtype=None, x_halo=None, outputs=()) -> None:
    """Raises TypeError/ValueError naming the argument; ``outputs``: (name, tensor, shape,
    dtype) of the caller's output buffers."""
    if not isinstance(plan, CakeCausalConv1dDetKcpPlan):
        raise TypeError(f"plan: expected a CakeCausalConv1dDetKcpPlan, got "
                        f"{type(plan).__name__}")
    checks.check_choice("activation", activation, ACTIVATIONS)
    _check_x(x, plan)
    _check_parameters(x, weight, bias, plan)
    if dy is not None:
        checks.check_tensor("dy", dy, dtypes=(x.dtype,), ndims=(2,), shape_hint="like x",
                            device_type=plan.device.type)
        checks.check_same_device("x", x, {"dy": dy})
        if dy.shape != x.shape:
            raise ValueError(f"dy: expected the shape of x {list(x.shape)}, got "
                             f"{checks.describe(dy)}")
    if grad_dtype is not None and grad_dtype not in (torch.float32, weight.dtype):
        raise ValueError(f"grad_dtype: expected torch.float32 or the weight's dtype "
                         f"{weight.dtype}, got {grad_dtype!r}")
    if x_halo is not None:
        checks.check_tensor("x_halo", x_halo, dtypes=(x.dtype,), ndims=(2,),
                            shape_hint="[rows, C] (the forward's x_halo)",
                            device_type=plan.device.type)
        rows = plan.exchanges["x"]
        want = (rows.received_rows if plan.exchange == "p2p" else
                plan.world_size * rows.pack_rows) if rows.needed else 0
        if tuple(x_halo.shape) != (want, plan.channels) or x_halo.device != x.device:
            raise ValueError(f"x_halo: expected [{want}, {plan.channels}] on {x.device} (what "
                             f"this plan's forward returns), got {checks.describe(x_halo)}")
    given = {name: value for name, value, _, _ in outputs if value is not None}
    for name, value, shape, dtype in outputs:
        if value is not None and shape is None:  # dbias without a bias
            raise ValueError(f"{name}: given, but there is no bias")
        if value is not None:
            checks.check_output(name, value, shape=shape, dtype=dtype, device=x.device)
    # The base programs check this too, but only after the exchange has started.
    checks.check_disjoint(given, {"x": x, "weight": weight, "bias": bias, "dy": dy,
                                  "x_halo": x_halo})
    if cu_seqlens is not None:
        plan.check_cu_seqlens(cu_seqlens)
    plan.check_group(group)


def checked(plan, check: Callable[[], None], where: str) -> None:
    """Runs a step's checks; with ``plan.check_steps``, every rank then agrees (one all_gather
    and a host read), so that a refusal on any rank raises on every rank."""
    if not (isinstance(plan, CakeCausalConv1dDetKcpPlan) and plan.check_steps
            and plan.group is not None):
        check()
        return
    refused = None
    try:
        check()
    except (TypeError, ValueError) as error:
        refused = _agreement.Refusal("step", error)
    mine = _agreement.row(refused=refused, world=plan.world_size, dtype=plan.dtype,
                          channels=plan.channels, layout=plan.layout, exchange=plan.exchange,
                          total=plan.total_tokens, digest=plan._digest, check_steps=True)
    rows = _agreement.gather_rows(mine, plan.group, plan.world_size,
                                  _agreement.device_for(plan.group))
    _agreement.raise_disagreement(rows, refused, f"{where} (plans of this step)")
