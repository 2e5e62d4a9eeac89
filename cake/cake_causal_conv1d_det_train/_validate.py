"""Host-side validation of the causal conv1d entries: every check runs before any launch and
raises ``TypeError``/``ValueError`` naming the argument (shared helpers in ``core.checks``).

``validate_*`` run in full the first time a call signature is seen (``plans.signature``);
``recheck_*`` run on every later call with that signature: the checks that read more than the
signature (cu_seqlens' values, overlap of outputs with inputs, the workspace's address).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ..core import checks

WIDTH = 4
ACTIVATIONS = ("silu", None)
DTYPES = (torch.bfloat16, torch.float16)
_X_SHAPE = "[S, C] (with cu_seqlens or one document) or [B, T, C] (B documents of T tokens)"


@dataclasses.dataclass(frozen=True)
class Problem:
    """What one call computes, as the router and the entries need it (built once per call
    signature: the fast path keeps it with the call's plan)."""

    device: torch.device
    dtype: torch.dtype
    tokens: int
    channels: int
    num_docs: int
    """Documents in cu_seqlens (0 without it)."""
    doc_len: int
    """Tokens per document without cu_seqlens (T for [B, T, C], S for [S, C])."""
    weight_fp32: bool
    has_bias: bool
    activation: str | None

    @property
    def variant(self) -> dict:
        return {"dtype": checks.dtype_name(self.dtype), "bias": self.has_bias,
                "activation": self.activation or "none"}


def validate_inputs(x, weight, bias, cu_seqlens, activation) -> Problem:
    checks.check_choice("activation", activation, ACTIVATIONS)
    checks.check_tensor("x", x, dtypes=DTYPES, ndims=(2, 3), shape_hint=_X_SHAPE)
    channels = x.shape[-1]
    checks.check_tensor("weight", weight, dtypes=(x.dtype, torch.float32), ndims=(2,),
                      shape_hint=f"[C, {WIDTH}]")
    checks.check_same_device("x", x, {"weight": weight})
    if weight.shape[1] != WIDTH:
        raise ValueError(f"weight: only width {WIDTH} is supported, got {checks.describe(weight)}")
    if weight.shape[0] != channels:
        raise ValueError(f"weight: expected [C, {WIDTH}] with C = {channels} (x's channels), "
                         f"got {checks.describe(weight)}")
    if channels < 1:
        raise ValueError(f"x: expected at least one channel, got {checks.describe(x)}")
    if bias is not None:
        checks.check_tensor("bias", bias, dtypes=(weight.dtype,), ndims=(1,),
                          shape_hint="[C] in weight's dtype")
        checks.check_same_device("x", x, {"bias": bias})
        if bias.shape[0] != channels:
            raise ValueError(f"bias: expected [C] with C = {channels}, got {checks.describe(bias)}")
    if x.dim() == 3:
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens: must be None for x of shape [B, T, C] "
                             f"(got x {checks.describe(x)}); pass x as [S, C] to pack documents")
        tokens, num_docs, doc_len = x.shape[0] * x.shape[1], 0, max(x.shape[1], 1)
    else:
        tokens = x.shape[0]
        if cu_seqlens is None:
            num_docs, doc_len = 0, max(tokens, 1)
        else:
            num_docs = checks.check_cu_seqlens("cu_seqlens", cu_seqlens, tokens=tokens,
                                             device=x.device)
            doc_len = 0
    return Problem(device=x.device, dtype=x.dtype, tokens=tokens, channels=channels,
                   num_docs=num_docs, doc_len=doc_len, weight_fp32=weight.dtype == torch.float32,
                   has_bias=bias is not None, activation=activation)


def validate_forward(x, weight, bias, cu_seqlens, activation, out) -> Problem:
    problem = validate_inputs(x, weight, bias, cu_seqlens, activation)
    if out is not None:
        checks.check_output("out", out, shape=x.shape, dtype=x.dtype, device=x.device)
        _check_forward_disjoint(x, weight, bias, cu_seqlens, out)
    return problem


def recheck_forward(x, weight, bias, cu_seqlens, out, problem: Problem) -> None:
    if cu_seqlens is not None:
        checks.check_cu_seqlens_values("cu_seqlens", cu_seqlens, tokens=problem.tokens)
    if out is not None:
        _check_forward_disjoint(x, weight, bias, cu_seqlens, out)


def _check_forward_disjoint(x, weight, bias, cu_seqlens, out) -> None:
    checks.check_disjoint({"out": out}, {"x": x, "weight": weight, "bias": bias,
                                       "cu_seqlens": cu_seqlens})


def validate_backward(dy, x, weight, bias, cu_seqlens, activation, grad_dtype, dx, dweight,
                      dbias, workspace, workspace_need: Callable[[Problem], int]) -> Problem:
    """``workspace_need(problem)`` gives the bytes the routed program needs; it is asked (once,
    as soon as the problem is known) only when a workspace is given."""
    problem = validate_inputs(x, weight, bias, cu_seqlens, activation)
    need = workspace_need(problem) if workspace is not None else 0
    checks.check_tensor("dy", dy, dtypes=(x.dtype,), ndims=(x.dim(),), shape_hint="like x")
    checks.check_same_device("x", x, {"dy": dy})
    if dy.shape != x.shape:
        raise ValueError(f"dy: expected the shape of x {list(x.shape)}, got {checks.describe(dy)}")
    if grad_dtype not in (torch.float32, weight.dtype):
        raise ValueError(f"grad_dtype: expected torch.float32 or the weight's dtype "
                         f"{weight.dtype}, got {grad_dtype!r}")
    if dx is not None:
        checks.check_output("dx", dx, shape=x.shape, dtype=x.dtype, device=x.device)
    if dweight is not None:
        checks.check_output("dweight", dweight, shape=weight.shape, dtype=grad_dtype,
                          device=x.device)
    if dbias is not None:
        if bias is None:
            raise ValueError("dbias: given, but there is no bias")
        checks.check_output("dbias", dbias, shape=bias.shape, dtype=grad_dtype, device=x.device)
    if workspace is not None:
        checks.check_workspace(workspace, device=x.device, need=need,
                             query="cake_causal_conv1d_det_train_backward_workspace_bytes")
    _check_backward_disjoint(dy, x, weight, bias, cu_seqlens, dx, dweight, dbias, workspace)
    return problem


def recheck_backward(dy, x, weight, bias, cu_seqlens, dx, dweight, dbias, workspace,
                     problem: Problem) -> None:
    if cu_seqlens is not None:
        checks.check_cu_seqlens_values("cu_seqlens", cu_seqlens, tokens=problem.tokens)
    if workspace is not None:
        checks.check_workspace_aligned(workspace)
    if dx is not None or dweight is not None or dbias is not None or workspace is not None:
        _check_backward_disjoint(dy, x, weight, bias, cu_seqlens, dx, dweight, dbias, workspace)


def _check_backward_disjoint(dy, x, weight, bias, cu_seqlens, dx, dweight, dbias,
                             workspace) -> None:
    outputs = {name: value for name, value in (("dx", dx), ("dweight", dweight),
                                               ("dbias", dbias), ("workspace", workspace))
               if value is not None}
    checks.check_disjoint(outputs, {"dy": dy, "x": x, "weight": weight, "bias": bias,
                                  "cu_seqlens": cu_seqlens})
