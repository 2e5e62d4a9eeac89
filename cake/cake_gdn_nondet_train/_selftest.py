"""``python -m cake selftest`` on a GPU: forward and backward against the float64 reference
(bf16, K = V = 128, four packed documents, initial and final state, qk_l2norm).

H = HV = 4: with one value head per q/k head, each dq/dk element gets its atomic additions in
stream order, so the two runs the self-test compares agree bitwise; grouped layouts (HV > H)
need not, by design (the det family is the bitwise one)."""

from __future__ import annotations

import torch

from .._shared import gdn_selftest
from . import reference
from ._function import CakeGDNNondetPlan, cake_gdn_nondet


def run(device_index: int) -> list:
    return [gdn_selftest.run_case(cake_gdn_nondet, CakeGDNNondetPlan, reference, device_index,
                                  heads=4, value_heads=4, seed=20261205)]


def bitwise_cases(device: torch.device) -> dict:
    """Seeded autograd cases, the tensors by name (ci/gpu_vendored_check.py compares builds)."""
    return gdn_selftest.bitwise_cases(cake_gdn_nondet, CakeGDNNondetPlan, device, grouped=False)
