#!/usr/bin/env python3
"""Host-side costs of the runtime and of both families' eager calls (docs/benchmarks.md).

Usage (GPU machine, repository root)::

    PYTHONPATH=. python tools/bench/host_overhead.py [--json out.json]

Each measured call gets two figures:

* ``host us``: the median host time of one call, timed with ``perf_counter`` around the call
  alone, the stream idle when it starts (a synchronize after each call, outside the timing).
  This is the Python, validation, allocation and launch work, and, for an autograd step, the
  engine's hand-off to its device thread and back;
* ``back-to-back us``: the mean time per call of many calls in a row (median of rounds): the
  larger of the host time and the GPU time, what a loop of such calls runs at.

Measured, per family and shape (causal conv1d at S x C = 32768 x 264 and 65536 x 384 with 3
documents; RMSNorm at T x D = 8 x 1024 and 65536 x 1024; bf16): one call of the forward C entry
(Python -> ctypes -> launch, no checks); the forward helper with and without preallocated
outputs; the backward helper; forward + backward helpers; the eager autograd step
(``functional(...).backward(dy)``); the autograd floor, the same step through an identity-like
``autograd.Function`` (forward ``empty_like(x)``, backward ``dy``; "+ weight grad" also returns
a fresh weight gradient, as the real step does), i.e. what the engine alone costs here; and
PyTorch's own eager step (depthwise ``F.conv1d`` + SiLU, ``F.rms_norm``). Also ``import cake``
(fresh interpreter), the first load of a program and ``torch.empty(0, device="cuda")``.

Programs are compiled beforehand (in parallel per family, into the JIT cache) when the package
has no prebuilt libraries, outside the timing.
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
for path in (REPO, REPO / "tools", REPO / "tools" / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import harness  # noqa: E402

CONV_SHAPES = ((32768, 264), (65536, 384))
RMSNORM_SHAPES = ((8, 1024), (65536, 1024))


def host_us(function, calls: int = 300) -> float:
    """Median host time of one call, starting with an idle stream."""
    import torch

    for _ in range(20):
        function()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def back_to_back_us(function, calls: int = 200, rounds: int = 5) -> float:
    """Median over rounds of the mean time per call of ``calls`` calls in a row."""
    import torch

    torch.cuda.synchronize()
    means = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        torch.cuda.synchronize()
        means.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(means)


def import_time_ms() -> float:
    code = "import time; t = time.perf_counter(); import cake; print(time.perf_counter() - t)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 check=True).stdout) * 1e3 for _ in range(5)]
    return statistics.median(runs)


def _identity_functions():
    import torch

    class Identity(torch.autograd.Function):
        """The engine's own cost: a view-free new output, the upstream gradient passed on."""

        @staticmethod
        def forward(ctx, x, weight):
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, dy):
            return dy, None

    class IdentityWithWeightGrad(torch.autograd.Function):
        """As Identity, plus a fresh weight gradient (one more allocation and accumulation)."""

        @staticmethod
        def forward(ctx, x, weight):
            ctx.save_for_backward(weight)
            return torch.empty_like(x)

        @staticmethod
        def backward(ctx, dy):
            weight, = ctx.saved_tensors
            return dy, torch.empty_like(weight)

    return Identity, IdentityWithWeightGrad


def _precompile(programs, used) -> None:
    """JIT-compiles, in parallel, the programs of ``used`` that have no library for GPU 0."""
    libraries = {p.library for p in used}
    harness.precompile([programs.package_dir], only=lambda p: p.library in libraries)


def conv_cases(torch, Identity, IdentityWithWeightGrad):
    """(shape label, {name: function}) for each conv1d shape."""
    import torch.nn.functional as F

    import cake.cake_causal_conv1d_det_train as conv
    from cake.cake_causal_conv1d_det_train import _function, _routes, _validate
    from cake.core import plans

    device = torch.device("cuda", 0)
    programs = plans.program_set(_function.__file__)
    inputs = []
    for tokens, channels in CONV_SHAPES:
        x = torch.randn(tokens, channels, device=device, dtype=torch.bfloat16)
        w = torch.randn(channels, 4, device=device, dtype=torch.bfloat16)
        cu = torch.tensor([0, tokens // 3, 2 * tokens // 3, tokens], device=device,
                          dtype=torch.int32)
        inputs.append((x, w, cu, _validate.validate_inputs(x, w, None, cu, "silu")))
    _precompile(programs, [_routes.select(programs.manifest, problem, plans.device_arch(device))
                           for *_, problem in inputs])
    cases = []
    for x, w, cu, problem in inputs:
        tokens, channels = x.shape
        dy, y = torch.randn_like(x), torch.empty_like(x)
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        x_torch = x.t().unsqueeze(0).contiguous().requires_grad_()  # [1, C, S]
        w_torch = w.unsqueeze(1).contiguous().requires_grad_()  # [C, 1, 4]
        dy_torch = dy.t().unsqueeze(0).contiguous()
        # The plan's forward entry, bound to the problem's sizes: a call passes the tensors.
        def entry_call(plan=_function._plan(problem), x=x, w=w, cu=cu, y=y,
                       stream=plans.stream_handle(device)):
            plan.forward(stream, x, w, None, cu, y)

        def both(x=x, w=w, cu=cu, dy=dy):
            conv.cake_causal_conv1d_det_train_forward(x, w, None, cu)
            conv.cake_causal_conv1d_det_train_backward(dy, x, w, None, cu, grad_dtype=w.dtype)

        def torch_step(x_torch=x_torch, w_torch=w_torch, dy_torch=dy_torch, channels=channels,
                       tokens=tokens):
            z = F.conv1d(x_torch, w_torch, padding=3, groups=channels)
            F.silu(z[..., :tokens]).backward(dy_torch)

        cases.append((f"conv1d {tokens}x{channels}", {
            "C entry call (forward)": entry_call,
            "forward helper, out given":
                lambda x=x, w=w, cu=cu, y=y: conv.cake_causal_conv1d_det_train_forward(
                    x, w, None, cu, out=y),
            "forward helper":
                lambda x=x, w=w, cu=cu: conv.cake_causal_conv1d_det_train_forward(x, w, None, cu),
            "backward helper":
                lambda x=x, w=w, cu=cu, dy=dy: conv.cake_causal_conv1d_det_train_backward(
                    dy, x, w, None, cu, grad_dtype=w.dtype),
            "forward + backward helpers": both,
            "eager autograd step":
                lambda xg=xg, wg=wg, cu=cu, dy=dy: conv.cake_causal_conv1d_det(
                    xg, wg, None, cu).backward(dy),
            "autograd floor (identity)":
                lambda xg=xg, wg=wg, dy=dy: Identity.apply(xg, wg).backward(dy),
            "autograd floor + weight grad":
                lambda xg=xg, wg=wg, dy=dy: IdentityWithWeightGrad.apply(xg, wg).backward(dy),
            "torch F.conv1d+silu eager step": torch_step,
        }))
    return cases


def rmsnorm_cases(torch, Identity, IdentityWithWeightGrad):
    """(shape label, {name: function}) for each RMSNorm shape."""
    import torch.nn.functional as F

    import cake.cake_rmsnorm_det_train as rms
    from cake._shared import rmsnorm
    from cake.cake_rmsnorm_det_train import _function
    from cake.core import plans

    device = torch.device("cuda", 0)
    programs = plans.program_set(_function.__file__)
    inputs = []
    for rows, cols in RMSNORM_SHAPES:
        x = torch.randn(rows, cols, device=device, dtype=torch.bfloat16)
        w = torch.rand(cols, device=device, dtype=torch.bfloat16)
        inputs.append((x, w, rmsnorm.validate_forward(
            x=x, gate=None, weight=w, residual=None, eps=1e-6, weight_offset=0.0, gated=False,
            out=None, residual_out=None, rstd=None)))
    _precompile(programs, [rmsnorm.select(programs.manifest, problem, plans.device_arch(device))
                           for *_, problem in inputs])
    cases = []
    for x, w, problem in inputs:
        rows, cols = x.shape
        dy, y = torch.randn_like(x), torch.empty_like(x)
        rstd = torch.empty(rows, device=device, dtype=torch.float32)
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        # The forward entry as the family binds it (rmsnorm.ForwardCall: rows, cols, the weight's
        # dtype and eps fixed): a call passes the tensors and weight_offset.
        def entry_call(call=rmsnorm.ForwardCall(_function._PROGRAMS.plan(problem), x, 1e-6), x=x,
                       w=w, y=y, rstd=rstd, stream=plans.stream_handle(device)):
            call.launch(stream, x, None, None, w, y, None, rstd, 0.0)

        def both(x=x, w=w, dy=dy):
            _, _, rstd = rms.cake_rmsnorm_det_train_forward(x, w)
            rms.cake_rmsnorm_det_train_backward(dy, x, w, rstd, grad_dtype=w.dtype)

        cases.append((f"rmsnorm {rows}x{cols}", {
            "C entry call (forward)": entry_call,
            "forward helper, outputs given":
                lambda x=x, w=w, y=y, rstd=rstd: rms.cake_rmsnorm_det_train_forward(
                    x, w, out=y, rstd=rstd),
            "forward helper": lambda x=x, w=w: rms.cake_rmsnorm_det_train_forward(x, w),
            "backward helper":
                lambda x=x, w=w, dy=dy, rstd=rstd: rms.cake_rmsnorm_det_train_backward(
                    dy, x, w, rstd, grad_dtype=w.dtype),
            "forward + backward helpers": both,
            "eager autograd step":
                lambda xg=xg, wg=wg, dy=dy: rms.cake_rmsnorm_det(xg, wg).backward(dy),
            "autograd floor (identity)":
                lambda xg=xg, wg=wg, dy=dy: Identity.apply(xg, wg).backward(dy),
            "autograd floor + weight grad":
                lambda xg=xg, wg=wg, dy=dy: IdentityWithWeightGrad.apply(xg, wg).backward(dy),
            "torch F.rms_norm eager step":
                lambda xg=xg, wg=wg, dy=dy, cols=cols: F.rms_norm(
                    xg, (cols,), wg, 1e-6).backward(dy),
        }))
    return cases


def first_load_ms(torch) -> tuple[float, str]:
    """Loading the RMSNorm bf16 vector program (D = 1024) into a fresh program set: dlopen and
    the digest and ABI checks (compiled beforehand by :func:`rmsnorm_cases`)."""
    from cake._shared import rmsnorm
    from cake.cake_rmsnorm_det_train import _function
    from cake.core import loader, plans

    device = torch.device("cuda", 0)
    programs = plans.program_set(_function.__file__)
    problem = rmsnorm.Problem(device=device, dtype=torch.bfloat16, rows=8, cols=1024,
                              weight_fp32=False, gated=False, has_residual=False, vector=True)
    program = rmsnorm.select(programs.manifest, problem, plans.device_arch(device))
    start = time.perf_counter()
    library = loader.ProgramSet(programs.package_dir).library(program, 0)
    return (time.perf_counter() - start) * 1e3, library.origin


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    summary = {"import cake ms": import_time_ms()}

    import torch

    torch.cuda.init()
    identities = _identity_functions()
    conv = conv_cases(torch, *identities)
    norm = rmsnorm_cases(torch, *identities)

    summary["first load ms"], summary["first load origin"] = first_load_ms(torch)
    device = torch.device("cuda", 0)
    summary["torch.empty(0, device='cuda') us"] = host_us(lambda: torch.empty(0, device=device))

    results = {}
    for label, functions in conv + norm:
        for name, function in functions.items():
            results[f"{label}: {name}"] = {"host us": host_us(function),
                                           "back-to-back us": back_to_back_us(function)}

    width = max(map(len, [*summary, *results]))
    for name, value in summary.items():
        shown = f"{value:10.2f}" if isinstance(value, float) else f"{value:>10}"
        print(f"{name:<{width}}  {shown}")
    print(f"\n{'call':<{width}}  {'host us':>10}  {'back-to-back us':>15}")
    for name, row in results.items():
        print(f"{name:<{width}}  {row['host us']:10.2f}  {row['back-to-back us']:15.2f}")
    if args.json:
        payload = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__,
                   "summary": summary, "calls": results}
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
