"""The RMSNorm families' bitwise cases (their ``_selftest.bitwise_cases``)."""

from __future__ import annotations

import torch

from ..core import selftest


def bitwise_cases(function, device: torch.device, gated: bool) -> dict:
    """Autograd forward and backward of (gated) RMSNorm ``function`` on seeded inputs: scalar and
    vector loads, residual, weight offset; the tensors by name."""
    outputs = {}
    # (name, rows, D, x dtype, weight dtype, residual, weight_offset)
    table = [
        ("vector-bf16-fp32w", 4097, 4096, torch.bfloat16, torch.float32, False, 0.0),
        ("scalar-fp16-residual", 1000, 1001, torch.float16, torch.float16, True, 0.0),
        ("vector-fp32-offset", 257, 16384, torch.float32, torch.float32, False, 1.0),
        ("scalar-bf16-residual", 3333, 77, torch.bfloat16, torch.bfloat16, True, 0.0),
    ]
    for seed, (name, rows, cols, dtype, wdtype, residual, offset) in enumerate(table):
        gen = selftest.generator(2000 + seed + (100 if gated else 0))
        x = torch.randn(rows, cols, generator=gen).to(device, dtype).requires_grad_()
        g = (torch.randn(rows, cols, generator=gen).to(device, dtype).requires_grad_()
             if gated else None)
        w = (torch.rand(cols, generator=gen) + 0.5 - offset).to(device, wdtype).requires_grad_()
        r = (torch.randn(rows, cols, generator=gen).to(device, dtype).requires_grad_()
             if residual else None)
        inputs = (x, g, w) if gated else (x, w)
        result = function(*inputs, r, eps=1e-6, weight_offset=offset)
        results = list(result) if residual else [result]
        grads = [torch.randn(rows, cols, generator=gen).to(device, dtype) for _ in results]
        torch.autograd.backward(results, grads)
        outputs[f"{name}/y"] = results[0]
        if residual:
            outputs[f"{name}/s"] = results[1]
            outputs[f"{name}/dresidual"] = r.grad
        outputs.update({f"{name}/dx": x.grad, f"{name}/dweight": w.grad})
        if gated:
            outputs[f"{name}/dg"] = g.grad
    return outputs
