"""Host-side validation of the RMSNorm entries: every check runs before any launch and raises
``TypeError``/``ValueError`` naming the argument (shared with the gated family in
``core.rmsnorm``, built on ``core.host``)."""

from __future__ import annotations

from ..core import rmsnorm
from ..core.rmsnorm import Problem

__all__ = ["Problem", "validate_backward", "validate_forward"]


def validate_forward(x, weight, residual, eps, weight_offset, out, residual_out, rstd) -> Problem:
    return rmsnorm.validate_forward(x=x, gate=None, weight=weight, residual=residual, eps=eps,
                                    weight_offset=weight_offset, gated=False, out=out,
                                    residual_out=residual_out, rstd=rstd)


def validate_backward(dy, x, weight, rstd, dsum, weight_offset, has_residual, grad_dtype, dx,
                      dresidual, dweight, workspace, workspace_bytes) -> Problem:
    return rmsnorm.validate_backward(dy=dy, x=x, gate=None, weight=weight, rstd=rstd, dsum=dsum,
                                     weight_offset=weight_offset, gated=False,
                                     has_residual=has_residual, grad_dtype=grad_dtype, dx=dx,
                                     dg=None, dresidual=dresidual, dweight=dweight,
                                     workspace=workspace, workspace_bytes=workspace_bytes)
