#!/usr/bin/env python3
"""Benchmark of context-parallel causal conv1d (cake.cake_causal_conv1d_det_train_kcp) on the
GPUs of one host, against the single-GPU step.

Usage (from the repository root, on a host with 2 GPUs)::

    PYTHONPATH=. torchrun --nproc-per-node 2 tools/bench/causal_conv1d_kcp.py
        [--tokens-per-rank 250340] [--channels 1024 4096] [--layouts zigzag contiguous]
        [--exchanges all_gather p2p] [--iters 30] [--json out.json]

Protocol (docs/benchmarks.md, tools/bench/harness.py): bf16, no bias, SiLU; S = P x
tokens-per-rank packed into 3 documents (the same on every rank); each rank times every call
with CUDA events after warm-up, its L2 flushed before each call; each iteration's time is
all-reduced with MAX over the ranks (the slowest rank counts) and the median reported. Rows, per
(C, layout, exchange):

* ``kcp ms``: one eager fwd+bwd step (``cake_causal_conv1d_det_kcp`` + ``backward``);
* ``serial ms``: the same with ``plan.overlap = False`` (each exchange waited for before the
  main pass it could hide behind);
* ``exchange ms``: the forward's x exchange and the backward's dy exchange alone;
* ``single ms``: the single-GPU step (``cake_causal_conv1d_det``) on tokens-per-rank tokens (the
  rank's own tokens, its pieces cut as documents), every rank at once;
* ``overhead``: kcp / single - 1; ``hidden``: (serial - kcp) / exchange, the share of the
  exchange the main pass hides (1: all of it).

Importing this file imports neither torch nor CUDA; without CUDA GPUs or outside torchrun it
exits with status 2 and says why.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for path in (REPO, REPO / "tools" / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import harness  # noqa: E402  (imports no torch)

COLUMNS = ("S", "C", "P", "layout", "exchange", "kcp ms", "serial ms", "exchange ms",
           "single ms", "overhead", "hidden")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens-per-rank", type=int, default=250340)
    parser.add_argument("--channels", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--layouts", nargs="+", default=["zigzag", "contiguous"],
                        choices=["zigzag", "contiguous"])
    parser.add_argument("--exchanges", nargs="+", default=["all_gather", "p2p"],
                        choices=["all_gather", "p2p"])
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the rows here (rank 0)")
    args = parser.parse_args(argv)
    if args.tokens_per_rank < 4:
        parser.error(f"--tokens-per-rank: expected >= 4, got {args.tokens_per_rank}")
    if any(c < 1 for c in args.channels):
        parser.error(f"--channels: expected values >= 1, got {args.channels}")
    if args.iters < 1 or args.warmup < 0:
        parser.error(f"--iters >= 1 and --warmup >= 0 expected, got {args.iters} and "
                     f"{args.warmup}")
    return args


def refuse(message: str) -> int:
    print(f"causal_conv1d_kcp.py: {message}", file=sys.stderr)
    return 2


def documents(total: int) -> list:
    """cu_seqlens of three documents that cross the rank boundaries (as the single-GPU
    benchmark's packs: a third, then the rest split unevenly)."""
    third = total // 3
    return [0, third, total - third + 7, total]


def slowest_median(samples: list) -> float:
    """Median over iterations of the slowest rank's time of each iteration."""
    import torch
    import torch.distributed as dist

    times = torch.tensor(samples, dtype=torch.float64, device="cuda")
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return statistics.median(times.tolist())


def measure(kcp, bench, args, channels: int, layout: str, exchange: str) -> dict:
    import torch
    import torch.distributed as dist

    from cake.cake_causal_conv1d_det_train import cake_causal_conv1d_det
    from cake.cake_causal_conv1d_det_train_kcp import _exchange

    world = dist.get_world_size()
    total = world * args.tokens_per_rank
    cu = torch.tensor(documents(total), dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(channels)
    x_global = torch.randn(total, channels, device="cuda", dtype=torch.bfloat16, generator=gen)
    dy_global = torch.randn(total, channels, device="cuda", dtype=torch.bfloat16, generator=gen)
    weight = (torch.randn(channels, 4, device="cuda", dtype=torch.bfloat16, generator=gen)
              * 0.5).requires_grad_()
    plan = kcp.CakeCausalConv1dDetKcpPlan.build(cu, total, channels, torch.bfloat16,
                                                layout=layout, exchange=exchange)
    x = kcp.cake_causal_conv1d_det_train_kcp_shard(x_global, plan).requires_grad_()
    dy = kcp.cake_causal_conv1d_det_train_kcp_shard(dy_global, plan)
    x_single = x.detach().clone().requires_grad_()

    def step():
        x.grad = weight.grad = None
        kcp.cake_causal_conv1d_det_kcp(x, weight, None, plan, cu_seqlens=cu).backward(dy)

    def exchange_only():
        _exchange.start(plan, x.detach(), "x").finish()
        _exchange.start(plan, dy, "dy").finish()

    def single():
        x_single.grad = weight.grad = None
        cake_causal_conv1d_det(x_single, weight, None, plan.local_cu_seqlens).backward(dy)

    def timed(fn) -> float:
        return slowest_median(bench.time(fn, warmup=args.warmup, iters=args.iters).samples)

    row = {"S": total, "C": channels, "P": world, "layout": layout, "exchange": exchange}
    row["kcp ms"] = timed(step)
    plan.overlap = False
    row["serial ms"] = timed(step)
    plan.overlap = True
    row["exchange ms"] = timed(exchange_only)
    row["single ms"] = timed(single)
    row["overhead"] = row["kcp ms"] / row["single ms"] - 1
    row["hidden"] = (row["serial ms"] - row["kcp ms"]) / row["exchange ms"] \
        if row["exchange ms"] > 0 else float("nan")
    return row


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        return refuse("needs CUDA GPUs (none visible here); run it with torchrun on a GPU host")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return refuse("run it under torchrun, one process a GPU (torchrun --nproc-per-node 2 "
                      "tools/bench/causal_conv1d_kcp.py)")
    import torch.distributed as dist

    import cake.cake_causal_conv1d_det_train_kcp as kcp

    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    if not kcp.is_cake_causal_conv1d_det_train_kcp_supported(device):
        return refuse(f"cake-train's programs do not run on {torch.cuda.get_device_name(device)}")
    dist.init_process_group("nccl", device_id=device)
    bench = harness.Bench(device)
    rows = []
    for channels in args.channels:
        for layout in args.layouts:
            for exchange in args.exchanges:
                rows.append(measure(kcp, bench, args, channels, layout, exchange))
                if dist.get_rank() == 0:
                    print(harness.format_table([rows[-1]], COLUMNS), flush=True)
                torch.cuda.empty_cache()
    if dist.get_rank() == 0:
        print()
        print(harness.format_table(rows, COLUMNS))
        if args.json:
            harness.write_json(args.json, {"rows": rows, **harness.device_summary()})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
