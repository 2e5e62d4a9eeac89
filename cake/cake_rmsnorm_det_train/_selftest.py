"""``python -m cake selftest`` on a GPU: forward and backward against the float64 reference."""

from __future__ import annotations

import torch

from .._shared import rmsnorm_selftest
from ..core import selftest
from ._function import cake_rmsnorm_det
from .reference import reference_backward, reference_forward

# bf16 outputs carry a relative rounding of 2^-8 per element; norm-wise that stays under 1e-2.
TOLERANCE = 1e-2


def run(device_index: int) -> list:
    device = torch.device("cuda", device_index)
    generator = torch.Generator(device=device).manual_seed(20261129)
    rows, width = 1000, 4100
    x = torch.randn(rows, width, device=device, dtype=torch.bfloat16, generator=generator)
    weight = torch.randn(width, device=device, dtype=torch.bfloat16, generator=generator)
    dy = torch.randn(rows, width, device=device, dtype=torch.bfloat16, generator=generator)

    def compute():
        leaves = [t.detach().requires_grad_() for t in (x, weight)]
        y = cake_rmsnorm_det(*leaves)
        y.backward(dy)
        return {"y": y, "dx": leaves[0].grad, "dweight": leaves[1].grad}

    y, _, _ = reference_forward(x, weight)
    dx, dweight = reference_backward(dy, x, weight)[:2]
    return [selftest.selftest_case(f"bf16 T={rows} D={width}", compute,
                                   {"y": y, "dx": dx, "dweight": dweight}, tolerance=TOLERANCE)]


def bitwise_cases(device: torch.device) -> dict:
    """Seeded autograd cases, the tensors by name (ci/gpu_vendored_check.py compares builds)."""
    return rmsnorm_selftest.bitwise_cases(cake_rmsnorm_det, device, gated=False)
