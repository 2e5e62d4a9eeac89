#!/usr/bin/env python3
"""Benchmark of the RMSNorm families against their peers (H200, bf16).

Usage (from the repository root, on a GPU machine; fla-core and liger-kernel wheels in .whl/)::

    PYTHONPATH=. python tools/bench/rmsnorm.py [--json out.json] [--iters 20] [--shapes all|small]
    PYTHONPATH=. python tools/bench/rmsnorm.py --precompile   # JIT both families in parallel

Protocol: ``tools/bench/harness.py`` (256 MiB L2 flush before every call, CUDA events, warm-up,
median; the peers of one shape interleaved A B B A; copy bandwidth of the same run as the
roofline). bf16 x/g/dy, bf16 weight (every peer gets the same tensors), eps 1e-6.

Groups per shape (T, D): ``fwd`` and ``bwd`` of RMSNorm, ``gated fwd`` and ``gated bwd`` of
``rmsnorm(x) * silu(g)``. Backward is timed alone: ``torch.autograd.grad`` of the forward's
output (graph retained) for every peer, cake included. Bytes that must move (the % column):
fwd 2 T D x 2 bytes (read x, write y); bwd 3 T D x 2 (read x, dy; write dx) plus the weight
gradient partials (cake: 1024 rows of D fp32, written and read); gated fwd 3 T D x 2; gated bwd
5 T D x 2 plus the partials.

Peers: ``torch.nn.functional.rms_norm`` eager and ``torch.compile``d (gated: ``F.rms_norm(x) *
F.silu(g)``, eager and compiled), FLA fla-core 0.6.0 ``fla.modules.norm.layernorm.rms_norm``
and ``fla.modules.norm.fused_norm_gate.rms_norm_gated`` (the function behind
``FusedRMSNormGated``), Liger ``LigerRMSNorm`` (liger-kernel 0.8.5, its defaults: casting
mode ``llama``, in-place backward). quack is not run: its CUDA 13 dependency
(nvidia-cutlass-dsl-libs-cu13, 92 MB) does not fit the device machine's 64 MiB carry limit.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "tools", REPO / "tools" / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import harness  # noqa: E402

SHAPES = [(t, d) for t in (65536, 262144) for d in (1024, 2048, 4096, 8192)]
SMALL = [(65536, 2048), (65536, 8192)]
PARTIAL_ROWS = 1024
EPS = 1e-6
WARMUP = 3


def precompile() -> None:
    """JIT-compiles every program of both families for this GPU's arch, in parallel."""
    from cake.core import jit, loader

    import cake.cake_gated_rmsnorm_det_train as gated
    import cake.cake_rmsnorm_det_train as plain

    jobs = []
    arch = loader.device(0).arch
    for package in (plain, gated):
        programs = loader.ProgramSet.for_package(Path(package.__file__).parent)
        jobs += [(programs, p) for p in programs.manifest.programs if arch in p.arches]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda job: jit.compile_program(job[0].tree, job[0].manifest, job[1], arch),
                      jobs))
    print(f"precompiled {len(jobs)} programs for {arch}")


def _peers():
    """Optional peers: name -> module, or the reason it is missing."""
    found = {}
    try:
        from fla.modules.norm import fused_norm_gate, layernorm
        found["fla"] = (layernorm, fused_norm_gate)
    except Exception as exc:  # an absent or broken wheel is reported, not fatal
        found["fla"] = f"unavailable: {type(exc).__name__}: {exc}"
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
        found["liger"] = LigerRMSNorm
    except Exception as exc:
        found["liger"] = f"unavailable: {type(exc).__name__}: {exc}"
    return found


def forwards(t: int, d: int, peers: dict, compiled: dict):
    """(plain, gated) dicts name -> (inputs needing grad, fn returning the output)."""
    import torch
    import torch.nn.functional as F

    from cake.cake_gated_rmsnorm_det_train import cake_gated_rmsnorm_det
    from cake.cake_rmsnorm_det_train import cake_rmsnorm_det

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    g = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.rand(d, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
    x, g, w = (v.requires_grad_(True) for v in (x, g, w))
    plain = {
        "cake": lambda: cake_rmsnorm_det(x, w, eps=EPS),
        "torch": lambda: F.rms_norm(x, (d,), w, EPS),
        "torch.compile": lambda: compiled["rms"](x, (d,), w, EPS),
    }
    gated = {
        "cake": lambda: cake_gated_rmsnorm_det(x, g, w, eps=EPS),
        "torch": lambda: F.rms_norm(x, (d,), w, EPS) * F.silu(g),
        "torch.compile": lambda: compiled["gated"](x, g, w),
    }
    if not isinstance(peers["fla"], str):
        layernorm, fused = peers["fla"]
        plain["fla"] = lambda: layernorm.rms_norm(x, w, None, eps=EPS)
        gated["fla"] = lambda: fused.rms_norm_gated(x, g, w, None, activation="swish", eps=EPS)
    if not isinstance(peers["liger"], str):
        liger = peers["liger"](d, eps=EPS).to(device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            liger.weight.copy_(w)
        plain["liger"] = lambda: liger(x)
    return (x, g, w), plain, gated


def graphed(t: int, d: int, x, g, w, dy) -> tuple:
    """Cake's forward and backward helpers with caller buffers, captured in CUDA graphs:
    (plain fwd, plain bwd, gated fwd, gated bwd) replays. Their time is the kernels' alone
    (no Python, validation or launch gaps), next to the eager figures."""
    import torch

    from cake.cake_gated_rmsnorm_det_train import (
        cake_gated_rmsnorm_det_train_backward, cake_gated_rmsnorm_det_train_backward_workspace_bytes,
        cake_gated_rmsnorm_det_train_forward)
    from cake.cake_rmsnorm_det_train import (
        cake_rmsnorm_det_train_backward, cake_rmsnorm_det_train_backward_workspace_bytes,
        cake_rmsnorm_det_train_forward)

    x, g, w = x.detach(), g.detach(), w.detach()
    y, dx, dg = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    rstd = torch.empty(t, dtype=torch.float32, device="cuda")
    dw = torch.empty_like(w)
    ws = torch.empty(cake_rmsnorm_det_train_backward_workspace_bytes(x, w), dtype=torch.uint8,
                     device="cuda")
    assert ws.numel() == cake_gated_rmsnorm_det_train_backward_workspace_bytes(x, g, w)
    calls = (
        lambda: cake_rmsnorm_det_train_forward(x, w, eps=EPS, out=y, rstd=rstd),
        lambda: cake_rmsnorm_det_train_backward(dy, x, w, rstd, grad_dtype=w.dtype, dx=dx,
                                                dweight=dw, workspace=ws),
        lambda: cake_gated_rmsnorm_det_train_forward(x, g, w, eps=EPS, out=y, rstd=rstd),
        lambda: cake_gated_rmsnorm_det_train_backward(dy, x, g, w, rstd, grad_dtype=w.dtype, dx=dx,
                                                      dg=dg, dweight=dw, workspace=ws),
    )
    replays = []
    for call in calls:
        call()  # loads the program before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        replays.append(graph.replay)
    return replays, (y, dx, dg, rstd, dw, ws)


def check_agreement(outputs: dict) -> dict:
    """Max |peer - cake| / max |cake| of each peer's output: a sanity check of the setup."""
    base = outputs["cake"].float()
    scale = base.abs().max().item()
    return {name: (out.float() - base).abs().max().item() / scale for name, out in outputs.items()
            if name != "cake"}


def run(shapes, iters: int, bench, bandwidth: float, on_shape=lambda rows: None):
    import torch
    import torch.nn.functional as F

    # The compiled peers' backward runs several times on one graph (retain_graph=True).
    import torch._functorch.config

    torch._functorch.config.donated_buffer = False
    peers = _peers()
    for name, value in peers.items():
        if isinstance(value, str):
            print(f"peer {name}: {value}", flush=True)
    compiled = {"rms": torch.compile(F.rms_norm),
                "gated": torch.compile(lambda x, g, w: F.rms_norm(x, (x.shape[-1],), w, EPS) * F.silu(g))}
    rows = []
    for t, d in shapes:
        (x, g, w), plain, gated = forwards(t, d, peers, compiled)
        dy = torch.randn(t, d, device="cuda", dtype=torch.bfloat16)
        replays, buffers = graphed(t, d, x, g, w, dy)
        partial_bytes = 2 * PARTIAL_ROWS * d * 4
        for label, fns, inputs, fwd_bytes, bwd_bytes, (fwd_graph, bwd_graph) in (
                ("fwd", plain, (x, w), 4 * t * d, 6 * t * d + partial_bytes, replays[:2]),
                ("gated fwd", gated, (x, g, w), 6 * t * d, 10 * t * d + partial_bytes, replays[2:])):
            with torch.no_grad():
                agreement = check_agreement({n: f() for n, f in fns.items()})
            timings = bench.interleaved(dict({n: (lambda f=f: f()) for n, f in fns.items()},
                                             **{"cake graph": fwd_graph}), iters=iters, warmup=WARMUP)
            graphs = {n: f() for n, f in fns.items()}
            grads = {}
            for n, y in graphs.items():
                # Liger's backward writes dx into dy (in place): it gets its own copy.
                upstream = dy.clone() if n == "liger" else dy
                # allow_unused: Liger's module holds its own weight (a copy of w).
                grads[n] = (lambda y=y, u=upstream: torch.autograd.grad(
                    y, inputs, u, retain_graph=True, allow_unused=True))
            with torch.no_grad():
                dx_agree = check_agreement({n: f()[0] for n, f in grads.items()})
            bwd = bench.interleaved(dict(grads, **{"cake graph": bwd_graph}), iters=iters, warmup=WARMUP)
            for phase, times, nbytes, agree in ((label, timings, fwd_bytes, agreement),
                                                (label.replace("fwd", "bwd"), bwd, bwd_bytes,
                                                 dx_agree)):
                for name, timing in times.items():
                    rows.append({
                        "T": t, "D": d, "op": phase, "impl": name, "ms": timing.median,
                        "spread": timing.spread,
                        "TB/s": nbytes / (timing.median * 1e-3) / 1e12,
                        "% copy": harness.percent_of_roofline(nbytes, timing.median, bandwidth),
                        "max rel diff vs cake": agree.get(name, 0.0)})
                best_peer = min((tm.median for n, tm in times.items() if not n.startswith("cake")),
                                default=None)
                cake_ms, graph_ms = times["cake"].median, times["cake graph"].median
                print(f"T={t} D={d} {phase:9s} cake {cake_ms:.3f} ms "
                      f"({harness.percent_of_roofline(nbytes, cake_ms, bandwidth):.1f}% of copy), "
                      f"graph {graph_ms:.3f} ms "
                      f"({harness.percent_of_roofline(nbytes, graph_ms, bandwidth):.1f}%)"
                      + (f", best peer {best_peer:.3f} ms" if best_peer else ""), flush=True)
            del graphs, grads
        del x, g, w, dy, plain, gated, replays, buffers
        torch.cuda.empty_cache()
        on_shape(rows)
    return rows


def host_overhead(calls: int = 300) -> list:
    """Wall microseconds per call on a tiny problem (T = 8, D = 1024), the GPU idle: the host
    cost of a call (Python, checks, launch), which the event timings include when it exceeds the
    GPU work queued ahead of the call."""
    import time

    import torch
    import torch.nn.functional as F

    from cake.cake_gated_rmsnorm_det_train import cake_gated_rmsnorm_det
    from cake.cake_rmsnorm_det_train import cake_rmsnorm_det

    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn_like(x)
    w = torch.ones(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    peers = _peers()
    cases = {
        "cake fwd": lambda: cake_rmsnorm_det(x, w),
        "torch fwd": lambda: F.rms_norm(x, (1024,), w, EPS),
        "cake fwd+bwd": lambda: torch.autograd.backward(cake_rmsnorm_det(x, w), dy),
        "torch fwd+bwd": lambda: torch.autograd.backward(F.rms_norm(x, (1024,), w, EPS), dy),
        "cake gated fwd+bwd": lambda: torch.autograd.backward(cake_gated_rmsnorm_det(x, g, w), dy),
    }
    if not isinstance(peers["fla"], str):
        layernorm, _ = peers["fla"]
        cases["fla fwd"] = lambda: layernorm.rms_norm(x, w, None, eps=EPS)
        cases["fla fwd+bwd"] = lambda: torch.autograd.backward(
            layernorm.rms_norm(x, w, None, eps=EPS), dy)
    rows = []
    for name, fn in cases.items():
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        rows.append({"call": name, "us per call": (time.perf_counter() - start) / calls * 1e6})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write all numbers here")
    parser.add_argument("--precompile", action="store_true", help="JIT all programs and exit")
    parser.add_argument("--shapes", default="all", help="'all', 'small' or T:D,T:D,...")
    parser.add_argument("--host", action="store_true", help="host cost per call, then exit")
    args = parser.parse_args(argv)
    if args.precompile:
        precompile()
        return 0
    if args.host:
        print(harness.format_table(host_overhead()))
        return 0
    shapes = {"all": SHAPES, "small": SMALL}.get(args.shapes) or [
        tuple(int(v) for v in item.split(":")) for item in args.shapes.split(",")]
    bench = harness.Bench()
    bandwidth = bench.copy_bandwidth()
    print(f"device-to-device copy: {bandwidth / 1e12:.3f} TB/s (read + written)", flush=True)

    def save(rows):  # after every shape, so a run cut short keeps what it measured
        if args.json:
            harness.write_json(args.json, {"device": harness.device_summary(),
                                           "copy_bandwidth": bandwidth, "rows": rows})

    rows = run(shapes, args.iters, bench, bandwidth, save)
    print(harness.format_table(rows, ["T", "D", "op", "impl", "ms", "TB/s", "% copy", "spread",
                                      "max rel diff vs cake"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
