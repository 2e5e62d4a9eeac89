#!/usr/bin/env python3
"""Representative small launches of every RMSNorm kernel, for compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 1 python tests/rmsnorm/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python tests/rmsnorm/sanitize.py

Covers both families; bf16, fp16 and fp32; the aligned and unaligned routes (D % 8 != 0 and a
misaligned x), up to the widest rows; narrow (16 elements a thread, several row groups a CTA,
tpr < 32, = 32, > 32) and wide (D > 8192) instances; more steps per CTA than ring slots;
residual and dsum; fp32 and activation-dtype weights and weight gradients; T = 0, 1 and a
partial last band. Exits 0 after a device synchronize; sanitizer findings set the exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from rmsnorm_families import FAMILIES  # noqa: E402


def run(family, rows, cols, *, dtype=torch.bfloat16, weight_fp32=False, residual=False,
        misaligned=False, grad_weight=False):
    torch.manual_seed(rows * 131 + cols)
    if misaligned:
        x = torch.randn(rows * cols + 1, device="cuda").to(dtype)[1:].view(rows, cols)
    else:
        x = torch.randn(rows, cols, device="cuda").to(dtype)
    g = torch.randn(rows, cols, device="cuda").to(dtype)
    w = torch.rand(cols, device="cuda").to(torch.float32 if weight_fp32 else dtype)
    r = torch.randn_like(g) if residual else None
    dy = torch.randn_like(g)
    y, s, rstd = family.forward(x, g, w, r, weight_offset=0.25)
    dsum = torch.randn_like(g) if residual else None
    family.backward(dy, s if residual else x, g, w, rstd, dsum=dsum, has_residual=residual,
                    weight_offset=0.25, grad_dtype=w.dtype if grad_weight else torch.float32)


def main() -> int:
    for family in FAMILIES:
        run(family, 0, 64)
        run(family, 1, 4096, residual=True)
        run(family, 37, 7)                                  # scalar, tpr 1, 256 groups
        run(family, 53, 127, dtype=torch.float16, weight_fp32=True)
        run(family, 45, 1024, misaligned=True, grad_weight=True)
        run(family, 70, 512, dtype=torch.float32, residual=True)   # fixed 32
        run(family, 33, 2048, residual=True, weight_fp32=True)     # tpr 128; RMSNorm's backward 256 of 8
        run(family, 17, 5120, dtype=torch.float16)                 # tpr 320
        run(family, 21, 4616)                                      # fixed 320, lanes idle
        run(family, 23, 7168, residual=True)                       # fixed 448; RMSNorm's forward 224 of 32
        run(family, 11, 6664)                                      # the same, lanes idle
        run(family, 29, 3072, residual=True)                       # fixed 192: 2 backward groups
        run(family, 31, 1536, residual=True)                       # fixed 96; RMSNorm's backward 192 of 8
        run(family, 27, 2560, dtype=torch.float16)                 # fixed 160: 3 backward groups
        run(family, 25, 3584, weight_fp32=True)                    # fixed 224
        run(family, 15, 4608, residual=True)                       # fixed 288
        run(family, 13, 7176)                                      # fixed 480, lanes idle
        run(family, 19, 3000, residual=True)                       # fixed 192, lanes idle
        run(family, 300, 4096, dtype=torch.float16)                # one-row forward, 300 CTAs
        run(family, 40, 8192, residual=True)                       # gated: one-row, 512 a row
        run(family, 9, 16384, residual=True, grad_weight=True)     # wide
        run(family, 5, 12000, dtype=torch.float32)                 # wide, fp32
        run(family, 7, 12288, residual=True)                       # wide, fixed 384
        run(family, 1100, 64)                                      # fixed 4; 69 bands, last one partial
        run(family, 5000, 1024, residual=True)                     # RMSNorm's backward: 2 groups, ~8 steps
        run(family, 3000, 512, residual=True)                      # RMSNorm's backward: 4 groups of 64
        run(family, 700, 256, weight_fp32=True)                    # RMSNorm's backward: 8 groups of 32
        run(family, 900, 128, residual=True)                       # fixed 8 (16 groups a forward CTA)
        run(family, 200, 16, dtype=torch.float16)                  # fixed 1 (128 groups)
        run(family, 500, 24, residual=True)                        # fixed 2; RMSNorm's backward 4 of 8
        run(family, 3, 16384, misaligned=True, residual=True)      # unaligned, wide
        run(family, 5, 8199, dtype=torch.float32)                  # unaligned fp32 (cp.async), wide
    torch.cuda.synchronize()
    print("sanitize: done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
