"""Entries of the row-scale test family, on the family skeleton (``core.autograd``).

x: ``[rows, cols]`` fp32/fp16/bf16 with cols a multiple of 16 (the kernels' hint), contiguous;
scale: ``[rows]`` fp32. On CPU tensors with ``TRITON_INTERPRET=1`` the programs run in Triton's
interpreter, through the same checks, plans and autograd.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..core import autograd, checks, plans

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class Problem:
    device: torch.device
    dtype: torch.dtype
    rows: int
    cols: int


def _validate(x, scale) -> Problem:
    device_type = checks.triton_device_type(x)
    checks.check_tensor("x", x, dtypes=DTYPES, ndims=(2,), shape_hint="[rows, cols]",
                        device_type=device_type)
    checks.check_tensor("scale", scale, dtypes=(torch.float32,), ndims=(1,),
                        shape_hint="[rows] float32", device_type=device_type)
    checks.check_same_device("x", x, {"scale": scale})
    rows, cols = x.shape
    if scale.shape[0] != rows:
        raise ValueError(f"scale: expected [rows] = [{rows}], got {checks.describe(scale)}")
    if cols % 16:
        raise ValueError(f"x: expected cols a multiple of 16, got {checks.describe(x)}")
    return Problem(x.device, x.dtype, rows, cols)


def _select(manifest, problem: Problem, arch):
    return plans.select_program(manifest, variant={"dtype": checks.dtype_name(problem.dtype)},
                                arch=arch, bands={}, floors={})


def _bindings(problem: Problem) -> dict:
    grid = {"grid_x": problem.rows, "grid_y": 1, "grid_z": 1, "cols": problem.cols}
    return {"scale": (("x", "y", "scale"), grid), "dot": (("x", "dy", "out"), grid)}


_plan = plans.Plans(__file__, _select, _bindings)


def cake_rowscale_det_train_forward(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``y = x * scale[:, None]`` (no autograd)."""
    plan = _plan(_validate(x, scale))
    y = torch.empty_like(x)
    plan.scale(plans.stream_handle(plan.device), x, y, scale)
    return y


def cake_rowscale_det_train_backward(dy: torch.Tensor, x: torch.Tensor,
                                     scale: torch.Tensor) -> tuple:
    """``(dx, dscale)``: ``dx = dy * scale[:, None]``, ``dscale = (dy * x).sum(-1)`` in fp32."""
    plan = _plan(_validate(x, scale))
    checks.check_tensor("dy", dy, dtypes=(x.dtype,), ndims=(2,), shape_hint="like x",
                        device_type=checks.triton_device_type(x))
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the shape of x, got {checks.describe(dy)}")
    stream = plans.stream_handle(plan.device)
    dx = torch.empty_like(x)
    dscale = torch.empty_like(scale)
    plan.scale(stream, dy, dx, scale)
    plan.dot(stream, x, dy, dscale)
    return dx, dscale


def is_cake_rowscale_det_train_supported(device: Optional[torch.device | int] = None, *,
                                         dtype: torch.dtype = torch.float32) -> bool:
    return plans.supported(__file__, device, dtype, DTYPES)


def _forward(x, scale) -> tuple:
    return (cake_rowscale_det_train_forward(x, scale),), None


def _backward(plan, constants, saved, grads) -> dict:
    x, scale = saved
    (dy,) = grads
    if dy is None:
        return {}
    dx, dscale = cake_rowscale_det_train_backward(dy.contiguous(), x, scale)
    return {"x": dx, "scale": dscale}


_OP = autograd.Differentiable(
    package=__package__, name="rowscale", function_name="CakeRowscaleDetFunction",
    module=__name__, doc="``apply(x, scale)``: x * scale[:, None].",
    arguments="Tensor x, Tensor scale", forward=_forward,
    fake=lambda x, scale: (torch.empty_like(x),), outputs=lambda args: (0,),
    save=lambda args, results: args, backward=_backward, grad_like={"x": 0, "scale": 1})
CakeRowscaleDetFunction = _OP.function


def cake_rowscale_det(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x * scale[:, None]`` with autograd (dx in x's dtype, dscale fp32)."""
    return _OP.functional(x, scale)
