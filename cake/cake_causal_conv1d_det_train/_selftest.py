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


def bitwise_cases(device: torch.device) -> dict:
    """Autograd forward and backward of :func:`cake_causal_conv1d_det` over the route bands, on
    seeded inputs: the tensors by name (ci/gpu_vendored_check.py compares two builds bitwise)."""
    outputs = {}
    # (name, tokens, channels, documents, x dtype, weight dtype, bias, activation)
    table = [
        ("narrow-bf16-bias-fp32w", 4099, 200, 5, torch.bfloat16, torch.float32, True, "silu"),
        ("wide-fp16-nobias", 8191, 1024, 3, torch.float16, torch.float16, False, "silu"),
        ("wide-bf16-bias-none", 3001, 264, 1, torch.bfloat16, torch.bfloat16, True, None),
        ("long-bf16-bias", 70001, 512, 3, torch.bfloat16, torch.bfloat16, True, "silu"),
    ]
    for seed, (name, tokens, channels, docs, dtype, wdtype, bias, activation) in enumerate(table):
        gen = selftest.generator(1000 + seed)
        x = torch.randn(tokens, channels, generator=gen).to(device, dtype).requires_grad_()
        w = (torch.randn(channels, 4, generator=gen) / 2).to(device, wdtype).requires_grad_()
        b = ((torch.randn(channels, generator=gen) / 4).to(device, wdtype).requires_grad_()
             if bias else None)
        cu = torch.tensor(selftest.document_offsets(tokens, docs, gen), dtype=torch.int32,
                          device=device)
        dy = torch.randn(tokens, channels, generator=gen).to(device, dtype)
        y = cake_causal_conv1d_det(x, w, b, cu, activation=activation)
        y.backward(dy)
        outputs.update({f"{name}/y": y, f"{name}/dx": x.grad, f"{name}/dweight": w.grad})
        if b is not None:
            outputs[f"{name}/dbias"] = b.grad
    return outputs
