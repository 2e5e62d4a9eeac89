"""GPU tests of KCP causal conv1d (``-m gpu``): the ``_kcp`` program's gather and scatter against
the CPU twin's semantics, bit for bit, for any table content (also invalid codes); every rank of
a pack in one process on one GPU (the real step functions, the family's programs, the exchange
simulated from the plans' tables), y and dx bitwise the single-rank op's and the partials within
the stated bound; the package's self-test; and two ranks over NCCL, one GPU each
(:func:`test_nccl_ranks_match_the_single_rank_op`): spawned by plain pytest on a host with two
GPUs, or, under torchrun, in the launched group::

    torchrun --nproc-per-node 2 -m pytest -q -p no:cacheprovider -k nccl \
        tests/causal_conv1d_kcp/test_causal_conv1d_kcp_gpu.py
"""

from __future__ import annotations

import os
import random

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import kcp_dist_worker as worker  # noqa: E402
import kcp_testlib as tl  # noqa: E402

from cake.cake_causal_conv1d_det_train_kcp import (_buffers, _compute, _program,  # noqa: E402
                                                   _selftest)
from cake.cake_causal_conv1d_det_train_kcp._tables import EXCHANGED_BIT, NEGATE_BIT  # noqa: E402

pytestmark = pytest.mark.gpu
SEED = int(os.environ.get("KCP_TEST_SEED", random.SystemRandom().randrange(2**31)))
DEVICE = "cuda"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _random_codes(gen: torch.Generator, rows: int, local_rows: int, exchanged_rows: int):
    """Codes of every kind: valid rows of both sources, negated ones, rows past the sources,
    zero rows, negative codes and codes with unknown bits."""
    row = torch.randint(0, max(local_rows, exchanged_rows) + 3, (rows,), generator=gen)
    kind = torch.randint(0, 6, (rows,), generator=gen)
    codes = row.clone()
    codes[kind == 1] |= EXCHANGED_BIT
    codes[kind == 2] |= NEGATE_BIT
    codes[kind == 3] |= EXCHANGED_BIT | NEGATE_BIT
    codes[kind == 4] = -torch.randint(1, 1 << 40, ((kind == 4).sum().item(),), generator=gen)
    codes[kind == 5] |= 1 << torch.randint(42, 62, ((kind == 5).sum().item(),), generator=gen)
    return codes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels,offset", [(64, 0), (4096, 0), (64, 3), (7, 0), (264, 0)])
def test_gather_and_scatter_are_the_cpu_semantics(dtype, channels, offset):
    gen = torch.Generator().manual_seed(SEED)
    local = torch.randn(37 * channels + offset, generator=gen).to(dtype)[offset:].view(37, channels)
    exchanged = torch.randn(12, channels, generator=gen).to(dtype)
    codes = _random_codes(gen, 300, 37, 12)
    want = torch.empty(300, channels, dtype=dtype)
    _compute.ReferenceCompute.gather(codes, local, exchanged, want)
    got = torch.full((300, channels), float("nan"), dtype=dtype, device=DEVICE)
    _program.gather(codes.to(DEVICE), local.to(DEVICE), exchanged.to(DEVICE), got)
    assert torch.equal(_bits(got.cpu()), _bits(want)), SEED
    targets = torch.randperm(400, generator=gen)[:300] - 60  # unique; some < 0, some past 37
    out = torch.randn(37, channels, generator=gen).to(dtype)
    expected = out.clone()
    _compute.ReferenceCompute.scatter(want, targets, expected)
    out = out.to(DEVICE)
    _program.scatter(got, targets.to(DEVICE), out)
    assert torch.equal(_bits(out.cpu()), _bits(expected)), SEED


# (P, layout, exchange, pack, C, variant index)
CASES = [(2, "zigzag", "all_gather", "one_doc", 64, 4),
         (3, "contiguous", "p2p", "short_docs_at_boundaries", 264, 4),
         (4, "zigzag", "p2p", "tiny_pieces_1_2", 8, 4),
         (4, "contiguous", "all_gather", "tiny_pieces_1", 7, 4),
         (2, "contiguous", "all_gather", "doc_ends_at_piece_end", 512, 4),
         (3, "zigzag", "all_gather", "empty_docs", 24, 4),
         (5, "zigzag", "p2p", "not_multiple_random", 64, 4)]
GPU_VARIANTS = (("silu", True, torch.bfloat16, torch.float32),
                ("silu", False, torch.bfloat16, torch.bfloat16),
                (None, True, torch.float16, torch.float16),
                (None, False, torch.float16, torch.float32),
                ("silu", True, torch.bfloat16, torch.bfloat16))


def _check(monkeypatch, cu, total, world, layout, exchange, channels, variant, seed):
    activation, with_bias, x_dtype, w_dtype = variant
    x, w, b, dy = tl.inputs(total, channels, x_dtype, w_dtype, with_bias, seed, device=DEVICE)
    run = tl.simulate(monkeypatch, cu, total, world, layout, exchange, x, w, b, dy, activation,
                      grad_dtype=torch.float32)
    errors = tl.output_errors(run["y"], run["dx"], cu, x, w, b, dy, activation)
    dw, db = (tl.rank_order_sum(run["partials"], i) for i in (0, 1))
    errors += tl.partials_errors(dw, db, cu, x, w, b, dy, activation, 2.0 ** -24,
                                 tl.gpu_partial_terms(total, world))
    return errors


@pytest.mark.parametrize("world,layout,exchange,name,channels,variant", CASES)
def test_every_rank_on_one_gpu_matches_the_single_rank_op(monkeypatch, world, layout, exchange,
                                                         name, channels, variant):
    rng = random.Random(f"{SEED}/{world}/{layout}/{exchange}/{name}")
    total, cu = tl.pack(name, world, layout, rng)
    errors = []
    for v in (GPU_VARIANTS[variant], GPU_VARIANTS[rng.randrange(4)]):
        errors += _check(monkeypatch, cu, total, world, layout, exchange, channels, v,
                         rng.randrange(2**31))
    assert not errors, f"seed {SEED}, S={total} cu={cu}: " + "; ".join(errors)


@pytest.mark.parametrize("world,layout,exchange", [(2, "zigzag", "all_gather"),
                                                    (4, "contiguous", "p2p")])
def test_long_packs_on_the_long_tiles(monkeypatch, world, layout, exchange):
    """Packs past the family's long-tile floor (S >= 65536, C >= 256), documents across the
    boundaries: the main passes take the long programs, the windows the short ones."""
    rng = random.Random(f"{SEED}/{world}/{layout}")
    total = 70001 * world
    cu = [0, 1000, total // 2 + 3, total - 2, total]
    for variant in GPU_VARIANTS[:2]:
        errors = _check(monkeypatch, cu, total, world, layout, exchange, 512, variant,
                        rng.randrange(2**31))
        assert not errors, f"seed {SEED}: " + "; ".join(errors)


def test_selftest_passes():
    results = _selftest.run(torch.cuda.current_device())
    assert [problem for _, problem in results] == [None, None], results


NCCL_WORLD = 2
NCCL_DEADLINE_S = 300  # the spawned ranks: a hang fails the test instead of blocking it


def test_nccl_ranks_match_the_single_rank_op(monkeypatch):
    """Every case of kcp_dist_worker.nccl_case_names (both layouts and exchanges, short documents
    across the boundaries, the long tiles) on two ranks over NCCL: y and dx gathered bitwise the
    single-rank programs', the partials summed in rank order within the bound, repeatable."""
    if "LOCAL_RANK" in os.environ:  # under torchrun: this process is one rank of the group
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        made = not dist.is_initialized()
        if made:
            dist.init_process_group("nccl")
        monkeypatch.setattr(_buffers, "empty", worker._nan_empty)
        try:
            results = {dist.get_rank(): worker.run_nccl_cases(SEED, device)}
        finally:
            if made:
                dist.destroy_process_group()
    elif torch.cuda.device_count() < NCCL_WORLD:
        pytest.skip(f"needs {NCCL_WORLD} GPUs (or torchrun: see the module's docstring)")
    else:
        results = worker.spawn(worker.nccl_worker, NCCL_WORLD, SEED, NCCL_DEADLINE_S)
    failures = [f"rank {rank} {case}: {' | '.join(errors)}" for rank, cases in results.items()
                for case, errors in cases.items() if errors]
    assert not failures, "; ".join(failures)
