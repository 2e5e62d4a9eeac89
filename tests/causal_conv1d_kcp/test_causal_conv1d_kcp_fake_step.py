"""A whole KCP step on the simulated GPU (tests/fake_gpu.py: every program entry records its
call instead of launching), in a one-process gloo group, zigzag: the sequence of entries the
forward and backward helpers call (the single-rank family's and the ``_kcp`` program's) and
their sizes and tensors, from the plan's tables."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import fake_gpu  # noqa: E402
from fake_gpu import cuda  # noqa: E402

import cake.cake_causal_conv1d_det_train_kcp as kcp  # noqa: E402
from cake.cake_causal_conv1d_det_train import _function as conv_function  # noqa: E402
from cake.cake_causal_conv1d_det_train_kcp import _buffers, _program  # noqa: E402

S, C = 20, 16
CU = [0, 7, 20]  # the second document crosses the middle: slot 1's first tokens are edges


@pytest.fixture(scope="module")
def group():
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture
def gpu(monkeypatch):
    """The simulated GPU; the family's plans and this package's entries are empty before and
    after; the step's tensors and the plan's tables are made on it."""
    memos = (conv_function._plan, conv_function._forward_plans, conv_function._backward_plans)
    for memo in memos:
        memo.clear()
    _program._entries.clear()
    launches = fake_gpu.install(monkeypatch)
    monkeypatch.setattr(_buffers, "empty",
                        lambda shape, dtype, device: cuda(torch.zeros(tuple(shape), dtype=dtype)))
    monkeypatch.setattr(_buffers, "upload",
                        lambda values, dtype, device: cuda(torch.tensor(list(values), dtype=dtype)))
    yield launches
    for memo in memos:
        memo.clear()
    _program._entries.clear()


def _moves(launches) -> list:
    """(entry, its sizes) of every call but the workspace queries."""
    sizes = {"forward": ("tokens", "num_docs"), "backward": ("tokens", "num_docs"),
             "gather": ("rows", "local_rows", "exchanged_rows", "channels"),
             "scatter": ("rows", "out_rows", "channels")}
    return [(launch.entry, tuple(launch.args[k] for k in sizes[launch.entry]))
            for launch in launches if launch.entry in sizes]


def test_a_zigzag_step_on_one_rank_launches_the_windows(group, gpu):
    plan = kcp.CakeCausalConv1dDetKcpPlan.build(torch.tensor(CU, dtype=torch.int32), S, C,
                                                torch.bfloat16, layout="zigzag",
                                                device="cuda:0")
    assert [(p.start, p.end, p.halo_len, p.edge_len, p.tail_len) for p in plan.pieces] == [
        (0, 10, 0, 0, 3), (10, 20, 3, 3, 0)]
    assert not plan.exchange_needed  # both pieces are this rank's: nothing travels
    gen = torch.Generator().manual_seed(0)
    x = cuda(torch.randn(S, C, generator=gen).to(torch.bfloat16))
    dy = cuda(torch.randn(S, C, generator=gen).to(torch.bfloat16))
    w = cuda(torch.randn(C, 4, generator=gen).to(torch.bfloat16))
    y, halo = kcp.cake_causal_conv1d_det_train_kcp_forward(x, w, None, plan, return_x_halo=True)
    forward = list(gpu)
    assert _moves(forward) == [
        ("forward", (S, 3)),          # the main pass, cut at 7 and 10
        ("gather", (6, S, 0, C)),     # slot 1's window: tokens 7..12
        ("forward", (6, 1)),          # the window in its full context
        ("scatter", (6, S, C))]       # its edge rows over the main pass's
    calls = [launch.args for launch in forward if launch.entry != "workspace_bytes"]
    assert calls[0]["cu_seqlens"] == plan.local_cu_seqlens.data_ptr()
    assert calls[0]["x"] == x.data_ptr() and calls[0]["y"] == y.data_ptr()
    assert calls[1]["table"] == plan.forward_windows.x_codes.data_ptr()
    assert calls[1]["local"] == x.data_ptr() and calls[1]["out"] == calls[2]["x"]
    assert calls[2]["cu_seqlens"] == plan.forward_windows.cu_seqlens.data_ptr()
    assert calls[3]["src"] == calls[2]["y"] and calls[3]["out"] == y.data_ptr()
    assert calls[3]["table"] == plan.forward_windows.targets.data_ptr()
    del gpu[:]
    dx, dweight, dbias = kcp.cake_causal_conv1d_det_train_kcp_backward(dy, x, w, None, plan,
                                                                       x_halo=halo)
    assert dbias is None and dweight.dtype == torch.float32
    assert _moves(gpu) == [
        ("backward", (S, 3)),         # the main pass
        ("gather", (9, S, 0, C)),     # fix-up x: slot 1's edges in context, then as seen
        ("gather", (9, S, 0, C)),     # fix-up dy: zero on the halo, negated the second time
        ("backward", (9, 2)),
        ("gather", (18, S, 0, C)),    # dx windows x: slot 0's tail (tokens 4..12), slot 1's
        ("gather", (18, S, 0, C)),    # front (7..15); dy
        ("backward", (18, 3)),        # cut at 7 in the first window
        ("scatter", (18, S, C))]      # their targets over the main pass's dx
    calls = [launch.args for launch in gpu if launch.entry != "workspace_bytes"]
    assert calls[0]["dx"] == dx.data_ptr() and calls[0]["dy"] == dy.data_ptr()
    assert calls[1]["table"] == plan.fixup_windows.x_codes.data_ptr()
    assert calls[2]["table"] == plan.fixup_windows.dy_codes.data_ptr()
    assert calls[2]["local"] == dy.data_ptr()
    assert calls[5]["table"] == plan.dx_windows.dy_codes.data_ptr()
    assert calls[6]["cu_seqlens"] == plan.dx_windows.cu_seqlens.data_ptr()
    assert calls[7]["out"] == dx.data_ptr() and calls[7]["src"] == calls[6]["dx"]
    assert plan.dx_windows.cu_seqlens.tolist() == [0, 3, 9, 18]
    assert all(launch.args.get("grad_fp32") == 1 for launch in gpu.of("backward"))
