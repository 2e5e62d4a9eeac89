"""Shared torch-side host helpers (``cake.core.host``) that need no GPU to check."""

from __future__ import annotations

import pytest
import torch

from cake.core import host


@pytest.fixture
def two_gpus(monkeypatch):
    """A simulated machine with two CUDA devices, the current one being 1."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


@pytest.mark.parametrize("asked,expected", [
    (None, 1), ("cuda", 1), (torch.device("cuda"), 1), (0, 0), ("cuda:1", 1),
    (torch.device("cuda", 0), 0), ("cpu", None), (torch.device("cpu"), None), (2, None),
    ("cuda:5", None), ("meta", None)])
def test_supported_device(two_gpus, asked, expected):
    found = host.supported_device(asked)
    assert (found.index if found is not None else None) == expected
    assert found is None or found.type == "cuda"


def test_supported_device_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert host.supported_device(None) is None and host.supported_device(0) is None


def test_op_names_are_unique_per_package():
    assert host.op_name("cake.cake_x_det_train", "forward") == "cake_cake_x_det_train::forward"
    assert host.op_name("flashinfer.experimental.cake.cake_x_det_train", "forward") != \
        host.op_name("cake.cake_x_det_train", "forward")


def test_backward_result_places_gradients_by_position():
    a, b = torch.zeros(1), torch.ones(1)
    assert host.backward_result(4, {0: a, 2: b}) == (a, None, b, None)


# --------------------------------------------------------------------------- fast path


def test_signature_tells_apart_what_the_checks_read():
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    same = [torch.ones(4, 8, dtype=torch.bfloat16),
            torch.zeros(40, dtype=torch.bfloat16)[:32].view(4, 8)]
    different = [x.float(), torch.zeros(8, 4, dtype=torch.bfloat16), x.t().contiguous().t(),
                 torch.nn.Parameter(x), None, [[0.0] * 8] * 4]
    for other in same:
        assert host.signature(other, 1e-6) == host.signature(x, 1e-6)
    for other in different:
        assert host.signature(other, 1e-6) != host.signature(x, 1e-6)
    # Equal scalars of different types are different signatures (True == 1 == 1.0).
    assert len({host.signature(x, v) for v in (True, 1, 1.0)}) == 3
    assert host.signature(x, "silu") != host.signature(x, None)
    # One flat tuple: where each value starts is still told apart.
    assert host.signature(x, None) != host.signature(None, x)
    assert host.signature(1e-6, None) != host.signature(None, 1e-6)
    assert host.signature(None, None) != host.signature(None)


def test_memo_is_bounded_and_skips_unhashable_keys():
    memo = host.Memo(limit=3)
    for key in range(5):
        assert memo.put(key, str(key)) == str(key)
    assert len(memo) == 3 and memo.get(0) is None and memo.get(1) is None  # oldest dropped
    assert memo.get(4) == "4"
    unhashable = (1, [2])
    assert memo.put(unhashable, "x") == "x" and memo.get(unhashable) is None and len(memo) == 3
    memo.clear()
    assert len(memo) == 0 and memo.get(4) is None


def test_check_disjoint_reports_the_first_overlap_and_skips_empty_tensors():
    base = torch.zeros(64)
    out, other_out = base[:16], base[16:32]
    host.check_disjoint({"out": out, "other": other_out}, {"x": base[32:], "none": None,
                                                           "empty": base[:0]})
    with pytest.raises(ValueError, match="^out: must not share memory with x$"):
        host.check_disjoint({"out": out}, {"x": base[8:24], "y": base})
    with pytest.raises(ValueError, match="^other: must not share memory with x$"):
        host.check_disjoint({"out": out, "other": other_out}, {"x": base[31:40]})
    with pytest.raises(ValueError, match="^out: must not share memory with other$"):
        host.check_disjoint({"out": out, "other": base[15:20]}, {})
    host.check_disjoint({"out": torch.zeros(0)}, {"x": base})


def test_aligned():
    buffer = torch.zeros(64, dtype=torch.uint8)
    assert host.aligned(buffer, None, buffer[16:])
    assert not host.aligned(buffer, buffer[4:])
    assert host.aligned(buffer[4:], to=4) and not host.aligned(buffer[4:], to=8)
    assert not host.aligned([0])  # not a tensor: such a call fails its checks anyway


class _Scale(torch.autograd.Function):
    """y = x * factor, launched by ``_launch_scale``, without setup_context (as the families'
    functions): functorch transforms refuse it, which tells whether eager_apply went through
    ``Function.apply``."""

    @staticmethod
    def forward(ctx, x, factor):
        return _keep_scale(ctx, x, factor, _launch_scale(x, factor))

    @staticmethod
    def backward(ctx, dy):
        return host.backward_result(len(ctx.needs_input_grad), {0: dy * ctx.factor})


_EVENTS = []


def _launch_scale(x, factor):
    _EVENTS.append("launch")
    return x.detach() * factor


def _keep_scale(ctx, x, factor, y):
    _EVENTS.append("keep")
    ctx.factor = factor
    return y


def test_eager_apply_launches_before_autograd_and_records_the_gradient():
    apply = host.eager_apply(_Scale, _launch_scale, _keep_scale)
    assert apply is not _Scale.apply, "this torch has the C apply: the short path must be taken"
    _EVENTS.clear()
    x = torch.randn(5, requires_grad=True)
    y = apply(x, 3.0)
    assert _EVENTS == ["launch", "keep"]
    assert type(y.grad_fn).__name__ == "_ScaleBackward"  # the subclass, named as _Scale
    assert issubclass(type(y.grad_fn)._forward_cls, _Scale) and type(y.grad_fn)._forward_cls is not _Scale
    y.backward(torch.arange(5.0))
    assert torch.equal(y.detach(), x.detach() * 3.0)
    assert torch.equal(x.grad, torch.arange(5.0) * 3.0)


def test_eager_apply_takes_function_apply_under_a_transform():
    apply = host.eager_apply(_Scale, _launch_scale, _keep_scale)
    _EVENTS.clear()
    with pytest.raises(RuntimeError, match="must override the setup_context"):
        torch.func.grad(lambda x: apply(x, 3.0).sum())(torch.randn(5))
    assert _EVENTS == []  # Function.apply refused it before its forward could launch
