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
