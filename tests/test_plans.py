"""How a family call reaches its program (``cake.core.plans``): the support query's device, the
fast path's signature and memo. No GPU needed."""

from __future__ import annotations

import pytest
import torch

from cake.core import plans


@pytest.fixture
def two_gpus(monkeypatch):
    """A simulated machine with two CUDA devices, the current one being 1."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(plans, "_current_device", lambda: 1)  # the launch path's own query


@pytest.mark.parametrize("asked,expected", [
    (None, 1), ("cuda", 1), (torch.device("cuda"), 1), (0, 0), ("cuda:1", 1),
    (torch.device("cuda", 0), 0), ("cpu", None), (torch.device("cpu"), None), (2, None),
    ("cuda:5", None), ("meta", None)])
def test_supported_device(two_gpus, asked, expected):
    found = plans.supported_device(asked)
    assert (found.index if found is not None else None) == expected
    assert found is None or found.type == "cuda"


def test_supported_device_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert plans.supported_device(None) is None and plans.supported_device(0) is None


@pytest.mark.parametrize("device", [torch.device("cuda", 1), torch.device("cuda")])
def test_stream_handle_is_the_current_devices_stream(two_gpus, monkeypatch, device):
    monkeypatch.setattr(plans, "_raw_stream", lambda index: 0x100 + index)
    assert plans.stream_handle(device) == 0x101
    assert plans.stream_handle(torch.device("cpu")) == 0


def test_stream_handle_refuses_tensors_of_another_device(two_gpus, monkeypatch):
    """Programs launch in the current context: tensors of another device would be read there."""
    monkeypatch.setattr(plans, "_raw_stream", lambda index: pytest.fail("no stream of cuda:1"))
    with pytest.raises(RuntimeError, match=r"the tensors are on cuda:0 but the current CUDA "
                                           r"device is cuda:1: call under 'with "
                                           r"torch.cuda.device\(0\):'"):
        plans.stream_handle(torch.device("cuda", 0))


# --------------------------------------------------------------------------- fast path


def test_signature_tells_apart_what_the_checks_read():
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    same = [torch.ones(4, 8, dtype=torch.bfloat16),
            torch.zeros(40, dtype=torch.bfloat16)[:32].view(4, 8)]
    different = [x.float(), torch.zeros(8, 4, dtype=torch.bfloat16), x.t().contiguous().t(),
                 torch.nn.Parameter(x), None, [[0.0] * 8] * 4]
    for other in same:
        assert plans.signature(other, 1e-6) == plans.signature(x, 1e-6)
    for other in different:
        assert plans.signature(other, 1e-6) != plans.signature(x, 1e-6)
    # Equal scalars of different types are different signatures (True == 1 == 1.0).
    assert len({plans.signature(x, v) for v in (True, 1, 1.0)}) == 3
    assert plans.signature(x, "silu") != plans.signature(x, None)
    # One flat tuple: where each value starts is still told apart.
    assert plans.signature(x, None) != plans.signature(None, x)
    assert plans.signature(1e-6, None) != plans.signature(None, 1e-6)
    assert plans.signature(None, None) != plans.signature(None)


def test_memo_is_bounded_and_skips_unhashable_keys():
    memo = plans.Memo(limit=3)
    for key in range(5):
        assert memo.put(key, str(key)) == str(key)
    assert len(memo) == 3 and memo.get(0) is None and memo.get(1) is None  # oldest dropped
    assert memo.get(4) == "4"
    unhashable = (1, [2])
    assert memo.put(unhashable, "x") == "x" and memo.get(unhashable) is None and len(memo) == 3
    memo.clear()
    assert len(memo) == 0 and memo.get(4) is None
