"""What the families' ``_selftest`` modules share: a case of ``python -m cake selftest`` (against
the float64 reference, run twice), and the seeded inputs of their bitwise cases (the checks that
compare two builds of a family, such as a vendored copy and cake-train's own, tensor by
tensor: ci/gpu_vendored_check.py)."""

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



def generator(seed: int) -> torch.Generator:
    """A CPU generator: bitwise cases draw their inputs on the CPU, the same on every machine."""
    return torch.Generator(device="cpu").manual_seed(seed)


def document_offsets(tokens: int, documents: int, gen: torch.Generator) -> list[int]:
    """``documents`` random packed-document offsets over ``tokens`` (0 first, ``tokens`` last)."""
    cuts = sorted(torch.randint(0, tokens + 1, (documents - 1,), generator=gen).tolist())
    return [0, *cuts, tokens]
