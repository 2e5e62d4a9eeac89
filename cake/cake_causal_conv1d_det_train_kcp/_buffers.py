"""Where a KCP step makes its tensors and a plan uploads its tables: one place, so that the
tests can make them NaN-poisoned (every row a step leaves unwritten shows) or on a simulated GPU
(tests/fake_gpu.py)."""

from __future__ import annotations

from typing import Sequence

import torch


def empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def upload(values: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=dtype, device=device)
