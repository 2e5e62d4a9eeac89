"""A self-test case for ``python -m cake selftest`` (the families' ``_selftest`` modules)."""

from __future__ import annotations

from typing import Mapping

import torch

def selftest_case(name: str, compute, reference: Mapping[str, torch.Tensor], *,
                  tolerance: float) -> tuple[str, str | None]:
    """One self-test case for ``python -m cake selftest``: ``(name, problem or None)``.

    ``compute()`` returns name -> tensor (outputs and gradients) and runs twice: the two runs
    must agree bit for bit, and each tensor must be within ``tolerance`` of the float64
    ``reference`` in norm-wise relative error (finite, every element written).
    """
    first = {k: v.detach().clone() for k, v in compute().items()}
    second = compute()
    for key, expected in reference.items():
        got = first[key]
        if not torch.equal(got, second[key]):
            return name, f"{key} differs between two identical runs"
        if not torch.isfinite(got).all():
            return name, f"{key} has non-finite elements"
        error = ((got.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()
        if error > tolerance:
            return name, f"{key}: relative error {error:.2e} > {tolerance:.0e}"
    return name, None

