"""``python -m cake selftest`` on a GPU: both entries, forward and backward, against the float64
reference (bf16), each case twice and bitwise repeatable."""

from __future__ import annotations

import torch

from .._shared import lm_head_selftest
from . import reference
from ._function import cake_lm_head_det_train_logprob, cake_lm_head_det_train_loss


def run(device_index: int) -> list:
    return lm_head_selftest.run(cake_lm_head_det_train_loss, cake_lm_head_det_train_logprob,
                                reference, device_index, deterministic=True)


def bitwise_cases(device: torch.device) -> dict:
    """Seeded autograd cases, the tensors by name (ci/gpu_vendored_check.py compares builds)."""
    return lm_head_selftest.bitwise_cases(cake_lm_head_det_train_loss,
                                          cake_lm_head_det_train_logprob, device,
                                          deterministic=True)
