"""One KCP step, forward and backward (docs/families/causal_conv1d_kcp.md, "Step flow").

Forward: pack and start the x exchange; the main pass (the single-rank forward over all local
tokens, cut at piece starts and document boundaries: right for every token but the first <= 3
of a piece whose document started earlier); wait; the forward windows (those edge tokens in
their full context, one run of the single-rank forward on a small stacked tensor), scattered
over the main pass's rows.

Backward: pack and start the dy exchange; the main pass (the single-rank backward: dx right for
every token but the edges and the last <= 3 of a piece whose document goes on; the weight
gradient of every local token, the edges' from a truncated context); the weight-gradient fix-up
(needs no dy from others, so it runs while dy travels); wait; the dx windows, scattered over the
main pass's rows. The weight-gradient partial is the main pass's plus the fix-up's.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _buffers, _exchange


def _windows_rows(plan, codes, local, exchanged, dtype) -> torch.Tensor:
    """The rows ``codes`` name (a window stack's x or dy), gathered into a new tensor."""
    out = _buffers.empty((codes.shape[0], local.shape[1]), dtype, local.device)
    plan.compute.gather(codes, local, exchanged, out)
    return out


def _started(plan, source: torch.Tensor, kind: str) -> _exchange.Pending:
    pending = _exchange.start(plan, source, kind)
    if not plan.overlap:  # measuring: the exchange not hidden behind the main pass
        pending = _exchange.Pending([], pending.finish())
    return pending


def forward(plan, x, weight, bias, activation, out: Optional[torch.Tensor] = None) -> tuple:
    """This rank's y, and the x rows it received (``x_halo``, for the backward)."""
    y = out if out is not None else _buffers.empty(x.shape, x.dtype, x.device)
    pending = _started(plan, x, "x")
    plan.compute.forward(x, weight, bias, plan.local_cu_seqlens, activation, y)
    x_halo = pending.finish()
    windows = plan.forward_windows
    if windows.rows:
        dtype = plan.compute.window_dtype(x.dtype)
        x_windows = _windows_rows(plan, windows.x_codes, x, x_halo, dtype)
        y_windows = _buffers.empty(x_windows.shape, dtype, x.device)
        plan.compute.forward(x_windows, weight, bias, windows.cu_seqlens, activation, y_windows)
        plan.compute.scatter(y_windows, windows.targets, y)
    return y, x_halo


def exchange_x(plan, x) -> torch.Tensor:
    """The x rows the forward receives, exchanged again (a backward without the forward's)."""
    return _exchange.start(plan, x, "x").finish()


def _weight_fixup(plan, dy, x, weight, bias, activation, x_halo) -> Optional[tuple]:
    """The weight-gradient partials of the edge tokens' full context minus those of the context
    the main pass gave them (their dy negated), or None without edges."""
    windows = plan.fixup_windows
    if not windows.rows:
        return None
    dtype = plan.compute.window_dtype(x.dtype)
    x_windows = _windows_rows(plan, windows.x_codes, x, x_halo, dtype)
    dy_windows = _windows_rows(plan, windows.dy_codes, dy, None, dtype)
    dx_windows = _buffers.empty(x_windows.shape, dtype, x.device)
    return plan.compute.backward(dy_windows, x_windows, weight, bias, windows.cu_seqlens,
                                 activation, dx_windows)


def _dx_windows(plan, dy, dy_halo, x, x_halo, weight, bias, activation, dx) -> None:
    windows = plan.dx_windows
    if not windows.rows:
        return
    dtype = plan.compute.window_dtype(x.dtype)
    x_windows = _windows_rows(plan, windows.x_codes, x, x_halo, dtype)
    dy_windows = _windows_rows(plan, windows.dy_codes, dy, dy_halo, dtype)
    dx_windows = _buffers.empty(x_windows.shape, dtype, x.device)
    plan.compute.backward(dy_windows, x_windows, weight, bias, windows.cu_seqlens, activation,
                          dx_windows)
    plan.compute.scatter(dx_windows, windows.targets, dx)


def _partial(main: Optional[torch.Tensor], fix: Optional[torch.Tensor], dtype: torch.dtype,
             out: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """main (+ fix), in the accumulation dtype, then cast to ``dtype`` (into ``out`` if given)."""
    if main is None:
        return None
    total = main if fix is None else main + fix
    if out is None:
        return total.to(dtype)
    return out.copy_(total)


def backward(plan, dy, x, weight, bias, activation, x_halo, grad_dtype: torch.dtype,
             dx: Optional[torch.Tensor] = None, dweight: Optional[torch.Tensor] = None,
             dbias: Optional[torch.Tensor] = None) -> tuple:
    """This rank's dx and its (dweight, dbias) partials in ``grad_dtype``."""
    dx = dx if dx is not None else _buffers.empty(x.shape, x.dtype, x.device)
    pending = _started(plan, dy, "dy")
    dweight_main, dbias_main = plan.compute.backward(dy, x, weight, bias, plan.local_cu_seqlens,
                                                     activation, dx)
    fixup = _weight_fixup(plan, dy, x, weight, bias, activation, x_halo) or (None, None)
    dy_halo = pending.finish()
    _dx_windows(plan, dy, dy_halo, x, x_halo, weight, bias, activation, dx)
    return (dx, _partial(dweight_main, fixup[0], grad_dtype, dweight),
            _partial(dbias_main, fixup[1], grad_dtype, dbias))
