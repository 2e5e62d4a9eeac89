"""Plain PyTorch float64 reference of the causal conv1d family (tests and documentation).

For token t of the document [s, e) that holds it::

    z[t, c] = bias[c] + sum_{k=0..3} weight[c, k] * x[t - 3 + k, c]   (terms with t - 3 + k < s are 0)
    y[t, c] = silu(z[t, c])   (activation "silu"), or z (activation None)

and for the backward from dy: ``dz = dy * silu'(z)``, ``dx[t] = sum_k weight[:, k] *
dz[t + 3 - k]`` (terms past the document end are 0), ``dweight[c, k] = sum_t dz[t, c] *
x[t - 3 + k, c]`` (same masking as z), ``dbias = sum_t dz``. Everything is computed in float64
on the inputs' device; the backward is written out (not autograd) so that tests can check it
against ``torch.autograd.gradcheck`` of :func:`causal_conv1d_reference`.
"""

from __future__ import annotations

import torch

WIDTH = 4


def document_starts(tokens: int, cu_seqlens: torch.Tensor | None, device) -> torch.Tensor:
    """start[t]: the first token of the document holding token t (int64, [S])."""
    t = torch.arange(tokens, device=device, dtype=torch.int64)
    if cu_seqlens is None:
        return torch.zeros_like(t)
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    doc = torch.searchsorted(cu, t, right=True) - 1
    return cu[doc]


def _flatten(x: torch.Tensor, cu_seqlens: torch.Tensor | None):
    """(S, C) view and the cu_seqlens that (B, T, C) input means (B documents of T tokens)."""
    if x.dim() == 3:
        batch, length, channels = x.shape
        cu = torch.arange(0, batch * length + 1, max(length, 1), dtype=torch.int64)
        if length == 0:
            cu = torch.zeros(batch + 1, dtype=torch.int64)
        return x.reshape(batch * length, channels), cu
    return x, cu_seqlens


def _shifted(x: torch.Tensor, starts: torch.Tensor, shift: int) -> torch.Tensor:
    """x[t - shift] where t - shift >= start[t], else 0."""
    if shift == 0:
        return x
    tokens = x.shape[0]
    out = torch.zeros_like(x)
    if tokens > shift:
        out[shift:] = x[:-shift]
    t = torch.arange(tokens, device=x.device)
    return out * (t - shift >= starts).unsqueeze(1).to(x.dtype)


def _ahead(x: torch.Tensor, starts: torch.Tensor, shift: int) -> torch.Tensor:
    """x[t + shift] where t + shift is in the same document as t, else 0."""
    if shift == 0:
        return x
    tokens = x.shape[0]
    out = torch.zeros_like(x)
    same = torch.zeros(tokens, dtype=torch.bool, device=x.device)
    if tokens > shift:
        out[:-shift] = x[shift:]
        same[:-shift] = starts[shift:] == starts[:-shift]
    return out * same.unsqueeze(1).to(x.dtype)


def pre_activation(x, weight, bias=None, cu_seqlens=None) -> torch.Tensor:
    """z in float64, shaped like x."""
    flat, cu = _flatten(x, cu_seqlens)
    x64 = flat.to(torch.float64)
    w64 = weight.to(device=x.device, dtype=torch.float64)
    starts = document_starts(flat.shape[0], cu, x.device)
    z = torch.zeros_like(x64)
    if bias is not None:
        z = z + bias.to(device=x.device, dtype=torch.float64)
    for k in range(WIDTH):
        z = z + w64[:, k] * _shifted(x64, starts, WIDTH - 1 - k)
    return z.reshape(x.shape)


def causal_conv1d_reference(x, weight, bias=None, cu_seqlens=None, *,
                            activation: str | None = "silu") -> torch.Tensor:
    """y in float64, shaped like x. Differentiable (for gradcheck on float64 inputs)."""
    z = pre_activation(x, weight, bias, cu_seqlens)
    return torch.nn.functional.silu(z) if activation == "silu" else z


def causal_conv1d_reference_backward(dy, x, weight, bias=None, cu_seqlens=None, *,
                                     activation: str | None = "silu"):
    """(dx, dweight, dbias) in float64; dbias is None without bias."""
    flat, cu = _flatten(x, cu_seqlens)
    starts = document_starts(flat.shape[0], cu, x.device)
    x64 = flat.to(torch.float64)
    w64 = weight.to(device=x.device, dtype=torch.float64)
    g = dy.reshape(flat.shape).to(torch.float64)
    if activation == "silu":
        z = pre_activation(x, weight, bias, cu_seqlens).reshape(flat.shape)
        s = torch.sigmoid(z)
        dz = g * s * (1 + z * (1 - s))
    else:
        dz = g
    dx = torch.zeros_like(x64)
    dweight = torch.empty(flat.shape[1], WIDTH, dtype=torch.float64, device=x.device)
    for k in range(WIDTH):
        dx = dx + w64[:, k] * _ahead(dz, starts, WIDTH - 1 - k)
        dweight[:, k] = (dz * _shifted(x64, starts, WIDTH - 1 - k)).sum(0)
    dbias = dz.sum(0) if bias is not None else None
    return dx.reshape(x.shape), dweight, dbias
