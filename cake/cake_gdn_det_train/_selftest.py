"""``python -m cake selftest`` on a GPU: forward and backward against the float64 reference
(bf16, K = V = 128, four packed documents, initial and final state, qk_l2norm; H = 2, HV = 4:
grouped value heads)."""

from __future__ import annotations

import torch

from .._shared import gdn_selftest
from . import reference
from ._function import CakeGDNDetPlan, cake_gdn_det


def run(device_index: int) -> list:
    return [gdn_selftest.run_case(cake_gdn_det, CakeGDNDetPlan, reference, device_index, heads=2,
                                  value_heads=4, seed=20261205)]


def bitwise_cases(device: torch.device) -> dict:
    """Seeded autograd cases, the tensors by name (ci/gpu_vendored_check.py compares builds)."""
    return gdn_selftest.bitwise_cases(cake_gdn_det, CakeGDNDetPlan, device, grouped=True)
