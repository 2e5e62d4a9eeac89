#!/usr/bin/env python3
"""Host-side costs of the runtime (issue 3): import, first load, and one call's host path.

Usage (GPU machine, repository root or an installed cake-train)::

    python tools/bench/host_overhead.py [--json out.json]

Measures, each as the median over many back-to-back calls timed with ``perf_counter``
(the GPU work of these calls is a few microseconds and runs asynchronously):

* ``import cake`` in a fresh interpreter (no torch);
* the first load of a program (dlopen + digest/ABI check), prebuilt when the package has
  libraries, otherwise from the JIT cache (compiled beforehand, outside the timing);
* one call through the loader's C entry (Python -> ctypes -> launch), against an empty
  ``torch.empty(0, device="cuda")``;
* the pieces of an eager causal-conv1d call at a small shape: validation, routing and library
  lookup, the stream handle, the forward entry, the whole forward, and the whole eager
  forward+backward step, next to PyTorch's own eager depthwise ``F.conv1d`` forward+backward
  at the same shape (what the autograd engine alone costs on this machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def per_call_us(function, calls: int = 2000, rounds: int = 7) -> float:
    """Median over ``rounds`` of the mean host time of ``calls`` back-to-back calls."""
    import torch

    for _ in range(50):
        function()
    torch.cuda.synchronize()
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        means.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(means)


def import_time_ms() -> float:
    code = "import time; t = time.perf_counter(); import cake; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout) * 1e3 for _ in range(5)]
    return statistics.median(runs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    results = {"import cake ms": import_time_ms()}

    import torch

    import cake.cake_causal_conv1d_det_train as conv
    from cake.cake_causal_conv1d_det_train import _function, _validate
    from cake.core import host, loader

    device = torch.device("cuda", 0)
    tokens, channels = 32768, 264
    x = torch.randn(tokens, channels, device=device, dtype=torch.bfloat16)
    w = torch.randn(channels, 4, device=device, dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    cu = torch.tensor([0, 10000, 20000, tokens], device=device, dtype=torch.int32)
    y = torch.empty_like(x)

    problem = _validate.validate_forward(x, w, None, cu, "silu", None)
    programs = host.program_set(_function.__file__)
    program = _function._routes.select(programs.manifest, problem, host.device_arch(device))
    fresh = loader.ProgramSet(programs.package_dir)
    fresh.library(program, 0)  # compile into the JIT cache if needed, outside the timing
    first = loader.ProgramSet(programs.package_dir)
    start = time.perf_counter()
    library = first.library(program, 0)
    results["first load ms"] = (time.perf_counter() - start) * 1e3
    results["first load origin"] = library.origin

    entry = library.entry("forward")
    stream = host.stream_handle(device)
    args_list = [x.data_ptr(), w.data_ptr(), 0, cu.data_ptr(), y.data_ptr(), tokens, channels,
                 3, 0, 0]
    xg = x.detach().requires_grad_()
    wg = w.detach().requires_grad_()
    x_torch = x.t().unsqueeze(0).contiguous().requires_grad_()  # [1, C, S]
    w_torch = w.unsqueeze(1).contiguous().requires_grad_()  # [C, 1, 4]
    dy_torch = dy.t().unsqueeze(0).contiguous()

    def torch_step():
        z = torch.nn.functional.conv1d(x_torch, w_torch, padding=3, groups=channels)
        torch.nn.functional.silu(z[..., :tokens]).backward(dy_torch)

    pieces = {
        "torch.empty(0, device='cuda') us": lambda: torch.empty(0, device=device),
        "C entry call (ctypes -> launch) us": lambda: entry(args_list, stream),
        "stream handle us": lambda: host.stream_handle(device),
        "validate_forward us": lambda: _validate.validate_forward(x, w, None, cu, "silu", None),
        "route + library lookup us": lambda: _function._library(problem),
        "forward helper (validate+route+launch) us":
            lambda: conv.cake_causal_conv1d_det_train_forward(x, w, None, cu, out=y),
        "eager fwd+bwd step us":
            lambda: conv.cake_causal_conv1d_det(xg, wg, None, cu).backward(dy),
        "torch F.conv1d depthwise eager fwd+bwd step us": torch_step,
    }
    for name, function in pieces.items():
        results[name] = per_call_us(function, calls=200 if "fwd+bwd" in name else 2000)

    width = max(map(len, results))
    for name, value in results.items():
        shown = f"{value:10.2f}" if isinstance(value, float) else f"{value:>10}"
        print(f"{name:<{width}}  {shown}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
