"""``python -m cake selftest`` on a GPU: both entries, forward and backward, against the float64
reference (bf16); the forward twice and bitwise repeatable, the backward (fp32 atomics) within
tolerance."""

from __future__ import annotations

import torch

from .._shared import lm_head_selftest
from . import reference
from ._function import cake_lm_head_nondet_train_logprob, cake_lm_head_nondet_train_loss


def run(device_index: int) -> list:
    return lm_head_selftest.run(cake_lm_head_nondet_train_loss, cake_lm_head_nondet_train_logprob,
                                reference, device_index, deterministic=False)


def bitwise_cases(device: torch.device) -> dict:
    """Seeded forward outputs, by name (ci/gpu_vendored_check.py compares builds bit for bit; the
    backward's atomics make its gradients differ run to run)."""
    return lm_head_selftest.bitwise_cases(cake_lm_head_nondet_train_loss,
                                          cake_lm_head_nondet_train_logprob, device,
                                          deterministic=False)
