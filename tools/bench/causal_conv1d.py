#!/usr/bin/env python3
"""Benchmark of cake_causal_conv1d_det_train against FLA's Triton causal conv1d (H200).

Usage (from the repository root, on a GPU machine)::

    PYTHONPATH=. python tools/bench/causal_conv1d.py [--json out.json] [--iters 50] [--no-peer]
    PYTHONPATH=. python tools/bench/causal_conv1d.py --precompile   # JIT all programs in parallel
    PYTHONPATH=. python tools/bench/causal_conv1d.py --tune small   # tile-shape sweep (TUNE_SETS)

Protocol: ``tools/bench/harness.py`` (256 MiB L2 flush before every call, CUDA events, warm-up,
median; cake and FLA interleaved A B B A; copy bandwidth of the same run as roofline). bf16,
no bias, SiLU, three documents per pack, x as [S, C]. Bytes per element: forward 4 (x read, y
written), backward 6 (x, dy read, dx written; dweight/dbias and the workspace are under 0.3%),
fwd+bwd 10. The peer is ``fla.modules.causal_conv1d.causal_conv1d`` (fla-core 0.6.0, Triton,
``backend="triton"``); Dao-AILab causal-conv1d is not built here (about 15 minutes of build).
The protocol and the results files: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "tools", REPO / "tools" / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import harness  # noqa: E402

# (S, C): the shapes of docs/families/causal_conv1d.md; three documents per pack.
SHAPES = [(250340, c) for c in (512, 1024, 2048, 4096, 8192)] + [
    (262144, 1536), (32768, 264), (65536, 384)]
SMALL = [(32768, 264), (65536, 384)]
BYTES = {"fwd": 4, "bwd": 6, "fwd+bwd": 10}

# Geometries swept by --tune (knobs of csrc/templates/causal_conv1d/kernel.cu): the forward's
# c<channel threads>g<row groups>, f<rows>x<stages>x<chunks>, m<min blocks per SM>, and the
# backward's b<token threads>x<tokens per step>x<steps per span>, m<min blocks per SM>.
def _tile(c, g, fwd, m, bwd):
    return dict(CAKE_VEC=4, CAKE_CHANNEL_THREADS=c, CAKE_ROW_GROUPS=g,
                CAKE_FORWARD_ROWS=fwd[0], CAKE_FORWARD_STAGES=fwd[1], CAKE_FORWARD_CHUNKS=fwd[2],
                CAKE_FORWARD_MIN_BLOCKS=m, CAKE_TOKEN_THREADS=bwd[0],
                CAKE_TOKENS_PER_THREAD=bwd[1], CAKE_ITERATIONS=bwd[2], CAKE_BACKWARD_MIN_BLOCKS=bwd[3],
                CAKE_BACKWARD_SCALAR_MIN_BLOCKS=1)


# --tune sets: name -> (geometries, shapes). "long": the "long" forward with backward spans
# around the family table's (b4x8x16 m4; b8x8x8 m2 before). "small": whole geometries (both
# directions) for the packs that fill the GPU once or less with the table's tiles.
TUNE_SETS = {
    "long": ({f"b{t}x{r}x{i} m{mb}": _tile(32, 4, (32, 4, 16), 4, (t, r, i, mb))
              for t, r, i, mb in ((8, 8, 8, 2), (8, 8, 16, 2), (8, 4, 16, 2), (8, 4, 16, 3),
                                  (4, 8, 8, 4), (4, 8, 16, 4), (16, 8, 4, 1))},
             [(250340, 512), (250340, 2048), (250340, 8192), (32768, 264), (65536, 384)]),
    "small": ({f"c{c}g{g} f{f[0]}x{f[1]}x{f[2]} m{m} b{b[0]}x{b[1]}x{b[2]} m{b[3]}":
               _tile(c, g, f, m, b)
               # The first two: the table's "short" and "long" tiles (vector path; the table's
               # scalar-path bound differs, and --tune runs only the vector path).
               for c, g, f, m, b in ((16, 8, (32, 4, 8), 5, (16, 8, 1, 2)),
                                     (32, 4, (32, 4, 16), 4, (4, 8, 16, 4)),
                                     (16, 8, (32, 4, 4), 5, (8, 8, 2, 4)),
                                     (16, 8, (32, 4, 8), 5, (4, 8, 4, 4)),
                                     (16, 8, (16, 4, 8), 6, (8, 8, 1, 4)),
                                     (8, 16, (32, 4, 8), 5, (16, 8, 1, 4)),
                                     (8, 16, (32, 4, 4), 5, (8, 8, 2, 4)),
                                     (32, 4, (32, 4, 8), 4, (8, 8, 2, 2)),
                                     (32, 4, (32, 4, 4), 4, (4, 8, 4, 4)),
                                     (16, 8, (32, 4, 8), 5, (16, 4, 2, 2)))},
              [(32768, 264), (65536, 384), (65536, 1024), (131072, 512)]),
}


def make_inputs(tokens: int, channels: int, *, requires_grad: bool = False, seed: int = 0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, channels, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.randn(channels, 4, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.5)
    dy = torch.randn(tokens, channels, device="cuda", dtype=torch.bfloat16, generator=gen)
    third = tokens // 3
    cu = torch.tensor([0, third, tokens - third + 7 if tokens > 20 else 2 * third, tokens],
                      dtype=torch.int32, device="cuda")
    if requires_grad:
        x.requires_grad_(True)
        w.requires_grad_(True)
    return x, w, dy, cu


def cake_calls(x, w, dy, cu):
    """fwd, bwd (preallocated outputs), fwd+bwd (autograd, eager) closures."""
    import torch

    from cake.cake_causal_conv1d_det_train import (
        cake_causal_conv1d_det, cake_causal_conv1d_det_train_backward,
        cake_causal_conv1d_det_train_backward_workspace_bytes,
        cake_causal_conv1d_det_train_forward)

    y = torch.empty_like(x)
    dx = torch.empty_like(x)
    dw = torch.empty(w.shape, dtype=torch.float32, device=x.device)
    ws = torch.empty(cake_causal_conv1d_det_train_backward_workspace_bytes(x, w, None, cu),
                     dtype=torch.uint8, device=x.device)
    xg = x.detach().requires_grad_(True)
    wg = w.detach().requires_grad_(True)

    def fwd():
        cake_causal_conv1d_det_train_forward(x, w, None, cu, out=y)

    def bwd():
        cake_causal_conv1d_det_train_backward(dy, x, w, None, cu, dx=dx, dweight=dw, workspace=ws)

    def fwd_bwd():
        xg.grad = wg.grad = None
        cake_causal_conv1d_det(xg, wg, None, cu).backward(dy)

    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd_bwd}


def fla_calls(x, w, dy, cu):
    from fla.modules.causal_conv1d import causal_conv1d

    x3 = x[None]
    dy3 = dy[None]
    xg = x3.detach().requires_grad_(True)
    wg = w.detach().requires_grad_(True)

    def fwd():
        causal_conv1d(x3, w, None, activation="silu", cu_seqlens=cu)

    def fwd_bwd():
        xg.grad = wg.grad = None
        y, _ = causal_conv1d(xg, wg, None, activation="silu", cu_seqlens=cu)
        y.backward(dy3)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def run_shapes(shapes, *, iters: int, peer: bool, bench: harness.Bench, bandwidth: float):
    import torch

    rows = []
    for tokens, channels in shapes:
        x, w, dy, cu = make_inputs(tokens, channels)
        ours = cake_calls(x, w, dy, cu)
        theirs = fla_calls(x, w, dy, cu) if peer else {}
        row = {"S": tokens, "C": channels}
        for op in ("fwd", "bwd", "fwd+bwd"):
            fns = {"cake": ours[op]}
            if op in theirs:
                fns["fla"] = theirs[op]
            timings = bench.interleaved(fns, iters=iters)
            ms = timings["cake"].median
            nbytes = BYTES[op] * tokens * channels
            row[f"{op} ms"] = ms
            row[f"{op} %roof"] = harness.percent_of_roofline(nbytes, ms, bandwidth)
            row[f"{op} spread"] = timings["cake"].spread
            if "fla" in timings:
                row[f"fla {op} ms"] = timings["fla"].median
                row[f"{op} x fla"] = timings["fla"].median / ms
        if (tokens, channels) in SMALL:
            host = bench.time(ours["fwd+bwd"], iters=iters, host_inclusive=True)
            row["fwd+bwd host-incl us"] = host.median * 1e3
        rows.append(row)
        print(harness.format_table([row]), flush=True)
        del x, w, dy, cu, ours, theirs
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- tuning


def tune_libraries(tiles: dict, *, dtype: str = "bfloat16"):
    """One program per tile shape (bf16, no bias, SiLU), JIT-compiled in parallel; name ->
    loaded library (``harness.tune_libraries``)."""
    from tools.families import cake_causal_conv1d_det_train as table

    base = {"CAKE_DTYPE_BF16": 1 if dtype == "bfloat16" else 0, "CAKE_HAS_BIAS": False,
            "CAKE_SILU": 1}
    return harness.tune_libraries(
        table.FAMILY, {name: dict(base, **params) for name, params in tiles.items()}, repo=REPO)


def _entry_calls(lib, x, w, cu, y, dy, dx, dw):
    """fwd, bwd closures through a library's C entries (any program, not only the routed one);
    the workspace size from its own entry."""
    import ctypes

    import torch

    tokens, channels = x.shape
    stream = torch.cuda.current_stream().cuda_stream
    size = ctypes.c_int64(-1)
    lib.entry("workspace_bytes")(0, tokens=tokens, channels=channels, out=ctypes.addressof(size))
    ws = torch.empty(max(size.value, 16), dtype=torch.uint8, device=x.device)
    sizes = dict(tokens=tokens, channels=channels, num_docs=cu.numel() - 1, doc_len=0,
                 weight_fp32=0)
    # Every argument bound once (no per-call values): a call packs nothing, as the list calls did.
    forward = lib.entry("forward").bind((), x=x, weight=w, bias=None, cu_seqlens=cu, y=y, **sizes)
    backward = lib.entry("backward").bind(
        (), x=x, weight=w, bias=None, cu_seqlens=cu, dy=dy, dx=dx, dweight=dw, dbias=None,
        workspace=ws, workspace_bytes=size.value, grad_fp32=1, **sizes)
    return (lambda: forward(stream)), (lambda: backward(stream)), ws


def run_tune(name: str, *, iters: int, bench: harness.Bench, bandwidth: float):
    """Every geometry of the tune set ``name`` at its shapes: time and % of copy bandwidth per
    direction; y, dx compared bitwise with the first geometry and dweight within fp32
    reordering."""
    import torch

    tiles, shapes = TUNE_SETS[name]
    libraries = tune_libraries(tiles)
    rows = []
    for tokens, channels in shapes:
        x, w, dy, cu = make_inputs(tokens, channels)
        y, dx = torch.empty_like(x), torch.empty_like(x)
        dw = torch.empty(w.shape, dtype=torch.float32, device="cuda")
        reference = None
        for name, lib in libraries.items():
            fwd, bwd, _ws = _entry_calls(lib, x, w, cu, y, dy, dx, dw)
            for out in (y, dx, dw):
                out.fill_(float("nan"))
            fwd()
            bwd()
            torch.cuda.synchronize()
            outputs = (y.clone(), dx.clone(), dw.clone())
            if reference is None:
                reference = outputs
            same = "=" if all(torch.equal(a, b) for a, b in zip(outputs[:2], reference[:2])) \
                else "DIFF"
            tf = bench.time(fwd, iters=iters).median
            tb = bench.time(bwd, iters=iters).median
            rows.append({"S": tokens, "C": channels, "tile": name, "fwd ms": tf,
                         "fwd %roof": harness.percent_of_roofline(4 * tokens * channels, tf,
                                                                  bandwidth),
                         "bwd ms": tb,
                         "bwd %roof": harness.percent_of_roofline(6 * tokens * channels, tb,
                                                                  bandwidth),
                         "y,dx vs first": same,
                         "dw maxdiff": float((outputs[2] - reference[2]).abs().max())})
        torch.cuda.empty_cache()
        print(harness.format_table(rows[-len(libraries):]), flush=True)
    return rows


def precompile() -> None:
    """JIT-compiles every program of the family for this GPU's arch, 16 at a time."""
    import cake.cake_causal_conv1d_det_train as package

    print(f"precompiled {harness.precompile([Path(package.__file__).parent])} programs")


def profile_host(calls: int = 300) -> None:
    """Where the host time of an eager fwd+bwd goes (top functions by own time)."""
    import cProfile
    import pstats
    import time

    import torch

    x, w, dy, cu = make_inputs(32768, 264)
    step = cake_calls(x, w, dy, cu)["fwd+bwd"]
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
    print(f"eager fwd+bwd, back to back: {(time.perf_counter() - start) / calls * 1e6:.1f} us/call")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", type=Path, help="write all numbers here")
    parser.add_argument("--no-peer", action="store_true", help="skip FLA")
    parser.add_argument("--tune", choices=sorted(TUNE_SETS),
                        help="sweep the tile shapes of this set (TUNE_SETS) instead")
    parser.add_argument("--precompile", action="store_true", help="JIT all programs and exit")
    parser.add_argument("--profile-host", action="store_true",
                        help="cProfile 300 eager fwd+bwd calls at S=32768, C=264 and exit")
    parser.add_argument("--shapes", default="all", help="'all', 'small' or S:C,S:C,...")
    args = parser.parse_args(argv)
    if args.precompile:
        precompile()
        return 0
    if args.profile_host:
        profile_host()
        return 0
    bench = harness.Bench()
    bandwidth = bench.copy_bandwidth()
    print(f"device-to-device copy: {bandwidth / 1e12:.3f} TB/s (read + written)", flush=True)
    if args.tune:
        rows = run_tune(args.tune, iters=args.iters, bench=bench, bandwidth=bandwidth)
    else:
        shapes = SHAPES if args.shapes == "all" else SMALL if args.shapes == "small" else [
            tuple(int(v) for v in item.split(":")) for item in args.shapes.split(",")]
        rows = run_shapes(shapes, iters=args.iters, peer=not args.no_peer, bench=bench,
                          bandwidth=bandwidth)
    print()
    print(harness.format_table(rows))
    if args.json:
        harness.write_json(args.json, {"copy_bandwidth_Bps": bandwidth, "rows": rows,
                                       **harness.device_summary()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
