"""``python -m cake selftest`` on a GPU: forward and backward against the float64 reference."""

from __future__ import annotations

import torch

from ..core import selftest
from ._function import cake_causal_conv1d_det
from .reference import causal_conv1d_reference, causal_conv1d_reference_backward

# bf16 outputs carry a relative rounding of 2^-8 per element; norm-wise that stays under 1e-2.
TOLERANCE = 1e-2


def run(device_index: int) -> list:
    device = torch.device("cuda", device_index)
    generator = torch.Generator(device=device).manual_seed(20261129)
    tokens, channels = 3000, 264
    x = torch.randn(tokens, channels, device=device, dtype=torch.bfloat16, generator=generator)
    weight = torch.randn(channels, 4, device=device, dtype=torch.bfloat16, generator=generator)
    bias = torch.randn(channels, device=device, dtype=torch.bfloat16, generator=generator)
    dy = torch.randn(tokens, channels, device=device, dtype=torch.bfloat16, generator=generator)
    cu = torch.tensor([0, 1, 3, 1200, tokens], device=device, dtype=torch.int32)

    def compute():
        leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
        y = cake_causal_conv1d_det(*leaves, cu)
        y.backward(dy)
        return {"y": y, "dx": leaves[0].grad, "dweight": leaves[1].grad,
                "dbias": leaves[2].grad}

    dx, dweight, dbias = causal_conv1d_reference_backward(dy, x, weight, bias, cu)
    reference = {"y": causal_conv1d_reference(x, weight, bias, cu), "dx": dx,
                 "dweight": dweight, "dbias": dbias}
    return [selftest.selftest_case(f"packed bf16 S={tokens} C={channels}, 4 documents", compute,
                               reference, tolerance=TOLERANCE)]
