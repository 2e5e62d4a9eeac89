#!/usr/bin/env python3
"""Host cost of the families' calls on the fake CUDA driver (tests/fake_cuda.c), no GPU needed.

Usage (repository root, nvcc on PATH: the programs are JIT-compiled once into a cache)::

    python tools/bench/host_fake_driver.py [--calls 2000] [--json out.json]

The real program libraries run their host code (argument checks, kernel choice, launch
geometry, the driver calls), and the fake driver records the launch instead of running it, so
this times everything a call costs on the host but the GPU runtime's own launch latency, with CPU
tensors standing in for CUDA ones (their allocation is the CPU allocator's). Per call: the median
over rounds of the mean of ``--calls`` calls. Not comparable with the H200's figures, which include
the real driver; compare runs of this script with each other (docs/benchmarks.md). The fake
counts launches without recording them (its record would cost more than the call).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def per_call_us(function, calls: int, rounds: int = 7) -> float:
    for _ in range(50):
        function()
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        means.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(means)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    os.environ.setdefault("CAKE_CACHE_DIR", str(Path(tempfile.gettempdir()) / "cake-bench-jit"))
    import fake_cuda

    fake = fake_cuda.load()
    import torch

    import fake_gpu
    from cake.cake_causal_conv1d_det_train import (cake_causal_conv1d_det,
                                                    cake_causal_conv1d_det_train_forward)
    from cake.cake_rmsnorm_det_train import (cake_rmsnorm_det, cake_rmsnorm_det_train_backward,
                                             cake_rmsnorm_det_train_forward)
    from cake.core import plans

    plans.stream_handle = lambda device: 0  # no CUDA in a CPU torch: the caller's stream is 0
    cuda = fake_gpu.cuda
    x = cuda(torch.randn(2048, 512, dtype=torch.bfloat16))
    w = cuda(torch.randn(512, 4, dtype=torch.bfloat16))
    y = cuda(torch.empty_like(x))
    xn = cuda(torch.randn(64, 4096, dtype=torch.bfloat16))
    wn = cuda(torch.ones(4096, dtype=torch.float32))
    xl = cuda(torch.randn(2048, 512, dtype=torch.bfloat16)).requires_grad_()
    wl = cuda(torch.randn(512, 4, dtype=torch.bfloat16)).requires_grad_()
    xnl = cuda(torch.randn(64, 4096, dtype=torch.bfloat16)).requires_grad_()
    wnl = cuda(torch.ones(4096, dtype=torch.float32)).requires_grad_()
    dyn = cuda(torch.randn(64, 4096, dtype=torch.bfloat16))
    dyl = cuda(torch.randn(2048, 512, dtype=torch.bfloat16))
    rstd = cuda(cake_rmsnorm_det_train_forward(xn, wn)[2])

    def step(functional, x, w, dy):
        def run():
            x.grad = w.grad = None
            functional(x, w).backward(dy)
        return run

    cases = {
        "conv1d forward helper, out given": lambda: cake_causal_conv1d_det_train_forward(
            x, w, None, None, out=y),
        "conv1d forward helper": lambda: cake_causal_conv1d_det_train_forward(x, w),
        "conv1d eager autograd forward": lambda: cake_causal_conv1d_det(xl, wl),
        "rmsnorm forward helper": lambda: cake_rmsnorm_det_train_forward(xn, wn),
        "rmsnorm eager autograd forward": lambda: cake_rmsnorm_det(xnl, wnl),
        "rmsnorm backward helper": lambda: cake_rmsnorm_det_train_backward(dyn, xn, wn, rstd),
        "conv1d eager autograd step": step(cake_causal_conv1d_det, xl, wl, dyl),
        "rmsnorm eager autograd step": step(cake_rmsnorm_det, xnl, wnl, dyn),
    }
    for function in cases.values():
        function()  # compiles the program (once), loads it
    results = {}
    for name, function in cases.items():
        fake.reset()
        fake.set_quiet()  # launches counted, not formatted into the record
        results[name] = per_call_us(function, args.calls)
        if fake.launch_count() == 0:
            raise SystemExit(f"{name}: no launch reached the fake driver")
        print(f"{name:<36} {results[name]:7.2f} us a call", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "calls": args.calls,
                                         "torch": torch.__version__, "us_per_call": results},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
