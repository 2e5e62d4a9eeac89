#!/usr/bin/env python3
"""Benchmark of the LM head families (fused linear + cross-entropy) against their peers (Hopper).

Usage (from the repository root, on a GPU machine; liger-kernel 0.8.5 and cut-cross-entropy
25.1.1 installed, or carried as wheels)::

    PYTHONPATH=. python tools/bench/lm_head.py [--json out.json] [--iters 20] [--shapes all|small]
        [--peers cake_det,cake_nondet,liger,cce,compile,eager]
    PYTHONPATH=. python tools/bench/lm_head.py --precompile   # JIT both families' bf16 programs

Protocol: ``tools/bench/harness.py`` (256 MiB L2 flush before every call, CUDA events, warm-up,
median; the peers of one shape interleaved A B B A), docs/benchmarks.md. bf16 hidden [T, D] and
weight [V, D] (every peer gets the same tensors), int64 labels with 10 % ignore_index, the mean
loss. Two timings a peer and shape: ``fwd`` (the loss with autograd recording, what a training
step's forward costs: Liger computes its gradients here) and ``fwd+bwd`` (the loss and
``backward()`` into hidden.grad and weight.grad, set to None before each call). ``peak GB``: the
most memory allocated during one fwd+bwd above what was allocated before it (inputs excluded,
gradients included). ``TFLOP/s``: 6 T V D (the three GEMMs of a fused step) per fwd+bwd time.
Each peer's loss is compared with float32 eager torch's on the first shape ("loss diff").

Peers: cake det and nondet (``cake_lm_head_{det,nondet}_train_loss``), Liger 0.8.5
``LigerFusedLinearCrossEntropyLoss`` (token chunks: a chunk x V logits block at a time),
cut-cross-entropy 25.1.1 ``linear_cross_entropy`` (fused tiles, gradient filtering),
``torch.compile`` of ``F.linear`` + ``F.cross_entropy`` and the same eagerly (both materialise
the T x V logits: eager runs out of memory at the largest shapes, reported as OOM). A peer that
fails to import is reported and skipped.
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

# (T, D, V): the shapes (docs/families/lm_head.md).
MODELS = [(2048, 151936), (4096, 128256), (5120, 151936), (3840, 262144)]
SHAPES = [(t, d, v) for t in (8192, 32768) for d, v in MODELS]
SMALL = [(8192, 2048, 151936), (8192, 4096, 128256)]
PEERS = ("cake_det", "cake_nondet", "liger", "cce", "compile", "eager")
PEER_MODULES = ("liger_kernel", "cut_cross_entropy", "triton")  # versions in every result file
IGNORED = 0.1


def _peer(name: str):
    """name -> loss(hidden, weight, labels), or raises ImportError naming what is missing."""
    import torch
    import torch.nn.functional as F

    if name == "cake_det":
        from cake.cake_lm_head_det_train import cake_lm_head_det_train_loss
        return lambda h, w, y: cake_lm_head_det_train_loss(h, w, y, check_labels=False)
    if name == "cake_nondet":
        from cake.cake_lm_head_nondet_train import cake_lm_head_nondet_train_loss
        return lambda h, w, y: cake_lm_head_nondet_train_loss(h, w, y, check_labels=False)
    if name == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        liger = LigerFusedLinearCrossEntropyLoss(ignore_index=-100)
        return lambda h, w, y: liger(w, h, y)
    if name == "cce":
        from cut_cross_entropy import linear_cross_entropy
        return lambda h, w, y: linear_cross_entropy(h, w, y, ignore_index=-100)

    def plain(h, w, y):
        return F.cross_entropy(F.linear(h, w).float(), y, ignore_index=-100)

    return torch.compile(plain) if name == "compile" else plain


def _inputs(tokens: int, dim: int, vocab: int) -> dict:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(tokens + dim + vocab)
    hidden = torch.randn(tokens, dim, device="cuda", generator=gen).bfloat16()
    weight = (torch.randn(vocab, dim, device="cuda", generator=gen) * dim**-0.5).bfloat16()
    labels = torch.randint(0, vocab, (tokens,), device="cuda", generator=gen)
    labels[torch.rand(tokens, device="cuda", generator=gen) < IGNORED] = -100
    return {"hidden": hidden.requires_grad_(), "weight": weight.requires_grad_(),
            "labels": labels}


def _calls(loss, x: dict) -> dict:
    def forward():
        return loss(x["hidden"], x["weight"], x["labels"])

    def step():
        x["hidden"].grad = x["weight"].grad = None
        forward().backward()

    return {"fwd": forward, "fwd+bwd": step}


def _peak_bytes(step, x: dict) -> float:
    import torch

    x["hidden"].grad = x["weight"].grad = None  # the warm-up's: the step's own count in its peak
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def run_shape(shape: tuple, peers: dict, *, iters: int, bench, check: bool) -> list:
    """One shape: every peer that runs (OOM recorded), its fwd and fwd+bwd times and peak."""
    import torch

    tokens, dim, vocab = shape
    x = _inputs(tokens, dim, vocab)
    reference = None
    if check:
        with torch.no_grad():
            reference = torch.nn.functional.cross_entropy(
                x["hidden"].float() @ x["weight"].float().T, x["labels"], ignore_index=-100)
    running, rows = {}, []
    for name, loss in peers.items():
        calls = _calls(loss, x)
        try:
            calls["fwd+bwd"]()  # warm-up, compile, JIT
            peak = _peak_bytes(calls["fwd+bwd"], x)
        except torch.cuda.OutOfMemoryError:
            x["hidden"].grad = x["weight"].grad = None
            torch.cuda.empty_cache()
            rows.append({"T": tokens, "D": dim, "V": vocab, "peer": name, "fwd ms": "OOM"})
            continue
        row = {"T": tokens, "D": dim, "V": vocab, "peer": name, "peak GB": peak / 1e9}
        if reference is not None:
            with torch.no_grad():
                row["loss diff"] = abs(calls["fwd"]().float().item() - reference.item())
        running[name] = calls
        rows.append(row)
    for op in ("fwd", "fwd+bwd"):
        timings = bench.interleaved({n: c[op] for n, c in running.items()}, iters=iters)
        for row in rows:
            if row["peer"] in timings:
                row[f"{op} ms"] = timings[row["peer"]].median
    for row in rows:
        if "fwd+bwd ms" in row:
            row["TFLOP/s"] = 6 * tokens * dim * vocab / (row["fwd+bwd ms"] * 1e-3) / 1e12
    return rows


def load_peers(names) -> dict:
    peers = {}
    for name in names:
        try:
            peers[name] = _peer(name)
        except ImportError as exc:
            print(f"skip {name}: {exc}", flush=True)
    return peers


def precompile() -> None:
    from cake.core import loader

    dirs = [REPO / "cake" / f"cake_lm_head_{mode}_train" for mode in ("det", "nondet")]
    count = harness.precompile(dirs, only=lambda p: p.variant == {"dtype": "bfloat16"})
    print(f"compiled {count} program(s) for {loader.device(0).arch}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--json", type=Path,
                        help="write the numbers here (after every shape; complete once the run ends)")
    parser.add_argument("--shapes", default="all", help="'all', 'small' or T:D:V,T:D:V,...")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"among {', '.join(PEERS)}")
    parser.add_argument("--precompile", action="store_true", help="JIT the programs and exit")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("lm_head bench: needs torch and a CUDA GPU", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("lm_head bench: needs a CUDA GPU (none is visible here)", file=sys.stderr)
        return 2
    unknown = sorted(set(args.peers.split(",")) - set(PEERS))
    if unknown:
        parser.error(f"unknown peers {unknown}; choose among {', '.join(PEERS)}")
    if args.precompile:
        precompile()
        return 0
    shapes = SHAPES if args.shapes == "all" else SMALL if args.shapes == "small" else [
        tuple(int(v) for v in item.split(":")) for item in args.shapes.split(",")]
    peers = load_peers(args.peers.split(","))
    bench = harness.Bench()
    record = harness.recorder(args.json, {**harness.versions(PEER_MODULES),
                                          **harness.device_summary()}) if args.json else None
    rows = []
    for index, shape in enumerate(shapes):
        rows += run_shape(shape, peers, iters=args.iters, bench=bench, check=index == 0)
        print(harness.format_table(rows[-len(peers):]), flush=True)
        if record:  # after each shape: a run cut short keeps what it measured
            record(rows)
    print()
    print(harness.format_table(rows, ["T", "D", "V", "peer", "fwd ms", "fwd+bwd ms", "TFLOP/s",
                                      "peak GB", "loss diff"]))
    if record:
        record(rows, complete=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
