#!/usr/bin/env python3
"""Two builds of the CUDA families on one GPU, in one process: every program's outputs and
gradients bit for bit, then speed (docs/benchmarks.md).

Usage (on the GPU machine, from the repository root)::

    PYTHONPATH=.:HOST python tools/bench/compare_builds.py --baseline PREFIX [--json out.json]

``cake.<family>`` is the build under test (this checkout, or an installed wheel first on
PYTHONPATH); the baseline is the same families vendored as ``PREFIX.<family>`` into ``HOST``
(another commit's ``tools/vendor.py`` and ``ci/build_vendored.sh``): vendored packages register
their own torch ops and load their own libraries, so both builds live in one process.

- **Bitwise**: every program of causal conv1d, RMSNorm and gated RMSNorm is reached by a case
  (each dtype, bias and activation at both conv1d tiles; each RMSNorm column band, vector and
  element routes; weights in the activation dtype and in fp32), forward and backward through
  the autograd functional on the same seeded inputs; every output and gradient must be equal
  byte for byte.
- **Speed**, interleaved (tools/bench/harness.py): kernel time as CUDA-graph replay of the
  forward + backward helpers, and eager time of the autograd step, at 3 conv1d and 4 RMSNorm
  shapes; host time per call (1000 forward calls of a one-row problem, back to back); the
  first call of each family (library verify, load, image load) for each build, each in a
  fresh process.

Exit 1 when a tensor differs. Ratios are baseline time / this build's time (> 1: faster).
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CONV = "cake_causal_conv1d_det_train"
RMS = "cake_rmsnorm_det_train"
GATED = "cake_gated_rmsnorm_det_train"
# The right edge of every vector column band of the RMSNorm tables (their widest row per
# program), and an odd width for the element route.
RMS_WIDTHS = (2048, 3584, 4096, 6144, 7168, 8192, 16384, 1001)


def families(prefix: str) -> dict:
    return {name: importlib.import_module(f"{prefix}.{name}") for name in (CONV, RMS, GATED)}


# --------------------------------------------------------------------------- cases


def conv_cases(torch):
    for dtype in (torch.bfloat16, torch.float16):
        for tokens, channels in ((4096, 192), (65536, 256)):  # the "short" and "long" tiles
            for bias in (True, False):
                for activation in ("silu", None):
                    for weight_dtype in (dtype, torch.float32):
                        yield (f"conv1d {str(dtype)[6:]} S={tokens} C={channels} bias={bias} "
                               f"act={activation} w={str(weight_dtype)[6:]}",
                               (tokens, channels, dtype, bias, activation, weight_dtype))


def run_conv(family, torch, tokens, channels, dtype, bias, activation, weight_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    cut = [0, tokens // 3, tokens // 3 + 2, tokens]
    x = torch.randn(tokens, channels, generator=gen).to(dtype).cuda().requires_grad_()
    w = (torch.randn(channels, 4, generator=gen) * 0.5).to(weight_dtype).cuda().requires_grad_()
    b = (torch.randn(channels, generator=gen).to(weight_dtype).cuda().requires_grad_()
         if bias else None)
    dy = torch.randn(tokens, channels, generator=gen).to(dtype).cuda()
    cu = torch.tensor(cut, dtype=torch.int32, device="cuda")
    y = family.cake_causal_conv1d_det(x, w, b, cu, activation=activation)
    y.backward(dy)
    return {"y": y, "dx": x.grad, "dw": w.grad, **({"db": b.grad} if bias else {})}


def rms_cases(torch):
    for gated in (False, True):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for cols in RMS_WIDTHS:
                for weight_dtype in dict.fromkeys((dtype, torch.float32)):
                    yield (f"{'gated ' if gated else ''}rmsnorm {str(dtype)[6:]} D={cols} "
                           f"w={str(weight_dtype)[6:]}", (gated, 257, cols, dtype, weight_dtype))


def run_rms(families_, torch, gated, rows, cols, dtype, weight_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen).to(dtype).cuda().requires_grad_()
    w = (1 + 0.1 * torch.randn(cols, generator=gen)).to(weight_dtype).cuda().requires_grad_()
    dy = torch.randn(rows, cols, generator=gen).to(dtype).cuda()
    if gated:
        g = torch.randn(rows, cols, generator=gen).to(dtype).cuda().requires_grad_()
        y = families_[GATED].cake_gated_rmsnorm_det(x, g, w)
        y.backward(dy)
        return {"y": y, "dx": x.grad, "dg": g.grad, "dw": w.grad}
    y = families_[RMS].cake_rmsnorm_det(x, w)
    y.backward(dy)
    return {"y": y, "dx": x.grad, "dw": w.grad}


def all_cases(torch):
    for index, (name, args) in enumerate(conv_cases(torch)):
        yield name, lambda fam, args=args, seed=index: run_conv(fam[CONV], torch, *args, seed)
    for index, (name, args) in enumerate(rms_cases(torch)):
        yield name, lambda fam, args=args, seed=1000 + index: run_rms(fam, torch, *args, seed)


def same_bytes(torch, a, b) -> bool:
    """The same shape, dtype and bytes (so NaNs and signed zeros compare too)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.detach().contiguous().view(as_int), b.detach().contiguous().view(as_int))


def bitwise(torch, new: dict, old: dict) -> tuple[int, list]:
    compared, differ = 0, []
    for name, case in all_cases(torch):
        got, want = case(new), case(old)
        for key in want:
            compared += 1
            if not same_bytes(torch, got[key], want[key]):
                differ.append(f"{name}: {key}")
    return compared, differ


# --------------------------------------------------------------------------- speed


_FIRST_CALL = """
import importlib, sys, time, torch
family = importlib.import_module(sys.argv[1])
x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(1024, 4, device="cuda", dtype=torch.bfloat16)
(x * 2).sum().backward()  # torch's own first-use costs (allocator, autograd), outside the timing
x.grad = None
call = {"conv": lambda: family.cake_causal_conv1d_det(x, w),
        "rms": lambda: family.cake_rmsnorm_det(x, w[:, 0].contiguous())}[sys.argv[2]]
torch.cuda.synchronize()
start = time.perf_counter()
call()
torch.cuda.synchronize()
print((time.perf_counter() - start) * 1e3)
"""


def first_calls(new_prefix: str, old_prefix: str) -> dict:
    """ms of the first call of each family (verify + load + image load + launch), per build,
    each in a fresh process (after torch's own first-use costs): in one process the build timed
    first would also pay for what the second then finds done."""
    result = {}
    for label, prefix in (("new", new_prefix), ("baseline", old_prefix)):
        for name, kind in ((CONV, "conv"), (RMS, "rms")):
            out = subprocess.run([sys.executable, "-c", _FIRST_CALL, f"{prefix}.{name}", kind],
                                 check=True, capture_output=True, text=True).stdout
            result[f"{label} {name}"] = float(out.split()[-1])
    return result


def speed_shapes(torch):
    conv = [(65536, 1024), (250340, 1024), (250340, 4096)]
    rms = [(65536, 1024), (65536, 2048), (32768, 4096), (16384, 8192)]
    for tokens, channels in conv:
        yield f"conv1d bf16 S={tokens} C={channels}", "conv", (tokens, channels)
    for rows, cols in rms:
        yield f"rmsnorm bf16 T={rows} D={cols}", "rms", (rows, cols)


def step_functions(torch, fam, kind, shape):
    """(eager autograd step, forward + backward helpers with preallocated outputs)."""
    # Drawn on the device: the largest shape is 1G elements, slow to draw on the host.
    gen = torch.Generator(device="cuda").manual_seed(7)

    def randn(*size):
        return torch.randn(*size, generator=gen, device="cuda").bfloat16()

    if kind == "conv":
        tokens, channels = shape
        x, w, dy = randn(tokens, channels), randn(channels, 4), randn(tokens, channels)
        x.requires_grad_()
        w.requires_grad_()
        cu = torch.tensor([0, tokens // 2, tokens], dtype=torch.int32, device="cuda")
        family = fam[CONV]
        y, dx = torch.empty_like(x), torch.empty_like(x)
        dw = torch.empty(channels, 4, device="cuda", dtype=torch.float32)
        workspace = torch.empty(family.cake_causal_conv1d_det_train_backward_workspace_bytes(
            x, w, None, cu), dtype=torch.uint8, device="cuda")

        def eager():
            family.cake_causal_conv1d_det(x, w, None, cu).backward(dy)

        def helpers():
            family.cake_causal_conv1d_det_train_forward(x.detach(), w.detach(), None, cu, out=y)
            family.cake_causal_conv1d_det_train_backward(
                dy, x.detach(), w.detach(), None, cu, grad_dtype=torch.float32, dx=dx,
                dweight=dw, workspace=workspace)
        return eager, helpers
    rows, cols = shape
    x, dy = randn(rows, cols).requires_grad_(), randn(rows, cols)
    w = torch.ones(cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    family = fam[RMS]

    def eager():
        family.cake_rmsnorm_det(x, w).backward(dy)

    def helpers():
        y, rstd = family.cake_rmsnorm_det_train_forward(x.detach(), w.detach())[::2]
        family.cake_rmsnorm_det_train_backward(dy, x.detach(), w.detach(), rstd)
    return eager, helpers


def graphed(torch, function):
    function()  # warm: plans, workspaces, libraries
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        function()
    return graph.replay


def speed(torch, new: dict, old: dict, iters: int) -> list:
    import harness

    bench = harness.Bench()
    rows = []
    for name, kind, shape in speed_shapes(torch):
        eager_new, helpers_new = step_functions(torch, new, kind, shape)
        eager_old, helpers_old = step_functions(torch, old, kind, shape)
        kernels = bench.interleaved({"new": graphed(torch, helpers_new),
                                     "baseline": graphed(torch, helpers_old)}, iters=iters)
        eager = bench.interleaved({"new": eager_new, "baseline": eager_old}, iters=iters,
                                  host_inclusive=True)
        rows.append({"shape": name,
                     "graph new ms": kernels["new"].median,
                     "graph baseline ms": kernels["baseline"].median,
                     "graph ratio": kernels["baseline"].median / kernels["new"].median,
                     "eager new ms": eager["new"].median,
                     "eager baseline ms": eager["baseline"].median,
                     "eager ratio": eager["baseline"].median / eager["new"].median})
    return rows


def host_per_call(torch, new: dict, old: dict, calls: int = 1000, rounds: int = 5) -> dict:
    """us per forward helper call of a one-row problem, back to back (the host's work bounds
    it), the builds alternating by round; the median of the rounds."""
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    results = {"new": [], "baseline": []}
    for _ in range(rounds):
        for label, fam in (("new", new), ("baseline", old), ("baseline", old), ("new", new)):
            forward = fam[RMS].cake_rmsnorm_det_train_forward
            for _ in range(50):
                forward(x, w, out=out)
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                forward(x, w, out=out)
            torch.cuda.synchronize()
            results[label].append((time.perf_counter() - start) / calls * 1e6)
    import statistics
    return {label: statistics.median(values) for label, values in results.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="the baseline's vendored prefix")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("compare_builds: needs a CUDA GPU", file=sys.stderr)
        return 2
    new, old = families("cake"), families(args.baseline)
    report = {"device": torch.cuda.get_device_name(),
              "first_call_ms": first_calls("cake", args.baseline)}
    compared, differ = bitwise(torch, new, old)
    report.update(bitwise_tensors=compared, bitwise_differ=differ)
    print(f"bitwise: {compared} tensors compared, {len(differ)} differ")
    for line in differ:
        print(f"  DIFFERS {line}")
    report["host_us_per_call"] = host_per_call(torch, new, old)
    report["speed"] = speed(torch, new, old, args.iters)
    print(json.dumps({k: v for k, v in report.items() if k != "bitwise_differ"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
