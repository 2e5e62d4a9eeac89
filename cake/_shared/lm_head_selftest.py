"""The LM head families' GPU self-test (``python -m cake selftest``) and bitwise cases (their
``_selftest.run`` and ``_selftest.bitwise_cases``)."""

from __future__ import annotations

import torch

from ..core import selftest

# docs/architecture.md#accuracy-budgets: loss and log-probabilities within 1e-3 of float64 (bf16 inputs are exact
# products summed in fp32, so ~1e-6 is expected); gradients norm-wise within 1e-2 (dz rounded to
# bf16, 2^-8, before the gradient GEMMs, and the result rounded once more).
VALUE_TOLERANCE = 1e-3
GRADIENT_TOLERANCE = 1e-2
_TOKENS, _DIM, _VOCAB = 1000, 1024, 5003  # V not a multiple of any tile


def _inputs(device: torch.device, seed: int) -> dict:
    gen = selftest.generator(seed)
    hidden = torch.randn(_TOKENS, _DIM, generator=gen).to(device, torch.bfloat16)
    weight = (torch.randn(_VOCAB, _DIM, generator=gen) * 0.05).to(device, torch.bfloat16)
    labels = torch.randint(0, _VOCAB, (_TOKENS,), generator=gen)
    labels[::7] = -100
    labels[1], labels[2] = 0, _VOCAB - 1
    return {"hidden": hidden, "weight": weight, "labels": labels.to(device),
            "grad_logprob": torch.randn(_TOKENS, generator=gen).to(device),
            "grad_entropy": torch.randn(_TOKENS, generator=gen).to(device)}


def _autograd(loss, logprob, x: dict) -> dict:
    """Both entries with autograd on x's inputs: outputs and gradients by name."""
    found = {}
    h, w = (x[n].detach().requires_grad_() for n in ("hidden", "weight"))
    value = loss(h, w, x["labels"], logit_softcap=30.0)
    value.backward()
    found.update({"loss": value, "loss/dhidden": h.grad, "loss/dweight": w.grad})
    h, w = (x[n].detach().requires_grad_() for n in ("hidden", "weight"))
    lp, ent = logprob(h, w, x["labels"], temperature=0.8, return_entropy=True)
    ((lp * x["grad_logprob"]).sum() + (ent * x["grad_entropy"]).sum()).backward()
    found.update({"logprob": lp, "entropy": ent, "logprob/dhidden": h.grad,
                  "logprob/dweight": w.grad})
    return found


def _reference(reference, x: dict) -> dict:
    ref, dh, dw = reference.reference_loss_with_grads(
        x["hidden"], x["weight"], x["labels"], torch.ones((), device=x["hidden"].device),
        logit_softcap=30.0)
    lp, ent, ldh, ldw = reference.reference_logprob_with_grads(
        x["hidden"], x["weight"], x["labels"], x["grad_logprob"], x["grad_entropy"],
        temperature=0.8)
    return {"loss": ref, "loss/dhidden": dh, "loss/dweight": dw, "logprob": lp, "entropy": ent,
            "logprob/dhidden": ldh, "logprob/dweight": ldw}


def _relative(found: torch.Tensor, expected: torch.Tensor) -> float:
    return ((found.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def run(loss, logprob, reference, device_index: int, *, deterministic: bool) -> list:
    """bf16 T = 1000, D = 1024, V = 5003, every seventh token ignored: the loss (softcap 30) and
    log-probs + entropy (temperature 0.8) of the entries ``loss`` and ``logprob``, values and
    gradients against the float64 ``reference`` module (the family's). det: each case runs twice
    and must repeat bit for bit; nondet: its gradients only within tolerance."""
    x = _inputs(torch.device("cuda", device_index), 20261205)
    reference = _reference(reference, x)
    values = ("loss", "logprob", "entropy")
    name = f"bf16 T={_TOKENS} D={_DIM} V={_VOCAB}"
    cases = [selftest.selftest_case(
        f"{name} values", lambda: {k: v for k, v in _autograd(loss, logprob, x).items()
                                   if k in values},
        {k: reference[k] for k in values}, tolerance=VALUE_TOLERANCE)]
    gradients = [k for k in reference if k not in values]
    if deterministic:
        cases.append(selftest.selftest_case(
            f"{name} gradients", lambda: {k: v for k, v in _autograd(loss, logprob, x).items()
                                          if k in gradients},
            {k: reference[k] for k in gradients}, tolerance=GRADIENT_TOLERANCE))
        return cases
    found, problem = _autograd(loss, logprob, x), None
    for key in gradients:
        error = _relative(found[key], reference[key])
        if not torch.isfinite(found[key]).all() or error > GRADIENT_TOLERANCE:
            problem = f"{key}: relative error {error:.2e} > {GRADIENT_TOLERANCE:.0e}"
            break
    return cases + [(f"{name} gradients (atomics: not bitwise)", problem)]


def bitwise_cases(loss, logprob, device: torch.device, *, deterministic: bool) -> dict:
    """Seeded autograd cases (bf16 and fp16, V not a tile multiple, every option): the tensors by
    name (ci/gpu_vendored_check.py compares two builds bit for bit). nondet: the forward's
    outputs only (its gradients are summed with atomics)."""
    outputs = {}
    for seed, dtype in enumerate((torch.bfloat16, torch.float16)):
        x = _inputs(device, 3000 + seed)
        x["hidden"], x["weight"] = x["hidden"].to(dtype), x["weight"].to(dtype)
        for key, value in _autograd(loss, logprob, x).items():
            if deterministic or "/" not in key:
                outputs[f"{dtype}/{key}".replace("torch.", "")] = value
    return outputs
