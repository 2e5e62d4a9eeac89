#!/usr/bin/env python3
"""Benchmark of the RMSNorm families against their peers (H200, bf16).

Usage (from the repository root, on a GPU machine; fla-core and liger-kernel wheels in .whl/)::

    PYTHONPATH=. python tools/bench/rmsnorm.py [--json out.json] [--iters 20] [--shapes all|small]
        [--ops fwd,bwd,...] [--profile]
    PYTHONPATH=. python tools/bench/rmsnorm.py --precompile   # JIT both families in parallel
    PYTHONPATH=. python tools/bench/rmsnorm.py --tune --json tune.json [--variants a,b] [--iters 15]
    PYTHONPATH=. python tools/bench/rmsnorm.py --eager-gap [--shapes T:D,...]   # eager vs graph
    PYTHONPATH=. python tools/bench/rmsnorm.py --once quack,fla --shapes 65536:8192   # for ncu
    python tools/bench/rmsnorm.py --table tools/bench/results/<a run's --json>.json   # the README's table

Protocol: ``tools/bench/harness.py`` (256 MiB L2 flush before every call, CUDA events, warm-up,
median; the peers of one shape interleaved A B B A; copy bandwidth of the same run as the
roofline). Every call is timed twice: as a user calls it (its host path in the interval where
the flush does not cover it) and with its host path hidden (``hide_host``: flushes repeated until
the device is still busy with them when the call has enqueued its work), the kernels' time.
bf16 x/g/dy, bf16 weight (every peer gets the same tensors), eps 1e-6.

Groups per shape (T, D): ``fwd`` and ``bwd`` of RMSNorm, ``gated fwd`` and ``gated bwd`` of
``rmsnorm(x) * silu(g)``. Backward is timed alone: ``torch.autograd.grad`` of the forward's
output (graph retained) for every peer, cake included. Bytes that must move (the % column):
fwd 2 T D x 2 bytes (read x, write y); bwd 3 T D x 2 (read x, dy; write dx) plus the weight
gradient partials (cake: 1024 rows of D fp32, written and read); gated fwd 3 T D x 2; gated bwd
5 T D x 2 plus the partials.

``--tune`` sweeps the kernels' tuning knobs instead (``TUNE_VARIANTS``: one bf16 vector program
per family, variant and D band of the table that the shapes reach, rendered with the variant's
knobs over the band's and JIT-compiled in parallel): at every
shape, every variant's fwd, bwd, gated fwd and gated bwd through the C entries with caller
buffers (kernels only), interleaved A B B A per op; the table variant's outputs checked against
float64 (sampled rows; dweight in full), every other variant's against the table's (bitwise, or
within a sanity bound), outputs poisoned before. It prints, per op, % of copy bandwidth per
variant and shape, the kernels before the shared-memory ring ("prev", from
``tools/bench/results/2026-11-29-h200-rmsnorm.json`` when that file is there: it is in git
history), a copy of the same bytes ("copy@size", the small shapes' ceiling under this protocol)
and, for bwd and gated fwd (two bytes read for one written), an elementwise add of the same bytes
("add@size": that mix's ceiling).

Peers: ``torch.nn.functional.rms_norm`` eager and ``torch.compile``d (gated: ``F.rms_norm(x) *
F.silu(g)``, eager and compiled), FLA fla-core 0.6.0 ``fla.modules.norm.layernorm.rms_norm``
and ``fla.modules.norm.fused_norm_gate.rms_norm_gated`` (the function behind
``FusedRMSNormGated``), Liger ``LigerRMSNorm`` (liger-kernel 0.8.5, its defaults: casting
mode ``llama``, in-place backward), and quack-kernels 0.6.5 ``quack.rmsnorm.rmsnorm`` (RMSNorm
only; it has no gated form) when it imports. quack needs nvidia-cutlass-dsl 4.8.1 with
``-libs-base``, ``-libs-core`` and its CUDA 13 libraries (``-libs-cu13``, 92 MB as a wheel),
apache-tvm-ffi 0.1.15 (0.1.6 lacks an argument the DSL passes) and torch-c-dlpack-ext; installed
with ``pip --target``, ``nvidia_cutlass_dsl/dsl_packages`` goes on PYTHONPATH too (what the
package's .pth file would add; ``tests/rmsnorm/h200_run.sh`` does it). A peer that fails to
import, or whose first call raises, is reported and skipped.
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
from tools.families import cake_gated_rmsnorm_det_train as gated_table  # noqa: E402
from tools.families import cake_rmsnorm_det_train as plain_table  # noqa: E402

SHAPES = [(t, d) for t in (65536, 262144) for d in (1024, 2048, 4096, 8192)]
SMALL = [(65536, 2048), (65536, 8192)]
GAP_SHAPES = [(65536, 2048), (262144, 8192)]  # --eager-gap's default
PARTIAL_ROWS = 1024
EPS = 1e-6
OPS = ("fwd", "bwd", "gated fwd", "gated bwd")
WARMUP = 3


def op_bytes(op: str, t: int, d: int) -> int:
    """Bytes that must move (see the module docstring): the % copy figures of every mode."""
    partials = 2 * PARTIAL_ROWS * d * 4
    return {"fwd": 4 * t * d, "bwd": 6 * t * d + partials, "gated fwd": 6 * t * d,
            "gated bwd": 10 * t * d + partials}[op]


def precompile() -> None:
    """JIT-compiles every program of both families for this GPU's arch, in parallel."""
    import cake.cake_gated_rmsnorm_det_train as gated
    import cake.cake_rmsnorm_det_train as plain

    count = harness.precompile([Path(plain.__file__).parent, Path(gated.__file__).parent])
    print(f"precompiled {count} programs")


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
    try:
        from quack.rmsnorm import rmsnorm as quack_rmsnorm
        found["quack"] = quack_rmsnorm
    except Exception as exc:
        found["quack"] = f"unavailable: {type(exc).__name__}: {exc}"
    return found


def forwards(t: int, d: int, peers: dict, compiled: dict):
    """(inputs needing grad, plain, gated): dicts name -> fn returning the output, for cake,
    torch and the peers of ``peers`` that imported (absent names are left out)."""
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
    if not isinstance(peers.get("fla", ""), str):
        layernorm, fused = peers["fla"]
        plain["fla"] = lambda: layernorm.rms_norm(x, w, None, eps=EPS)
        gated["fla"] = lambda: fused.rms_norm_gated(x, g, w, None, activation="swish", eps=EPS)
    if not isinstance(peers.get("liger", ""), str):
        liger = peers["liger"](d, eps=EPS).to(device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            liger.weight.copy_(w)
        plain["liger"] = lambda: liger(x)
    if not isinstance(peers.get("quack", ""), str):
        plain["quack"] = lambda: peers["quack"](x, w, eps=EPS)
    return (x, g, w), plain, gated


def graphed(t: int, d: int, x, g, w, dy) -> tuple:
    """Cake's forward and backward helpers with caller buffers, captured in CUDA graphs:
    (plain fwd, plain bwd, gated fwd, gated bwd) replays, the same four eager calls, and the
    buffers. The replays' time is the kernels' alone (no Python, validation or launch gaps),
    next to the eager figures."""
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
    # One workspace for both families (their band counts differ).
    ws = torch.empty(max(cake_rmsnorm_det_train_backward_workspace_bytes(x, w),
                         cake_gated_rmsnorm_det_train_backward_workspace_bytes(x, g, w)),
                     dtype=torch.uint8, device="cuda")
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
    return replays, calls, (y, dx, dg, rstd, dw, ws)


def check_agreement(outputs: dict) -> dict:
    """Max |peer - cake| / max |cake| of each peer's output: a sanity check of the setup."""
    base = outputs["cake"].float()
    scale = base.abs().max().item()
    return {name: (out.float() - base).abs().max().item() / scale for name, out in outputs.items()
            if name != "cake"}


def allocator_events(before: dict) -> str:
    """What the caching allocator did since ``before`` (``torch.cuda.memory_stats()``):
    cudaMalloc / cudaFree calls and retries after freeing the cache (a cudaFree waits for the
    device, so an eager call that triggers one shows the wait in its timing)."""
    import torch

    after = torch.cuda.memory_stats()
    keys = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")
    return ", ".join(f"{k} {after[k] - before[k]}" if k in after and k in before
                     else f"{k} (not reported by this torch)" for k in keys)


def drop_failing_peers(fns: dict, where: str) -> None:
    """Removes (and reports) the peers whose first call raises, e.g. a peer whose JIT needs a
    dependency version the machine lacks: the run goes on with the others."""
    for name in [n for n in fns if n != "cake"]:
        try:
            fns[name]()
        except Exception as exc:  # noqa: BLE001 (any peer failure: report and skip)
            print(f"peer {name}: dropped at {where}: {type(exc).__name__}: {exc}", flush=True)
            del fns[name]


def fastest_peer_ms(timings: dict):
    """The fastest peer's median (``harness.Timing``s by name; cake's own rows left out), or None."""
    return min((tm.median for n, tm in timings.items() if not n.startswith("cake")), default=None)


def run(shapes, iters: int, bench, bandwidth: float, on_shape=lambda rows: None, *,
        profile: bool = False, ops=OPS):
    """The peer timings: every call twice, event-timed as a user calls it ("ms": its host path
    shows where the flush does not cover it) and with its host path hidden ("kernels ms",
    ``Bench.interleaved(hide_host=True)``). With ``profile``, each op's calls are also traced
    (``Bench.device_breakdown``): every row gets its device time and the idle time before it.
    Only the ``ops`` named are timed (a backward's forward still runs, untimed, to build its graph)."""
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
        replays, _, buffers = graphed(t, d, x, g, w, dy)
        for label, fns, inputs, graph_replays in (
                ("fwd", plain, (x, w), replays[:2]), ("gated fwd", gated, (x, g, w), replays[2:])):
            # In a function of its own: the backward calls, which hold their forward graphs, go
            # when it returns.
            rows += time_label(bench, label, fns, inputs, graph_replays, dy, (t, d), ops=ops,
                               iters=iters, bandwidth=bandwidth, profile=profile)
        del x, g, w, dy, plain, gated, replays, buffers
        torch.cuda.empty_cache()
        on_shape(rows)
    return rows


def time_label(bench, label: str, fns: dict, inputs: tuple, graph_replays: tuple, dy, shape: tuple,
               *, ops, iters: int, bandwidth: float, profile: bool) -> list:
    """The rows of one forward (``label``: "fwd" or "gated fwd") and its backward at one shape,
    each timed only if named in ``ops``: ``fns`` are the peers' forwards, ``graph_replays`` cake's
    (forward, backward) graph replays (see :func:`run`)."""
    import torch

    t, d = shape
    bwd_label = label.replace("fwd", "bwd")
    if label not in ops and bwd_label not in ops:
        return []
    drop_failing_peers(fns, f"{label} {t}x{d}")
    timed = []  # (phase, calls, eager timings, kernels timings, agreement)
    if label in ops:
        with torch.no_grad():
            agreement = check_agreement({n: f() for n, f in fns.items()})
        calls = dict({n: (lambda f=f: f()) for n, f in fns.items()}, **{"cake graph": graph_replays[0]})
        timed.append((label, calls, *time_calls(bench, calls, iters, f"T={t} D={d} {label}"), agreement))
    if bwd_label in ops:
        grads = backward_calls(fns, inputs, dy)
        with torch.no_grad():
            dx_agreement = check_agreement({n: f()[0] for n, f in grads.items()})
        calls = dict(grads, **{"cake graph": graph_replays[1]})
        timed.append((bwd_label, calls, *time_calls(bench, calls, iters, f"T={t} D={d} {bwd_label}"),
                      dx_agreement))
    rows = []
    for phase, calls, times, hidden, agree in timed:
        rows += phase_rows(phase, shape, times, hidden, agree,
                           bench.device_breakdown(calls) if profile else {}, bandwidth)
    return rows


def phase_rows(phase: str, shape: tuple, times: dict, hidden: dict, agree: dict, splits: dict,
               bandwidth: float) -> list:
    """One op's rows (eager and kernels timings, ``splits``: its traced device times by name, if
    any), printed as they are made."""
    t, d = shape
    nbytes = op_bytes(phase, t, d)
    rows = []
    for name, timing in times.items():
        rows.append({
            "T": t, "D": d, "op": phase, "impl": name, "ms": timing.median,
            "spread": timing.spread,
            "TB/s": nbytes / (timing.median * 1e-3) / 1e12,
            "% copy": harness.percent_of_roofline(nbytes, timing.median, bandwidth),
            "kernels ms": hidden[name].median, "kernels spread": hidden[name].spread,
            "kernels flushes": hidden[name].flushes,
            "max rel diff vs cake": agree.get(name, 0.0)})
        split = splits.get(name)
        if split:
            rows[-1].update({"device us": split["device_us"], "idle us": split["idle_us"]})
            print(f"T={t} D={d} {phase:9s} {name}: event {timing.median * 1e3:.1f} us, "
                  f"device {split['device_us']:.1f} us in {split['kernels']:.0f} ops, "
                  f"idle before {split['idle_us']:.1f} us", flush=True)
    best_peer, best_kernels = fastest_peer_ms(times), fastest_peer_ms(hidden)
    cake_ms, graph_ms = times["cake"].median, times["cake graph"].median
    kernels_ms = hidden["cake"].median
    print(f"T={t} D={d} {phase:9s} cake {cake_ms:.3f} ms "
          f"({harness.percent_of_roofline(nbytes, cake_ms, bandwidth):.1f}% of copy), "
          f"graph {graph_ms:.3f} ms "
          f"({harness.percent_of_roofline(nbytes, graph_ms, bandwidth):.1f}%), "
          f"kernels {kernels_ms:.3f} ms "
          f"({harness.percent_of_roofline(nbytes, kernels_ms, bandwidth):.1f}%)"
          + (f", best peer {best_peer:.3f} ms, kernels {best_kernels:.3f} ms"
             if best_peer else ""), flush=True)
    return rows


def backward_calls(forwards: dict, inputs: tuple, dy) -> dict:
    """name -> the autograd backward (``torch.autograd.grad`` of dy, graph retained) of one
    call of that peer's forward, made here."""
    import torch

    grads = {}
    for name, forward in forwards.items():
        y = forward()
        # Liger's backward writes dx into dy (in place): it gets its own copy.
        upstream = dy.clone() if name == "liger" else dy
        # allow_unused: Liger's module holds its own weight (a copy of w).
        grads[name] = (lambda y=y, u=upstream: torch.autograd.grad(
            y, inputs, u, retain_graph=True, allow_unused=True))
    return grads


def time_calls(bench, calls: dict, iters: int, where: str) -> tuple:
    """(eager timings, kernels timings) of ``calls`` timed together (see :func:`run`)."""
    import torch

    before = torch.cuda.memory_stats()
    eager = bench.interleaved(calls, iters=iters, warmup=WARMUP)
    kernels = bench.interleaved(calls, iters=iters, warmup=0, hide_host=True)
    print(f"{where}: allocator during the timing: " + allocator_events(before), flush=True)
    return eager, kernels


def call_once(shapes, only: set) -> None:
    """Calls the RMSNorm forward and its autograd backward of cake and of each peer in ``only``
    twice per shape (the first call compiles what it needs), untimed: for a profiler run over the
    process (``ncu``, ``nsys``) that compares the kernels themselves."""
    import torch

    peers = {name: value for name, value in _peers().items() if name in only}
    for name, value in peers.items():
        if isinstance(value, str):
            print(f"peer {name}: {value}", flush=True)
    for t, d in shapes:
        (x, _, w), plain, _ = forwards(t, d, peers, compiled={"rms": None, "gated": None})
        dy = torch.randn(t, d, device="cuda", dtype=torch.bfloat16)
        for name in ["cake", *sorted(n for n in plain if n in only)]:
            for _ in range(2):
                torch.autograd.grad(plain[name](), (x, w), dy, allow_unused=True)
            torch.cuda.synchronize()
            print(f"T={t} D={d}: {name} called", flush=True)
        del x, w, dy, plain
        torch.cuda.empty_cache()


def eager_gap(shapes, iters: int, bench) -> list:
    """RMSNorm's forward and backward, four ways each, interleaved per shape: the CUDA-graph
    replay of the helper with caller buffers (the kernels alone), the same helper called
    eagerly, the helper allocating its outputs, and the autograd functional (backward:
    ``torch.autograd.grad`` of its output). The kernels are the same, so a difference is host
    time that the flush before the call (58 us on the H200) does not hide."""
    import torch

    from cake.cake_rmsnorm_det_train import (cake_rmsnorm_det, cake_rmsnorm_det_train_backward,
                                             cake_rmsnorm_det_train_forward)

    rows = []
    for t, d in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        x, g, dy = (torch.randn(t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                    for _ in range(3))
        w = (torch.rand(d, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
        replays, given, (_, _, _, rstd, _, _) = graphed(t, d, x, g, w, dy)
        xg, wg = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
        yg = cake_rmsnorm_det(xg, wg, eps=EPS)
        ops = {
            "fwd": {"graph": replays[0], "helper, outputs given": given[0],
                    "helper": lambda: cake_rmsnorm_det_train_forward(x, w, eps=EPS),
                    "autograd": lambda: cake_rmsnorm_det(xg, wg, eps=EPS)},
            "bwd": {"graph": replays[1], "helper, outputs given": given[1],
                    "helper": lambda: cake_rmsnorm_det_train_backward(dy, x, w, rstd,
                                                                      grad_dtype=w.dtype),
                    "autograd": lambda: torch.autograd.grad(yg, (xg, wg), dy, retain_graph=True)},
        }
        for op, fns in ops.items():
            for name, timing in bench.interleaved(fns, iters=iters, warmup=WARMUP).items():
                rows.append({"T": t, "D": d, "op": op, "call": name, "us": timing.median * 1e3,
                             "spread": timing.spread})
            print(harness.format_table(rows[-len(fns):]), flush=True)
        del x, g, dy, w, replays, given, rstd, xg, wg, yg, ops, fns  # fns: the last op's closures
        torch.cuda.empty_cache()
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
    if not isinstance(peers.get("fla", ""), str):
        layernorm, _ = peers["fla"]
        cases["fla fwd"] = lambda: layernorm.rms_norm(x, w, None, eps=EPS)
        cases["fla fwd+bwd"] = lambda: torch.autograd.backward(
            layernorm.rms_norm(x, w, None, eps=EPS), dy)
    if not isinstance(peers.get("quack", ""), str):
        cases["quack fwd"] = lambda: peers["quack"](x, w, eps=EPS)
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


# --------------------------------------------------------------------------- tuning

# RMSNorm's ring backward (TUNING's; its 16-bit programs at D <= 2048 take the registers path
# since 2026-12-03), which the ring variants below start from so that they mean the same at
# every D (in the gated family, whose table has a 3-slot ring of 264 bands, they run these).
NARROW_BACKWARD = plain_table.NARROW_BACKWARD_TUNING
RING_BACKWARD = {knob: plain_table.TUNING[knob] for knob in NARROW_BACKWARD}
# The gated table's backward shape, for RMSNorm's backward in the variants below.
GATED_BACKWARD_SHAPE = {**RING_BACKWARD, "CAKE_BACKWARD_STAGES": 3, "CAKE_BACKWARD_MIN_BLOCKS": 0,
                        "CAKE_BACKWARD_BANDS": 264}

# Variants swept by --tune: knob overrides (csrc/templates/rmsnorm/kernel.cu) on top of each
# family's bf16 vector tuning in its table (``tuning`` in tools/families/cake_rmsnorm_det_train.py;
# the two families differ in the backward's stages and register bound), one knob at a time, and a
# few pairs. "table" is that tuning itself (the reference of the output checks); "registers" is
# the design before the shared-memory ring, launched as it was (one persistent forward wave).
# CAKE_BACKWARD_BANDS is the count for CTAs of CAKE_BACKWARD_CTA_THREADS; since 2026-12-03's
# backward_bands a D whose CTA is smaller and fits more of them an SM gets more (e.g. 792 for the
# table's 528 at D = 4097 .. 5120, 1188 for bands792 there; with 256-thread CTAs also at D = 2056);
# the variants' figures measured before then had the knob's count at every D. A variant that
# leaves a backward knob out takes the band's: at D <= 2048 RMSNorm's registers-path backward.
# The results/... files the comments below cite are past runs, kept in git history (the tree keeps
# only the current one per family and GPU: docs/benchmarks.md).
TUNE_VARIANTS = {
    "table": {},
    "registers": {"CAKE_FORWARD_STAGES": 0, "CAKE_BACKWARD_STAGES": 0, "CAKE_FORWARD_MIN_BLOCKS": 0,
                  "CAKE_BACKWARD_MIN_BLOCKS": 0, "CAKE_FORWARD_CTA_ROWS": 0},
    "fwd_stages3": {"CAKE_FORWARD_STAGES": 3},
    "fwd_stages4": {"CAKE_FORWARD_STAGES": 4},
    "fwd_mb2": {"CAKE_FORWARD_MIN_BLOCKS": 2},
    "fwd_mb0": {"CAKE_FORWARD_MIN_BLOCKS": 0},
    "fwd_mb3": {"CAKE_FORWARD_MIN_BLOCKS": 3},
    "fwd_mb4": {"CAKE_FORWARD_MIN_BLOCKS": 4},
    "fwd_weights_l1": {"CAKE_FORWARD_WEIGHTS": 2},
    "fwd_weights_regs": {"CAKE_FORWARD_WEIGHTS": 1, "CAKE_FORWARD_MIN_BLOCKS": 2},
    "bwd_stages2": {"CAKE_BACKWARD_STAGES": 2},
    "bwd_stages3": {"CAKE_BACKWARD_STAGES": 3},
    "bwd_stages4": {"CAKE_BACKWARD_STAGES": 4},
    "bwd_weights_l1": {"CAKE_BACKWARD_WEIGHTS": 2, "CAKE_BACKWARD_MIN_BLOCKS": 1},
    "bwd_weights_l1_stages2": {"CAKE_BACKWARD_WEIGHTS": 2, "CAKE_BACKWARD_MIN_BLOCKS": 1,
                               "CAKE_BACKWARD_STAGES": 2},
    "bwd_weights_regs": {"CAKE_BACKWARD_WEIGHTS": 1, "CAKE_BACKWARD_MIN_BLOCKS": 1},
    "bwd_mb0": {"CAKE_BACKWARD_MIN_BLOCKS": 0},
    "bwd_mb1": {"CAKE_BACKWARD_MIN_BLOCKS": 1},
    "fwd_wave": {"CAKE_FORWARD_CTA_ROWS": 0},
    "fwd_registers_rows8": {"CAKE_FORWARD_STAGES": 0, "CAKE_FORWARD_CTA_ROWS": 8},
    # The registers path (next row in registers, no ring) at 16 elements a thread up to
    # D = 8192 (it has no 32-element instance), CTAs of 8, 16 or 32 rows.
    "fwd_registers_row512_rows8": {"CAKE_FORWARD_STAGES": 0, "CAKE_FORWARD_CTA_ROWS": 8,
                                   "CAKE_FORWARD_MAX_ROW_THREADS": 512},
    "fwd_registers_row512_rows16": {"CAKE_FORWARD_STAGES": 0, "CAKE_FORWARD_CTA_ROWS": 16,
                                    "CAKE_FORWARD_MAX_ROW_THREADS": 512},
    "fwd_registers_row512_rows32": {"CAKE_FORWARD_STAGES": 0, "CAKE_FORWARD_CTA_ROWS": 32,
                                    "CAKE_FORWARD_MAX_ROW_THREADS": 512},
    "fwd_rows2": {"CAKE_FORWARD_CTA_ROWS": 2},
    "fwd_rows4": {"CAKE_FORWARD_CTA_ROWS": 4},
    "fwd_rows8": {"CAKE_FORWARD_CTA_ROWS": 8},
    "fwd_rows32": {"CAKE_FORWARD_CTA_ROWS": 32},
    "bands512": {"CAKE_BACKWARD_BANDS": 512},
    "bands2048": {"CAKE_BACKWARD_BANDS": 2048},
    # Band counts that fill whole waves on 132 SMs at 1, 2 or 4 resident CTAs an SM (528 =
    # 4 x 132; 792 = 6 x 132). The table since 2026-12-01 has 512-thread backward CTAs in 528
    # bands for RMSNorm and 264 for the gated family, so cta512_bands528 and cta512_bands264
    # each repeat one family's table. The day's bands tunes (...-backward-bands-*.json) ran on
    # the table before (256-thread CTAs in 1024 bands), where cta256_bands528 and
    # cta256_bands1056 were bands528 and bands1056.
    "cta256_bands528": {"CAKE_BACKWARD_CTA_THREADS": 256, "CAKE_BACKWARD_BANDS": 528},
    "cta256_bands1056": {"CAKE_BACKWARD_CTA_THREADS": 256, "CAKE_BACKWARD_BANDS": 1056},
    "cta512_bands264": {"CAKE_BACKWARD_CTA_THREADS": 512, "CAKE_BACKWARD_BANDS": 264},
    "cta512_bands528": {"CAKE_BACKWARD_CTA_THREADS": 512, "CAKE_BACKWARD_BANDS": 528},
    "cta512_bands1056": {"CAKE_BACKWARD_CTA_THREADS": 512, "CAKE_BACKWARD_BANDS": 1056},
    "bands792": {"CAKE_BACKWARD_BANDS": 792},  # 3 waves for RMSNorm, 6 for the gated family
    # A staged backward CTA's weights staged a pack at a time while its first ring copies are in
    # flight, or an element at a time before them (RMSNorm's table overlaps, the gated one's does
    # not: 2026-12-02, results/2026-12-02-h200-rmsnorm-backward-staging-ab.txt).
    "bwd_overlap_staging": {"CAKE_BACKWARD_OVERLAP_STAGING": 1},
    "bwd_serial_staging": {"CAKE_BACKWARD_OVERLAP_STAGING": 0},
    # The backward's CTAs take the row steps in turn (both tables), or a band of consecutive
    # rows each (2026-12-02, results/2026-12-02-h200-rmsnorm-backward-interleave-*).
    "bwd_interleave": {"CAKE_BACKWARD_INTERLEAVE": 1},
    "bwd_bands": {"CAKE_BACKWARD_INTERLEAVE": 0},
    # The row steps in regions of 1/2, 1/4, ..., each taken in turn by a wave of half the bands'
    # CTAs (CAKE_BACKWARD_GUIDED; the gated table's 1 since 2026-12-02, results/
    # 2026-12-02-h200-rmsnorm-backward-guided-tune-*.json), and with other band counts.
    "bwd_guided1": {"CAKE_BACKWARD_GUIDED": 1},
    "bwd_guided2": {"CAKE_BACKWARD_GUIDED": 2},
    "bwd_guided3": {"CAKE_BACKWARD_GUIDED": 3},
    "bwd_guided4": {"CAKE_BACKWARD_GUIDED": 4},
    "bwd_bands264_guided1": {"CAKE_BACKWARD_BANDS": 264, "CAKE_BACKWARD_GUIDED": 1},
    "bwd_bands1056_guided1": {"CAKE_BACKWARD_BANDS": 1056, "CAKE_BACKWARD_GUIDED": 1},
    # The gated backward's shape (3-slot ring, no register bound, one CTA an SM, two waves of
    # bands) for RMSNorm's; with its waves in halves (the gated table since 2026-12-02), and a
    # 4-slot ring.
    "bwd_gated_shape": GATED_BACKWARD_SHAPE,
    "bwd_gated_shape_guided1": {**GATED_BACKWARD_SHAPE, "CAKE_BACKWARD_GUIDED": 1},
    "bwd_gated_shape_stages4_guided1": {**GATED_BACKWARD_SHAPE, "CAKE_BACKWARD_STAGES": 4,
                                        "CAKE_BACKWARD_GUIDED": 1},
    # Main's backward before 2026-12-01's bands: 256-thread CTAs in 1024 bands, both families.
    "bwd_cta256_bands1024": {"CAKE_BACKWARD_CTA_THREADS": 256, "CAKE_BACKWARD_BANDS": 1024},
    # quack 0.6.5's Hopper backward at D = 1024 (rmsnorm_config.py): one 128-thread row of 8
    # elements a CTA step, 8 CTAs an SM in one wave (132 x 8 partial rows); and neighbours of it.
    # In cake's kernel through its ring: 65-77% of copy at D = 1024, 2048 with 8 elements a thread,
    # 71-92% with 16 in 128-thread CTAs, against the table's 87-94%
    # (2026-12-02-h200-rmsnorm-backward-quack-shape-tune.json).
    "bwd_cta128_ept8_bands1056": {**RING_BACKWARD, "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 8,
                                  "CAKE_BACKWARD_CTA_THREADS": 128, "CAKE_BACKWARD_BANDS": 1056},
    "bwd_cta128_ept8_bands1056_stages3": {**RING_BACKWARD, "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 8,
                                          "CAKE_BACKWARD_CTA_THREADS": 128, "CAKE_BACKWARD_BANDS": 1056,
                                          "CAKE_BACKWARD_STAGES": 3},
    "bwd_cta256_ept8_bands528": {**RING_BACKWARD, "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 8,
                                 "CAKE_BACKWARD_CTA_THREADS": 256},
    "bwd_cta128_bands1056": {**RING_BACKWARD, "CAKE_BACKWARD_CTA_THREADS": 128, "CAKE_BACKWARD_BANDS": 1056},
    "bwd_cta128_bands1056_stages3": {**RING_BACKWARD, "CAKE_BACKWARD_CTA_THREADS": 128,
                                     "CAKE_BACKWARD_BANDS": 1056, "CAKE_BACKWARD_STAGES": 3},
    # The same shapes on the registers path (the next row loaded while the current one is
    # reduced, no ring), and neighbours; at D <= 2048 RMSNorm's 16-bit table since 2026-12-03 is
    # bwd_reg_ept8_cta256_bands528 (NARROW_BACKWARD_TUNING), and bwd_ring_table its backward
    # before. In two H200 tunes (2026-12-04-h200-rmsnorm-backward-registers-tune{1,2}.json): one
    # 128-thread row of 8 elements a CTA (8 an SM) 1.043x the ring at 262144 x 1024 but spilling
    # at D = 2048 (16 elements at 64 registers); 128-thread rows of 16 at 128 registers (4 an SM)
    # 1.028x there; 512-thread CTAs and 1056 bands: the family table's comment.
    "bwd_ring_table": RING_BACKWARD,
    "bwd_reg_ept8_cta128_bands1056": {**NARROW_BACKWARD, "CAKE_BACKWARD_MAX_ROW_THREADS": 128,
                                      "CAKE_BACKWARD_CTA_THREADS": 128, "CAKE_BACKWARD_BANDS": 1056},
    "bwd_reg_cta128_mb1_bands528": {**NARROW_BACKWARD, "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 16,
                                    "CAKE_BACKWARD_MAX_ROW_THREADS": 128, "CAKE_BACKWARD_CTA_THREADS": 128,
                                    "CAKE_BACKWARD_MIN_BLOCKS": 1},
    "bwd_reg_ept8_cta256_bands528": NARROW_BACKWARD,
    "bwd_reg_ept8_cta256_bands1056": {**NARROW_BACKWARD, "CAKE_BACKWARD_BANDS": 1056},
    "bwd_reg_ept8_row256_cta512_bands264": {**NARROW_BACKWARD, "CAKE_BACKWARD_CTA_THREADS": 512,
                                            "CAKE_BACKWARD_BANDS": 264},
    "bwd_reg_ept8_row256_cta512_bands528": {**NARROW_BACKWARD, "CAKE_BACKWARD_CTA_THREADS": 512},
    # Fixed-width rows for every multiple of 32 threads below 512 (96, 160, 224, 288, ...: D = 1536,
    # 2560, 3584, 4608 at 16 elements a thread) but not for the rows of a warp or less (D <= 512:
    # the run-time width there; both tables from 2026-12-03 until 2026-12-04's value 3), or only
    # the multiples of 64 (the tables before).
    "common32": {"CAKE_FORWARD_COMMON_WIDTHS": 2, "CAKE_BACKWARD_COMMON_WIDTHS": 2},
    "common64": {"CAKE_FORWARD_COMMON_WIDTHS": 1, "CAKE_BACKWARD_COMMON_WIDTHS": 1},
    "ept8": {"CAKE_FORWARD_MIN_ELEMS_PER_THREAD": 8, "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 8},
    "row256": {"CAKE_FORWARD_MAX_ROW_THREADS": 256, "CAKE_BACKWARD_MAX_ROW_THREADS": 256},
    "ept8_row256": {"CAKE_FORWARD_MIN_ELEMS_PER_THREAD": 8, "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 8,
                    "CAKE_FORWARD_MAX_ROW_THREADS": 256, "CAKE_BACKWARD_MAX_ROW_THREADS": 256},
    # The forward's widest row group below 32 elements a thread (the table: 64 for RMSNorm's
    # 16-bit vector programs above D = 8192, 256 at D = 6145 .. 7168, 512 elsewhere and for the
    # gated ones, so fwd_row64 and fwd_row512 each repeat a table).
    "fwd_row512": {"CAKE_FORWARD_MAX_ROW_THREADS": 512},
    "fwd_row128": {"CAKE_FORWARD_MAX_ROW_THREADS": 128},
    "fwd_row64": {"CAKE_FORWARD_MAX_ROW_THREADS": 64},
    "fwd_row32": {"CAKE_FORWARD_MAX_ROW_THREADS": 32},
    # The backward's (both families' table: 512): 32 elements a thread keep their weight-gradient
    # sums in shared memory (dw_in_shared) under a one-CTA register bound.
    "bwd_row256": {"CAKE_BACKWARD_MAX_ROW_THREADS": 256},
    "bwd_row128": {"CAKE_BACKWARD_MAX_ROW_THREADS": 128},
    "bwd_row64": {"CAKE_BACKWARD_MAX_ROW_THREADS": 64},
    # One-warp rows (no barrier in the row sums): 32 elements a thread from D = 1024 up, one
    # CTA an SM: 40-74% of copy (results/2026-12-02-h200-rmsnorm-group-barriers-ab.txt).
    "bwd_row32": {"CAKE_BACKWARD_MAX_ROW_THREADS": 32},
    "cta128": {"CAKE_FORWARD_CTA_THREADS": 128, "CAKE_BACKWARD_CTA_THREADS": 128},
    # 512 threads both ways: the table since 2026-12-01 (with its bands), so cta512 repeats it.
    "cta512": {"CAKE_FORWARD_CTA_THREADS": 512, "CAKE_BACKWARD_CTA_THREADS": 512},
    "l2_128": {"CAKE_L2_PREFETCH": 128},
    "l2_256": {"CAKE_L2_PREFETCH": 256},
    # Forward CTA size (the night's sweeps, results/2026-11-29-h200-rmsnorm-forward-
    # cta-*.json; those runs had one CAKE_CTA_THREADS knob for both directions and families):
    # 512 or 256 threads (the ring programs' table: 512), and weights read through L1 (shared
    # memory left to the ring). On the one-row forwards at D = 4096, fwd_cta512 pairs the 256-thread
    # rows (the gated table there since 2026-12-03) and fwd_cta256 gives each its own CTA.
    # Paired rows in the one-row forwards of D <= 2048 (two or four 128-thread rows a CTA at D = 2048,
    # 32 or 64 rows of 8 threads at D = 128): both families behind their tables' one row step a
    # CTA at 65536 and 262144 x 2048 (by 0.6-8.2 points of copy), RMSNorm's at 1048576 x 128 too
    # (0.4, 0.9), the gated one's there 0.3 ahead in 256-thread CTAs, 0.6 behind in 512
    # (results/2026-12-04-h200-rmsnorm-paired-one-row-tune.json).
    "fwd_cta256": {"CAKE_FORWARD_CTA_THREADS": 256},
    "fwd_cta512": {"CAKE_FORWARD_CTA_THREADS": 512},
    "fwd_weights_l1_stages3": {"CAKE_FORWARD_WEIGHTS": 2, "CAKE_FORWARD_STAGES": 3},
    "fwd_weights_l1_rows32": {"CAKE_FORWARD_WEIGHTS": 2, "CAKE_FORWARD_CTA_ROWS": 32},
    # RMSNorm's one-row forward (the table up to D = 4096; 2048 when this ran) at 8 elements a
    # thread and 32 registers (4 CTAs' bound: full occupancy, FLA's); the backward then has
    # 8-element instances too.
    "one_row_ept8_mb4": {"CAKE_FORWARD_MIN_ELEMS_PER_THREAD": 8, "CAKE_BACKWARD_MIN_ELEMS_PER_THREAD": 8,
                         "CAKE_FORWARD_MIN_BLOCKS": 4},
    # The one-row forward at 40 registers (RMSNorm's table up to D = 2048 and at 3585 .. 4096)
    # at every D, in both families (the gated one spills at D = 2048 in it), and at 2 CTAs'
    # register bound (64: the gated table up to D = 3584).
    "one_row": dict(plain_table.ONE_ROW_FORWARD_TUNING),
    "one_row_mb2": dict(plain_table.GATED_ONE_ROW_NARROW_TUNING),
    # More bytes in flight an SM for RMSNorm's one-row forward at D = 8192 (a 512-thread row,
    # 3 CTAs an SM at 40 registers): 4 CTAs at 32 registers (the table at D = 4097 .. 6144 and
    # 7169 .. 8192 since this sweep, with fixed rows of 288 to 512 threads there, and at
    # D = 2049 .. 3584 since 2026-12-03: ...-forward-32-registers-tune{1,2}.json); 32 elements a
    # thread in rows of up to 256 threads at 3 or 2 CTAs' bound (40 or 48 registers; the latter
    # the table at D = 6145 .. 7168 since 2026-12-03: ...-forward-32-elements-checks.txt); or 4
    # rows a CTA with the next row in registers (56, 2 CTAs' bound).
    "one_row_mb4": dict(plain_table.ONE_ROW_FORWARD_TUNING, CAKE_FORWARD_MIN_BLOCKS=4),
    "one_row_row256": dict(plain_table.ONE_ROW_FORWARD_TUNING, CAKE_FORWARD_MAX_ROW_THREADS=256),
    "one_row_row256_mb2": dict(plain_table.ONE_ROW_FORWARD_TUNING, CAKE_FORWARD_MAX_ROW_THREADS=256,
                               CAKE_FORWARD_MIN_BLOCKS=2),
    "one_row_rows4": dict(plain_table.ONE_ROW_FORWARD_TUNING, CAKE_FORWARD_CTA_ROWS=4,
                          CAKE_FORWARD_MIN_BLOCKS=2),
    # one_row_mb4 at D = 4096 (8 rows an SM instead of 6 at 40 registers; measured as
    # one_row_wide_row256 when a knob bounded the fixed widths): 0.9-1.0 points behind the table
    # (results/2026-12-02-h200-rmsnorm-dweight-dependent-launch-tune.json). At 32
    # registers its 128-thread fixed rows spill (D = 4096 runs the 256-thread ones; the tune
    # does not check for spills).
    # On the one-row forward at D = 4096, with fwd_cta512 (two 256-thread rows a CTA;
    # results/2026-12-03-h200-rmsnorm-forward-4096-weights-first-tune1.json) and fwd_rows2,
    # fwd_rows4 above: a CTA's next rows loaded while it writes the current one (2 or 4 rows a
    # CTA, at 40 or 64 registers; ...-forward-4096-rows-tune{1,2}.json): 2.3-4.7 points behind
    # the table.
    "fwd_rows2_mb2": {"CAKE_FORWARD_CTA_ROWS": 2, "CAKE_FORWARD_MIN_BLOCKS": 2},
    # The one-row forwards at 8 elements a thread (rows of 16 threads at D = 128, the heads that
    # QK-norm and GDN's output norm normalise): at 40 registers, or at 32 (16 CTAs of 128 threads
    # an SM; 16 elements a thread spill there) in CTAs of 128 or 256 threads. In one H200 tune of
    # 2026-12-04 (results/2026-12-04-h200-rmsnorm-head-forward-ept8-tune.json, D = 64
    # .. 2048) RMSNorm's table led all three at every D (92.8 / 95.9% of copy at 1048576 /
    # 4194304 x 128 against 92.4 / 95.4 for the best, ept8_mb4); the gated forward at 40 registers
    # (one_row_fwd_ept8) led its table by 0.7 points at D = 128 (98.3 / 101.3%) and was level at
    # 256, behind at 64 and 512 .. 2048 (by 5.4 points at 2048); at 32 registers it spills.
    "one_row_fwd_ept8": dict(plain_table.ONE_ROW_FORWARD_TUNING, CAKE_FORWARD_MIN_ELEMS_PER_THREAD=8),
    "one_row_fwd_ept8_mb4": dict(plain_table.ONE_ROW_FORWARD_TUNING, CAKE_FORWARD_MIN_ELEMS_PER_THREAD=8,
                                 CAKE_FORWARD_MIN_BLOCKS=4),
    "one_row_fwd_ept8_cta256_mb4": dict(plain_table.ONE_ROW_FORWARD_TUNING,
                                        CAKE_FORWARD_MIN_ELEMS_PER_THREAD=8,
                                        CAKE_FORWARD_CTA_THREADS=256, CAKE_FORWARD_MIN_BLOCKS=4),
    # The backward's rows of 192, 320, 384 and 448 threads (D = 3072, 5120, 6144, 7168 at 16
    # elements a thread) fixed, but not the other multiples of 32 (the tables of the eighth and
    # ninth sessions of 2026-12-03; common32 is the tables since), or run-time-width as before;
    # with 792 bands, whole waves where 320-thread CTAs fit 3 an SM.
    "bwd_common_widths": {"CAKE_BACKWARD_COMMON_WIDTHS": 1},
    "bwd_runtime_widths": {"CAKE_BACKWARD_COMMON_WIDTHS": 0},
    "bwd_common_widths_bands792": {"CAKE_BACKWARD_COMMON_WIDTHS": 1, "CAKE_BACKWARD_BANDS": 792},
}


def tune_band(cols: int) -> tuple:
    """The routes of both families' bf16 vector programs serving D = ``cols``: shapes with the
    same routes share the tune's programs."""
    routes = (plain_table.band("bfloat16", "vector", gated, cols)[0] for gated in (False, True))
    return tuple((route["cols_min"], route["cols_max"]) for route in routes)


def tune_programs(variants: dict, cols: int) -> dict:
    """variant -> {"plain": library, "gated": library}: the bf16 vector program of each family
    serving D = ``cols`` (its table's band) with the variant's knobs, JIT-compiled in parallel
    (``harness.tune_libraries``). Variants whose knobs come out the same for a family (e.g.
    bwd_stages2 is the plain table) share its program."""
    out = {name: {} for name in variants}
    for key, table, gated in (("plain", plain_table, False), ("gated", gated_table, True)):
        base = dict(plain_table.tuning("bfloat16", "vector", gated, cols), CAKE_DTYPE=0, CAKE_VECTOR=1,
                    CAKE_GATED=int(gated))
        knobs = {name: dict(base, **overrides) for name, overrides in variants.items()}
        unique = {}
        for name, params in knobs.items():
            unique.setdefault(tuple(sorted(params.items())), name)
        libraries = harness.tune_libraries(table.FAMILY, {name: knobs[name] for name in unique.values()},
                                           repo=REPO)
        for name, params in knobs.items():
            out[name][key] = libraries[unique[tuple(sorted(params.items()))]]
    return out


class TuneCase:
    """Inputs and caller buffers of one shape (bf16 x, g, dy and weight; fp32 rstd and dweight)
    and closures calling a library's C entries directly (their declared arguments:
    tools/families/cake_rmsnorm_det_train.py, ENTRIES)."""

    def __init__(self, t: int, d: int, libraries: dict):
        import ctypes

        import torch

        self.t, self.d = t, d
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.x = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.g = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.dy = torch.randn(t, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        self.w = (torch.rand(d, device="cuda", generator=gen) + 0.5).to(torch.bfloat16)
        self.y, self.dx, self.dg = (torch.empty_like(self.x) for _ in range(3))
        self.rstd = torch.empty(t, device="cuda", dtype=torch.float32)
        self.dw = torch.empty(d, device="cuda", dtype=torch.float32)
        need = ctypes.c_int64(-1)
        sizes = []
        for pair in libraries.values():
            for library in pair.values():
                library.entry("workspace_bytes")(0, rows=t, cols=d, out=ctypes.addressof(need))
                sizes.append(need.value)
        self.ws = torch.empty(max(sizes), device="cuda", dtype=torch.uint8)

    def call(self, library, op: str):
        """A closure running `op` through `library` (plain for fwd/bwd, gated for gated ops)."""
        import torch

        gate = self.g if op.startswith("gated") else None
        stream = torch.cuda.current_stream().cuda_stream
        # Every argument bound once (no per-call values): a call packs nothing, as the list
        # calls did.
        if op.endswith("fwd"):
            entry = library.entry("forward").bind(
                (), x=self.x, residual=None, gate=gate, weight=self.w, y=self.y, residual_out=None,
                rstd=self.rstd, rows=self.t, cols=self.d, weight_fp32=0, eps=EPS,
                weight_offset=0.0)
        else:
            entry = library.entry("backward").bind(
                (), s=self.x, gate=gate, weight=self.w, dy=self.dy, rstd=self.rstd, dsum=None,
                dx=self.dx, dresidual=None, dgate=self.dg if gate is not None else None,
                workspace=self.ws, workspace_bytes=self.ws.numel(), dweight=self.dw, rows=self.t,
                cols=self.d, weight_fp32=0, dweight_dtype=2, weight_offset=0.0)
        return lambda: entry(stream)

    def outputs(self, gated: bool) -> dict:
        out = {"y": self.y, "rstd": self.rstd, "dx": self.dx, "dweight": self.dw}
        if gated:
            out["dg"] = self.dg
        return out

    def reference(self, gated: bool, rows: int = 64) -> dict:
        """float64 y, rstd, dx (, dg) of `rows` rows spread over the call (their indices under
        "rows"), and dweight of every row (chunked) with its envelope sum |dn * xhat|."""
        import torch

        index = torch.linspace(0, self.t - 1, rows, device="cuda").round().long()
        x, dy, w = self.x[index].double(), self.dy[index].double(), self.w.double()
        g = self.g[index].double() if gated else None
        rstd = torch.rsqrt(x.square().mean(-1, keepdim=True) + EPS)
        xhat = x * rstd
        gate = g * torch.sigmoid(g) if gated else 1.0
        dn = dy * gate
        dx = rstd * (dn * w - xhat * (dn * w * xhat).mean(-1, keepdim=True))
        ref = {"rows": index, "y": xhat * w * gate, "rstd": rstd.squeeze(-1), "dx": dx}
        if gated:
            sig = torch.sigmoid(g)
            ref["dg"] = dy * xhat * w * sig * (1 + g * (1 - sig))
        dweight = torch.zeros(self.d, dtype=torch.float64, device="cuda")
        envelope = torch.zeros_like(dweight)
        for start in range(0, self.t, 8192):
            part = slice(start, start + 8192)
            xs = self.x[part].double()
            xs = xs * torch.rsqrt(xs.square().mean(-1, keepdim=True) + EPS)
            dns = self.dy[part].double()
            if gated:
                gs = self.g[part].double()
                dns = dns * gs * torch.sigmoid(gs)
            dweight += (dns * xs).sum(0)
            envelope += (dns * xs).abs().sum(0)
        ref["dweight"], ref["envelope"] = dweight, envelope
        return ref


def _close(got, want, envelope=None) -> bool:
    """The tune's sanity bound (the GPU tests hold the exact ones): 2 bf16 ulps of each element
    plus 2^-10 of the tensor's largest magnitude; dweight: 1e-4 of its envelope sum |dn * xhat|.
    Compared in row chunks (a 4 GiB tensor in float64 would not fit twice)."""
    if envelope is not None:
        return bool(((got.double() - want.double()).abs() <= 1e-4 * envelope + 1e-6).all())
    scale = float(want.abs().max())
    for start in range(0, got.shape[0], 16384):
        g, w = got[start:start + 16384].double(), want[start:start + 16384].double()
        if not bool(((g - w).abs() <= 2.0 ** -7 * w.abs() + 2.0 ** -10 * scale).all()):
            return False
    return True


def check_variants(case: TuneCase, programs: dict) -> dict:
    """Runs every variant's forward and backward, both families, on poisoned outputs: (variant,
    family) -> "=" (bitwise the table's outputs), "~" (within the sanity bound of them),
    "FAIL <outputs>", or "FAIL launch: <message>" (not timed); the first variant (the table) is
    checked against float64 instead ("ok" or "FAIL ...")."""
    import torch

    results = {}
    for gated, key in ((False, "plain"), (True, "gated")):
        ref = case.reference(gated)
        base = None
        for name, pair in programs.items():
            outputs = case.outputs(gated)
            for tensor in outputs.values():
                tensor.fill_(float("nan"))
            prefix = "gated " if gated else ""
            try:
                case.call(pair[key], prefix + "fwd")()
                case.call(pair[key], prefix + "bwd")()
            except RuntimeError as exc:  # an entry refused to launch (its message says why)
                results[(name, key)] = f"FAIL launch: {exc}"
                continue
            torch.cuda.synchronize()
            if base is None:
                rows = ref["rows"]
                bad = [n for n, t in outputs.items() if n != "dweight" and not _close(t[rows], ref[n])]
                if not _close(outputs["dweight"], ref["dweight"], ref["envelope"]):
                    bad.append("dweight")
                base = {n: t.clone() for n, t in outputs.items()}
                results[(name, key)] = "FAIL " + ",".join(bad) if bad else "ok"
                continue
            if all(torch.equal(outputs[n], base[n]) for n in outputs):
                results[(name, key)] = "="
                continue
            bad = [n for n in outputs if n != "dweight" and not _close(outputs[n], base[n])]
            if not _close(outputs["dweight"], base["dweight"], ref["envelope"]):
                bad.append("dweight")
            results[(name, key)] = "FAIL " + ",".join(bad) if bad else "~"
        del base
    return results


def copy_at_size(bench: harness.Bench, nbytes: int, iters: int) -> float:
    """ms of a device copy that moves `nbytes` (read plus written), same protocol."""
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    return bench.time(lambda: dst.copy_(src), warmup=2, iters=iters).median


# Ops that read two bytes for each byte they write (bwd: x, dy -> dx; gated fwd: x, g -> y): the
# tune also times an elementwise add of the same bytes, the copy's counterpart for that mix.
TWO_READS_ONE_WRITE = ("bwd", "gated fwd")
REFERENCES = ("copy@size", "add@size")  # the tune's rows that time no variant


def add_at_size(bench: harness.Bench, nbytes: int, iters: int) -> float:
    """ms of an elementwise add that moves `nbytes` (two tensors read, one written), same protocol."""
    import torch

    a, b, out = (torch.empty(nbytes // 6, dtype=torch.int16, device="cuda") for _ in range(3))
    return bench.time(lambda: torch.add(a, b, out=out), warmup=2, iters=iters).median


def run_tune(shapes, variants: dict, iters: int, bench: harness.Bench, bandwidth: float,
             on_shape=lambda rows: None, *, profile: bool = False) -> list:
    """Times every variant's op at every shape (interleaved, against a copy of the same bytes);
    ``profile`` adds each call's device operations from a trace (``Bench.device_breakdown``:
    the backward's main and weight-gradient kernels and the gap between them)."""
    import torch

    # One set of programs for each band of the RMSNorm table that the shapes reach (the
    # variants' knobs go on top of the band's own).
    by_band = {}
    for _, d in shapes:
        if tune_band(d) not in by_band:
            by_band[tune_band(d)] = tune_programs(variants, d)
            print(f"programs ready for {len(variants)} variants (band of D = {d})", flush=True)
    rows = []
    for t, d in shapes:
        programs = by_band[tune_band(d)]
        case = TuneCase(t, d, programs)
        checks = check_variants(case, programs)
        for op in OPS:
            key = "gated" if op.startswith("gated") else "plain"
            nbytes = op_bytes(op, t, d)
            runnable = {name: case.call(pair[key], op) for name, pair in programs.items()
                        if not checks[(name, key)].startswith("FAIL launch")}
            timings = bench.interleaved(runnable, iters=iters, warmup=2)
            traced = bench.device_breakdown(runnable) if profile else {}
            copy_ms = copy_at_size(bench, nbytes, iters)
            rows.append({"T": t, "D": d, "op": op, "variant": "copy@size", "ms": copy_ms,
                         "% copy": harness.percent_of_roofline(nbytes, copy_ms, bandwidth)})
            if op in TWO_READS_ONE_WRITE:
                add_ms = add_at_size(bench, nbytes, iters)
                rows.append({"T": t, "D": d, "op": op, "variant": "add@size", "ms": add_ms,
                             "% copy": harness.percent_of_roofline(nbytes, add_ms, bandwidth)})
            for name, timing in timings.items():
                rows.append({"T": t, "D": d, "op": op, "variant": name, "ms": timing.median,
                             "spread": timing.spread, "check": checks[(name, key)],
                             "% copy": harness.percent_of_roofline(nbytes, timing.median, bandwidth)})
                if name in traced:
                    split = traced[name]
                    rows[-1].update({"device us": split["device_us"], "idle us": split["idle_us"],
                                     "ops us": split["ops_us"], "gaps us": split["gaps_us"]})
                    print(f"T={t} D={d} {op} {name}: ops " + " + ".join(f"{u:.1f}" for u in split["ops_us"])
                          + " us, gaps " + " ".join(f"{u:.1f}" for u in split["gaps_us"])
                          + f" us, idle before {split['idle_us']:.1f} us", flush=True)
        best = {}
        for r in rows:
            if (r["T"], r["D"]) == (t, d) and r["variant"] in programs:
                if r["op"] not in best or r["% copy"] > best[r["op"]]["% copy"]:
                    best[r["op"]] = r
        print(f"T={t} D={d} best: " + ", ".join(
            f"{op} {r['variant']} {r['% copy']:.1f}%" for op, r in best.items()), flush=True)
        del case
        torch.cuda.empty_cache()
        on_shape(rows)
    return rows


def peer_table(rows: list, bandwidth: float) -> str:
    """The README's peer table from a run's rows: per shape and op, cake's eager call against
    the fastest peer's eager call (event times, host path included), and the same calls with
    their host paths hidden ("kernels ms": the device's time from the call's first operation to
    its last, gaps included): like with like. Ratios above 1 mean cake is faster."""
    if any("kernels ms" not in row for row in rows):
        raise ValueError("these rows have no \"kernels ms\" (host-hidden) figures: a run of "
                         "tools/bench/rmsnorm.py from before 2026-12-03's fourth session")
    groups = {}
    for row in rows:
        groups.setdefault((row["T"], row["D"], row["op"]), {})[row["impl"]] = row

    def cell(op, t, d, ms):
        return f"{ms:.3f} ({harness.percent_of_roofline(op_bytes(op, t, d), ms, bandwidth):.0f}%)"

    lines = ["| T | D | op | cake eager ms (% copy) | best peer eager ms | eager x | "
             "cake kernels ms (% copy) | best peer kernels ms (% copy) | kernels x |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (t, d, op), impls in groups.items():
        peers = {name: row for name, row in impls.items() if not name.startswith("cake")}
        eager = min(peers, key=lambda name: peers[name]["ms"])
        kernels = min(peers, key=lambda name: peers[name]["kernels ms"])
        cake_eager, cake_kernels = impls["cake"]["ms"], impls["cake"]["kernels ms"]
        peer_kernels = peers[kernels]["kernels ms"]
        lines.append(f"| {t} | {d} | {op} | {cell(op, t, d, cake_eager)} | {eager} "
                     f"{peers[eager]['ms']:.3f} | {peers[eager]['ms'] / cake_eager:.2f} | "
                     f"{cell(op, t, d, cake_kernels)} | {kernels} {cell(op, t, d, peer_kernels)} | "
                     f"{peer_kernels / cake_kernels:.2f} |")
    return "\n".join(lines)


def previous_ms(path: Path = REPO / "tools" / "bench" / "results" / "2026-11-29-h200-rmsnorm.json") -> dict:
    """(T, D, op) -> ms of the kernels before the ring ("cake graph" rows of the last full run)."""
    import json

    if not path.is_file():
        return {}
    found = {}
    for row in json.loads(path.read_text())["rows"]:
        if row["impl"] == "cake graph":
            found[(row["T"], row["D"], row["op"])] = row["ms"]
    return found


def tune_tables(rows: list, bandwidth: float) -> str:
    """Per op: % of copy per variant (rows) and shape (columns), the best per shape marked *;
    a cell ends in ! when the variant's outputs failed the check. Also the kernels before the
    ring ("prev", from the last full run), a copy of the same bytes ("copy@size") and, for the
    ops that read two bytes a byte written, an add ("add@size")."""
    shapes = sorted({(r["T"], r["D"]) for r in rows})
    previous = previous_ms()
    lines = []
    for op in OPS:
        cells = {(r["variant"], r["T"], r["D"]): r for r in rows if r["op"] == op}
        names = list(dict.fromkeys(r["variant"] for r in rows if r["op"] == op))
        best = {s: max((c for (n, *k), c in cells.items() if tuple(k) == s and n not in REFERENCES),
                       key=lambda c: c["% copy"], default=None) for s in shapes}
        lines.append(f"\n{op}: % of copy bandwidth ({bandwidth / 1e12:.3f} TB/s); * best, ! check failed")
        lines.append("| variant | " + " | ".join(f"{t}x{d}" for t, d in shapes) + " |")
        lines.append("|---|" + "---|" * len(shapes))
        prev = [previous.get((t, d, op)) for t, d in shapes]
        if any(prev):
            lines.append("| prev | " + " | ".join(
                "" if ms is None else f"{harness.percent_of_roofline(op_bytes(op, t, d), ms, bandwidth):.1f}"
                for ms, (t, d) in zip(prev, shapes)) + " |")
        for name in names:
            row = []
            for t, d in shapes:
                cell = cells.get((name, t, d))
                text = "" if cell is None else f"{cell['% copy']:.1f}"
                if cell is not None and cell is best[(t, d)]:
                    text += "*"
                if cell is not None and cell.get("check", "").startswith("FAIL"):
                    text += "!"
                row.append(text)
            lines.append(f"| {name} | " + " | ".join(row) + " |")
    failed = sorted({(r["variant"], r["T"], r["D"], r["op"].replace(" bwd", "").replace(" fwd", "")
                      if r["op"].startswith("gated") else "plain", r["check"])
                     for r in rows if r.get("check", "").startswith("FAIL")})
    lines.append("\nchecks: " + ("every variant agrees with the table's outputs, and those with float64"
                                 if not failed else "; ".join(f"{n} {t}x{d} {family}: {c}"
                                                              for n, t, d, family, c in failed)))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write all numbers here")
    parser.add_argument("--precompile", action="store_true", help="JIT all programs and exit")
    parser.add_argument("--shapes", default="all", help="'all', 'small' or T:D,T:D,...")
    parser.add_argument("--host", action="store_true", help="host cost per call, then exit")
    parser.add_argument("--eager-gap", action="store_true",
                        help="eager calls against their graph replays (RMSNorm), then exit")
    parser.add_argument("--tune", action="store_true", help="sweep TUNE_VARIANTS instead")
    parser.add_argument("--once", metavar="PEERS",
                        help="call cake's and these peers' (comma-separated) RMSNorm forward and "
                             "backward twice per shape, untimed (for ncu), then exit")
    parser.add_argument("--profile", action="store_true",
                        help="peers: also trace each op's calls (device time, idle time before), "
                             "then the host cost per call in the same process; --tune: each "
                             "call's kernels and the gaps between them")
    parser.add_argument("--variants", help="--tune: a comma-separated subset of TUNE_VARIANTS")
    parser.add_argument("--ops", default=",".join(OPS),
                        help="peers: a comma-separated subset of the ops timed (default all: "
                             + ", ".join(OPS) + ")")
    parser.add_argument("--table", type=Path, metavar="JSON",
                        help="print the peer table of a run's --json file, then exit")
    args = parser.parse_args(argv)
    ops = tuple(op.strip() for op in args.ops.split(","))
    if set(ops) - set(OPS):
        parser.error(f"unknown ops {sorted(set(ops) - set(OPS))}; known: {', '.join(OPS)}")
    if args.table:
        import json

        result = json.loads(args.table.read_text())
        print(peer_table(result["rows"], result["copy_bandwidth"]))
        return 0
    if args.precompile:
        precompile()
        return 0
    if args.host:
        print(harness.format_table(host_overhead()))
        return 0
    shapes = {"all": SHAPES, "small": SMALL}.get(args.shapes) or [
        tuple(int(v) for v in item.split(":")) for item in args.shapes.split(",")]
    if args.once:
        call_once(shapes, set(args.once.split(",")))
        return 0
    bench = harness.Bench()
    bandwidth = bench.copy_bandwidth()
    print(f"device-to-device copy: {bandwidth / 1e12:.3f} TB/s (read + written)", flush=True)

    def save(rows, **extra):  # after every shape, so a run cut short keeps what it measured
        if args.json:
            harness.write_json(args.json, {"device": harness.device_summary(),
                                           "copy_bandwidth": bandwidth, "rows": rows, **extra})

    if args.eager_gap:
        rows = eager_gap(shapes if args.shapes != "all" else GAP_SHAPES, args.iters, bench)
        save(rows)
        return 0
    if args.tune:
        chosen = args.variants.split(",") if args.variants else list(TUNE_VARIANTS)
        names = ["table"] + [n for n in chosen if n != "table"]  # the reference of the checks
        unknown = sorted(set(names) - set(TUNE_VARIANTS))
        if unknown:
            parser.error(f"unknown variants {unknown}; known: {', '.join(TUNE_VARIANTS)}")

        def save_tune(rows):
            if args.json:
                harness.write_json(args.json, {
                    "device": harness.device_summary(), "copy_bandwidth": bandwidth,
                    "variants": {n: TUNE_VARIANTS[n] for n in names}, "rows": rows})

        rows = run_tune(shapes, {n: TUNE_VARIANTS[n] for n in names}, args.iters, bench, bandwidth,
                        save_tune, profile=args.profile)
        print(tune_tables(rows, bandwidth))
        return 0
    rows = run(shapes, args.iters, bench, bandwidth, save, profile=args.profile, ops=ops)
    print(harness.format_table(rows, ["T", "D", "op", "impl", "ms", "TB/s", "% copy", "spread",
                                      "kernels ms", "kernels flushes", "max rel diff vs cake"]
                               + (["device us", "idle us"] if args.profile else [])))
    print(peer_table(rows, bandwidth))
    if args.profile:
        # The host path in the process the eager figures came from (peers imported, compiled,
        # timed), against a fresh process's (--host).
        host = host_overhead()
        print("host cost per call in this process, after the timings:\n" + harness.format_table(host))
        save(rows, host=host)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
