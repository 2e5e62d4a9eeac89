"""What a KCP step computes with: the single-rank family's forward and backward, and the row
moves of this package's ``_kcp`` program (gather, scatter).

:class:`CudaCompute` runs the family's programs (``cake.cake_causal_conv1d_det_train``: its
public helpers, which take cu_seqlens and every output) and the ``_kcp`` program, so that y and
dx of every token come from the very libraries that compute the single-rank op.
:class:`ReferenceCompute` is the CPU path (the tests'): the family's float64 reference with a
position-independent exp, and the row moves' semantics (``kcp_config.h``) in torch index ops.

This is the one module of the package that imports the single-rank family (a relative sibling
import: a vendored copy carries both packages side by side).
"""

from __future__ import annotations

from typing import Optional

import torch

from ..cake_causal_conv1d_det_train import (cake_causal_conv1d_det_train_backward,
                                            cake_causal_conv1d_det_train_forward,
                                            is_cake_causal_conv1d_det_train_supported, reference)
from . import _buffers, _program
from ._tables import CODE_BITS, EXCHANGED_BIT, NEGATE_BIT, ROW_MASK


class CudaCompute:
    """The family's programs and the ``_kcp`` row moves; windows in x's dtype, weight-gradient
    partials in fp32."""

    x_dtypes = (torch.bfloat16, torch.float16)

    @staticmethod
    def window_dtype(x_dtype: torch.dtype) -> torch.dtype:
        return x_dtype

    @staticmethod
    def supported(device: torch.device, dtype: torch.dtype) -> bool:
        return is_cake_causal_conv1d_det_train_supported(device, dtype=dtype)

    @staticmethod
    def load(device: torch.device) -> None:
        """Loads the ``_kcp`` program for ``device`` (at plan build, so that a device it cannot
        run on is refused before any step)."""
        _program.entries(device)

    @staticmethod
    def forward(x, weight, bias, cu_seqlens, activation, out) -> None:
        cake_causal_conv1d_det_train_forward(x, weight, bias, cu_seqlens, activation=activation,
                                             out=out)

    @staticmethod
    def backward(dy, x, weight, bias, cu_seqlens, activation, dx) -> tuple:
        """dx into ``dx``; returns the fp32 (dweight, dbias) of these tokens."""
        dweight = _buffers.empty(weight.shape, torch.float32, x.device)
        dbias = None if bias is None else _buffers.empty(bias.shape, torch.float32, x.device)
        cake_causal_conv1d_det_train_backward(dy, x, weight, bias, cu_seqlens,
                                              activation=activation, grad_dtype=torch.float32,
                                              dx=dx, dweight=dweight, dbias=dbias)
        return dweight, dbias

    gather = staticmethod(_program.gather)
    scatter = staticmethod(_program.scatter)


# Position-independent exp for the CPU reference: torch's CPU sigmoid (which the family's
# reference uses) takes a vector path and a scalar path for the leftover elements, whose results
# differ by an ulp, so one token could get two values in two tensors. Here every element is
# computed in a full vector of copies of itself, so it takes the vector path wherever it sits
# (tests: test_reference_exp_is_position_independent). The one switch: set to torch.exp to see
# the difference it makes.
_LANES = 16  # a multiple of every vector width of float64 (2, 4, 8) and of their unrolling


def _lane_exp(z: torch.Tensor) -> torch.Tensor:
    flat = z.reshape(-1, 1).expand(-1, _LANES).contiguous()
    return torch.exp(flat)[:, 0].reshape(z.shape)


_exp = _lane_exp


def _sigmoid(z: torch.Tensor) -> torch.Tensor:
    return 1 / (1 + _exp(-z))


class ReferenceCompute:
    """The CPU path: the family's float64 reference (``reference.pre_activation`` and its
    written-out backward) with a position-independent exp; windows and partials in float64."""

    x_dtypes = (torch.bfloat16, torch.float16, torch.float32, torch.float64)

    @staticmethod
    def window_dtype(x_dtype: torch.dtype) -> torch.dtype:
        return torch.float64

    @staticmethod
    def supported(device: torch.device, dtype: torch.dtype) -> bool:
        return dtype in ReferenceCompute.x_dtypes

    @staticmethod
    def load(device: torch.device) -> None:
        """Nothing to load on the CPU."""

    @staticmethod
    def forward(x, weight, bias, cu_seqlens, activation, out) -> None:
        z = reference.pre_activation(x, weight, bias, cu_seqlens)
        out.copy_(z * _sigmoid(z) if activation == "silu" else z)

    @staticmethod
    def backward(dy, x, weight, bias, cu_seqlens, activation, dx) -> tuple:
        """dx into ``dx``; returns the float64 (dweight, dbias) of these tokens. dz is formed
        here (the position-independent exp) and handed to the reference's backward as its
        upstream gradient with no activation, which then runs the same formulas."""
        dz = dy.to(torch.float64)
        if activation == "silu":
            z = reference.pre_activation(x, weight, bias, cu_seqlens)
            s = _sigmoid(z)
            dz = dz * s * (1 + z * (1 - s))
        dx64, dweight, dbias = reference.causal_conv1d_reference_backward(
            dz, x, weight, bias, cu_seqlens, activation=None)
        dx.copy_(dx64)
        return dweight, dbias

    @staticmethod
    def gather(codes: torch.Tensor, local: torch.Tensor, exchanged: Optional[torch.Tensor],
               out: torch.Tensor) -> None:
        """The ``_kcp`` gather's semantics (kcp_config.h), in float64: ``out[i]`` = the row
        ``codes[i]`` names, zero for a negative code, an unknown bit or a row past its source,
        negated (-0 for a zero) when bit 41 is set."""
        valid = (codes >= 0) & ((codes & ~CODE_BITS) == 0)
        row = codes & ROW_MASK
        from_exchanged = (codes & EXCHANGED_BIT) != 0
        values = torch.zeros(out.shape, dtype=torch.float64, device=out.device)
        for source, mask in ((local, valid & ~from_exchanged), (exchanged, valid & from_exchanged)):
            rows = 0 if source is None else source.shape[0]
            take = mask & (row < rows)
            if bool(take.any()):
                values[take] = source[row[take]].to(torch.float64)
        negate = valid & ((codes & NEGATE_BIT) != 0)
        values[negate] = -values[negate]
        out.copy_(values)

    @staticmethod
    def scatter(src: torch.Tensor, targets: torch.Tensor, out: torch.Tensor) -> None:
        """The ``_kcp`` scatter's semantics: ``out[targets[i]] = src[i]`` where
        ``0 <= targets[i] < rows of out`` (cast to out's dtype)."""
        keep = (targets >= 0) & (targets < out.shape[0])
        out[targets[keep]] = src[keep].to(out.dtype)


def compute_for(device: torch.device):
    """The compute of a plan on ``device``: the programs on CUDA, the reference on the CPU."""
    return CudaCompute if device.type == "cuda" else ReferenceCompute

