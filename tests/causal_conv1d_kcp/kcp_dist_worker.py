"""The KCP cases over torch.distributed, run by every rank of one process group: gloo on the CPU
(spawned by test_causal_conv1d_kcp_dist.py) and NCCL, one GPU a rank
(test_causal_conv1d_kcp_gpu.py, spawned or under torchrun). Each case records its errors per
rank; one process group serves every case of a group size, in the same order on every rank."""

from __future__ import annotations

import json
import os
import random
import re
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kcp_testlib as tl

import cake.cake_causal_conv1d_det_train_kcp as kcp
from cake.cake_causal_conv1d_det_train_kcp import _buffers

CHANNELS = 3
# Packs whose step runs twice (determinism: the same bits, reduced sums included); the others
# once, to keep the run short on CI's two cores.
REPEATED = ("tiny_pieces_1", "short_docs_at_boundaries", "random_a")

BAD_CASES = ("build_cu_seqlens_differs_on_last_rank", "build_dtype_differs_on_one_rank",
             "build_channels_differs_on_one_rank", "build_layout_differs_on_one_rank",
             "build_total_tokens_differs_on_one_rank", "build_bad_cu_seqlens_on_rank0",
             "build_bad_dtype_on_one_rank", "step_stale_plan_other_cu_seqlens",
             "step_stale_plan_other_S", "step_other_channels", "step_wrong_dtype_all_ranks",
             "step_other_group", "backward_helper_stale_plan",
             "check_steps_wrong_dtype_on_one_rank", "check_steps_ranks_use_different_plans",
             "check_steps_good_step", "still_aligned_after_errors")


def case_names() -> list:
    good = [f"fb/{layout}/{exchange}/{name}" for layout in tl.LAYOUTS
            for exchange in tl.EXCHANGES for name in tl.PACK_NAMES]
    return good + [f"bad/{name}" for name in BAD_CASES]


# --------------------------------------------------------------------------- good cases


def _step(x, w, b, dy, plan, activation, cu_t) -> tuple:
    x_local = kcp.cake_causal_conv1d_det_train_kcp_shard(x, plan).requires_grad_()
    w_leaf = w.clone().requires_grad_()
    b_leaf = b.clone().requires_grad_() if b is not None else None
    y = kcp.cake_causal_conv1d_det_kcp(x_local, w_leaf, b_leaf, plan, activation=activation,
                                       cu_seqlens=cu_t)
    y.backward(kcp.cake_causal_conv1d_det_train_kcp_shard(dy, plan))
    return y.detach(), x_local.grad, w_leaf.grad, (b_leaf.grad if b is not None else None)


def _same(label: str, pairs) -> list:
    return [f"{label} {name} differs" for name, a, c in pairs
            if (a is None) != (c is None) or (a is not None and not torch.equal(a, c))]


def run_good(world: int, case: str, seed: int) -> list:
    _, layout, exchange, name = case.split("/")
    rng = random.Random(f"{seed}/{world}/{case}")  # the same on every rank
    total, cu = tl.pack(name, world, layout, rng)
    activation, with_bias, x_dtype, w_dtype = tl.VARIANTS[rng.randrange(len(tl.VARIANTS))]
    x, w, b, dy = tl.inputs(total, CHANNELS, x_dtype, w_dtype, with_bias, rng.randrange(2**31))
    cu_t = torch.tensor(cu, dtype=torch.int32)
    plan = kcp.CakeCausalConv1dDetKcpPlan.build(cu_t, total, CHANNELS, x_dtype, layout=layout,
                                                exchange=exchange)
    y, dx, dw, db = _step(x, w, b, dy, plan, activation, cu_t)
    unshard = kcp.cake_causal_conv1d_det_train_kcp_unshard
    errors = tl.output_errors(unshard(y, plan), unshard(dx, plan), cu, x, w, b, dy, activation)
    reduce = kcp.cake_causal_conv1d_det_train_kcp_reduce_weight_grads
    rdw, rdb = reduce(dw, db, plan)
    errors += tl.partials_errors(rdw, rdb, cu, x, w, b, dy, activation,
                                 tl.UNIT_ROUNDOFF[w_dtype], tl.partial_terms(total, world, w_dtype))
    if name in REPEATED:
        y2, dx2, dw2, db2 = _step(x, w, b, dy, plan, activation, cu_t)
        rdw2, rdb2 = reduce(dw2, db2, plan)
        errors += _same("a second step:", (("y", y, y2), ("dx", dx, dx2), ("dweight", dw, dw2),
                                           ("dbias", db, db2), ("reduced dweight", rdw, rdw2),
                                           ("reduced dbias", rdb, rdb2)))
    x_local = kcp.cake_causal_conv1d_det_train_kcp_shard(x, plan)
    yh, halo = kcp.cake_causal_conv1d_det_train_kcp_forward(
        x_local, w, b, plan, activation=activation, cu_seqlens=cu_t, return_x_halo=True)
    dxh, dwh, dbh = kcp.cake_causal_conv1d_det_train_kcp_backward(
        kcp.cake_causal_conv1d_det_train_kcp_shard(dy, plan), x_local, w, b, plan,
        activation=activation, grad_dtype=w.dtype,
        x_halo=halo if rng.random() < 0.5 else None)  # the same choice on every rank
    errors += _same("the helpers:", (("y", y, yh), ("dx", dx, dxh), ("dweight", dw, dwh),
                                     ("dbias", db, dbh)))
    return errors


# --------------------------------------------------------------------------- bad cases


def expect_raise(fn, exc, pattern) -> list:
    try:
        fn()
    except exc as e:
        return [] if re.search(pattern, str(e)) else [
            f"raised {type(e).__name__} without /{pattern}/: {e}"]
    except Exception as e:  # noqa: BLE001  (reported as the case's error)
        return [f"raised {type(e).__name__} (expected {exc.__name__} /{pattern}/): {e}"]
    return [f"did not raise (expected {exc.__name__} /{pattern}/)"]


def _build(cu, total=24, channels=CHANNELS, dtype=torch.float64, **kw):
    return kcp.CakeCausalConv1dDetKcpPlan.build(cu, total, channels, dtype, **kw)


def run_bad_build(world: int, rank: int, name: str, cu_a, cu_b) -> list:
    odd = 1 % world  # "one rank": rank 1 (rank 0 when alone)
    if name == "build_cu_seqlens_differs_on_last_rank":
        return expect_raise(lambda: _build(cu_b if rank == world - 1 else cu_a), ValueError,
                            r"disagree on cu_seqlens fingerprint")
    if name == "build_dtype_differs_on_one_rank":
        return expect_raise(lambda: _build(cu_a, dtype=torch.float32 if rank == odd
                                           else torch.float64),
                            ValueError, r"disagree on dtype \(rank 0: float")
    if name == "build_channels_differs_on_one_rank":
        return expect_raise(lambda: _build(cu_a, channels=CHANNELS + (rank == odd)), ValueError,
                            r"disagree on channels")
    if name == "build_layout_differs_on_one_rank":
        return expect_raise(lambda: _build(cu_a, layout="zigzag" if rank == odd
                                           else "contiguous"),
                            ValueError, r"disagree on layout")
    if name == "build_total_tokens_differs_on_one_rank":
        other = torch.tensor([0, 5, 17, 25], dtype=torch.int32)
        return expect_raise(lambda: _build(other, 25) if rank == odd else _build(cu_a),
                            ValueError, r"disagree on total_tokens")
    if name == "build_bad_cu_seqlens_on_rank0":
        bad = torch.tensor([0, 5, 17, 23], dtype=torch.int32)
        if rank == 0:
            return expect_raise(lambda: _build(bad), ValueError, r"must end at total_tokens")
        return expect_raise(lambda: _build(cu_a), ValueError, r"refused on rank 0 \(cu_seqlens\)")
    if rank == odd:  # build_bad_dtype_on_one_rank
        return expect_raise(lambda: _build(cu_a, dtype=torch.int32), TypeError, r"dtype: expected")
    return expect_raise(lambda: _build(cu_a), ValueError, rf"refused on rank {odd} \(dtype\)")


def run_bad_step(world: int, rank: int, name: str, cu_a, cu_b) -> list:
    f64, odd = torch.float64, 1 % world
    x, w, b, dy = tl.inputs(24, CHANNELS, f64, f64, True, 7)
    shard, call = kcp.cake_causal_conv1d_det_train_kcp_shard, kcp.cake_causal_conv1d_det_kcp
    if name == "step_stale_plan_other_cu_seqlens":
        plan = _build(cu_a)
        return expect_raise(lambda: call(shard(x, plan), w, b, plan, cu_seqlens=cu_b),
                            ValueError, r"built from other cu_seqlens")
    if name == "step_stale_plan_other_S":
        errors = []
        for layout, grow in (("contiguous", world), ("zigzag", 2 * world)):
            plan = _build(cu_a, layout=layout)  # a new batch of S + grow tokens: L grows
            x2 = tl.inputs(24 + grow, CHANNELS, f64, f64, True, 8)[0]
            ranges = kcp.cake_causal_conv1d_det_train_kcp_token_ranges(24 + grow, world, rank,
                                                                       layout)
            x_local = torch.cat([x2[a:c] for a, c in ranges])
            errors += expect_raise(lambda: call(x_local, w, b, plan), ValueError,
                                   r"x: expected shape .* another batch")
        return errors
    if name == "step_other_channels":
        plan = _build(cu_a)
        return expect_raise(lambda: call(shard(x, plan), torch.zeros(CHANNELS + 1, 4, dtype=f64),
                                         None, plan),
                            ValueError, r"weight: expected \[C, 4\] with C = 3")
    if name == "step_wrong_dtype_all_ranks":
        plan = _build(cu_a)
        return expect_raise(lambda: call(shard(x, plan).float(), w, b, plan), TypeError,
                            r"x: expected dtype float64")
    if name == "step_other_group":
        other = dist.new_group(list(range(world)))
        plan = _build(cu_a)
        return expect_raise(lambda: call(shard(x, plan), w, b, plan, group=other), ValueError,
                            r"another process group")
    if name == "backward_helper_stale_plan":
        plan = _build(cu_a)
        return expect_raise(lambda: kcp.cake_causal_conv1d_det_train_kcp_backward(
            shard(dy, plan), shard(x, plan), w, b, plan, cu_seqlens=cu_b), ValueError,
            r"built from other cu_seqlens")
    if name == "check_steps_wrong_dtype_on_one_rank":
        plan = _build(cu_a, check_steps=True)
        if rank == odd:
            return expect_raise(lambda: call(shard(x, plan).float(), w, b, plan), TypeError,
                                r"x: expected dtype float64")
        return expect_raise(lambda: call(shard(x, plan), w, b, plan), ValueError,
                            rf"refused on rank {odd} \(step\)")
    if name == "check_steps_ranks_use_different_plans":
        plan_a, plan_b = _build(cu_a, check_steps=True), _build(cu_b, check_steps=True)
        plan = plan_a if rank == 0 else plan_b
        if world == 1:
            return []
        return expect_raise(lambda: call(shard(x, plan), w, b, plan), ValueError,
                            r"plans of this step\): the ranks disagree on cu_seqlens fingerprint")
    # check_steps_good_step, still_aligned_after_errors
    plan = _build(cu_a, check_steps=name == "check_steps_good_step", layout="zigzag")
    plan.overlap = name == "check_steps_good_step"  # the other waits for each exchange first
    y, dx, _, _ = _step(x, w, b, dy, plan, "silu", cu_a)
    unshard = kcp.cake_causal_conv1d_det_train_kcp_unshard
    errors = tl.output_errors(unshard(y, plan), unshard(dx, plan), cu_a.tolist(), x, w, b, dy,
                              "silu")
    dist.barrier()
    return errors


def run_bad(world: int, rank: int, case: str) -> list:
    name = case.split("/", 1)[1]
    cu_a = torch.tensor([0, 5, 17, 24], dtype=torch.int32)
    cu_b = torch.tensor([0, 9, 13, 24], dtype=torch.int32)
    if name.startswith("build_"):
        return run_bad_build(world, rank, name, cu_a, cu_b)
    return run_bad_step(world, rank, name, cu_a, cu_b)


# --------------------------------------------------------------------------- NCCL cases

# (pack, C, exchanges): small packs at odd widths (the scalar row moves at C = 7) and one long
# pack past the family's long-tile floor (S >= 65536 a rank, C >= 256).
NCCL_PACKS = (("one_doc", 264, tl.EXCHANGES), ("short_docs_at_boundaries", 7, tl.EXCHANGES),
              ("tiny_pieces_1_2", 64, tl.EXCHANGES), ("empty_docs", 24, ("p2p",)),
              ("random_a", 512, ("all_gather",)), ("long", 1024, ("all_gather",)))
# (activation, bias, x dtype, weight dtype); each case draws one.
NCCL_VARIANTS = (("silu", True, torch.bfloat16, torch.float32),
                 ("silu", False, torch.bfloat16, torch.bfloat16),
                 (None, True, torch.float16, torch.float16))


def nccl_case_names() -> list:
    return [f"nccl/{layout}/{exchange}/{name}/{channels}" for layout in tl.LAYOUTS
            for name, channels, exchanges in NCCL_PACKS for exchange in exchanges]


def run_nccl(world: int, case: str, seed: int, device: torch.device) -> list:
    """One autograd step on ``device`` (this rank's GPU): y and dx (gathered) bitwise the
    single-rank programs' on the whole pack, the partials summed in rank order within the fp32
    bound, a second step bitwise the first."""
    _, layout, exchange, name, channels = case.split("/")
    rng = random.Random(f"{seed}/{world}/{case}")  # the same on every rank
    if name == "long":
        total = 70001 * world
        cu = [0, 1000, total // 2 + 3, total - 2, total]
    else:
        total, cu = tl.pack(name, world, layout, rng)
    activation, with_bias, x_dtype, w_dtype = NCCL_VARIANTS[rng.randrange(len(NCCL_VARIANTS))]
    x, w, b, dy = tl.inputs(total, int(channels), x_dtype, w_dtype, with_bias,
                            rng.randrange(2**31), device=device)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    plan = kcp.CakeCausalConv1dDetKcpPlan.build(cu_t, total, int(channels), x_dtype,
                                                layout=layout, exchange=exchange)
    y, dx, dw, db = _step(x, w, b, dy, plan, activation, cu_t)
    unshard = kcp.cake_causal_conv1d_det_train_kcp_unshard
    errors = tl.output_errors(unshard(y, plan), unshard(dx, plan), cu, x, w, b, dy, activation)
    reduce = kcp.cake_causal_conv1d_det_train_kcp_reduce_weight_grads
    rdw, rdb = reduce(dw, db, plan)
    errors += tl.partials_errors(rdw, rdb, cu, x, w, b, dy, activation,
                                 tl.UNIT_ROUNDOFF[w_dtype], tl.gpu_partial_terms(total, world))
    y2, dx2, dw2, db2 = _step(x, w, b, dy, plan, activation, cu_t)
    errors += _same("a second step:", (("y", y, y2), ("dx", dx, dx2), ("dweight", dw, dw2),
                                       ("dbias", db, db2)))
    return errors


def run_nccl_cases(seed: int, device: torch.device) -> dict:
    """Every NCCL case on this rank of the initialized group, on ``device`` (its GPU): case ->
    this rank's errors. Rank 0's seed serves every rank."""
    seed_t = torch.tensor([seed], dtype=torch.int64, device=device)
    dist.broadcast(seed_t, 0)
    seed = int(seed_t.item())
    results = {}
    for case in nccl_case_names():
        try:
            results[case] = run_nccl(dist.get_world_size(), case, seed, device)
        except Exception:  # noqa: BLE001  (the case's error, reported by the test)
            results[case] = [f"seed {seed}: " + traceback.format_exc(limit=6)]
    return results


# --------------------------------------------------------------------------- workers


def _nan_empty(shape, dtype, device):
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)


def worker(rank: int, world: int, store: str, out_path: str, seed: int) -> None:
    """A gloo rank: every CPU case."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=90))
    _buffers.empty = _nan_empty  # every tensor a step makes starts as NaN
    results = {}
    for case in case_names():
        try:
            errors = (run_good(world, case, seed) if case.startswith("fb/")
                      else run_bad(world, rank, case))
        except Exception:  # noqa: BLE001  (the case's error, reported by the test)
            errors = [traceback.format_exc(limit=6)]
        results[case] = errors
    _finish(results, out_path, rank)


def nccl_worker(rank: int, world: int, store: str, out_path: str, seed: int) -> None:
    """An NCCL rank on GPU ``rank``: every NCCL case."""
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    _buffers.empty = _nan_empty  # every tensor a step makes starts as NaN
    _finish(run_nccl_cases(seed, torch.device("cuda", rank)), out_path, rank)


def _finish(results: dict, out_path: str, rank: int) -> None:
    with open(f"{out_path}.rank{rank}.json", "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def spawn(target, world: int, seed: int, deadline_s: float) -> dict:
    """Runs ``target`` (worker or nccl_worker) in ``world`` new processes: rank -> its results.
    A run past ``deadline_s`` fails instead of blocking (a hang is a failure)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        context = mp.start_processes(target, args=(world, os.path.join(tmp, "store"), out, seed),
                                     nprocs=world, join=False, start_method="spawn")
        deadline = time.monotonic() + deadline_s
        try:
            while not context.join(timeout=1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"P={world}: workers still running after {deadline_s} s")
        finally:
            for process in context.processes:  # only the workers started here, by handle
                if process.is_alive():
                    process.kill()
        results = {}
        for rank in range(world):
            with open(f"{out}.rank{rank}.json") as f:
                results[rank] = json.load(f)
    return results
