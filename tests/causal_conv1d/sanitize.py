#!/usr/bin/env python3
"""Representative small launches of every kernel kind, for compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 1 python tests/causal_conv1d/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python tests/causal_conv1d/sanitize.py

Covers: the narrow, wide and wide_long tiles; 16-byte and scalar access (C % 8 != 0 and a
misaligned x); fp32 and activation-dtype weights and gradients; [B, T, C] input; S = 0, 1;
and garbage cu_seqlens passed straight to the launcher (as under graph capture), which must
stay in bounds. Exits 0 after a device synchronize; sanitizer findings set the exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from cake.cake_causal_conv1d_det_train import (  # noqa: E402
    cake_causal_conv1d_det_train_backward, cake_causal_conv1d_det_train_forward)
from cake.cake_causal_conv1d_det_train import _function  # noqa: E402
from cake.cake_causal_conv1d_det_train._validate import validate_inputs  # noqa: E402
from cake.core import plans  # noqa: E402


def inputs(tokens, channels, *, dtype=torch.bfloat16, wdtype=None, misaligned=False, seed=0):
    torch.manual_seed(seed)
    if misaligned:
        x = torch.randn(tokens * channels + 1, device="cuda").to(dtype)[1:].view(tokens, channels)
    else:
        x = torch.randn(tokens, channels, device="cuda").to(dtype)
    w = torch.randn(channels, 4, device="cuda").to(wdtype or dtype)
    b = torch.randn(channels, device="cuda").to(wdtype or dtype)
    dy = torch.randn_like(x)
    return x, w, b, dy


def run(tokens, channels, cu_lengths=None, **kwargs):
    x, w, b, dy = inputs(tokens, channels, **kwargs)
    cu = None
    if cu_lengths is not None:
        cu = torch.tensor([0] + torch.tensor(cu_lengths).cumsum(0).tolist(), dtype=torch.int32,
                          device="cuda")
    cake_causal_conv1d_det_train_forward(x, w, b, cu)
    cake_causal_conv1d_det_train_backward(dy, x, w, b, cu)
    cake_causal_conv1d_det_train_backward(dy, x, w, None, cu, activation=None,
                                          grad_dtype=w.dtype)


def garbage_cu(tokens, channels):
    """Bypasses host validation (as graph capture does) with nonsense offsets."""
    x, w, b, dy = inputs(tokens, channels)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    dw, db = torch.empty_like(w, dtype=torch.float32), torch.empty_like(b, dtype=torch.float32)
    for values in ([5, -7, 100000, 2, tokens - 1, 1 << 30, -1], [0, -(1 << 31)],
                   [tokens + 50, 3]):
        cu = torch.tensor(values, dtype=torch.int32, device="cuda")
        good = validate_inputs(x, w, b, None, "silu")
        problem = type(good)(**{**good.__dict__, "num_docs": len(values) - 1, "doc_len": 0})
        plan = _function._plan(problem)
        need = plan.workspace_bytes
        ws = torch.empty(need, dtype=torch.uint8, device="cuda")
        stream = plans.stream_handle(plan.device)
        # The plan's entries, bound to the problem (tensors per call), as the helpers call them.
        plan.forward(stream, x, w, b, cu, y)
        plan.backward(stream, x, w, b, cu, dy, dx, dw, db, ws, need, int(dw.dtype == torch.float32))


def main() -> int:
    run(37, 264, [1, 2, 3, 0, 31])                 # wide tile, vectors
    run(37, 263, [5, 32])                          # wide tile, scalar path
    run(300, 64, [1] * 300)                        # narrow tile, length-1 documents
    run(301, 7, [100, 201], wdtype=torch.float32)  # narrow, scalar, fp32 weights
    run(129, 72, None, misaligned=True)            # C % 8 == 0 but x misaligned: scalar path
    run(1, 8, [1])
    run(0, 16, [0])
    run(65537, 256, [3, 65000, 534], dtype=torch.float16)  # wide_long (token floor 65536)
    x, w, b, dy = inputs(3 * 50, 24)
    cake_causal_conv1d_det_train_backward(dy.view(3, 50, 24), x.view(3, 50, 24), w, b)
    garbage_cu(200, 40)
    garbage_cu(70000, 256)
    torch.cuda.synchronize()
    print("sanitize: ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
